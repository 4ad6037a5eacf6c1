"""Explain DataLoader failures: which resource ran out, the numbers now, and the fix.

Torch reports three different exhaustions (shm bytes, shm segments/fds/maps, memory) with
the same words: "DataLoader worker (pid N) exited unexpectedly". This module turns the
message and a fresh resource probe into an answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
from typing import Iterator

from cocodet.loader.hang import worker_stacks
from cocodet.loader.plan_record import LoaderPlan
from cocodet.loader.resources import probe
from cocodet.units import mib

log = logging.getLogger(__name__)


class LoaderFailure(RuntimeError):
    """A DataLoader failure with its diagnosis; the original error is the __cause__."""


_SHM_BYTES = ("bus error", "no space left on device", "sigbus", "unable to write to file </torch_")
_SEGMENTS = ("too many open files", "received 0 items of ancdata", "unable to mmap", "emfile")
_MEMORY = ("killed by signal: killed", "cannot allocate memory", "sigkill", "out of memory")
# A worker that dies while the main process receives its fds surfaces as a broken socket.
_WORKER = ("exited unexpectedly", "killed by signal", "connection reset by peer", "connectionrefusederror", "eoferror")


def _fmt(x: int | None) -> str:
    return mib(x, "n/a")


# "unable to mmap N bytes": one tensor's mapping. Tiny ones (96, 144, 336 bytes were seen:
# label and count storages) fail when the process ran out of map slots (vm.max_map_count);
# a batch-sized one fails when /dev/shm ran out of bytes (the pin-memory thread then says
# "Cannot allocate memory", which is not the OOM killer). 64 KiB separates the two.
_MMAP_SIZE = re.compile(r"unable to mmap (\d+) bytes")
LARGE_MAPPING = 64 << 10


# A full disk that names its file ("[Errno 28] No space left on device: '/data/x'"): that
# file's disk, not /dev/shm, unless the file is one of torch's shared-memory files.
_FULL_DISK_PATH = re.compile(r"(?:No space left on device|Disk quota exceeded)[^'\n]*'(/[^'\n]+)'", re.I)


def full_disk_path(message: str) -> str | None:
    """The file a full-disk error names, when it is not in shared memory (None otherwise)."""
    found = _FULL_DISK_PATH.search(message)
    if found is None or found.group(1).startswith("/dev/shm") or "/torch_" in found.group(1):
        return None
    return found.group(1)


def classify(message: str) -> str | None:
    """'hang' (loader.timeout passed), 'shm', 'disk' (a full disk other than /dev/shm, named),
    'segments', 'memory', 'worker' (died, cause unknown), 'segfault' or None (not a loader
    failure)."""
    text = message.lower()
    if "dataloader timed out after" in text:
        return "hang"
    mapping = _MMAP_SIZE.search(text)
    if mapping:
        return "shm" if int(mapping.group(1)) >= LARGE_MAPPING else "segments"
    if full_disk_path(message):
        return "disk"
    for kind, needles in (("shm", _SHM_BYTES), ("segments", _SEGMENTS)):
        if any(n in text for n in needles):
            return kind
    if "in dataloader worker process" in text:
        return None  # an exception raised by a sample: it carries its own traceback and image
    if "segmentation fault" in text or "sigsegv" in text:
        return "segfault"
    for kind, needles in (("memory", _MEMORY), ("worker", _WORKER)):
        if any(n in text for n in needles):
            return kind
    return None


def worker_signals(error: BaseException) -> dict[int, str]:
    """Signals that ended DataLoader workers, read from the iterator in the error's traceback.

    Torch often reports only "exited unexpectedly"; the worker Process objects still hold
    their exit codes (-N for signal N).
    """
    found: dict[int, str] = {}
    chained: BaseException | None = error
    while chained is not None:  # our own fetch check names them (worker_deaths.WorkerDied)
        found.update(getattr(chained, "worker_signals", {}))
        chained = chained.__cause__ or chained.__context__
    for owner in _failed_iterators(error):
        for w in getattr(owner, "_workers", []):
            if w.exitcode is None:
                w.join(timeout=0.5)  # a worker killed mid-send may not be reaped yet
            code = w.exitcode
            if code is not None and code < 0:
                try:
                    found[w.pid] = signal.Signals(-code).name
                except ValueError:
                    found[w.pid] = f"signal {-code}"
    return found


def _failed_iterators(error: BaseException) -> list:
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    found = []
    chained: BaseException | None = error
    while chained is not None:  # a late signal error carries the original one as __context__
        tb = chained.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if isinstance(owner, _MultiProcessingDataLoaderIter) and owner not in found:
                found.append(owner)
            tb = tb.tb_next
        chained = chained.__context__
    return found


def _forget_workers(error: BaseException) -> None:
    """Stop torch's SIGCHLD handler from raising again for a loader already diagnosed."""
    from torch.utils.data import _utils

    for owner in _failed_iterators(error):
        with contextlib.suppress(Exception):
            _utils.signal_handling._remove_worker_pids(id(owner))


_SIGNAL_KIND = {"SIGBUS": "shm", "SIGKILL": "memory", "SIGSEGV": "segfault"}


def failure_kind(error: BaseException) -> str | None:
    """classify() of the error; when a worker was ended by a signal that names its cause
    (SIGKILL: memory, SIGBUS: shm, SIGSEGV: segfault), the signal decides: a worker killed
    while sending a batch also breaks the transfer, whose message ("received 0 items of
    ancdata", "connection reset") alone would read as an fd problem or an unknown death."""
    kind = classify(f"{type(error).__name__}: {error}")
    if kind is None or kind == "hang":
        return kind
    signals = worker_signals(error)
    return next((_SIGNAL_KIND[s] for s in signals.values() if s in _SIGNAL_KIND), kind)


def explain(error: BaseException, plan: LoaderPlan, shm_path: str = "/dev/shm") -> str | None:
    """A diagnosis for ``error`` with numbers measured now, or None when it is not a loader failure."""
    message = f"{type(error).__name__}: {error}"
    kind = failure_kind(error)
    if kind is None:
        return None
    signals = worker_signals(error)
    res = probe(shm_path=shm_path)
    named = re.search(r"killed by signal: ([A-Za-z ]+)", message)
    what = ", ".join(f"worker {pid} ended by {sig}" for pid, sig in signals.items()) or \
        (named.group(1).strip() if named else type(error).__name__)
    head = f"DataLoader failure ({what}) with {plan.num_workers} workers, " \
           f"prefetch {plan.prefetch_factor}, batch {plan.batch_size} ({_fmt(plan.batch_bytes)}/batch)."
    if kind == "hang":
        return f"{head}\n{_hang(plan)}\nOriginal error: {message}"
    body = _CAUSES[kind](plan, res, message) if kind in _CAUSES else (
        f"A worker died without a recognisable resource signature. /dev/shm free {_fmt(res.shm_free_bytes)}, "
        f"RLIMIT_NOFILE {res.nofile_soft}, memory available {_fmt(res.memory_available_bytes)}.")
    hint = "Reproduce in one process, with the full traceback, with loader=explicit loader.num_workers=0."
    return f"{head}\n{body}\n{hint}\nOriginal error: {message.splitlines()[0] if message else ''}"


def _cause(cause: str, measured: str, fix: str) -> str:
    return f"Likely cause: {cause}. {measured}. Fix: {fix}." if measured else f"Likely cause: {cause}. Fix: {fix}."


def _shm(plan: LoaderPlan, res, message: str) -> str:
    measured = (f"{res.shm_path} has {_fmt(res.shm_total_bytes)} in all, {_fmt(res.shm_free_bytes)} free now; the plan "
                f"kept {_fmt(plan.inflight_bytes)} in flight (budget {_fmt(plan.shm_budget_bytes)})")
    return _cause("/dev/shm ran out of bytes", measured, "run the container with --shm-size=2g (or --ipc=host), use "
                  "loader=auto (sizes workers to the free shm), or lower loader.prefetch_factor / loader.batch_size")


def _disk(plan: LoaderPlan, res, message: str) -> str:
    path = full_disk_path(message)
    full = f"the disk holding {path} is full ({_disk_space(path)}); not /dev/shm, which has {_fmt(res.shm_free_bytes)} free"
    return _cause(full, "", "free space on that disk, or point what writes there (the cache_dir of dataset or "
                  "dataset.remote, the checkpoint dirpath) at a larger one")


def _segments(plan: LoaderPlan, res, message: str) -> str:
    what = ("shared-memory segments — file descriptors or memory maps (a small 'unable to mmap' means the map count "
            "ran out)")
    limits = (f"RLIMIT_NOFILE soft is {res.nofile_soft} (hard {res.nofile_hard}), vm.max_map_count {res.max_map_count}; "
              f"the plan holds {plan.inflight_fds} fds in flight")
    return _cause(what, limits, f"`ulimit -n {max(4096, res.nofile_hard)}`, a lower loader.prefetch_factor, or fewer "
                  "workers (loader=auto)")


def _memory(plan: LoaderPlan, res, message: str) -> str:
    seen = (f"Available now: {_fmt(res.memory_available_bytes)} ({res.memory_source}); the plan assumed "
            f"{_fmt(plan.worker_footprint_bytes)} per worker. Check `dmesg | grep -i oom`")
    return _cause("memory — SIGKILL is what the kernel's OOM killer sends", seen,
                  "loader=auto (caps workers by memory), fewer workers, loader.prefetch_factor=1, or a smaller batch")


def _segfault(plan: LoaderPlan, res, message: str) -> str:
    return ("Likely cause: native code crashed inside a worker (SIGSEGV), not a resource limit. Libraries that are "
            "not fork-safe (a CUDA context or an OpenMP/BLAS thread pool created before the workers forked, some "
            "image codecs) are the usual suspects. Retry with loader.num_workers=0: if it passes, retry with 1 "
            "worker; a crash at 1 but not at 0 points at fork-unsafe state, one at 0 too at the data or the library.")


_CAUSES = {"shm": _shm, "disk": _disk, "segments": _segments, "memory": _memory, "segfault": _segfault}


def _hang(plan: LoaderPlan) -> str:
    """Where each worker was when no batch came, and how to reproduce in one process."""
    stacks = worker_stacks()
    shown = "\n".join(f"--- worker {pid} ---\n{text}" for pid, text in stacks.items()) or \
        ("(no worker stacks: loading ran in the main process; its stack is in the original error below)"
         if plan.num_workers == 0 else "(the workers did not answer SIGUSR1)")
    body = (f"Likely cause: loading hung — no batch for loader.timeout={plan.timeout_s:g} s. Usual culprits: a "
            f"read that never returns (a dead network mount, a FIFO or device file among the images, a stalled "
            f"disk), a deadlock in a worker (a lock held across fork by a library), or a worker stopped by the "
            f"OS. Where each worker was:\n{shown}\nFix the path or mount the stacks point at; raise "
            f"loader.timeout if batches are legitimately that slow (0 disables it).")
    hint = "" if plan.num_workers == 0 else \
        "Reproduce in one process with loader=explicit loader.num_workers=0 (the watchdog then shows the main thread's stack)."
    return f"{body}\n{hint}"


def _disk_space(path: str) -> str:
    """"X free of Y" on the disk of ``path`` (its nearest existing folder)."""
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
                    _forget_workers(error)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return error, diagnosis
        except RuntimeError as late:
            error = late
    return error, None
