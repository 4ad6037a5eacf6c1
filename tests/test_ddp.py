"""Multi-process and multi-node training on Lightning DDP (gloo on CPU), proven exactly-once:
real processes launched by Lightning, and two 'nodes' on localhost through its plain
environment variables."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NARROW_MODEL, REPO, run_train
from cocodet.loader.plan_record import BatchGeometry, LoaderRequest
from cocodet.loader.policy import plan_loader
from cocodet.models.detector import merge_rank_detections
from test_policy import host

DROPPED_IMAGES = 1  # 79 of coco_tiny's 80 per split: an odd count, so 2 ranks need one padded repeat


@pytest.fixture(scope="module")
def coco79(coco_tiny, tmp_path_factory) -> Path:
    """coco_tiny with 79 train and 79 val images (the image folders linked, annotations filtered)."""
    root = tmp_path_factory.mktemp("coco79")
    (root / "annotations").mkdir()
    for split in ("train2017", "val2017"):
        (root / split).symlink_to(coco_tiny / split)
        data = json.loads((coco_tiny / "annotations" / f"instances_{split}.json").read_text())
        keep = set(sorted(im["id"] for im in data["images"])[DROPPED_IMAGES:])
        data["images"] = [im for im in data["images"] if im["id"] in keep]
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] in keep]
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(data))
    return root


def args(root: Path, *extra: str) -> list[str]:
    return ["dataset=coco", f"dataset.root={root}", "dataset.image_size=64", "loader.batch_size=8", NARROW_MODEL,
            "trainer.max_epochs=1", "trainer.enable_progress_bar=false", *extra]


@pytest.fixture(scope="module")
def two_ranks(coco79, tmp_path_factory) -> dict[int, tuple]:
    """trainer=ddp_cpu (2 processes) at 0 and at 2 workers per rank: {workers: (process, summary)}."""
    base = tmp_path_factory.mktemp("ddp")
    runs = {}
    for w in (0, 2):
        tracked = ["logger=mlflow"] if w == 0 else []  # rank 0 alone talks to MLflow (design §16)
        proc, s = run_train(args(coco79, "trainer=ddp_cpu", "loader=explicit", f"loader.num_workers={w}", *tracked),
                            base / f"w{w}", timeout=900, env={"MLFLOW_TRACKING_URI": f"sqlite:///{base}/mlflow.db"})
        runs[w] = (proc, s, base / f"w{w}")
    yield runs
    shutil.rmtree(base, ignore_errors=True)  # a module's training runs leave checkpoints (about 0.2 GB each): gone when it ends


@pytest.mark.slow
def test_two_ranks_take_every_train_index_once_and_evaluate_each_val_image_once(two_ranks):
    proc, s, _ = two_ranks[0]
    ddp = s["ddp"]
    assert s["status"] == "completed" and ddp["world_size"] == 2
    # 79 images over 2 ranks: 40 each, the 80th a padded repeat of one index.
    assert ddp["train_images"] == 79 and ddp["train_unique"] == 79
    assert ddp["train_consumed"] == 80 and ddp["train_padded"] == 1
    assert s["steps"] == 5  # 40 per rank at batch 8
    assert ddp["val_images_evaluated"] == 79 and ddp["val_repeats_removed"] == 1
    assert len(ddp["stream_digests"]) == 2 and ddp["stream_digests"][0] != ddp["stream_digests"][1]


@pytest.mark.slow
def test_grouped_batches_end_the_epoch_on_both_ranks_each_image_once(coco79, tmp_path):
    """loader.group_aspect_ratio=3 under trainer=ddp_cpu: batches from one aspect-ratio bin, the
    epoch's batch list padded to an even count by repeating whole batches, so both ranks run the
    same steps (a rank with one step more would hang at the next collective) and every train
    image is taken; the repeats are exactly the padding batches' images."""
    import numpy as np
    from cocodet.coco.index import build_index
    from cocodet.loader.grouped_sampler import GroupedEpochSampler

    _, s = run_train(args(coco79, "trainer=ddp_cpu", "loader=explicit", "loader.num_workers=0", "augment=hflip",
                          "+model.detector.min_size=64", "+model.detector.max_size=96", "loader.group_aspect_ratio=3",
                          "trainer.limit_val_batches=1"), tmp_path / "run", timeout=900)
    index = build_index(coco79 / "train2017", coco79 / "annotations" / "instances_train2017.json",
                        keep_empty="reference")
    ranks = [GroupedEpochSampler(np.asarray(index.sizes), 8, 3, seed=0, rank=r, world_size=2) for r in (0, 1)]
    ddp = s["ddp"]
    assert s["status"] == "completed" and s["plan"]["group_aspect_ratio"] == 3
    assert s["steps"] == ranks[0].rank_batches == ranks[1].rank_batches
    assert ddp["train_images"] == len(index) and ddp["train_unique"] == len(index)
    assert ddp["train_consumed"] == len(ranks[0]) + len(ranks[1]) and ddp["train_padded"] == ddp["train_consumed"] - len(index)
    assert len(ddp["stream_digests"]) == 2


@pytest.mark.slow
def test_rank_zero_alone_writes_and_prints_the_summary(two_ranks):
    proc, s, run_dir = two_ranks[0]
    json_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(json_lines) == 1 and json_lines[0] == proc.stdout.strip().splitlines()[-1]
    assert json.loads((run_dir / "summary.json").read_text()) == s
    # Each rank logs its own plan, with the per-host and per-rank figures.
    out = proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"loader plan for rank {rank} (local rank {rank} of 2 on this host, node 0)" in out
        # The one rank reader (cocodet.ranks) answered as the trainer did, on both ranks.
        assert (f"rank reader (lightning): rank {rank} of 2, local rank {rank} of 2; trainer: rank {rank} of 2: "
                "they agree") in out
    assert s["ranks"] == {"launcher": "lightning", "global_rank": 0, "world_size": 2, "local_world_size": 2,
                          "agrees_with_trainer": True}
    assert "CPUs: host / per rank" in out and "/dev/shm: host free / rank budget" in out
    assert (run_dir / "train_ddp_process_1.log").is_file()
    # COCOeval ran once per validation, on rank 0.
    assert out.count("COCOeval (epoch 0, 79 images, 1 padded repeats removed") == 1
    # One MLflow run, rank 0's, its one validation logged once.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("cocodet").experiment_id])
    assert [r.info.run_id for r in runs] == [s["mlflow"]["run_id"]] and runs[0].info.status == "FINISHED"
    assert len(client.get_metric_history(runs[0].info.run_id, "val/map")) == 1


@pytest.mark.slow
def test_each_ranks_stream_is_the_same_at_0_and_2_workers(two_ranks):
    assert two_ranks[0][1]["ddp"]["stream_digests"] == two_ranks[2][1]["ddp"]["stream_digests"]
    assert two_ranks[2][1]["plan"]["num_workers"] == 2


@pytest.mark.slow
def test_two_rank_resume_continues_each_ranks_stream(coco79, two_ranks, tmp_path):
    """A 2-rank run resumed from its epoch-1 checkpoint for a second epoch: each rank's digest
    equals that of a 2-epoch run (the checkpoint carries every rank's digest)."""
    first = two_ranks[0][1]
    two_epochs = [*args(coco79, "trainer=ddp_cpu", "loader=explicit", "loader.num_workers=0"), "trainer.max_epochs=2"]
    _, straight = run_train(two_epochs, tmp_path / "straight", timeout=900)
    _, resumed = run_train([*two_epochs, f"ckpt_path={first['last_ckpt']}"], tmp_path / "resumed", timeout=900)
    assert resumed["steps"] == straight["steps"] == 10
    assert resumed["ddp"]["stream_digests"] == straight["ddp"]["stream_digests"]
    assert resumed["ddp"]["train_consumed"] == 80  # this run's own epoch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_localhost_through_lightnings_environment_variables(coco79, two_ranks, tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, str(REPO / "train.py"),
           *args(coco79, "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2")]
    nodes = [subprocess.Popen([*cmd, f"hydra.run.dir={tmp_path / f'node{n}'}"], cwd=REPO, env={**env, "NODE_RANK": str(n)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in (1, 0)]
    outs = [p.communicate(timeout=900)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[1][-3000:] + outs[0][-3000:]
    s = json.loads(outs[1].strip().splitlines()[-1])  # node 0 holds rank 0
    assert s["ddp"]["world_size"] == 2 and s["ddp"]["train_padded"] == 1 and s["ddp"]["val_images_evaluated"] == 79
    assert not (tmp_path / "node1" / "summary.json").exists()
    assert "loader plan for rank 1 (local rank 0 of 1 on this host, node 1)" in outs[0]
    # Two nodes of one process each are two ranks: the same streams as two ranks on one host.
    assert s["ddp"]["stream_digests"] == two_ranks[0][1]["ddp"]["stream_digests"]


def test_padded_repeats_are_merged_once_lowest_rank_first():
    rank0 = {1: [{"image_id": 1, "score": 0.9}], 3: []}
    rank1 = {2: [{"image_id": 2, "score": 0.5}], 1: [{"image_id": 1, "score": 0.1}]}
    merged, repeats = merge_rank_detections([rank0, rank1])
    assert sorted(merged) == [1, 2, 3] and repeats == 1 and merged[1] == [{"image_id": 1, "score": 0.9}]


def test_local_ranks_share_the_hosts_cpus_shm_and_memory():
    one = plan_loader(LoaderRequest("auto"), BatchGeometry(64, 10 << 20), host(), cuda=True)
    eight = plan_loader(LoaderRequest("auto"), BatchGeometry(64, 10 << 20), host(local_world_size=8, usable_cpus=1),
                        cuda=True)
    assert eight.local_ranks == 8 and eight.host_cpus == one.host_cpus
    assert eight.shm_budget_bytes == one.shm_budget_bytes // 8
    memory = next(c for c in eight.caps if c.name == "memory")
    assert "/ 8 local ranks" in memory.reason
    assert re.search(r"local ranks on this host\s+8\n", eight.table())


@pytest.mark.slow
def test_torchrun_launches_the_same_two_ranks(coco79, two_ranks, tmp_path):
    """torchrun starts the processes (Lightning's TorchElasticEnvironment); every rank is given
    the same run dir, and rank 0 prints the one summary."""
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(REPO / "train.py"),
                           *args(coco79, "trainer=ddp_cpu"), f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    s = json.loads(line)
    assert s["ddp"]["world_size"] == 2 and s["ddp"]["train_padded"] == 1
    assert s["ddp"]["stream_digests"] == two_ranks[0][1]["ddp"]["stream_digests"]
    assert "loader plan for rank 1 (local rank 1 of 2 on this host, node 0)" in proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (f"rank reader (torchelastic): rank {rank} of 2, local rank {rank} of 2; trainer: rank {rank} of 2: "
                "they agree") in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("env,label,ranks", [
    ({"SLURM_NTASKS": "6", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_NTASKS_PER_NODE": "2"},
     "loader plan for rank 5 (local rank 1 of 2 on this host, node 2)", 2),
    ({"TORCHELASTIC_RUN_ID": "r", "RANK": "3", "LOCAL_RANK": "3", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "4",
      "WORLD_SIZE": "4"},
     "loader plan for rank 3 (local rank 3 of 4 on this host, node 0)", 4),
])
def test_a_launchers_rank_variables_reach_the_plan(env, label, ranks, synthetic_root, tmp_path):
    from conftest import synthetic_overrides

    proc, s = run_train([*synthetic_overrides(synthetic_root), "mode=plan"], tmp_path / "plan", env=env)
    out = proc.stdout + proc.stderr
    assert label in out
    host_cpus, per_rank = map(int, re.search(r"CPUs: host / per rank\s+(\d+) / (\d+)", out).groups())
    assert per_rank == max(1, host_cpus // ranks) and re.search(rf"local ranks on this host\s+{ranks}\n", out)
    assert s is None and not (tmp_path / "plan" / "summary.json").exists()  # not rank 0: no summary
