"""The rank reader's answers once a trainer holds the ranks (design §7.3): checked against the
trainer's (``check_ranks``), and a multi-process run ended in order (``finish_ranks``).

The trainer is any object with Lightning's rank attributes, so nothing is imported for it; the
ranks are ``ranks.py``'s, which reads them from the launcher's variables before any trainer.
"""

from __future__ import annotations

import logging

from cocodet.ranks import Ranks

log = logging.getLogger(__name__)


def check_ranks(trainer, ranks: Ranks) -> dict:
    """The rank reader's answers beside the trainer's, logged by every rank; a disagreement is
    a warning (the plan divided this host's CPUs and shm by the reader's local world size)."""
    agrees = (ranks.global_rank, ranks.world_size) == (trainer.global_rank, trainer.world_size)
    line = (
        f"rank reader ({ranks.launcher}): rank {ranks.global_rank} of {ranks.world_size}, local rank "
        f"{ranks.local_rank} of {ranks.local_world_size}; trainer: rank {trainer.global_rank} of {trainer.world_size}"
    )
    if agrees:
        log.info("%s: they agree", line)
    else:
        log.warning(
            "%s: they disagree, so the loader plan may have divided this host by the wrong number of ranks; "
            "report the launcher's environment variables",
            line,
        )
    return {
        "launcher": ranks.launcher,
        "global_rank": ranks.global_rank,
        "world_size": ranks.world_size,
        "local_world_size": ranks.local_world_size,
        "agrees_with_trainer": agrees,
    }


def finish_ranks(trainer) -> None:
    """End a multi-process run in order: every rank meets here, then rank 0 waits for the
    ranks it launched on this host, so its summary is the last line on the shared stdout."""
    if trainer.world_size <= 1:
        return
    trainer.strategy.barrier("cocodet-summary")
    if trainer.is_global_zero:
        for proc in getattr(trainer.strategy.launcher, "procs", None) or []:
            proc.wait(timeout=300)
