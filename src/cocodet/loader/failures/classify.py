"""What kind of DataLoader failure an error is, read from its message and from the signals
that ended its workers: "shm", "segments", "memory", "segfault", "disk", "hang", "worker"
(a death with no resource signature), or None for an error that is no loader failure.

Torch reports three different exhaustions (shm bytes, shm segments/fds/maps, memory) with the
same words, so the message alone is not enough: a worker's exit signal names its cause.
``diagnose.py`` turns the kind into the answer with the numbers.
"""

from __future__ import annotations

import contextlib
import re
import signal

_SHM_BYTES = ("bus error", "no space left on device", "sigbus", "unable to write to file </torch_")
_SEGMENTS = ("too many open files", "received 0 items of ancdata", "unable to mmap", "emfile")
_MEMORY = ("killed by signal: killed", "cannot allocate memory", "sigkill", "out of memory")
# A worker that dies while the main process receives its fds surfaces as a broken socket.
_WORKER = ("exited unexpectedly", "killed by signal", "connection reset by peer", "connectionrefusederror", "eoferror")


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


def forget_workers(error: BaseException) -> None:
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
