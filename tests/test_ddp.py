"""Multi-process and multi-node training on Lightning DDP (gloo on CPU), proven exactly-once:
real processes launched by Lightning, and two 'nodes' on localhost through its plain
environment variables."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import NARROW_MODEL, REPO, run_train
from moto_store import DUMMY_KEYS, moto_server, s3_client
from test_policy import host

from cocodet.loader.plan.policy import plan_loader
from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
from cocodet.models.validation import merge_rank_detections

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
    return [
        "dataset=coco",
        f"dataset.root={root}",
        "dataset.image_size=64",
        "loader.batch_size=8",
        NARROW_MODEL,
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def two_ranks(coco79, tmp_path_factory) -> dict[int, tuple]:
    """trainer=ddp_cpu (2 processes) at 0 and at 2 workers per rank: {workers: (process, summary)}."""
    base = tmp_path_factory.mktemp("ddp")
    runs = {}
    for w in (0, 2):
        tracked = ["logger=mlflow"] if w == 0 else []  # rank 0 alone talks to MLflow (design §16)
        proc, s = run_train(
            args(coco79, "trainer=ddp_cpu", "loader=explicit", f"loader.num_workers={w}", *tracked),
            base / f"w{w}",
            timeout=900,
            env={"MLFLOW_TRACKING_URI": f"sqlite:///{base}/mlflow.db"},
        )
        runs[w] = (proc, s, base / f"w{w}")
    yield runs
    shutil.rmtree(
        base, ignore_errors=True
    )  # a module's training runs leave checkpoints (about 0.2 GB each): gone when it ends


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

    from cocodet.datasets.index import build_index
    from cocodet.loader.grouped_sampler import GroupedEpochSampler

    _, s = run_train(
        args(
            coco79,
            "trainer=ddp_cpu",
            "loader=explicit",
            "loader.num_workers=0",
            "augment=hflip",
            "+model.detector.min_size=64",
            "+model.detector.max_size=96",
            "loader.group_aspect_ratio=3",
            "trainer.limit_val_batches=1",
        ),
        tmp_path / "run",
        timeout=900,
    )
    index = build_index(
        coco79 / "train2017", coco79 / "annotations" / "instances_train2017.json", keep_empty="reference"
    )
    ranks = [GroupedEpochSampler(np.asarray(index.sizes), 8, 3, seed=0, rank=r, world_size=2) for r in (0, 1)]
    ddp = s["ddp"]
    assert s["status"] == "completed" and s["plan"]["group_aspect_ratio"] == 3
    assert s["steps"] == ranks[0].rank_batches == ranks[1].rank_batches
    assert ddp["train_images"] == len(index) and ddp["train_unique"] == len(index)
    assert ddp["train_consumed"] == len(ranks[0]) + len(ranks[1]) and ddp["train_padded"] == ddp[
        "train_consumed"
    ] - len(index)
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
        assert (
            f"rank reader (lightning): rank {rank} of 2, local rank {rank} of 2; trainer: rank {rank} of 2: they agree"
        ) in out
    assert s["ranks"] == {
        "launcher": "lightning",
        "global_rank": 0,
        "world_size": 2,
        "local_world_size": 2,
        "agrees_with_trainer": True,
    }
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
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        *args(coco79, "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"),
    ]
    nodes = [
        subprocess.Popen(
            [*cmd, f"hydra.run.dir={tmp_path / f'node{n}'}"],
            cwd=REPO,
            env={**env, "NODE_RANK": str(n)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in (1, 0)
    ]
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
    eight = plan_loader(
        LoaderRequest("auto"), BatchGeometry(64, 10 << 20), host(local_world_size=8, usable_cpus=1), cuda=True
    )
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
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(REPO / "train.py"),
            *args(coco79, "trainer=ddp_cpu"),
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    s = json.loads(line)
    assert s["ddp"]["world_size"] == 2 and s["ddp"]["train_padded"] == 1
    assert s["ddp"]["stream_digests"] == two_ranks[0][1]["ddp"]["stream_digests"]
    assert "loader plan for rank 1 (local rank 1 of 2 on this host, node 0)" in proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (
            f"rank reader (torchelastic): rank {rank} of 2, local rank {rank} of 2; trainer: rank {rank} of 2: "
            "they agree"
        ) in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "env,label,ranks",
    [
        (
            {
                "SLURM_NTASKS": "6",
                "SLURM_PROCID": "5",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "2",
                "SLURM_NTASKS_PER_NODE": "2",
            },
            "loader plan for rank 5 (local rank 1 of 2 on this host, node 2)",
            2,
        ),
        (
            {
                "TORCHELASTIC_RUN_ID": "r",
                "RANK": "3",
                "LOCAL_RANK": "3",
                "GROUP_RANK": "0",
                "LOCAL_WORLD_SIZE": "4",
                "WORLD_SIZE": "4",
            },
            "loader plan for rank 3 (local rank 3 of 4 on this host, node 0)",
            4,
        ),
    ],
)
def test_a_launchers_rank_variables_reach_the_plan(env, label, ranks, synthetic_root, tmp_path):
    from conftest import synthetic_overrides

    proc, s = run_train([*synthetic_overrides(synthetic_root), "mode=plan"], tmp_path / "plan", env=env)
    out = proc.stdout + proc.stderr
    assert label in out
    host_cpus, per_rank = map(int, re.search(r"CPUs: host / per rank\s+(\d+) / (\d+)", out).groups())
    assert per_rank == max(1, host_cpus // ranks) and re.search(
        rf"local ranks on this host\s+{ranks} \(ranks read from ", out
    )
    assert s is None and not (tmp_path / "plan" / "summary.json").exists()  # not rank 0: no summary


# Two torchrun agents on this host act as two nodes (deploy/k8s/ runs the same flags on each pod;
# tests/test_k8s_multinode.py holds the manifests to them). On one host both agents match the
# rendezvous endpoint, so each says whether it hosts the rendezvous store (is_host), as pod 0's
# DNS name decides on a cluster.
TORCHRUN_FLAGS = ["--nnodes=2", "--nproc-per-node=1", "--max-restarts=1", "--rdzv-backend=c10d"]
EVERY_N_STEPS = 2  # resume points at steps 2 and 4 of the 5-step epoch


def node_overrides(root: Path, *extra: str) -> list[str]:
    """two_ranks' run (0 workers) as two nodes of one process each."""
    return args(
        root,
        "trainer=ddp_cpu",
        "trainer.devices=1",
        "trainer.num_nodes=2",
        "loader=explicit",
        "loader.num_workers=0",
        f"checkpoint.every_n_steps={EVERY_N_STEPS}",
        *extra,
    )


def start_agent(
    node: int, port: int, run_id: str, overrides: list[str], cwd: Path, env: dict | None = None
) -> subprocess.Popen:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        *TORCHRUN_FLAGS,
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=is_host={str(node == 0).lower()}",
        str(REPO / "train.py"),
        *overrides,
    ]
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
        "COCODET_TEST_NODE": str(node),
        **(env or {}),
    }  # OMP: 2 ranks, 2 cores
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_once(step: int, marker: Path, when: str = "end", agent: bool = False) -> list[str]:
    """Node 1's trainer (and its workers; ``agent``: its torchrun agent too) SIGKILLed at ``step``, once."""
    return [
        "+callbacks.kill._target_=signal_at_step.KillNodeOnceAtStep",
        f"+callbacks.kill.step={step}",
        "+callbacks.kill.node=1",
        f"+callbacks.kill.marker={marker}",
        f"+callbacks.kill.when={when}",
        f"+callbacks.kill.agent={agent}",
    ]


def summary_of(out: str) -> dict | None:
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def the_summary(outs: list[str]) -> dict:
    """The one summary, printed by whichever agent's worker became rank 0 (the rendezvous decides)."""
    [s] = [s for s in map(summary_of, outs) if s is not None]
    return s


@pytest.mark.slow
@pytest.mark.parametrize(
    "step,when,workers,redone,bucket",
    [
        (2, "end", 0, 0, True),  # just after the resume point of step 2 was written (to a bucket folder)
        (3, "start", 2, 1, False),  # mid-step, before the resume point of step 4, its loader workers killed with it
    ],
    ids=["after_a_resume_point_in_a_bucket", "mid_step_with_workers"],
)
def test_a_node_lost_mid_epoch_resumes_by_itself_and_keeps_the_stream(
    coco79, two_ranks, tmp_path, step, when, workers, redone, bucket
):
    """torchrun --max-restarts restarts the group; the new attempt meets on a store of its own
    (the agents' one holds the dead attempt's keys), rank 0 picks the newest resume point (in
    a bucket folder: ``checkpoint.dir=s3://...``), and the run ends with the Lightning launcher's
    streams, its records in one folder each. (A node lost at the end of step 3, before the resume
    point of step 4, is the replaced agent's test.)"""
    with ExitStack() as stack:
        port, overrides = (
            free_port(),
            node_overrides(coco79, f"loader.num_workers={workers}", *kill_once(step, tmp_path / "k", when)),
        )
        env, checkpoints = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}, None
        if redone:
            overrides.append("logger=mlflow")
        if bucket:
            endpoint, checkpoints = stack.enter_context(moto_server()), "s3://ckpts/lost-node"
            s3_client(endpoint).create_bucket(Bucket="ckpts")
            overrides += [f"checkpoint.dir={checkpoints}", f"checkpoint.storage_options.endpoint_url={endpoint}"]
            env.update(DUMMY_KEYS)
        agents = [start_agent(n, port, "lost-node", overrides, tmp_path, env=env) for n in (0, 1)]
        outs = [a.communicate(timeout=600)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    s = assert_one_resumed_run(outs, tmp_path / "outputs" / "torchrun" / "lost-node", two_ranks, redone, checkpoints)
    if "logger=mlflow" in overrides:  # the restarted attempt continued the MLflow run the first one began
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name("cocodet").experiment_id])
        assert [r.info.run_id for r in runs] == [s["mlflow"]["run_id"]] and runs[0].info.status == "FINISHED"


def assert_one_resumed_run(
    outs: list[str], run_dir: Path, two_ranks: dict, redone: int, checkpoints: str | None = None
) -> dict:
    """The run resumed once at step 2 ended as the Lightning launcher's, its records in one folder
    (``checkpoints``: the bucket folder it resumed from; None: the run folder's)."""
    s = the_summary(outs)  # run_dir: the rendezvous id's folder
    assert json.loads((run_dir / "summary.json").read_text()) == s
    assert s["status"] == "completed" and s["steps"] == 5
    assert s["attempts"] == {"count": 2, "restarts": 1, "steps_redone": redone, "resumed_steps": [0, 2]}
    assert s["ddp"]["stream_digests"] == two_ranks[0][1]["ddp"]["stream_digests"]
    where = re.escape(checkpoints) if checkpoints else rf"\S+/outputs/torchrun/{run_dir.name}/checkpoints"
    assert re.search(rf"ckpt_path=last_if_any: resuming {where}/resume.ckpt", "".join(outs))
    if checkpoints:
        assert s["last_ckpt"] == f"{checkpoints}/last.ckpt" and not (run_dir / "checkpoints").exists()
    for rank in (0, 1):  # each node's plan says where its ranks came from
        assert re.search(
            rf"local ranks on this host +1 \(ranks read from torchelastic \(rank {rank} of 2, node {rank}\)\)",
            "".join(outs),
        )
    assert [p.name for p in (run_dir / "csv").iterdir()] == ["version_0"]  # one run's records, not one per attempt
    assert [p.name for p in (run_dir / "tensorboard").iterdir()] == ["version_0"]
    return s


@pytest.mark.slow
def test_a_lost_agent_replaced_by_a_new_one_resumes_the_run(coco79, two_ranks, tmp_path):
    """What a recreated pod does: node 1's whole agent is SIGKILLed (nothing there restarts
    anything) and a new agent is started in its place with the same command."""
    port, overrides = free_port(), node_overrides(coco79, *kill_once(3, tmp_path / "k", agent=True))
    # Each round its own store: what an agent joining survivors needs (elastic/meeting.py)
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    node0, lost = (start_agent(n, port, "replaced", overrides, tmp_path, env) for n in (0, 1))
    lost.communicate(timeout=600)
    assert lost.returncode == -signal.SIGKILL
    new = start_agent(1, port, "replaced", overrides, tmp_path, env)
    outs = [node0.communicate(timeout=600)[0], new.communicate(timeout=600)[0]]
    assert [node0.returncode, new.returncode] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert_one_resumed_run(outs, tmp_path / "outputs" / "torchrun" / "replaced", two_ranks, redone=1)


HEARD = {1: 2, 0: 3}  # node: the train batch (of the epoch's 5) in which its rank hears SIGTERM


def records(path: Path, node: int) -> list[dict]:
    file = path.with_name(f"{path.name}.node{node}")
    return [json.loads(line) for line in file.read_text().splitlines()] if file.is_file() else []


@pytest.mark.slow
def test_sigterm_to_every_node_still_ends_preempted_with_a_resume_point(coco79, tmp_path):
    """Each rank notes the signal; they agree at a batch end (models/preemption.py): Lightning's
    own handler broadcast from inside the handler, and ranks signalled apart hung. Here they
    are signalled in different batches for certain, each while it waits for its signal (a test
    callback): node 1's rank at the end of batch 2, after that batch's collectives; node 0's at
    the start of batch 3, signalled only once it has reported that later batch. The run stops at
    the end of batch 3, the first batch end after both heard it, and each rank's own record says
    in which batch it heard it."""
    port, record = free_port(), tmp_path / "record"
    overrides = node_overrides(
        coco79,
        "checkpoint.every_n_steps=0",
        "+callbacks.record._target_=signal_at_step.SigtermRecord",
        f"+callbacks.record.path={record}",
        f"+callbacks.record.hold={{node1:[end,{HEARD[1]}],node0:[start,{HEARD[0]}]}}",
    )
    agents = [start_agent(n, port, "preempted", overrides, tmp_path) for n in (0, 1)]
    deadline = time.monotonic() + 300
    for node in (1, 0):  # a cluster's preemption: every pod, each told at its own moment
        while (
            not any("holding" in r for r in records(record, node))
            and time.monotonic() < deadline
            and all(a.poll() is None for a in agents)
        ):
            time.sleep(0.05)
        assert {"holding": HEARD[node], "hook": "end" if node else "start"} in records(record, node), (
            records(record, 0),
            records(record, 1),
        )
        agents[node].send_signal(signal.SIGTERM)
    outs = [a.communicate(timeout=300)[0] for a in agents]
    summaries = [s for s in map(summary_of, outs) if s is not None]
    assert len(summaries) == 1, outs[0][-3000:] + outs[1][-3000:]
    s = summaries[0]
    assert s["status"] == "preempted", outs[0][-3000:]
    for node in (0, 1):
        rows = records(record, node)
        assert [r for r in rows if "heard" in r] == [{"heard": HEARD[node], "ended": False}], rows
        # both stopped at the end of batch 3, the first batch end after every rank had heard it
        assert [r for r in rows if "start" in r or "end" in r][-2:] == [{"start": 3}, {"end": 3}], rows
    assert s["last_ckpt"].endswith("checkpoints/resume.ckpt") and s["steps"] == 4
    assert s["attempts"] == {"count": 1, "restarts": 0, "steps_redone": 0, "resumed_steps": [0]}


def test_a_multi_node_launch_without_one_run_folder_is_refused_in_one_line(tmp_path):
    """torchrun's default rendezvous id ("none") names no run: two nodes would compose two
    ${now} folders, and a restart a third."""
    from test_elastic import TORCHRUN

    env = {**os.environ, **TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}  # node 1 of 2
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: this torchelastic launch (2 ranks on 2 nodes) has no run folder")
    assert "torchrun --rdzv-id=<run name>" in line and "hydra.run.dir=" in line
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.ckpt"))
