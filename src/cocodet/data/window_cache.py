"""The window cache: decoded images of the last positions of one rank's epoch order, shared by
the main process and its DataLoader workers, so a window partner (``data/dataset.py``) is
read instead of decoded again.

Layout, one anonymous shared-memory file (``memfd``: not /dev/shm, whose 64 MB a container
keeps for the batches in flight): ``slots`` headers of 64 bytes, then ``slots`` pixel areas of
side x side x 3 bytes. Position p of the epoch order lives in slot p % slots, keyed by the
dataset index and the working size (never by file path: a split may name one file twice), so
a window of W positions maps to W distinct slots while slots >= W + the positions in flight.

- Readers map the file read-only: what :meth:`WindowCache.get` returns is a read-only view,
  so a recipe can never write into shared pixels (``letterbox_resize`` returns its input when
  no resize is needed; a write raises). The view is checked after use (:meth:`intact`): the
  dataset builds the sample, then redoes it if a slot it read was rewritten meanwhile. A copy
  would cost a 1.2 MB memcpy per partner; the check costs one integer read.
- Writers hold a claim on the slot (``storage/claims.py``: a lock held by a live process; a
  writer killed mid-write loses it at once) and write through their own writable map, the
  resize writing straight into the slot (:meth:`WindowCache.publishing`), inside a seqlock:
  the slot's generation is odd while it is written, and a reader that sees it odd, or changed
  between its read and its check, has a miss. A slot is never read torn.
- A miss decodes and publishes; a hit returns exactly the pixels a decode would. The cache
  changes the speed, never the stream.
- A writer names the image it writes in the slot's header when it claims the slot. A reader
  that wants that image waits for the writer instead of decoding it too (a partner that
  another worker's sample is decoding right now): at most ``wait_s`` (:data:`WAIT_S`), polling
  the claim, which a writer killed mid-write loses at once, so the reader then claims the
  slot and decodes itself. A reader waits holding no claim (it claims one slot at a time and
  releases it before its next read), so no two processes wait on each other.

Workers reach the file through fork (the descriptor and the map are inherited). A process that
gets the dataset by pickling (spawn) has no cache: every read decodes, with the same pixels.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import time

import numpy as np

from cocodet.storage.claims import SlotClaims
from cocodet.window_slot import SLOT_HEADER as HEADER
from cocodet.window_slot import slot_pixels

PAGE = mmap.PAGESIZE
# How long a reader waits for another live process writing the image it wants into the slot,
# before it decodes that image itself: far above one decode (milliseconds at COCO sizes), so
# it only ends the wait for a writer that is stuck, never for one that is slow.
WAIT_S = 2.0
POLL_S = (0.0001, 0.001)  # the first and the longest pause between two looks at a held claim


def cache_bytes(slots: int, side: int) -> int:
    return _pixels_at(slots) + slots * slot_pixels(side)


def _pixels_at(slots: int) -> int:
    return -(-slots * HEADER.itemsize // PAGE) * PAGE


class WindowCache:
    """``slots`` images of at most ``side`` x ``side`` (the working size); :meth:`get` and
    :meth:`put` by (position, dataset index)."""

    def __init__(self, slots: int, side: int, wait_s: float = WAIT_S):
        self.slots, self.side, self.wait_s = slots, side, wait_s
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("cocodet-window-cache")
        else:  # no memfd (not Linux): an unlinked temporary file, its pages in the page cache
            self._file = tempfile.TemporaryFile(prefix="cocodet-window-cache-")
            self.fd = os.dup(self._file.fileno())
        os.ftruncate(self.fd, cache_bytes(slots, side))
        self._open()

    def _open(self) -> None:
        self.map = mmap.mmap(self.fd, cache_bytes(self.slots, self.side), access=mmap.ACCESS_READ)
        self.headers = np.frombuffer(self.map, HEADER, count=self.slots)
        self._writable = mmap.mmap(self.fd, cache_bytes(self.slots, self.side), access=mmap.ACCESS_WRITE)
        self._write_headers = np.frombuffer(self._writable, HEADER, count=self.slots)
        self.claims = SlotClaims(self.fd)
        self.hits = self.misses = 0  # this process's reads
        self.waits = self.waits_timed_out = 0  # this process's waits for another's writer, and those it gave up

    def __getstate__(self):  # spawn: the descriptor does not travel; that process decodes every read
        return {"slots": self.slots, "side": self.side}

    def __setstate__(self, state):
        self.slots, self.side, self.fd, self.map, self.headers = state["slots"], state["side"], None, None, None
        self._writable = self._write_headers = None
        self.wait_s = WAIT_S
        self.hits = self.misses = self.waits = self.waits_timed_out = 0

    def get(
        self, position: int, index: int, copy: bool = False
    ) -> tuple[np.ndarray, tuple[int, int], float, tuple] | None:
        """(the pixels, stored (h, w), scale stored -> working, a token for :meth:`intact`) of
        dataset image ``index`` if the slot of ``position`` holds it whole; None (a miss)
        otherwise. The pixels are a read-only view into the slot (``copy``: a copy, checked
        here), valid for as long as :meth:`intact` says so."""
        if self.map is None:
            return None
        slot = position % self.slots
        header = self.headers[slot]
        gen = int(header["gen"])
        if gen == 0 or gen & 1 or int(header["index"]) != index or int(header["size"]) != self.side:
            self.misses += 1
            return None
        h, w = int(header["h"]), int(header["w"])
        orig_hw, scale = (int(header["orig_h"]), int(header["orig_w"])), float(header["scale"])
        image = self._pixels(slot, h, w, writable=False)
        if copy:
            image = image.copy()
        if not self.intact((slot, gen)):  # rewritten while read
            self.misses += 1
            return None
        self.hits += 1
        return image, orig_hw, scale, (slot, gen)

    def intact(self, token: tuple[int, int]) -> bool:
        """Whether the slot a :meth:`get` read (its ``token``) still holds what it held then."""
        slot, gen = token
        return self.map is not None and int(self.headers[slot]["gen"]) == gen

    def _pixels(self, slot: int, h: int, w: int, writable: bool) -> np.ndarray:
        at = _pixels_at(self.slots) + slot * slot_pixels(self.side)
        return np.frombuffer(self._writable if writable else self.map, np.uint8, count=h * w * 3, offset=at).reshape(
            h, w, 3
        )

    @contextlib.contextmanager
    def publishing(self, position: int, index: int):
        """Claim the slot of ``position`` for image ``index`` and mark it being written, naming
        ``index`` there; yields a :class:`Publishing`, or None: the slot holds ``index`` whole now
        (another process published it, or was writing it and was waited for: :meth:`get` reads
        it), another live process holds the slot for another image or kept writing this one for
        ``wait_s``, or no cache here. The claim is released on leaving, whatever happens; a slot
        left unfinished stays a miss. The caller holds no other claim of this cache (see
        :meth:`_claim`)."""
        slot = position % self.slots
        if self.map is None or not self._claim(slot, index):
            yield None
            return
        try:
            if self._holds(slot, index):  # published since the caller's miss: nothing to write
                yield None
            else:
                gen = int(self.headers[slot]["gen"])
                writing = gen + 1 if gen % 2 == 0 else gen  # odd: a writer died here; the slot is ours now
                headers = self._write_headers
                headers["gen"][slot] = writing
                # What is being written, for a reader that wants it (_claim); readers never take it
                # for the slot's content while the generation is odd.
                headers["index"][slot], headers["size"][slot] = index, self.side
                yield Publishing(self, slot, index, writing)
        finally:
            self.claims.release(slot)

    def _claim(self, slot: int, index: int) -> bool:
        """Claim ``slot``; while another live process holds it writing image ``index`` (the
        header names it and the generation is odd), wait for that writer, at most ``wait_s``:
        its pixels are those a decode here would give, so waiting saves a decode (and, from a
        bucket, a GET). False, at once, when the holder writes another image, or after
        ``wait_s``. A writer killed mid-write loses the claim at once: the wait ends then with
        the claim ours and the slot unfinished. No deadlock: a process waits here holding no
        claim of this cache, and a holder waits on none while it writes."""
        if self.claims.try_claim(slot):
            return True
        deadline, pause = None, POLL_S[0]
        while True:
            header = self.headers[slot]
            if int(header["gen"]) & 1 and (int(header["index"]) != index or int(header["size"]) != self.side):
                return False  # another image being written: nothing to wait for
            # Otherwise a writer of this image, or one between its claim and its mark or between
            # its last write and its release (microseconds): wait.
            if deadline is None:
                self.waits += 1
                deadline = time.monotonic() + self.wait_s
            elif time.monotonic() >= deadline:
                self.waits_timed_out += 1
                return False
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])
            if self.claims.try_claim(slot):
                return True

    def _holds(self, slot: int, index: int) -> bool:
        header = self.headers[slot]
        gen = int(header["gen"])
        return gen != 0 and not gen & 1 and int(header["index"]) == index and int(header["size"]) == self.side

    def put(self, position: int, index: int, image: np.ndarray, orig_hw: tuple[int, int], scale: float) -> bool:
        """Publish a copy of image ``index`` read at ``position``; False (nothing written) when
        the slot holds it already, another live process is writing that slot (for ``wait_s`` at
        most when it writes this image), or the image does not fit a slot."""
        with self.publishing(position, index) as slot:
            return slot is not None and slot.done(image, orig_hw, scale) is not None

    def close(self) -> None:
        """Unmap and close (a view still held elsewhere keeps the map until it is freed)."""
        if self.map is not None:
            self.headers = self._write_headers = None
            for view_map in (self.map, self._writable):
                try:
                    view_map.close()
                except BufferError:  # a sample still holds a view: the map goes when the last view does
                    pass
            self.map = self._writable = None
            os.close(self.fd)


class Publishing:
    """One claimed slot being written: :meth:`pixels` gives where a resize writes, :meth:`done`
    finishes the slot and returns what readers will read."""

    def __init__(self, cache: WindowCache, slot: int, index: int, writing: int):
        self.cache, self.slot, self.index, self.writing = cache, slot, index, writing

    def pixels(self, h: int, w: int) -> np.ndarray | None:
        """The slot's h x w x 3 pixels, writable (None: larger than a slot)."""
        return self.cache._pixels(self.slot, h, w, writable=True) if max(h, w) <= self.cache.side else None

    def done(self, image: np.ndarray, orig_hw: tuple[int, int], scale: float) -> tuple[np.ndarray, tuple] | None:
        """Finish the slot with ``image`` (copied in unless the resize wrote it there already):
        (a read-only view of it, its token), or None when it does not fit a slot."""
        h, w = image.shape[:2]
        if max(h, w) > self.cache.side or image.dtype != np.uint8:
            return None
        target = self.cache._pixels(self.slot, h, w, writable=True)
        if not np.shares_memory(image, target):
            target[...] = image
        headers = self.cache._write_headers
        for name, value in zip(
            ("index", "size", "h", "w", "orig_h", "orig_w", "scale"),
            (self.index, self.cache.side, h, w, *orig_hw, scale),
        ):
            headers[name][self.slot] = value
        headers["gen"][self.slot] = self.writing + 1  # last: the slot is whole
        return self.cache._pixels(self.slot, h, w, writable=False), (self.slot, self.writing + 1)
