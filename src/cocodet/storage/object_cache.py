"""The node-local copies of remote objects that the read-ahead fills (``dataset.remote.cache_dir``).

One file per object version: ``<sha256(url)[:24]>-<ETag>``, so a changed object is never
served from an older copy. Every file is written by the one process that claimed it, under
``<name>.part`` (created with ``O_EXCL``), checked against the listing's size (and, for a
single-part upload, whose ETag is the MD5 of its bytes, against the ETag), then renamed into
place: a reader sees a whole file or none. A worker that finds no copy waits for the claimer
if the object is being fetched, else claims and fetches it itself (a *miss*, counted), so an
object is fetched once however many workers and the prefetcher want it.

The budget is one counter in shared memory, which the rank's workers inherit: a copy is
published only after its bytes were reserved there, so the folder never holds more than the
budget, even when a worker runs ahead of the read-ahead (its copy is then not kept). The
prefetcher (``storage/prefetch.py``) alone evicts. Ranks on one host share ``cache_dir``, each in
a folder of its own (``local-rank-N``) with its share of ``cache_bytes``: no rank evicts what
another counts.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from cocodet.storage import store as storage

POLL_S = 0.005  # how often a waiting reader looks for a copy another process is writing


class ObjectCache:
    """Copies of this split's objects in ``folder``. ``objects``: URL -> ``{"size", "etag"}``
    (one listing); only those objects go through the cache."""

    def __init__(self, folder: str | os.PathLike, objects: dict[str, dict], budget: int):
        import multiprocessing

        self.folder = Path(os.path.expanduser(str(folder)))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.objects, self.budget = objects, int(budget)
        self._paths: dict[str, Path] = {}
        self._held = multiprocessing.Value("q", 0)  # bytes of the copies in the folder (and reserved for)
        for stale in self.folder.glob("*.part"):  # claims of a run that died: no process of this rank is running
            self._unlink(stale)

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes if they fit in the budget."""
        with self._held.get_lock():
            if self._held.value + size > self.budget:
                return False
            self._held.value += size
            return True

    def release(self, size: int) -> None:
        with self._held.get_lock():
            self._held.value -= size

    def held_bytes(self) -> int:
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
        path = self.path(url)
        try:
            data = self._read_copy(path)
        except FileNotFoundError:
            return self.fetch(url, miss=True)
        storage.count("cache_hits")
        return data

    def fetch(self, url: str, miss: bool = False, reserved: bool = False) -> bytes:
        """Fetch the object unless another process is doing so, and publish it if its bytes
        were ``reserved`` (the prefetcher) or fit now (a worker's miss); then its bytes."""
        path = self.path(url)
        deadline = time.monotonic() + storage.settings().timeout_s + storage.settings().give_up_s
        while True:
            claim = self._claim(path)
            if claim is not None:
                return self._fetch_into(url, path, claim, miss, reserved)
            try:
                return self._read_copy(path)  # published while we looked
            except FileNotFoundError:
                pass
            storage.check_store_up(url, "a copy another process fetches")  # it retries; we give up with it
            if time.monotonic() > deadline:  # the claimer died: its .part is stale
                self._unlink(path.with_name(path.name + ".part"))
                deadline = time.monotonic() + storage.settings().timeout_s + storage.settings().give_up_s
            time.sleep(POLL_S)

    def _claim(self, path: Path) -> int | None:
        try:
            return os.open(path.with_name(path.name + ".part"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None

    def _fetch_into(self, url: str, path: Path, fd: int, miss: bool, reserved: bool) -> bytes:
        part = path.with_name(path.name + ".part")
        try:
            if path.exists():  # published between our look and our claim
                os.close(fd)
                self._unlink(part)
                return self._read_copy(path)
            data = storage.get_object(url)
            self._check(url, data)
            with os.fdopen(fd, "wb") as f:
                if reserved or self.reserve(len(data)):
                    f.write(data)
                    f.close()
                    os.replace(part, path)
            self._unlink(part)  # not kept: the budget is full
        except BaseException:
            self._unlink(part)
            raise
        if miss:
            storage.count("misses")
        return data

    def _check(self, url: str, data: bytes) -> None:
        """The listing's size, and the ETag where it is the MD5 of the bytes (single-part uploads)."""
        want = self.objects[url]
        etag = want["etag"]
        if len(data) != want["size"] or (re.fullmatch(r"[0-9a-f]{32}", etag)
                                          and hashlib.md5(data, usedforsecurity=False).hexdigest() != etag):
            raise storage.StoreError(f"{url}: read {len(data)} bytes that do not match the listing ({want['size']} "
                                     f"bytes, ETag {etag}); the object changed during the run: start it again")

    @staticmethod
    def _read_copy(path: Path) -> bytes:
        """A copy's bytes (FileNotFoundError when there is none): what storage.get_object wrote."""
        return path.read_bytes()

    def evict(self, url: str) -> None:
        """Remove the copy and its bytes from the count."""
        try:
            size = self.path(url).stat().st_size
            self.path(url).unlink()
        except FileNotFoundError:
            return
        self.release(size)

    def held(self, url: str) -> bool:
        return self.path(url).exists()

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
