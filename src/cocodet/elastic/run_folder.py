"""The folder a run writes to, when no ``hydra.run.dir`` is given: one that every process of the
run composes alike.

Hydra's default, ``outputs/<date>/<time>``, is read by each process when it starts: two nodes, or
an attempt torchrun restarts, compose two folders, and a restarted attempt finds no checkpoint to
resume. Under torchrun with a rendezvous id (``--rdzv-id``; ``--standalone`` makes one up), the
default is ``outputs/torchrun/<id>``: what every agent of the run is given, restarts included.
A launch that would still write to folders of its own (several nodes, or torchrun restarts, with
no id and no ``hydra.run.dir``) is refused in one line (:func:`unshared_folder`).
"""

from __future__ import annotations

from typing import Mapping

from omegaconf import OmegaConf

from cocodet.ranks import Ranks, elastic_launch

RESOLVER = "cocodet_run_dir"  # conf/config.yaml: hydra.run.dir: ${cocodet_run_dir:<Hydra's usual default>}


def register() -> None:
    """Make ``${cocodet_run_dir:default}`` known to OmegaConf (before Hydra composes)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, default_run_dir)


def default_run_dir(default: str, environ: Mapping[str, str] | None = None) -> str:
    """``outputs/torchrun/<rendezvous id>`` under torchrun with an id, else ``default``."""
    run_id = elastic_launch(environ).run_id
    return f"outputs/torchrun/{run_id}" if run_id else default


def unshared_folder(ranks: Ranks, run_dir_given: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """Why this launch would write to more than one folder (one line, with what to pass), or None."""
    nodes = -(-ranks.world_size // max(1, ranks.local_world_size))
    launch = elastic_launch(environ)
    restarts = launch.max_restarts if ranks.launcher == "torchelastic" else 0
    if run_dir_given or (nodes <= 1 and not restarts) or (ranks.launcher == "torchelastic" and launch.run_id):
        return None
    how = f"{ranks.world_size} ranks on {nodes} nodes" if nodes > 1 else f"--max-restarts={restarts}"
    fix = (
        "torchrun --rdzv-id=<run name> (the folder is then outputs/torchrun/<run name>) or "
        if ranks.launcher == "torchelastic"
        else ""
    )
    return (
        f"this {ranks.launcher} launch ({how}) has no run folder that every node and every restart agrees on: each "
        f"process would compose its own outputs/<date>/<time>, and a restarted one would not find the run's "
        f"checkpoints; pass {fix}hydra.run.dir=<a folder every node can write, the same on each>"
    )
