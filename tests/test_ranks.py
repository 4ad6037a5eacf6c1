"""One rank reader (cocodet.ranks): each launcher's variables, read as Lightning 2.6.6 reads them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

from cocodet.ranks import Ranks, read_ranks

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_NTASKS": "6",
    "SLURM_PROCID": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "2",
    "SLURM_NNODES": "3",
    "SLURM_NTASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_NAME": "train",
}


@pytest.mark.parametrize(
    "case,env,devices,nodes,expect",
    [
        ("no launcher: a one-process run", {}, 1, 1, Ranks(0, 0, 0, 1, 1, "lightning")),
        ("Lightning's launcher, the parent (ddp_cpu)", {}, 2, 1, Ranks(0, 0, 0, 2, 2, "lightning")),
        (
            "Lightning's launcher, the rank it started",
            {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"},
            2,
            1,
            Ranks(1, 1, 0, 2, 2, "lightning"),
        ),
        (
            "Lightning's launcher on node 1 of 2",
            {"LOCAL_RANK": "1", "NODE_RANK": "1"},
            2,
            2,
            Ranks(3, 1, 1, 4, 2, "lightning"),
        ),
        ("Lightning's launcher, node from GROUP_RANK", {"GROUP_RANK": "1"}, 4, 2, Ranks(4, 0, 1, 8, 4, "lightning")),
        ("torchrun", TORCHRUN, 1, 1, Ranks(5, 1, 1, 8, 4, "torchelastic")),
        ("SLURM (srun)", SLURM, 1, 1, Ranks(4, 0, 2, 6, 2, "slurm")),
        (
            "SLURM, ntasks per node as a list",
            {**SLURM, "SLURM_NTASKS_PER_NODE": "3,2,1"},
            1,
            1,
            Ranks(4, 0, 2, 6, 3, "slurm"),
        ),
        (
            "SLURM without ntasks per node",
            {k: v for k, v in SLURM.items() if k != "SLURM_NTASKS_PER_NODE"},
            1,
            1,
            Ranks(4, 0, 2, 6, 2, "slurm"),
        ),
        (
            "an interactive SLURM allocation is not SLURM's launch",
            {**SLURM, "SLURM_JOB_NAME": "interactive"},
            2,
            1,
            Ranks(0, 0, 0, 2, 2, "lightning"),
        ),
        (
            "SLURM variables without SLURM_NTASKS",
            {k: v for k, v in SLURM.items() if k != "SLURM_NTASKS"},
            1,
            1,
            Ranks(0, 0, 0, 1, 1, "lightning"),
        ),
        (
            "torchrun inside a SLURM allocation: torchrun wins",
            {**SLURM, **TORCHRUN},
            1,
            1,
            Ranks(5, 1, 1, 8, 4, "torchelastic"),
        ),
        (
            "torchrun variables without TORCHELASTIC_RUN_ID are Lightning's",
            {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"},
            4,
            2,
            Ranks(5, 1, 1, 8, 4, "lightning"),
        ),
    ],
)
def test_each_launchers_variables(case, env, devices, nodes, expect):
    assert read_ranks(devices, nodes, env) == expect, case


def test_lsf_reads_jsrun_variables_and_the_rank_file(tmp_path):
    import socket

    here = socket.gethostname()
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("\n".join(["launch", "other", "other", here, here]) + "\n")
    env = {
        "LSB_JOBID": "7",
        "LSB_DJOB_RANKFILE": str(rankfile),
        "JSM_NAMESPACE_LOCAL_RANK": "1",
        "JSM_NAMESPACE_SIZE": "4",
        "JSM_NAMESPACE_RANK": "3",
    }
    assert read_ranks(1, 1, env) == Ranks(3, 1, 1, 4, 2, "lsf")
    assert read_ranks(1, 1, {**env, **SLURM}).launcher == "slurm"  # SLURM comes first in Lightning's order


def test_mpi_needs_mpi4py_as_lightning_does(monkeypatch):
    import importlib.util

    env = {
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    assert read_ranks(1, 1, env).launcher == "lightning"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "mpi4py" else real(name, *a))
    assert read_ranks(1, 1, env) == Ranks(2, 0, 1, 4, 2, "mpi")


def test_lightning_chooses_the_same_environment():
    """Lightning's own choice (its AcceleratorConnector, CPU, no process started) names the
    environment the reader names, and its ranks equal the reader's, for each launcher."""
    import os

    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    cases = {"torchelastic": TORCHRUN, "slurm": {**SLURM, "SLURM_NTASKS_PER_NODE": "2"}, "lightning": {}}
    for launcher, env in cases.items():
        saved = dict(os.environ)
        try:
            for k in [
                k
                for k in os.environ
                if k.startswith(("SLURM_", "TORCHELASTIC", "LSB_", "JSM_", "OMPI_"))
                or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
            ]:
                del os.environ[k]
            os.environ.update(env)
            cluster = _AcceleratorConnector(accelerator="cpu", devices=1)._choose_and_init_cluster_environment()
            ours = read_ranks(1, 1)
            theirs = (cluster.global_rank(), cluster.local_rank(), cluster.world_size())
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert ours.launcher == launcher
        assert type(cluster).__name__.lower().startswith(launcher), (launcher, type(cluster).__name__)
        if launcher != "lightning":  # Lightning's own environment learns its ranks from the strategy, later
            assert theirs == (ours.global_rank, ours.local_rank, ours.world_size)


RANK_VARIABLE = re.compile(
    r"^(RANK|LOCAL_RANK|NODE_RANK|GROUP_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|SLURM_\w+|"
    r"OMPI_COMM_WORLD_\w+|PMI_RANK|PMI_SIZE|LSB_\w+|JSM_NAMESPACE_\w+|TORCHELASTIC_\w+)$"
)


def rank_variable_readers(root: Path) -> dict[str, list[str]]:
    """Every module under ``root`` that names a launcher's rank variable (a string constant)."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RANK_VARIABLE.match(node.value):
                found.setdefault(str(path.relative_to(root)), []).append(node.value)
    return found


def test_src_reads_launcher_variables_in_one_place(tmp_path):
    """Ranks are read once, by cocodet/ranks.py, for every launcher; others are handed the result
    (the store's User-Agent gets its rank through storage.configure)."""
    assert list(rank_variable_readers(REPO / "src")) == ["cocodet/ranks.py"]
    planted = tmp_path / "cocodet"
    planted.mkdir()
    (planted / "session.py").write_text('import os\nrank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")\n')
    assert rank_variable_readers(tmp_path) == {"cocodet/session.py": ["RANK", "LOCAL_RANK"]}
