"""dataset.root=s3://bucket against a real moto_server filled with coco_tiny (issue 42): the
stream contract as on local disk, every mode on the bucket, credentials kept secret, and a
store that fails named in one line."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import s3fs  # noqa: F401  (pinned in requirements.txt: missing, it fails here, never skips)
from conftest import NARROW_MODEL, REPO, is_root, run_in_process, run_train
from moto_store import DUMMY_KEYS, filled_store, moto_server, recorded, s3_client, upload_folder

from cocodet.models.evaluation import STAT_NAMES

BUCKET = "coco-tiny"
ENV = {"PYTHONPATH": str(REPO / "tests")}


@pytest.fixture(scope="module")
def store(coco_tiny):
    """The endpoint of a moto_server holding coco_tiny in ``coco-tiny``."""
    with filled_store(coco_tiny, BUCKET) as (endpoint, objects):
        assert objects == 162
        yield endpoint


def remote(endpoint: str, bucket: str = BUCKET) -> list[str]:
    return ["dataset=coco", f"dataset.root=s3://{bucket}", f"dataset.storage_options.endpoint_url={endpoint}"]


def bench_args(root_args: list[str], *extra: str) -> list[str]:
    return [
        "mode=bench",
        *root_args,
        "dataset.image_size=192",
        "loader=explicit",
        "loader.batch_size=4",
        "bench.batches=20",
        "bench.warmup=0",
        "bench.digest_batches=20",
        "bench.decode_probe=0",
        *extra,
    ]


def test_the_stream_equals_the_local_roots_at_every_worker_count_and_with_parts(store, coco_tiny, tmp_path):
    local = run_in_process(
        bench_args(["dataset=coco", f"dataset.root={coco_tiny}"], "loader.num_workers=2"), tmp_path / "local"
    )
    digests = {}
    for name, extra in {
        "w0": ["loader.num_workers=0", "bench.decode_probe=2"],
        "w1": ["loader.num_workers=1"],
        "w2_parts": ["loader.num_workers=2", "loader.part_images=3"],
    }.items():
        s = run_in_process(bench_args(remote(store), *extra), tmp_path / name)
        assert s["digest_batches"] == 20 and s["examples"] == 80, name
        digests[name] = s["batch_digest"]
    assert set(digests.values()) == {local["batch_digest"]}, (local["batch_digest"], digests)


def test_the_pixel_cache_of_a_bucket_is_keyed_by_one_listing(store, coco_tiny, tmp_path):
    """dataset.cache=disk on the bucket: built with one GET per image, the same batches as
    decoding, and a second start that asks the store for nothing but listings (no HEAD per
    object, no image read)."""
    args = bench_args(
        remote(store), "loader.num_workers=2", "dataset.cache=disk", f"dataset.cache_dir={tmp_path / 'cache'}"
    )
    recorded(store, reset=True)
    first = run_in_process(args, tmp_path / "first")
    images = [r for r in recorded(store) if "2017/0" in r["url"]]
    assert sum(r["method"] == "GET" and "/train2017/" in r["url"] for r in images) == 80
    recorded(store, reset=True)
    second = run_in_process(args, tmp_path / "second")
    again = recorded(store)
    assert [r for r in again if "2017/0" in r["url"]] == [], "the second start read or HEADed images"
    assert all(r["method"] in ("GET", "HEAD") for r in again)
    local = run_in_process(
        bench_args(["dataset=coco", f"dataset.root={coco_tiny}"], "loader.num_workers=2"), tmp_path / "local"
    )
    assert first["batch_digest"] == second["batch_digest"] == local["batch_digest"]
    assert second["decodes_per_sample"] == 0


def test_ranks_read_their_own_indices_and_the_padding_twice():
    from cocodet.loader.epoch_sampler import EpochSampler
    from cocodet.loader.rank_share import padding, rank_indices

    for size, world in ((80, 2), (80, 3), (7, 4)):
        shares = [rank_indices(size, 0, 3, r, world) for r in range(world)]
        for r, share in enumerate(shares):
            assert [k[1] for k in EpochSampler(size, 0, True, r, world).epoch_keys(3)] == share.tolist()
        counts = np.bincount(np.concatenate(shares), minlength=size)
        assert counts.min() == 1 and int((counts == 2).sum()) == padding(size, world) and counts.max() <= 2


def test_plan_names_the_root_and_what_an_epoch_reads_per_rank(store, coco_tiny, tmp_path, caplog):
    caplog.set_level("INFO")
    s = run_in_process(["mode=plan", *remote(store), "dataset.verify=true"], tmp_path / "plan")
    files = sorted((coco_tiny / "train2017").iterdir())
    assert s["remote"]["root"] == f"s3://{BUCKET}" and s["remote"]["objects_per_epoch"] == 80
    assert s["remote"]["bytes_per_epoch"] == sum(f.stat().st_size for f in files)
    assert "remote root s3://coco-tiny: this rank reads 80 of 80 train objects" in caplog.text
    verify = json.loads((tmp_path / "plan" / "verify.json").read_text())  # dataset.verify decoded every object
    assert verify == {"train": [], "val": []}
    assert "train: 80 images, 0 problems" in caplog.text and "val: 80 images, 0 problems" in caplog.text


@pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare")
def test_the_read_ahead_budget_fits_a_small_disk_and_a_number_that_cannot_is_refused(store, tmp_path):
    """The copies' folder is a 64 MiB tmpfs (a small node disk, in a private mount namespace):
    the default budget (auto) takes half of it, so plan succeeds; 4 GiB asked for explicitly is
    refused in one line with the folder and its free space."""
    copies = tmp_path / "copies"
    copies.mkdir()
    small_disk = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=64m tmpfs {copies} && exec "$@"',
        "sh",
    ]
    args = ["mode=plan", *remote(store), f"dataset.remote.cache_dir={copies}"]
    proc, s = run_train(args, tmp_path / "auto", prefix=small_disk)
    budget = s["remote"]["read_ahead"]
    assert "(auto: half of the 0.1 GiB free there, at most 4 GiB)" in proc.stdout + proc.stderr
    assert 30 * 2**20 <= budget["cache_bytes"] <= 32 * 2**20 and budget["free_bytes"] > 60 * 2**20, budget
    assert budget["holds_the_split"]  # coco_tiny's 80 train images: 11.7 MiB
    proc, _ = run_train(
        [*args, "dataset.remote.cache_bytes=4294967296"], tmp_path / "asked", prefix=small_disk, check=False
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"dataset.remote.cache_bytes=4294967296 (4.0 GiB) does not fit in {copies}: 0.1 GiB free there" in last


def test_the_annotation_is_fetched_once_and_the_index_not_parsed_again(store, tmp_path, caplog):
    caplog.set_level("INFO")
    cache = tmp_path / "cache"
    args = ["mode=plan", *remote(store), f"dataset.cache_dir={cache}"]
    recorded(store, reset=True)
    run_in_process(args, tmp_path / "first")
    first = [r for r in recorded(store) if r["method"] == "GET" and "annotations/instances" in r["url"]]
    assert len(first) == 2  # train and val, one GET each
    caplog.clear()
    recorded(store, reset=True)
    run_in_process(args, tmp_path / "second")
    again = [r for r in recorded(store) if r["method"] == "GET" and "annotations/instances" in r["url"]]
    assert again == [], again  # a HEAD each (the ETag), no GET
    assert caplog.text.count("read the cached index") == 2 and "built the index" not in caplog.text


def test_prediction_grid_tiles_are_read_from_the_bucket(store, coco_tiny):
    from cocodet.datasets.splits import SplitLoader
    from cocodet.models.prediction_grid import _stored_image
    from cocodet.storage import session

    session.configure({"endpoint_url": store})
    val = (
        SplitLoader(
            root=f"s3://{BUCKET}",
            train_images="train2017",
            train_ann="annotations/instances_train2017.json",
            val_images="val2017",
            val_ann="annotations/instances_val2017.json",
        )
        .load()
        .val
    )
    local = (
        SplitLoader(
            root=str(coco_tiny),
            train_images="val2017",
            train_ann="annotations/instances_val2017.json",
            val_images="val2017",
            val_ann="annotations/instances_val2017.json",
        )
        .load()
        .train
    )
    for k in range(3):
        assert val.paths[k].startswith(f"s3://{BUCKET}/val2017/")
        image, scale = _stored_image(val, k, 96, 10**9)
        assert image is not None and scale > 0, val.paths[k]  # not the "unreadable" tile
        assert np.array_equal(image, _stored_image(local, k, 96, 10**9)[0])


def test_preview_reads_the_bucket(store, tmp_path):
    s = run_in_process(
        ["mode=preview", *remote(store), "dataset.image_size=128", "preview.batches=1"], tmp_path / "preview"
    )
    assert s["mode"] == "preview" and len(s["pngs"]) == 1 and Path(s["pngs"][0]).stat().st_size > 10_000
    assert not (tmp_path / "preview" / "bad_samples.jsonl").exists()


def test_a_deleted_object_is_a_bad_sample_named_by_its_key(store, coco_tiny, tmp_path):
    upload_folder(store, coco_tiny, "coco-missing")
    gone = sorted(p.name for p in (coco_tiny / "train2017").iterdir())[5]
    s3_client(store).delete_object(Bucket="coco-missing", Key=f"train2017/{gone}")
    s = run_in_process(
        bench_args(remote(store, "coco-missing"), "loader.num_workers=2", "dataset.on_bad_sample=skip"),
        tmp_path / "skip",
    )
    records = [json.loads(line) for line in (tmp_path / "skip" / "bad_samples.jsonl").read_text().splitlines()]
    assert s["examples"] == 80 and records
    assert {r["file"] for r in records} == {f"s3://coco-missing/train2017/{gone}"}
    assert all("no such object (404 on GetObject)" in r["reason"] for r in records)
    from cocodet.errors import BadSampleError

    with pytest.raises(BadSampleError, match=f"s3://coco-missing/train2017/{gone}.*404"):
        run_in_process(bench_args(remote(store, "coco-missing"), "loader.num_workers=0"), tmp_path / "raise")


def test_a_store_that_does_not_answer_ends_the_run_within_the_timeout(tmp_path, monkeypatch):
    from cocodet.storage.errors import StoreDown

    for name, value in DUMMY_KEYS.items():
        monkeypatch.setenv(name, value)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts connections (the kernel does), never answers
    held = []
    threading.Thread(target=lambda: [held.append(silent.accept()) for _ in range(64)], daemon=True).start()
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(
        StoreDown,
        match=r"failed ListObjectsV2 for [3-9] s \(\d+ retries; last: .* did not answer "
        r"ListObjectsV2 within dataset.remote.timeout_s=1.5 s",
    ):
        run_in_process(
            [
                "mode=plan",
                *remote(endpoint),
                "dataset.remote.timeout_s=1.5",
                "dataset.remote.retries=1",
                "dataset.remote.give_up_s=3",
            ],
            tmp_path / "plan",
        )
    assert time.monotonic() - started < 12
    silent.close()


class CuttingProxy:
    """A TCP proxy to ``endpoint`` that cuts the responses to the first ``cuts`` requests whose
    line starts with ``prefix`` after 2,000 bytes and closes the connection: a store (or a load
    balancer) restarted in the middle of a body."""

    def __init__(self, endpoint: str, prefix: bytes, cuts: int):
        self.upstream = ("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
        self.prefix, self.cuts = prefix, cuts
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            cut = threading.Event()
            threading.Thread(target=self._requests, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, cut), daemon=True).start()

    def _requests(self, client, upstream, cut) -> None:
        while data := client.recv(65536):
            if data.startswith(self.prefix) and self.cuts > 0:
                self.cuts -= 1
                cut.set()
            upstream.sendall(data)

    def _responses(self, upstream, client, cut) -> None:
        sent = 0
        while data := upstream.recv(65536):
            if cut.is_set():
                client.sendall(data[: max(0, 2000 - sent)])
                sent += len(data)
                if sent >= 2000:
                    break
            else:
                client.sendall(data)
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)  # the FIN now: the other thread still holds the socket
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_a_response_cut_short_is_retried(store, coco_tiny, monkeypatch):
    """CI met it as a store restarted mid-epoch: aiohttp's ClientPayloadError ("received 3677 of
    249283 bytes") ended the run instead of costing a retry."""
    from cocodet.storage import session
    from cocodet.storage import store as storage

    for name, value in DUMMY_KEYS.items():
        monkeypatch.setenv(name, value)
    name = sorted(p.name for p in (coco_tiny / "train2017").iterdir())[3]
    proxy = CuttingProxy(store, f"GET /{BUCKET}/train2017/{name}".encode(), cuts=2)
    try:
        session.configure({"endpoint_url": proxy.endpoint}, timeout_s=10, retries=3, give_up_s=5)
        before = session.counts().get("retries", 0)
        data = storage.get_object(f"s3://{BUCKET}/train2017/{name}")
        assert data == (coco_tiny / "train2017" / name).read_bytes()
        assert proxy.cuts == 0 and session.counts()["retries"] - before == 2
    finally:
        proxy.close()
        session.configure({"endpoint_url": store})


def test_a_credential_override_is_refused_before_hydra_writes_it(tmp_path):
    secret = "cocodet-OVERRIDE-secret-7c1e"
    for override in (
        f"dataset.storage_options.secret={secret}",
        f"+dataset.storage_options.key={secret}",
        f"hydra.job.env_set.AWS_SECRET_ACCESS_KEY={secret}",
        f"dataset.root=s3://user:{secret}@host/bucket",
    ):
        proc, _ = run_train(["mode=plan", override], tmp_path / "run", check=False)
        assert proc.returncode == 2, override
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "environment" in lines[0], proc.stderr
        assert secret not in proc.stderr + proc.stdout
        assert not (tmp_path / "run").exists()  # Hydra never started: no .hydra/overrides.yaml


def test_a_credential_in_a_config_file_is_refused(tmp_path):
    from cocodet.errors import ConfigError

    with pytest.raises(ConfigError, match="dataset.storage_options.client_kwargs.aws_secret_access_key: a credential"):
        run_in_process(["mode=plan", "+dataset.storage_options.client_kwargs.aws_secret_access_key=x"], tmp_path / "r")


@pytest.fixture(scope="module")
def guarded_store(coco_tiny):
    """A moto_server that checks keys: one user, allowed to list the bucket and read only its
    annotations (so its images are refused, as under a policy or an expired token)."""
    import boto3

    with moto_server(auth_after=3) as endpoint:  # the admin's user, policy and key; then every request is checked
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="admin")
        iam.put_user_policy(
            UserName="admin",
            PolicyName="all",
            PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
            ),
        )
        admin = iam.create_access_key(UserName="admin")["AccessKey"]
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=admin["AccessKeyId"],
            aws_secret_access_key=admin["SecretAccessKey"],
        )
        iam.create_user(UserName="reader")
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket", "s3:GetObject"],
                    "Resource": ["arn:aws:s3:::coco-auth", "arn:aws:s3:::coco-auth/annotations/*"],
                }
            ],
        }
        iam.put_user_policy(UserName="reader", PolicyName="annotations", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        upload_folder(endpoint, coco_tiny, "coco-auth", key=admin["AccessKeyId"], secret=admin["SecretAccessKey"])
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]


@pytest.mark.slow
def test_a_refusal_ends_the_run_in_one_line_even_with_skip(guarded_store, tmp_path):
    endpoint, key_id, secret = guarded_store
    cases = {
        "wrong_secret": ({"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": "not-" + secret}, "ListObjectsV2"),
        "images_refused": ({"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}, "GetObject"),
    }
    for name, (keys, operation) in cases.items():
        proc, _ = run_train(
            [
                "mode=bench",
                *remote(endpoint, "coco-auth"),
                "dataset.on_bad_sample=skip",
                "dataset.image_size=128",
                "bench.batches=4",
                "bench.decode_probe=0",
                "loader=explicit",
                "loader.num_workers=1",
            ],
            tmp_path / name,
            env=keys,
            check=False,
            timeout=300,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        assert (
            lines[-1].startswith("error: s3://coco-auth") and f"refused {operation} on bucket 'coco-auth'" in lines[-1]
        )
        assert "Traceback" not in proc.stderr and secret not in proc.stderr + proc.stdout, name
        assert not (tmp_path / name / "bad_samples.jsonl").exists()  # nothing was skipped as a bad sample


# A mid-epoch stop and resume on the bucket, with a distinctive secret in the environment: the
# local root's digest, every mode afterwards, and the secret in no file the runs leave.
SECRET = "cocodet-DISTINCT-secret-1f9b2d"
KEY_ID = "AKIACOCODETDISTINCT7"


def train_args(root_args: list[str], *extra: str) -> list[str]:
    return [
        *root_args,
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=2",
        "trainer.deterministic=true",
        "trainer.enable_progress_bar=false",
        "loader=explicit",
        "loader.num_workers=2",
        *extra,
    ]


CHECKPOINTS = "s3://run-ckpts/run"  # checkpoint.dir: in the same store, so the dataset's endpoint is its


@pytest.fixture(scope="module")
def resumed_run(store, coco_tiny, tmp_path_factory):
    """A run on the bucket with its checkpoints in another bucket, SIGKILLed at step 15 (a
    resume point every 5 steps), resumed from another, empty folder (another machine) with
    ``ckpt_path=last``; an incomplete upload planted in the checkpoint folder before the resume."""
    base = tmp_path_factory.mktemp("remote_train")
    keys = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, **ENV}
    client = s3_client(store)
    client.create_bucket(Bucket="run-ckpts")
    in_bucket = [f"checkpoint.dir={CHECKPOINTS}", "checkpoint.every_n_steps=5"]
    kill = [
        "+callbacks.signal_at._target_=signal_at_step.SignalAtStep",
        "+callbacks.signal_at.step=15",
        "+callbacks.signal_at.signal_name=SIGKILL",
    ]
    p1, _ = run_train(train_args(remote(store), *in_bucket, *kill), base / "run", env=keys, timeout=900, check=False)
    assert p1.returncode == -9, p1.stderr[-2000:]
    left = client.create_multipart_upload(Bucket="run-ckpts", Key="run/last.ckpt")["UploadId"]
    client.upload_part(Bucket="run-ckpts", Key="run/last.ckpt", UploadId=left, PartNumber=1, Body=b"x" * 1024)
    run_dir = base / "another_machine"
    p2, second = run_train(
        train_args(remote(store), *in_bucket, "loader.num_workers=1", "ckpt_path=last"), run_dir, env=keys, timeout=900
    )
    local = run_in_process(train_args(["dataset=coco", f"dataset.root={coco_tiny}"]), base / "local")
    return {
        "second": second,
        "local": local,
        "run_dir": run_dir,
        "base": base,
        "output": p1.stdout + p1.stderr + p2.stdout + p2.stderr,
        "resume_line": [line for line in p2.stderr.splitlines() if line.startswith("ckpt_path=last")],
    }


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_from_the_bucket_on_another_machine_with_the_local_roots_digest(
    resumed_run, store
):
    second, local = resumed_run["second"], resumed_run["local"]
    assert resumed_run["resume_line"] == [
        f"ckpt_path=last: resuming {CHECKPOINTS}/resume.ckpt; this run writes its logs to {resumed_run['run_dir']}"
    ]
    assert second["status"] == "completed" and second["steps"] == 20 and local["steps"] == 20
    assert second["stream_digest"] == local["stream_digest"]
    assert second["last_ckpt"] == f"{CHECKPOINTS}/last.ckpt" and second["best_ckpt"].startswith(f"{CHECKPOINTS}/best-")
    assert second["attempts"]["resumed_steps"] == [0, 15]  # the ledger's copy in the bucket, on a new machine
    client = s3_client(store)
    assert client.list_multipart_uploads(Bucket="run-ckpts").get("Uploads", []) == []  # the planted one aborted
    names = {o["Key"] for o in client.list_objects_v2(Bucket="run-ckpts")["Contents"]}
    assert {"run/last.ckpt", "run/resume.ckpt", "run/summary.json", "run/attempts.json"} <= names, names


@pytest.mark.slow
def test_eval_of_a_checkpoint_in_the_bucket_gives_the_local_copys_numbers(resumed_run, store, tmp_path):
    """As a user types it: the checkpoint's URL and its store's endpoint; the dataset, model and
    augment groups come from the checkpoint, read in one GET (the weights take the same bytes)."""
    ckpt = resumed_run["second"]["last_ckpt"]
    assert ckpt == f"{CHECKPOINTS}/last.ckpt"
    keys = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, **ENV}
    loader = ["loader=explicit", "loader.batch_size=8", "loader.num_workers=2", "trainer.limit_val_batches=2"]
    args = ["mode=eval", f"ckpt_path={ckpt}", f"checkpoint.storage_options.endpoint_url={store}", *loader]
    proc, s = run_train([*args, "trainer.enable_progress_bar=false"], tmp_path / "eval", env=keys)
    assert s["images"] == 16 and 0.0 <= s["map"] <= 1.0, s  # trainer.limit_val_batches=2 of 8
    assert f"as the run was trained (from {ckpt})" in proc.stdout + proc.stderr  # the groups it was trained with
    copy = tmp_path / "last.ckpt"  # the same checkpoint as a local file: the same 12 numbers
    copy.write_bytes(s3_client(store).get_object(Bucket="run-ckpts", Key="run/last.ckpt")["Body"].read())
    local = run_in_process(["mode=eval", *train_args(remote(store)), f"ckpt_path={copy}"], tmp_path / "local")
    assert {k: s[k] for k in STAT_NAMES} == {k: local[k] for k in STAT_NAMES}


@pytest.mark.slow
def test_predict_on_the_bucket(resumed_run, store, tmp_path):
    ckpt = resumed_run["second"]["last_ckpt"]
    extra = ["predict.source=s3://coco-tiny/val2017", "predict.draw=false"]
    s = run_in_process(["mode=predict", *train_args(remote(store)), f"ckpt_path={ckpt}", *extra], tmp_path / "predict")
    assert s["images"] == 80 and s["bad_images"] == 0, s
    names = [im["file_name"] for im in json.loads(Path(s["images_json"]).read_text())]
    assert all(n.startswith("s3://coco-tiny/val2017/") for n in names)


@pytest.mark.slow
def test_no_credential_in_anything_the_runs_leave(resumed_run, store):
    assert resumed_run["second"]["status"] == "completed"
    leaks = []
    for path in Path(resumed_run["base"]).rglob("*"):  # both runs' folders (the killed one's too)
        if path.is_file():
            data = path.read_bytes()
            leaks += [
                f"{path} holds {name}"
                for name, value in (("secret", SECRET), ("key id", KEY_ID))
                if value.encode() in data
            ]
    checked = {p.name for p in Path(resumed_run["run_dir"]).rglob("*") if p.is_file()}  # what was searched
    assert {
        "config.yaml",
        "hydra.yaml",
        "overrides.yaml",
        "summary.json",
        "train.log",
        "metrics.csv",
        "hparams.yaml",
        "attempts.json",
    } <= checked, checked
    assert any(n.startswith("events.out.tfevents") for n in checked)
    assert not leaks, leaks
    assert SECRET not in resumed_run["output"] and KEY_ID not in resumed_run["output"]
    bucket = s3_client(store)  # what the runs left beside their checkpoints
    listed = [o["Key"] for o in bucket.list_objects_v2(Bucket="run-ckpts")["Contents"]]
    assert {"run/last.ckpt", "run/summary.json", "run/attempts.json"} <= set(listed), listed
    for key in listed:
        data = bucket.get_object(Bucket="run-ckpts", Key=key)["Body"].read()
        leaks += [
            f"s3://run-ckpts/{key} holds {n}" for n, v in (("secret", SECRET), ("key id", KEY_ID)) if v.encode() in data
        ]
    assert not leaks, leaks
