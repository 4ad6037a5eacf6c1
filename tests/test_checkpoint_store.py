"""Checkpoints in a bucket folder (``checkpoint.dir=s3://...``) against a real moto_server: each
written whole with its digest, a changed byte refused when named and passed over by
``ckpt_path=last``, and a writer killed mid-upload leaving the previous checkpoint whole and no
incomplete upload once the next run starts. No training here: the writer is the run's own
(``AtomicCheckpointIO``), given checkpoints of a known size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s3fs  # pinned in requirements.txt: missing, it fails here, never skips
import torch
from conftest import REPO
from moto_store import DUMMY_KEYS, moto_server, s3_client

from cocodet.errors import UserError
from cocodet.models import checkpoint_store
from cocodet.models.checkpoint_file import load_checkpoint
from cocodet.models.checkpoint_io import AtomicCheckpointIO
from cocodet.models.checkpoint_store import CheckpointDigestError, CheckpointFolder
from cocodet.storage import session

BUCKET = "ckpts"
FOLDER = f"s3://{BUCKET}/run"


@pytest.fixture(scope="module")
def endpoint():
    saved = {k: os.environ.get(k) for k in DUMMY_KEYS}
    os.environ.update(DUMMY_KEYS)
    try:
        with moto_server() as url:
            s3_client(url).create_bucket(Bucket=BUCKET)
            yield url
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def folder(endpoint, request):
    """A fresh bucket folder as this process's checkpoint folder."""
    name = f"s3://{BUCKET}/{request.node.name}"
    session.configure({}, timeout_s=10, retries=1, give_up_s=5)
    checkpoint_store.configure(CheckpointFolder(name, {"endpoint_url": endpoint}, part_bytes=5 * 2**20))
    yield name
    session.configure({})
    checkpoint_store.configure(CheckpointFolder("checkpoints"))


def state(step: int, floats: int = 1000) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((floats,), float(step))}}


def objects_in(endpoint: str, prefix: str) -> dict[str, dict]:
    client = s3_client(endpoint)
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.head_object(Bucket=BUCKET, Key=o["Key"]) for o in listed}


def test_a_checkpoint_is_one_object_with_its_digest_and_reads_back(endpoint, folder):
    writer = AtomicCheckpointIO()
    writer.save_checkpoint(state(3, floats=3 * 2**20), f"{folder}/last.ckpt")  # 12 MiB: three parts
    key = folder.split("/", 3)[3] + "/last.ckpt"
    head = objects_in(endpoint, key)[key]
    body = s3_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert head["Metadata"]["sha256"] == checkpoint_store.digest(body) and head["ContentLength"] == len(body)
    assert writer.whole == [f"{folder}/last.ckpt"]
    assert load_checkpoint(f"{folder}/last.ckpt", weights_only=True)["global_step"] == 3
    kept = checkpoint_store.read(f"{folder}/last.ckpt", keep=True)  # read early, for the trained groups
    s3_client(endpoint).delete_object(Bucket=BUCKET, Key=key)
    assert checkpoint_store.read(f"{folder}/last.ckpt") == kept == body  # the weights' read: no second GET
    with pytest.raises(FileNotFoundError):
        checkpoint_store.read(f"{folder}/last.ckpt")
    assert s3_client(endpoint).list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_changed_byte_is_refused_when_named_and_passed_over_by_last(endpoint, folder, tmp_path, caplog):
    from test_resume import spec_of

    from cocodet.modes.last_run import resume_checkpoint

    writer = AtomicCheckpointIO()
    writer.save_checkpoint(state(5), f"{folder}/resume.ckpt")
    writer.save_checkpoint(state(10), f"{folder}/last.ckpt")  # the newer, within the same second
    client, key = s3_client(endpoint), folder.split("/", 3)[3] + "/last.ckpt"
    answer = client.get_object(Bucket=BUCKET, Key=key)
    data = bytearray(answer["Body"].read())
    data[len(data) // 2] ^= 0x01  # one bit of one byte, in the tensor's storage
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data), Metadata=answer["Metadata"])

    with pytest.raises(CheckpointDigestError) as refused:
        load_checkpoint(f"{folder}/last.ckpt", weights_only=True)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{folder}/last.ckpt is not the checkpoint that was written")
    assert "ckpt_path=last" in line

    spec = spec_of(f"checkpoint.dir={folder}", "ckpt_path=last", run_dir=tmp_path / "elsewhere")
    path, checkpoint = resume_checkpoint(spec)
    assert path == f"{folder}/resume.ckpt" and checkpoint["global_step"] == 5
    assert any("passed over" in r.getMessage() and "last.ckpt" in r.getMessage() for r in caplog.records)
    named = spec_of(f"checkpoint.dir={folder}", f"ckpt_path={folder}/last.ckpt", run_dir=tmp_path / "named")
    with pytest.raises(CheckpointDigestError):
        resume_checkpoint(named)


def test_last_in_an_empty_bucket_folder_says_where_it_looked(endpoint, folder, tmp_path):
    from test_resume import spec_of

    from cocodet.modes.last_run import resume_checkpoint

    spec = spec_of(f"checkpoint.dir={folder}", "ckpt_path=last", run_dir=tmp_path / "run")
    with pytest.raises(UserError, match=rf"no checkpoint in {folder} \(checkpoint.dir\)"):
        resume_checkpoint(spec)
    fresh = spec_of(f"checkpoint.dir={folder}", "ckpt_path=last_if_any", run_dir=tmp_path / "run")
    assert resume_checkpoint(fresh) == (None, {})


WRITER = """
import sys, torch
from cocodet.models import checkpoint_store
from cocodet.models.checkpoint_io import AtomicCheckpointIO
from cocodet.storage import session
session.configure({}, timeout_s=10, retries=1, give_up_s=5)
folder, endpoint = sys.argv[1], sys.argv[2]
checkpoint_store.configure(checkpoint_store.CheckpointFolder(folder, {"endpoint_url": endpoint}, part_bytes=5 * 2**20))
big = {"global_step": 99, "state_dict": {"w": torch.zeros(100 * 2**20)}}
AtomicCheckpointIO().save_checkpoint(big, folder + "/last.ckpt")
"""


def test_a_writer_killed_mid_upload_leaves_the_previous_checkpoint_and_the_next_start_aborts_its_upload(
    endpoint, folder
):
    AtomicCheckpointIO().save_checkpoint(state(7), f"{folder}/last.ckpt")
    client, prefix = s3_client(endpoint), folder.split("/", 3)[3] + "/"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, folder, endpoint], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    try:
        deadline = time.monotonic() + 120
        while not client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads"):
            assert writer.poll() is None and time.monotonic() < deadline, "the 400 MB upload never began"
            time.sleep(0.02)
        os.kill(writer.pid, signal.SIGKILL)  # mid-upload: 80 parts of 5 MiB
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -9
    assert len(client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix)["Uploads"]) == 1
    assert load_checkpoint(f"{folder}/last.ckpt", weights_only=True)["global_step"] == 7  # the previous one, whole

    checkpoint_store.configure(CheckpointFolder(folder, {"endpoint_url": endpoint}))  # the next run starts
    checkpoint_store.abort_left_uploads()
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []) == []


def test_a_store_that_stays_down_ends_the_upload_naming_the_newest_whole_checkpoint(endpoint, tmp_path):
    from cocodet.models.checkpoint_store import CheckpointStoreDown

    with moto_server() as doomed:
        s3_client(doomed).create_bucket(Bucket=BUCKET)
        session.configure({}, timeout_s=1, retries=1, give_up_s=2)
        checkpoint_store.configure(CheckpointFolder(FOLDER, {"endpoint_url": doomed}))
        writer = AtomicCheckpointIO()
        writer.save_checkpoint(state(1), f"{FOLDER}/last.ckpt")
    try:  # the server is gone for good
        started = time.monotonic()
        with pytest.raises(CheckpointStoreDown) as down:
            writer.save_checkpoint(state(2), f"{FOLDER}/best-001.ckpt")
        assert time.monotonic() - started < 30
        line = str(down.value)
        assert down.value.status == "store_down" and "\n" not in line
        assert f"the newest checkpoint written whole is {FOLDER}/last.ckpt" in line and "give_up_s=2 s;" in line
        assert "checkpoint.storage_options.endpoint_url" in line and "dataset.storage_options" not in line
        assert writer.whole == [f"{FOLDER}/last.ckpt"]
    finally:
        session.configure({})
        checkpoint_store.configure(CheckpointFolder("checkpoints"))


def test_records_are_copied_beside_checkpoints_kept_elsewhere_and_restored_on_a_new_machine(endpoint, folder, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"status": "completed"}\n')
    checkpoint_store.copy_record(run / "summary.json", folder)
    checkpoint_store.copy_record(run / "bad_samples.jsonl", folder)  # none written: nothing copied
    keys = set(objects_in(endpoint, folder.split("/", 3)[3] + "/"))
    assert keys == {folder.split("/", 3)[3] + "/summary.json"}
    other = tmp_path / "other_machine" / "summary.json"
    checkpoint_store.restore_record(other, folder)
    assert other.read_text() == '{"status": "completed"}\n'

    local = tmp_path / "run" / "checkpoints"  # the default folder, inside the run's: no copy
    checkpoint_store.copy_record(run / "summary.json", str(local))
    assert not (local / "summary.json").exists()
    disk = tmp_path / "volume"  # a folder elsewhere (another disk): a copy
    checkpoint_store.copy_record(run / "summary.json", str(disk))
    assert (disk / "summary.json").read_text() == '{"status": "completed"}\n'


def test_only_s3_buckets_hold_checkpoints():
    with pytest.raises(UserError, match="only s3:// buckets"):
        checkpoint_store.configure(CheckpointFolder("gs://bucket/run"))
    checkpoint_store.configure(CheckpointFolder("checkpoints"))


def test_a_credential_in_checkpoint_storage_options_is_refused(tmp_path):
    from test_resume import spec_of

    from cocodet.errors import ConfigError

    with pytest.raises(ConfigError, match="checkpoint.storage_options.secret"):
        spec_of("+checkpoint.storage_options.secret=abc123", run_dir=tmp_path)


def test_checkpoint_storage_options_default_to_the_datasets_when_both_are_buckets(tmp_path):
    from test_resume import spec_of

    both = spec_of(
        "dataset=coco",
        "dataset.root=s3://data",
        "dataset.storage_options.endpoint_url=http://store:9000",
        "checkpoint.dir=s3://ckpts/run",
        run_dir=tmp_path,
    )
    assert both.checkpoint.options == {"endpoint_url": "http://store:9000"} and not both.checkpoint.in_run_dir
    own = spec_of(
        "dataset=coco",
        "dataset.root=s3://data",
        "dataset.storage_options.endpoint_url=http://store:9000",
        "checkpoint.dir=s3://ckpts/run",
        "checkpoint.storage_options.endpoint_url=http://other:9000",
        run_dir=tmp_path,
    )
    assert own.checkpoint.options == {"endpoint_url": "http://other:9000"}
    data_in_bucket = spec_of(  # a ckpt_path=s3://... is read with them too
        "dataset=coco",
        "dataset.root=s3://data",
        "dataset.storage_options.endpoint_url=http://store:9000",
        run_dir=tmp_path,
    )
    assert data_in_bucket.checkpoint.options == {"endpoint_url": "http://store:9000"}
    local_data = spec_of(
        "dataset.storage_options.endpoint_url=http://store:9000", "checkpoint.dir=s3://c/r", run_dir=tmp_path
    )
    assert local_data.checkpoint.options == {}
    default = spec_of(run_dir=tmp_path)
    assert default.checkpoint.dir == str(tmp_path / "checkpoints") and default.checkpoint.in_run_dir


def test_a_path_in_the_bucket_is_not_mangled(tmp_path):
    from cocodet.models.preemption import PreemptionCheckpoint

    assert PreemptionCheckpoint(FOLDER).path == f"{FOLDER}/resume.ckpt"
    assert PreemptionCheckpoint(str(tmp_path)).path == str(Path(tmp_path) / "resume.ckpt")


def test_a_multi_node_launch_with_checkpoints_in_a_bucket_needs_no_shared_run_folder(tmp_path, monkeypatch):
    """Every node and restart finds the checkpoints in the bucket folder, whatever run folder
    each composes (the refusal without a bucket: test_ddp.py)."""
    from test_elastic import TORCHRUN
    from test_resume import spec_of

    from cocodet.errors import UserError

    for name, value in {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}.items():  # a second node, no run id
        monkeypatch.setenv(name, value)
    nodes = ("trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2")
    with pytest.raises(UserError, match="has no run folder that every node and every restart agrees on"):
        spec_of(*nodes, run_dir=tmp_path)
    assert spec_of(*nodes, f"checkpoint.dir={FOLDER}", run_dir=tmp_path).checkpoint.dir == FOLDER


@pytest.mark.slow
def test_a_run_whose_checkpoint_store_dies_ends_store_down_naming_the_newest_whole_checkpoint(tmp_path, monkeypatch):
    """The store killed for good once the first epoch's checkpoints are in: the next upload is
    retried for give_up_s, then the run ends store_down (exit 2), its summary and last line
    naming the newest checkpoint written whole."""
    from conftest import NARROW_MODEL, synthetic_overrides

    for name, value in DUMMY_KEYS.items():
        monkeypatch.setenv(name, value)
    with moto_server() as doomed:
        client = s3_client(doomed)
        client.create_bucket(Bucket=BUCKET)
        args = [
            *synthetic_overrides(tmp_path / "data"),
            "dataset.image_size=64",
            "loader.batch_size=8",
            NARROW_MODEL,
            "trainer.max_epochs=3",
            "trainer.limit_val_batches=1",
            "trainer.enable_progress_bar=false",
            "loader=explicit",
            "loader.num_workers=0",
            f"checkpoint.dir={FOLDER}",
            f"checkpoint.storage_options.endpoint_url={doomed}",
            "dataset.remote.timeout_s=2",
            "dataset.remote.retries=1",
            "dataset.remote.give_up_s=2",
        ]
        command = [sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"]
        run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while "run/last.ckpt" not in {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])}:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.05)
    out, err = run.communicate(timeout=300)  # the server is gone for good
    assert run.returncode == 2, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    last = err.strip().splitlines()[-1]
    assert summary["status"] == "store_down" and summary["steps"] >= 4
    assert summary["last_ckpt"] == f"{FOLDER}/last.ckpt"
    assert last.startswith(f"error: checkpoint.dir {FOLDER}: ") and "gave up after dataset.remote.give_up_s=2 s" in last
    assert f"the newest checkpoint written whole is {FOLDER}/" in last and "ckpt_path=last" in last


def test_a_checkpoint_in_another_runs_bucket_folder_is_never_removed(tmp_path):
    """Lightning removes a replaced remote checkpoint wherever it is; here, as on local disk,
    only from the callback's own folder, and never the one the run resumed from."""
    from types import SimpleNamespace

    from cocodet.models.store_checkpoint import ModelCheckpoint

    callback = ModelCheckpoint(dirpath=f"s3://{BUCKET}/run_b", filename="last")
    resumed = SimpleNamespace(ckpt_path=f"s3://{BUCKET}/run_a/last.ckpt")
    new = f"s3://{BUCKET}/run_b/last.ckpt"
    assert not callback._should_remove_checkpoint(resumed, f"s3://{BUCKET}/run_a/last.ckpt", new)
    assert not callback._should_remove_checkpoint(resumed, f"s3://{BUCKET}/run_a/best-003.ckpt", new)
    assert callback._should_remove_checkpoint(resumed, f"s3://{BUCKET}/run_b/best-001.ckpt", new)
    assert not callback._should_remove_checkpoint(resumed, new, new)


def test_an_upload_part_the_store_drops_once_is_sent_again(endpoint, folder, monkeypatch):
    """A store that blinks mid-upload: the part is retried under the dataset's rules
    (dataset.remote), and the checkpoint is whole."""
    real = s3fs.S3FileSystem._call_s3
    dropped = []

    async def blinking(self, method, *args, **kwargs):
        if method == "upload_part" and kwargs.get("PartNumber") == 2 and not dropped:
            dropped.append(2)
            raise ConnectionResetError("Connection reset by peer")
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", blinking)
    AtomicCheckpointIO().save_checkpoint(state(4, floats=3 * 2**20), f"{folder}/last.ckpt")
    assert dropped == [2] and session.counts()["retries"] == 1
    assert load_checkpoint(f"{folder}/last.ckpt", weights_only=True)["global_step"] == 4
