"""Which rank am I, and how many ranks share this host: answered once, the way Lightning 2.6.6
will see it (design §7.3).

Lightning picks the first cluster environment that detects itself, in this order
(``AcceleratorConnector._choose_and_init_cluster_environment``): TorchElastic (torchrun),
SLURM, LSF, MPI, else its own ``LightningEnvironment``. Each reads its own variables; reading
them in another order, or mixing two launchers' variables, gives answers that disagree with
the trainer's (a torchrun inside a SLURM allocation has both sets). Kubeflow's PyTorchJob is
not detected by Lightning on its own and is left out here too.

With a trainer, the reader's answers are checked against the trainer's and a multi-process run
ends in order (``ranks_in_trainer.py``).

Bottom layer: imports nothing of cocodet, and torch only to count the GPUs of ``devices=auto`` on a
CUDA host (``mode=plan`` on a CPU never imports it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run. ``launcher``: the environment Lightning would choose
    ("torchelastic", "slurm", "lsf", "mpi" or "lightning")."""

    global_rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    launcher: str

    def label(self) -> str:
        """' for rank R (local rank L of N on this host, node K)'; '' for a one-process run."""
        if self.world_size <= 1 and self.local_world_size <= 1 and self.global_rank == 0:
            return ""
        return (
            f" for rank {self.global_rank} (local rank {self.local_rank} of {self.local_world_size} on this host, "
            f"node {self.node_rank})"
        )


def read_ranks(devices: int = 1, num_nodes: int = 1, environ: Mapping[str, str] | None = None) -> Ranks:
    """The ranks from the launcher's variables. ``devices`` and ``num_nodes`` are the trainer's
    (processes per node and nodes): what Lightning's own launcher starts, and what its
    ``LightningEnvironment`` derives the world from."""
    env = os.environ if environ is None else environ
    devices, num_nodes = max(1, int(devices)), max(1, int(num_nodes))
    for detect, read in _ENVIRONMENTS:
        if detect(env):
            return read(env, devices, num_nodes)
    return _lightning(env, devices, num_nodes)


def processes_per_host(devices, cuda: bool) -> int:
    """Processes a run starts on this host (they share its CPUs and /dev/shm), from Lightning's
    ``devices``: a count, a list of device ids, or -1/"auto" (every GPU, else one process)."""
    if isinstance(devices, bool):
        return 1
    if isinstance(devices, int) and devices > 0:
        return devices
    if str(devices) in ("-1", "auto"):
        if cuda:
            import torch

            return max(1, torch.cuda.device_count())
        return 1
    if isinstance(devices, str) and devices.isdigit():
        return max(1, int(devices))
    try:
        return max(1, len(list(devices)))
    except TypeError:
        return 1


def trainer_ranks(trainer: Mapping, environ: Mapping[str, str] | None = None) -> tuple[Ranks, bool]:
    """:func:`read_ranks` for a trainer's own arguments (``devices``: a count, a list of device
    ids, or -1/"auto"; ``num_nodes``), and whether its accelerator uses CUDA."""
    cuda = uses_cuda(trainer.get("accelerator", "auto"))
    ranks = read_ranks(processes_per_host(trainer.get("devices", 1), cuda), int(trainer.get("num_nodes") or 1), environ)
    return ranks, cuda


def uses_cuda(accelerator: str) -> bool:
    """Whether batches go to a CUDA device: a GPU accelerator (or auto) on a host that has one.
    A CPU run answers without importing torch (``mode=plan`` stays fast)."""
    if str(accelerator) not in ("gpu", "cuda", "auto"):
        return False
    import torch

    return torch.cuda.is_available()


def _int(env: Mapping[str, str], key: str, default: int = 0) -> int:
    value = str(env.get(key, "")).strip()
    return int(value) if value.lstrip("-").isdigit() else default


def _torchelastic(env, devices, num_nodes) -> Ranks:
    # torch.distributed.is_torchelastic_launched(): TORCHELASTIC_RUN_ID is set.
    world = _int(env, "WORLD_SIZE", devices * num_nodes)
    return Ranks(
        _int(env, "RANK"),
        _int(env, "LOCAL_RANK"),
        _int(env, "GROUP_RANK"),
        world,
        _int(env, "LOCAL_WORLD_SIZE", devices),
        "torchelastic",
    )


def _slurm_detected(env) -> bool:
    # lightning's _is_srun_used: SLURM_NTASKS set, and not an interactive allocation by job name.
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def _slurm(env, devices, num_nodes) -> Ranks:
    world = _int(env, "SLURM_NTASKS", 1)
    # SLURM_NTASKS_PER_NODE may read "2", "2(x3)" or "2,1": this node's count is the first.
    per_node = re.match(r"\d+", str(env.get("SLURM_NTASKS_PER_NODE", "")))
    nodes = _int(env, "SLURM_NNODES", 1) or 1
    local_world = int(per_node.group()) if per_node else max(1, world // nodes)
    return Ranks(
        _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID"), world, local_world, "slurm"
    )


_LSF_VARIABLES = {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"}


def _lsf(env, devices, num_nodes) -> Ranks:
    # The rank file lists one host per rank after the launch node's line (lightning's _read_hosts).
    try:
        with open(env["LSB_DJOB_RANKFILE"]) as f:
            hosts = [ln.strip() for ln in f if ln.strip()][1:]
    except OSError:
        hosts = []
    here = socket.gethostname()
    order = list(dict.fromkeys(hosts))
    node = order.index(here) if here in order else 0
    local_world = hosts.count(here) or devices
    return Ranks(
        _int(env, "JSM_NAMESPACE_RANK"),
        _int(env, "JSM_NAMESPACE_LOCAL_RANK"),
        node,
        _int(env, "JSM_NAMESPACE_SIZE", 1),
        local_world,
        "lsf",
    )


def _mpi_detected(env) -> bool:
    # Lightning asks mpi4py for COMM_WORLD's size (> 1); importing it would initialise MPI, so
    # the launcher's own size variables stand in, and only where mpi4py is installed.
    size = _int(env, "OMPI_COMM_WORLD_SIZE", _int(env, "PMI_SIZE", 0))
    return size > 1 and importlib.util.find_spec("mpi4py") is not None


def _mpi(env, devices, num_nodes) -> Ranks:
    world = _int(env, "OMPI_COMM_WORLD_SIZE", _int(env, "PMI_SIZE", 1))
    rank = _int(env, "OMPI_COMM_WORLD_RANK", _int(env, "PMI_RANK"))
    local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", _int(env, "MPI_LOCALRANKID"))
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", _int(env, "MPI_LOCALNRANKS", devices))
    return Ranks(
        rank, local, _int(env, "OMPI_COMM_WORLD_NODE_RANK", rank // max(1, local_world)), world, local_world, "mpi"
    )


def _lightning(env, devices, num_nodes) -> Ranks:
    # Lightning's own launcher: the parent has no variables (it becomes local rank 0 of node 0);
    # the ranks it starts get LOCAL_RANK and NODE_RANK; the global rank is node_rank * devices
    # + local_rank and the world num_nodes * devices (DDPStrategy.set_world_ranks).
    local = _int(env, "LOCAL_RANK")
    node = _int(env, "NODE_RANK", _int(env, "GROUP_RANK"))
    return Ranks(node * devices + local, local, node, devices * num_nodes, devices, "lightning")


_ENVIRONMENTS = (
    (lambda env: "TORCHELASTIC_RUN_ID" in env, _torchelastic),
    (_slurm_detected, _slurm),
    (lambda env: _LSF_VARIABLES <= set(env), _lsf),
    (_mpi_detected, _mpi),
)


@dataclass(frozen=True)
class ElasticLaunch:
    """What torchrun tells its workers beyond their ranks (design §7.4). ``run_id``: its
    ``--rdzv-id`` (None outside torchrun, or for its default, "none", which names no run);
    ``max_restarts``: its ``--max-restarts`` (0 outside torchrun); ``shared_store``: the agents
    share one store across restarts (``TORCHELASTIC_USE_AGENT_STORE``; not with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` on the agents)."""

    run_id: str | None
    max_restarts: int
    shared_store: bool


def elastic_launch(environ: Mapping[str, str] | None = None) -> ElasticLaunch:
    env = os.environ if environ is None else environ
    run_id = str(env.get("TORCHELASTIC_RUN_ID", "")).strip()
    return ElasticLaunch(
        None if run_id.lower() in ("", "none") else run_id,
        max(0, _int(env, "TORCHELASTIC_MAX_RESTARTS")),
        env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def leave_the_agents_store(port: int) -> None:
    """From now on this process's ``init_process_group`` (env://) uses a store on ``port``
    served by rank 0, not torchrun's agents' one (elastic/meeting.py says why)."""
    os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")
