"""The node-local copies of remote objects that the read-ahead fills (``dataset.remote.cache_dir``).

One file per object version: ``<sha256(url)[:24]>-<ETag>``, so a changed object is never
served from an older copy. Every file is written by the one holder of its claim, an ``flock`` on
``<name>.part`` (``storage/claims.py``: held by a live process, taken over at once from a dead
one, never decided by a clock), checked against the listing's size (and its MD5 where the
store's ETags are MD5s, see :meth:`ObjectCache._check`), then renamed into place while the
claim is held: a reader sees a whole file or none, and a copy whose size is not the listing's
is never served. A worker that finds no copy waits for the claimer if the object is being
fetched, else claims and fetches it itself (a *miss*, counted), so an object is fetched once
however many workers and the read-ahead thread want it.

The budget is one counter in shared memory, which the rank's workers inherit: a copy is
published only after its bytes were reserved there, so the folder never holds more than the
budget, even when a worker runs ahead of the read-ahead (its copy is then not kept). Beside it,
each object's count of GETs made by readers (the workers' misses), also inherited: a read-ahead
fetch that finds the count moved since it planned the fetch makes no GET (see
:meth:`ObjectCache.fetch`'s ``seen``). The
read-ahead thread (``read_ahead/fetcher.py:ReadAhead``) alone evicts. Ranks on one host share ``cache_dir``, each in
a folder of its own (``local-rank-N``) with its share of ``cache_bytes``: no rank evicts what
another counts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np

from cocodet.storage import store as storage
from cocodet.storage.claims import SharedLock, claim_file
from cocodet.units import mib

log = logging.getLogger(__name__)
POLL_S = 0.005  # how often a waiting reader looks for a copy another process is writing
# After the copies' disk refused a write (full, over quota, read-only, failing), copies are not
# attempted for this long: reads go to the store, the read-ahead pauses; then one try again.
DISK_RETRY_S = 30.0


class ObjectCache:
    """Copies of this split's objects in ``folder``. ``objects``: URL -> ``{"size", "etag"}``
    (one listing); only those objects go through the cache."""

    def __init__(self, folder: str | os.PathLike, objects: dict[str, dict], budget: int):
        import multiprocessing

        self.folder = Path(os.path.expanduser(str(folder)))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.objects, self.budget = objects, int(budget)
        self._paths: dict[str, Path] = {}
        # Bytes of the copies in the folder (and reserved for), under a lock the kernel releases
        # if a worker is killed holding it (storage/claims.py).
        self._held = multiprocessing.Value("q", 0, lock=False)
        self._held_lock = SharedLock()
        # time.monotonic() until which the disk is taken to refuse copies (0: it takes them), for
        # this process and its workers: one double, written whole (a race sets a near time).
        self._refused_until = multiprocessing.Value("d", 0.0, lock=False)
        self._etags_are_md5 = True  # until an object shows otherwise (SSE-KMS, SSE-C): then sizes only
        # [len(objects)] GETs each object had from readers (not the read-ahead), in the order of
        # ``objects``. One writer at a time per object: a reader counts while it holds the claim.
        self._number = {url: i for i, url in enumerate(objects)}
        self._reader_gets = np.frombuffer(multiprocessing.Array("q", max(1, len(objects)), lock=False), np.int64)
        for stale in self.folder.glob("*.part"):  # a dead claimer's leftovers; a live one's claim is kept
            fd = claim_file(stale)
            if fd is not None:
                self._unlink(stale)
                os.close(fd)

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes if they fit in the budget."""
        with self._held_lock:
            if self._held.value + size > self.budget:
                return False
            self._held.value += size
            return True

    def release(self, size: int) -> None:
        with self._held_lock:
            self._held.value -= size

    def held_bytes(self) -> int:
        with self._held_lock:
            return int(self._held.value)

    def path(self, url: str) -> Path:
        found = self._paths.get(url)
        if found is None:  # named once per object and process: a worker asks for it on every read
            etag = re.sub(r"[^A-Za-z0-9]", "", self.objects[url]["etag"])[:40]
            found = self._paths[url] = self.folder / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}-{etag or 'noetag'}"
        return found

    def read(self, url: str) -> bytes | None:
        """The object's bytes from its copy (a hit), from a copy another process is writing
        (waited for), or fetched here and published (a miss); None for an object not listed."""
        if url not in self.objects:
            return None
        data = self._read_copy(url)
        if data is None:
            return self.fetch(url, miss=True)
        storage.count("cache_hits")
        return data

    def reader_gets(self) -> np.ndarray:
        """[len(objects)] the GETs each object has had from readers so far (a copy), in the order
        of ``objects``: what a read-ahead fetch passes back as ``seen``."""
        return self._reader_gets.copy()

    def number(self, url: str) -> int:
        """The object's place in ``objects`` (its entry in :meth:`reader_gets`)."""
        return self._number[url]

    def fetch(self, url: str, miss: bool = False, reserved: bool = False, seen: int | None = None) -> bytes | None:
        """Fetch the object unless another live process or thread holds its claim (then wait
        for its copy, for as long as the holder lives and the store answers), and publish it if
        its bytes were ``reserved`` (the read-ahead thread) or fit now (a worker's miss); its bytes.
        A reservation not needed (the copy was there already) is given back.

        ``seen`` (the read-ahead's fetches): the object's :meth:`reader_gets` count read before
        the fetch was planned. Once the claim is held and no copy is there, a higher count means
        a reader has made its own GET since, without keeping a copy (the budget, which this
        fetch's reservation fills, had no room): that GET may have served the very read this
        fetch was planned for, so this one would be a second GET for one read. Then nothing is
        fetched, the reservation is given back and None returned. From the claim on, a reader
        of the object waits for this copy instead. While the disk refuses copies such a fetch
        returns None at once too: a GET whose bytes cannot be kept serves no read."""
        part = self._part(url)
        while True:
            if not self.writable():
                if seen is not None:
                    self._give_back(url, reserved)
                    return None
                return self._direct(url, miss, reserved)
            try:
                fd = claim_file(part)
            except OSError as e:  # the folder's disk refused even the claim's empty file
                self._disk_refused(part, e)
                continue
            if fd is not None:
                return self._fetch_into(url, part, fd, miss, reserved, seen)
            data = self._found(url, reserved)  # published while we looked
            if data is not None:
                return data
            storage.check_store_up(url, "a copy another process fetches")  # it retries; we give up with it
            time.sleep(POLL_S)

    def _found(self, url: str, reserved: bool) -> bytes | None:
        """A whole copy's bytes, another's, with a reservation made for it given back; None if none."""
        data = self._read_copy(url)
        if data is not None and reserved:
            self.release(len(data))
        return data

    def _give_back(self, url: str, reserved: bool) -> None:
        """No fetch after all: the reservation made for the object, if any, is given back."""
        if reserved:
            self.release(int(self.objects[url]["size"]))

    def _part(self, url: str) -> Path:
        path = self.path(url)
        return path.with_name(path.name + ".part")

    def _fetch_into(self, url: str, part: Path, fd: int, miss: bool, reserved: bool,
                    seen: int | None = None) -> bytes | None:
        """Holding the claim ``fd`` on ``part``: fetch, check, and publish by renaming ``part``
        (None: a reader's GET since ``seen``, see :meth:`fetch`)."""
        try:
            data = self._found(url, reserved)
            if data is not None:  # published between our look and our claim
                self._unlink(part)
                return data
            if seen is not None and self._reader_gets[self._number[url]] != seen:
                self._unlink(part)
                self._give_back(url, reserved)
                return None
            if seen is None:  # a reader's GET (counted under the claim: one writer per object)
                self._reader_gets[self._number[url]] += 1
            data = storage.get_object(url)
            self._check(url, data)
            if reserved or self.reserve(len(data)):
                if not self._publish(url, part, fd, data):
                    self.release(len(data))  # nothing kept: the reservation is given back
            else:  # not kept: the budget is full
                self._unlink(part)
        except BaseException:
            self._unlink(part)
            raise
        finally:
            os.close(fd)
        if miss:
            storage.count("misses")
        return data

    def _publish(self, url: str, part: Path, fd: int, data: bytes) -> bool:
        """Write ``data`` into the claimed ``part`` and rename it to the copy's name; False
        when the disk refused (the bytes are in memory already: a copy is a saving, never a
        reason to fail a read)."""
        try:
            os.ftruncate(fd, 0)  # a dead claimer may have left part of a file here
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.replace(part, self.path(url))  # still claimed: nobody else writes this name meanwhile
            return True
        except OSError as e:
            self._unlink(part)
            self._disk_refused(part, e)
            return False

    def _direct(self, url: str, miss: bool, reserved: bool) -> bytes:
        """The object's bytes while the disk refuses copies: a copy already there, else one GET
        kept in memory only; a reservation made for it is given back."""
        data = self._found(url, reserved)
        if data is not None:
            return data
        self._reader_gets[self._number[url]] += 1  # no claim here: two readers may race; a count that moved is all it tells
        data = storage.get_object(url)
        self._check(url, data)
        if reserved:
            self.release(len(data))
        if miss:
            storage.count("misses")
        return data

    def writable(self) -> bool:
        """False for DISK_RETRY_S after the copies' disk refused a write."""
        return time.monotonic() >= self._refused_until.value

    def _disk_refused(self, path: Path, error: OSError) -> None:
        """Stop copying for DISK_RETRY_S; said once per refusal, by the process that met it,
        with the folder's disk and its free space: the disk is named, not an image."""
        was_writable = self.writable()
        self._refused_until.value = time.monotonic() + DISK_RETRY_S
        if was_writable:
            try:
                usage = shutil.disk_usage(self.folder)
                space = f"{mib(usage.free)} free of {mib(usage.total)}"
            except OSError:
                space = "free space unknown"
            log.warning("read-ahead copies: writing %s failed (%s, errno %s) on the disk of %s (%s); no copy is kept "
                        "for %g s: reads go to the store directly and the run goes on. Free space there or point "
                        "dataset.remote.cache_dir at a larger disk", path.name,
                        error.strerror or error, error.errno, self.folder, space, DISK_RETRY_S)

    def _check(self, url: str, data: bytes) -> None:
        """The listing's size, always; the MD5 where the ETag is one. A single-part upload's
        ETag is the MD5 of its bytes, except under SSE-KMS or SSE-C, whose ETags look the same
        (32 hex digits) but are not. So an MD5 that differs is settled by one HEAD: the same
        ETag as listed means the object did not change and this store's ETags are not MD5s
        (sizes only from then on, in this process); another ETag means it changed."""
        want = self.objects[url]
        etag = want["etag"]
        changed = len(data) != want["size"]
        if not changed and self._etags_are_md5 and re.fullmatch(r"[0-9a-f]{32}", etag) and \
                hashlib.md5(data, usedforsecurity=False).hexdigest() != etag:
            changed = storage.object_info(url)["etag"] != etag
            if not changed:
                self._etags_are_md5 = False
                log.info("%s: its ETag is not the MD5 of its bytes (SSE-KMS or SSE-C): copies from this store are "
                         "checked by their size", url)
        if changed:
            raise storage.StoreError(f"{url}: read {len(data)} bytes that do not match the listing ({want['size']} "
                                     f"bytes, ETag {etag}); the object changed during the run: start it again")

    def _read_copy(self, url: str) -> bytes | None:
        """A whole copy's bytes, or None (no copy, or one whose size is not the listing's: an
        earlier run's, cut short; the next fetch replaces it)."""
        try:
            data = self.path(url).read_bytes()
        except FileNotFoundError:
            return None
        return data if len(data) == self.objects[url]["size"] else None

    def evict(self, url: str) -> None:
        """Remove the copy and its bytes from the count."""
        try:
            size = self.path(url).stat().st_size
            self.path(url).unlink()
        except FileNotFoundError:
            return
        self.release(size)

    def close(self) -> None:
        """Give up the folder's claim (``read_ahead/budget.py:split_folder``): another run may use it."""
        claim, self.folder_claim = getattr(self, "folder_claim", None), None
        if claim is not None:
            os.close(claim)

    def held(self, url: str) -> bool:
        return self.path(url).exists()

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
