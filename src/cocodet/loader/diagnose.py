"""Explain DataLoader failures: which resource ran out, the numbers now, and the fix.

Torch reports three different exhaustions (shm bytes, shm segments/fds/maps, memory) with
the same words: "DataLoader worker (pid N) exited unexpectedly". This module turns the
message and a fresh resource probe into an answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Iterator

from cocodet.loader.policy import MiB, LoaderPlan
from cocodet.loader.resources import probe

log = logging.getLogger(__name__)


class LoaderFailure(RuntimeError):
    """A DataLoader failure with its diagnosis; the original error is the __cause__."""


_SHM_BYTES = ("bus error", "no space left on device", "sigbus", "unable to write to file </torch_")
_SEGMENTS = ("too many open files", "received 0 items of ancdata", "unable to mmap", "emfile")
_MEMORY = ("killed by signal: killed", "cannot allocate memory", "sigkill", "out of memory")
_WORKER = ("exited unexpectedly", "killed by signal")


def _fmt(x: int | None) -> str:
    return "n/a" if x is None else f"{x / MiB:.1f} MiB"


def classify(message: str) -> str | None:
    """'shm', 'segments', 'memory', 'worker' (died, cause unknown) or None (not a loader failure)."""
    text = message.lower()
    for kind, needles in (("shm", _SHM_BYTES), ("segments", _SEGMENTS)):
        if any(n in text for n in needles):
            return kind
    if "in dataloader worker process" in text:
        return None  # an exception raised by a sample: it carries its own traceback and image
    for kind, needles in (("memory", _MEMORY), ("worker", _WORKER)):
        if any(n in text for n in needles):
            return kind
    return None


def explain(error: BaseException, plan: LoaderPlan, shm_path: str = "/dev/shm") -> str | None:
    """A diagnosis for ``error`` with numbers measured now, or None when it is not a loader failure."""
    message = f"{type(error).__name__}: {error}"
    kind = classify(message)
    if kind is None:
        return None
    res = probe(shm_path=shm_path)
    signal = re.search(r"killed by signal: ([A-Za-z ]+)", message)
    head = f"DataLoader failure ({signal.group(1).strip() if signal else type(error).__name__}) with {plan.num_workers} workers, " \
           f"prefetch {plan.prefetch_factor}, batch {plan.batch_size} ({_fmt(plan.batch_bytes)}/batch)."
    if kind == "shm":
        body = (f"Likely cause: /dev/shm ran out of bytes. {res.shm_path} has {_fmt(res.shm_total_bytes)} in all, "
                f"{_fmt(res.shm_free_bytes)} free now; the plan kept {_fmt(plan.inflight_bytes)} in flight "
                f"(budget {_fmt(plan.shm_budget_bytes)}). Fix: run the container with --shm-size=2g (or --ipc=host), "
                f"use loader=auto (sizes workers to the free shm), or lower loader.prefetch_factor / loader.batch_size.")
    elif kind == "segments":
        body = (f"Likely cause: shared-memory segments — file descriptors or memory maps. RLIMIT_NOFILE soft is "
                f"{res.nofile_soft} (hard {res.nofile_hard}), vm.max_map_count {res.max_map_count}; the plan holds "
                f"{plan.inflight_fds} fds in flight. Fix: `ulimit -n {max(4096, res.nofile_hard)}`, a lower "
                f"loader.prefetch_factor, or fewer workers (loader=auto).")
    elif kind == "memory":
        body = (f"Likely cause: memory — SIGKILL is what the kernel's OOM killer sends. Available now: "
                f"{_fmt(res.memory_available_bytes)} ({res.memory_source}); the plan assumed "
                f"{_fmt(plan.worker_footprint_bytes)} per worker. Check `dmesg | grep -i oom`. Fix: loader=auto "
                f"(caps workers by memory), fewer workers, loader.prefetch_factor=1, or a smaller batch.")
    else:
        body = (f"A worker died without a recognisable resource signature. /dev/shm free {_fmt(res.shm_free_bytes)}, "
                f"RLIMIT_NOFILE {res.nofile_soft}, memory available {_fmt(res.memory_available_bytes)}.")
    hint = "Reproduce in one process, with the full traceback, with loader=explicit loader.num_workers=0."
    return f"{head}\n{body}\n{hint}\nOriginal error: {message.splitlines()[0] if message else ''}"


@contextlib.contextmanager
def explained_loader_failures(plan: LoaderPlan, shm_path: str = "/dev/shm") -> Iterator[None]:
    """Re-raise loader failures inside the block as LoaderFailure with the diagnosis."""
    try:
        yield
    except (RuntimeError, OSError) as e:  # torch raises RuntimeError; shm/fd errors surface as OSError
        if isinstance(e, LoaderFailure):
            raise
        diagnosis = explain(e, plan, shm_path)
        if diagnosis is None:
            raise
        log.error("%s", diagnosis)
        raise LoaderFailure(diagnosis) from e
