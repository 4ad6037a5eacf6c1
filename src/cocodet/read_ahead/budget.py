"""How much a remote root's read-ahead may hold, and where: the budget
(``dataset.remote.cache_bytes``, ``auto`` by default), its folder, this run's claimed
folder of copies (design §15), and the shared counter of the bytes the copies hold."""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import os
import shutil
from pathlib import Path

from cocodet.storage.claims import SharedLock, claim_file

AUTO_CACHE_BYTES = 4 * 2**30  # cache_bytes=auto's ceiling (the fixed default before auto): ~25k COCO images' window


def read_ahead_budget(
    folder,
    cache_bytes: int | str,
    local_ranks: int,
    objects: dict[str, dict],
    concurrency: int,
    working_bytes: int = 0,
    own: str | os.PathLike | None = None,
) -> dict:
    """This rank's share of ``dataset.remote.cache_bytes`` and what the read-ahead holds in
    memory. ``auto`` is half of what the folder's disk can give (free space plus this split's
    copies already there, in ``own``, which the run adopts or evicts), at most
    :data:`AUTO_CACHE_BYTES`, raised to the working set (``working_bytes`` per rank) where the
    disk can give that, so a small disk gets a small window, not a refusal; a number the disk
    cannot hold is refused with the numbers. Files of other runs and splits are not counted as
    free: they are not this run's to remove."""
    from cocodet.errors import UserError
    from cocodet.storage.cache_files import ensure_folder

    folder = Path(os.path.expanduser(str(folder)))
    ensure_folder(folder)
    mine = Path(own) if own is not None else None
    free = shutil.disk_usage(folder).free + (
        sum(p.stat().st_size for p in mine.rglob("*") if p.is_file()) if mine is not None and mine.is_dir() else 0
    )
    auto = cache_bytes == "auto"
    if auto:
        cache_bytes = min(AUTO_CACHE_BYTES, free // 2)
        if working_bytes * local_ranks > cache_bytes:  # what fetches each object once, if the disk has it
            cache_bytes = min(working_bytes * local_ranks, free * 9 // 10)
    cache_bytes = int(cache_bytes)
    if cache_bytes > free:
        raise UserError(
            f"dataset.remote.cache_bytes={cache_bytes} ({cache_bytes / 2**30:.1f} GiB) does not fit "
            f"in {folder}: {free / 2**30:.1f} GiB free there; lower it (or use auto: half the free "
            "space), or point dataset.remote.cache_dir at a larger local disk"
        )
    largest = max((o["size"] for o in objects.values()), default=0)
    total = sum(o["size"] for o in objects.values())
    return {
        "cache_dir": str(folder),
        "cache_bytes": cache_bytes,
        "auto": auto,
        "free_bytes": int(free),
        "rank_budget_bytes": int(cache_bytes // local_ranks),
        "working_set_bytes": int(working_bytes),
        "split_bytes": int(total),
        "holds_the_split": bool(cache_bytes // local_ranks >= total),
        "memory_bytes": int(concurrency * largest),
        "concurrency": int(concurrency),
    }


def working_set_words(budget: dict, working: tuple[int, int], local_ranks: int) -> tuple[str, str | None]:
    """(the plan's line on the working set; a warning when this rank's budget is below it)."""
    objects, bytes_ = working
    line = (
        f"working set {objects} objects, {bytes_ / 2**20:.1f} MiB per rank (what the read-ahead holds at once to "
        "fetch each object once per epoch)"
    )
    if budget["rank_budget_bytes"] >= bytes_:
        return line, None
    need = -(-bytes_ * local_ranks // 2**20) * 2**20
    return line, (
        f"read-ahead: this rank's {budget['rank_budget_bytes'] / 2**20:.1f} MiB is below its working set of "
        f"{objects} objects ({bytes_ / 2**20:.1f} MiB): some objects are fetched more than once per epoch "
        f"(never more often than without the read-ahead); set dataset.remote.cache_bytes={need} to fetch "
        "each once"
    )


def budget_origin(budget: dict) -> str:
    """Where an automatic budget came from, for the log line; empty for a number the user set."""
    if not budget["auto"]:
        return ""
    if budget["rank_budget_bytes"] >= budget["working_set_bytes"] > min(AUTO_CACHE_BYTES, budget["free_bytes"] // 2):
        return f" (auto: the working set, {budget['free_bytes'] / 2**30:.1f} GiB free there)"
    return (
        f" (auto: half of the {budget['free_bytes'] / 2**30:.1f} GiB free there, at most "
        f"{AUTO_CACHE_BYTES / 2**30:.0f} GiB)"
    )


def read_ahead_folder(remote: dict, cache_dir: str | None) -> str | None:
    """``dataset.remote.cache_dir``, else ``<dataset.cache_dir>/objects``; None when both are null."""
    return remote.get("cache_dir") or (os.path.join(os.path.expanduser(cache_dir), "objects") if cache_dir else None)


def split_folder(folder: str, local_rank: int, images_url: str) -> tuple[Path, int]:
    """This run's copies: ``<folder>/local-rank-N/<split>-<k>``, one folder per split (a
    hash of its image prefix), claimed with an ``flock`` held for the run (the returned
    descriptor), so runs sharing a host and a split (a ``local_parallel`` sweep) never evict
    each other's copies: a second one takes the next ``k``."""
    base = Path(os.path.expanduser(folder)) / f"local-rank-{local_rank}"
    base.mkdir(parents=True, exist_ok=True)
    split = hashlib.sha256(images_url.encode()).hexdigest()[:12]
    for k in itertools.count():
        mine = base / f"{split}-{k}"
        mine.mkdir(exist_ok=True)
        fd = claim_file(mine / ".claim")
        if fd is not None:
            return mine, fd


class HeldBytes:
    """The bytes a rank's copies take (and those reserved for copies being written): one counter
    in shared memory, which the rank's forked workers inherit, under a lock the kernel releases
    if a worker is killed holding it (``storage/claims.py``)."""

    def __init__(self):
        self._bytes = multiprocessing.Value("q", 0, lock=False)
        self._lock = SharedLock()

    def reserve(self, size: int, budget: int) -> bool:
        """Count ``size`` more bytes if they fit in ``budget``."""
        with self._lock:
            if self._bytes.value + size > budget:
                return False
            self._bytes.value += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._bytes.value -= size

    def value(self) -> int:
        with self._lock:
            return int(self._bytes.value)
