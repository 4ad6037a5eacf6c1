"""The node-local copies of remote objects that the read-ahead fills (``dataset.remote.cache_dir``).

One file per object version: ``<sha256(url)[:24]>-<ETag>``, so a changed object is never
served from an older copy. Every file is written by the one holder of its claim, an ``flock`` on
``<name>.part`` (``storage/claims.py``: held by a live process, taken over at once from a dead
one, never decided by a clock), checked against the listing's size (and its MD5 where the
store's ETags are MD5s, see ``read_ahead/listing_check.py``), then renamed into place while the
claim is held: a reader sees a whole file or none, and a copy whose size is not the listing's
is never served. A worker that finds no copy waits for the claimer if the object is being
fetched, else claims and fetches it itself (a *miss*, counted), so an object is fetched once
however many workers and the read-ahead thread want it.

The budget is one counter in shared memory, which the rank's workers inherit: a copy is
published only after its bytes were reserved there, so the folder never holds more than the
budget, even when a worker runs ahead of the read-ahead (its copy is then not kept). Beside it,
each object's count of GETs made by readers (``read_ahead/reader_gets.py``), and whether the
disk takes copies (``read_ahead/disk_refusal.py``), also inherited. The read-ahead thread
(``read_ahead/fetcher.py:ReadAhead``) alone evicts. Ranks on one host share ``cache_dir``, each in
a folder of its own (``local-rank-N``) with its share of ``cache_bytes``: no rank evicts what
another counts.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

import numpy as np

from cocodet.read_ahead.budget import HeldBytes
from cocodet.read_ahead.disk_refusal import DiskRefusal
from cocodet.read_ahead.listing_check import ListingCheck
from cocodet.read_ahead.reader_gets import ReaderGets
from cocodet.storage import store as storage
from cocodet.storage.claims import claim_file
from cocodet.storage.session import check_store_up, count

POLL_S = 0.005  # how often a waiting reader looks for a copy another process is writing


class ObjectCache:
    """Copies of this split's objects in ``folder``. ``objects``: URL -> ``{"size", "etag"}``
    (one listing); only those objects go through the cache."""

    def __init__(self, folder: str | os.PathLike, objects: dict[str, dict], budget: int):
        self.folder = Path(os.path.expanduser(str(folder)))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.objects, self.budget = objects, int(budget)
        self._paths: dict[str, Path] = {}
        self._held = HeldBytes()  # bytes of the copies in the folder and of the fetches under way
        self._disk = DiskRefusal(self.folder)
        self._check = ListingCheck(objects).check  # raises on bytes that are not the listing's
        self._reader_gets = ReaderGets(objects)
        for stale in self.folder.glob("*.part"):  # a dead claimer's leftovers; a live one's claim is kept
            fd = claim_file(stale)
            if fd is not None:
                stale.unlink(missing_ok=True)
                os.close(fd)

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes if they fit in the budget."""
        return self._held.reserve(size, self.budget)

    def release(self, size: int) -> None:
        self._held.release(size)

    def held_bytes(self) -> int:
        return self._held.value()

    def path(self, url: str) -> Path:
        found = self._paths.get(url)
        if found is None:  # named once per object and process: a worker asks for it on every read
            etag = re.sub(r"[^A-Za-z0-9]", "", self.objects[url]["etag"])[:40]
            found = self._paths[url] = (
                self.folder / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}-{etag or 'noetag'}"
            )
        return found

    def read(self, url: str) -> bytes | None:
        """The object's bytes from its copy (a hit), from a copy another process is writing
        (waited for), or fetched here and published (a miss); None for an object not listed."""
        if url not in self.objects:
            return None
        data = self._read_copy(url)
        if data is None:
            return self.fetch(url, miss=True)
        count("cache_hits")
        return data

    def reader_gets(self) -> np.ndarray:
        """[len(objects)] the GETs each object has had from readers so far (a copy), in the order
        of ``objects``: what a read-ahead fetch passes back as ``seen``."""
        return self._reader_gets.snapshot()

    def number(self, url: str) -> int:
        """The object's place in ``objects`` (its entry in :meth:`reader_gets`)."""
        return self._reader_gets.number(url)

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
                self._disk.refused(part, e)
                continue
            if fd is not None:
                return self._fetch_into(url, part, fd, miss, reserved, seen)
            data = self._found(url, reserved)  # published while we looked
            if data is not None:
                return data
            check_store_up(url, "a copy another process fetches")  # it retries; we give up with it
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

    def _fetch_into(
        self, url: str, part: Path, fd: int, miss: bool, reserved: bool, seen: int | None = None
    ) -> bytes | None:
        """Holding the claim ``fd`` on ``part``: fetch, check, and publish by renaming ``part``
        (None: a reader's GET since ``seen``, see :meth:`fetch`)."""
        try:
            data = self._found(url, reserved)
            if data is not None:  # published between our look and our claim
                part.unlink(missing_ok=True)
                return data
            if seen is not None and self._reader_gets.moved(url, seen):
                part.unlink(missing_ok=True)
                self._give_back(url, reserved)
                return None
            if seen is None:  # a reader's GET (counted under the claim: one writer per object)
                self._reader_gets.add(url)
            data = storage.get_object(url)
            self._check(url, data)
            if reserved or self.reserve(len(data)):
                if not self._publish(url, part, fd, data):
                    self.release(len(data))  # nothing kept: the reservation is given back
            else:  # not kept: the budget is full
                part.unlink(missing_ok=True)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        if miss:
            count("misses")
        return data

    def _publish(self, url: str, part: Path, fd: int, data: bytes) -> bool:
        """Write ``data`` into the claimed ``part`` and rename it to the copy's name; False
        when the disk refused (the bytes are in memory already: a copy is a saving, never a
        reason to fail a read)."""
        try:
            os.ftruncate(fd, 0)  # a dead claimer may have left part of a file here
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.replace(part, self.path(url))  # still claimed: nobody else writes this name meanwhile
            return True
        except OSError as e:
            part.unlink(missing_ok=True)
            self._disk.refused(part, e)
            return False

    def _direct(self, url: str, miss: bool, reserved: bool) -> bytes:
        """The object's bytes while the disk refuses copies: a copy already there, else one GET
        kept in memory only; a reservation made for it is given back."""
        data = self._found(url, reserved)
        if data is not None:
            return data
        self._reader_gets.add(url)  # no claim here: two readers may race; a count that moved is all it tells
        data = storage.get_object(url)
        self._check(url, data)
        if reserved:
            self.release(len(data))
        if miss:
            count("misses")
        return data

    def writable(self) -> bool:
        """False for DISK_RETRY_S (``read_ahead/disk_refusal.py``) after the copies' disk refused a write."""
        return self._disk.writable()

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
