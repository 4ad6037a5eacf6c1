"""Explain DataLoader failures: which resource ran out, the numbers now, and the fix.

Torch reports three different exhaustions (shm bytes, shm segments/fds/maps, memory) with
the same words: "DataLoader worker (pid N) exited unexpectedly". This module turns the kind
``classify.py`` reads from the error, and a fresh resource probe, into an answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
from typing import Iterator

from cocodet.loader.failures.classify import failure_kind, forget_workers, full_disk_path, worker_signals
from cocodet.loader.failures.hang import worker_stacks
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.plan.resources import probe
from cocodet.units import mib

log = logging.getLogger(__name__)


class LoaderFailure(RuntimeError):
    """A DataLoader failure with its diagnosis; the original error is the __cause__."""


def _fmt(x: int | None) -> str:
    return mib(x, "n/a")


def explain(error: BaseException, plan: LoaderPlan, shm_path: str = "/dev/shm") -> str | None:
    """A diagnosis for ``error`` with numbers measured now, or None when it is not a loader failure."""
    message = f"{type(error).__name__}: {error}"
    kind = failure_kind(error)
    if kind is None:
        return None
    signals = worker_signals(error)
    res = probe(shm_path=shm_path)
    named = re.search(r"killed by signal: ([A-Za-z ]+)", message)
    what = ", ".join(f"worker {pid} ended by {sig}" for pid, sig in signals.items()) or (
        named.group(1).strip() if named else type(error).__name__
    )
    head = (
        f"DataLoader failure ({what}) with {plan.num_workers} workers, "
        f"prefetch {plan.prefetch_factor}, batch {plan.batch_size} ({_fmt(plan.batch_bytes)}/batch)."
    )
    if kind == "hang":
        return f"{head}\n{_hang(plan)}\nOriginal error: {message}"
    body = (
        _CAUSES[kind](plan, res, message)
        if kind in _CAUSES
        else (
            f"A worker died without a recognisable resource signature. /dev/shm free {_fmt(res.shm_free_bytes)}, "
            f"RLIMIT_NOFILE {res.nofile_soft}, memory available {_fmt(res.memory_available_bytes)}."
        )
    )
    hint = "Reproduce in one process, with the full traceback, with loader=explicit loader.num_workers=0."
    return f"{head}\n{body}\n{hint}\nOriginal error: {message.splitlines()[0] if message else ''}"


def _cause(cause: str, measured: str, fix: str) -> str:
    return f"Likely cause: {cause}. {measured}. Fix: {fix}." if measured else f"Likely cause: {cause}. Fix: {fix}."


def _shm(plan: LoaderPlan, res, message: str) -> str:
    measured = (
        f"{res.shm_path} has {_fmt(res.shm_total_bytes)} in all, {_fmt(res.shm_free_bytes)} free now; the plan "
        f"kept {_fmt(plan.inflight_bytes)} in flight (budget {_fmt(plan.shm_budget_bytes)})"
    )
    return _cause(
        "/dev/shm ran out of bytes",
        measured,
        "run the container with --shm-size=2g (or --ipc=host), use "
        "loader=auto (sizes workers to the free shm), or lower loader.prefetch_factor / loader.batch_size",
    )


def _disk(plan: LoaderPlan, res, message: str) -> str:
    path = full_disk_path(message)
    shm_free = _fmt(res.shm_free_bytes)
    full = f"the disk holding {path} is full ({_disk_space(path)}); not /dev/shm, which has {shm_free} free"
    return _cause(
        full,
        "",
        "free space on that disk, or point what writes there (the cache_dir of dataset or "
        "dataset.remote, the checkpoint dirpath) at a larger one",
    )


def _segments(plan: LoaderPlan, res, message: str) -> str:
    what = (
        "shared-memory segments — file descriptors or memory maps (a small 'unable to mmap' means the map count "
        "ran out)"
    )
    limits = (
        f"RLIMIT_NOFILE soft is {res.nofile_soft} (hard {res.nofile_hard}), vm.max_map_count {res.max_map_count}; "
        f"the plan holds {plan.inflight_fds} fds in flight"
    )
    return _cause(
        what,
        limits,
        f"`ulimit -n {max(4096, res.nofile_hard)}`, a lower loader.prefetch_factor, or fewer workers (loader=auto)",
    )


def _memory(plan: LoaderPlan, res, message: str) -> str:
    seen = (
        f"Available now: {_fmt(res.memory_available_bytes)} ({res.memory_source}); the plan assumed "
        f"{_fmt(plan.worker_footprint_bytes)} per worker. Check `dmesg | grep -i oom`"
    )
    return _cause(
        "memory — SIGKILL is what the kernel's OOM killer sends",
        seen,
        "loader=auto (caps workers by memory), fewer workers, loader.prefetch_factor=1, or a smaller batch",
    )


def _segfault(plan: LoaderPlan, res, message: str) -> str:
    return (
        "Likely cause: native code crashed inside a worker (SIGSEGV), not a resource limit. Libraries that are "
        "not fork-safe (a CUDA context or an OpenMP/BLAS thread pool created before the workers forked, some "
        "image codecs) are the usual suspects. Retry with loader.num_workers=0: if it passes, retry with 1 "
        "worker; a crash at 1 but not at 0 points at fork-unsafe state, one at 0 too at the data or the library."
    )


_CAUSES = {"shm": _shm, "disk": _disk, "segments": _segments, "memory": _memory, "segfault": _segfault}


def _hang(plan: LoaderPlan) -> str:
    """Where each worker was when no batch came, and how to reproduce in one process."""
    stacks = worker_stacks()
    shown = "\n".join(f"--- worker {pid} ---\n{text}" for pid, text in stacks.items()) or (
        "(no worker stacks: loading ran in the main process; its stack is in the original error below)"
        if plan.num_workers == 0
        else "(the workers did not answer SIGUSR1)"
    )
    body = (
        f"Likely cause: loading hung — no batch for loader.timeout={plan.timeout_s:g} s. Usual culprits: a "
        f"read that never returns (a dead network mount, a FIFO or device file among the images, a stalled "
        f"disk), a deadlock in a worker (a lock held across fork by a library), or a worker stopped by the "
        f"OS. Where each worker was:\n{shown}\nFix the path or mount the stacks point at; raise "
        f"loader.timeout if batches are legitimately that slow (0 disables it)."
    )
    hint = (
        ""
        if plan.num_workers == 0
        else "Reproduce in one process with loader=explicit loader.num_workers=0 "
        "(the watchdog then shows the main thread's stack)."
    )
    return f"{body}\n{hint}"


def _disk_space(path: str) -> str:
    """ "X free of Y" on the disk of ``path`` (its nearest existing folder)."""
    import shutil
    from pathlib import Path

    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "its free space unknown"
    return f"{_fmt(usage.free)} free of {_fmt(usage.total)} at {folder}"


@contextlib.contextmanager
def explained_loader_failures(plan: LoaderPlan, shm_path: str = "/dev/shm") -> Iterator[None]:
    """Re-raise loader failures inside the block as LoaderFailure with the diagnosis."""
    try:
        yield
    except LoaderFailure:
        raise
    except (RuntimeError, OSError, EOFError) as e:  # torch: RuntimeError; shm/fd/socket errors: OSError
        error, diagnosis = _diagnose(e, plan, shm_path)
        if diagnosis is None:
            raise
        log.error("%s", diagnosis)
        raise LoaderFailure(diagnosis) from error


def _diagnose(error: BaseException, plan: LoaderPlan, shm_path: str) -> tuple[BaseException, str | None]:
    """explain() shielded from torch's SIGCHLD handler.

    A dying worker can surface twice: as a broken transfer in the main thread and, a moment
    later, as the RuntimeError torch's SIGCHLD handler raises asynchronously. SIGCHLD is
    blocked while diagnosing and the failed loader's workers are unregistered, so the handler
    does not raise on top of the diagnosis; if it fired before the block took effect, its
    error (which names the signal) is diagnosed instead.
    """
    for _ in range(4):  # each retry needs a new worker death; a few cover every worker of a loader
        try:
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            try:
                diagnosis = explain(error, plan, shm_path)
                if diagnosis is not None:
                    forget_workers(error)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return error, diagnosis
        except RuntimeError as late:
            error = late
    return error, None
