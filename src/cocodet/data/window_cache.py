"""The window cache: decoded images of the last positions of one rank's epoch order, shared by
the main process and its DataLoader workers, so a window partner (``data/dataset.py``) is
read instead of decoded again.

Layout, one anonymous shared-memory file (``memfd``: not /dev/shm, whose 64 MB a container
keeps for the batches in flight): ``slots`` headers of 64 bytes, then ``slots`` pixel areas of
side x side x 3 bytes. Position p of the epoch order lives in slot p % slots, keyed by the
dataset index and the working size (never by file path: a split may name one file twice), so
a window of W positions maps to W distinct slots while slots >= W + the positions in flight.

- Readers map the file read-only and copy what they read: a recipe can never write into
  shared pixels (``letterbox_resize`` returns its input when no resize is needed).
- Writers write with ``pwrite`` under a claim on the slot (``storage/claims.py``: a lock held
  by a live process; a writer killed mid-write loses it at once), a seqlock around the write:
  the slot's generation is odd while it is written, and a reader that sees it odd, or changed
  between before and after its copy, counts a miss. A slot is never read torn.
- A miss decodes and publishes; a hit returns exactly the pixels a decode would. The cache
  changes the speed, never the stream.

Workers reach the file through fork (the descriptor and the map are inherited). A process that
gets the dataset by pickling (spawn) has no cache: every read decodes, with the same pixels.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from cocodet.storage.claims import SlotClaims

HEADER = np.dtype([("gen", "<i8"), ("index", "<i8"), ("size", "<i8"), ("h", "<i8"), ("w", "<i8"),
                   ("orig_h", "<i8"), ("orig_w", "<i8"), ("scale", "<f8")])  # 64 bytes a slot
PAGE = mmap.PAGESIZE


def slot_bytes(side: int) -> int:
    """One slot's pixel area for images whose long side is ``side``."""
    return side * side * 3


def cache_bytes(slots: int, side: int) -> int:
    return _pixels_at(slots) + slots * slot_bytes(side)


def _pixels_at(slots: int) -> int:
    return -(-slots * HEADER.itemsize // PAGE) * PAGE


class WindowCache:
    """``slots`` images of at most ``side`` x ``side`` (the working size); :meth:`get` and
    :meth:`put` by (position, dataset index)."""

    def __init__(self, slots: int, side: int):
        self.slots, self.side = slots, side
        self.fd = os.memfd_create("cocodet-window-cache")
        os.ftruncate(self.fd, cache_bytes(slots, side))
        self._open()

    def _open(self) -> None:
        self.map = mmap.mmap(self.fd, cache_bytes(self.slots, self.side), access=mmap.ACCESS_READ)
        self.headers = np.frombuffer(self.map, HEADER, count=self.slots)
        self.claims = SlotClaims(self.fd)
        self.hits = self.misses = 0  # this process's reads

    def __getstate__(self):  # spawn: the descriptor does not travel; that process decodes every read
        return {"slots": self.slots, "side": self.side}

    def __setstate__(self, state):
        self.slots, self.side, self.fd, self.map, self.headers = state["slots"], state["side"], None, None, None
        self.hits = self.misses = 0

    def get(self, position: int, index: int) -> tuple[np.ndarray, tuple[int, int], float] | None:
        """(a copy of the pixels, stored (h, w), scale stored -> working) of dataset image
        ``index`` if the slot of ``position`` holds it whole; None (a miss) otherwise."""
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
        at = _pixels_at(self.slots) + slot * slot_bytes(self.side)
        image = np.frombuffer(self.map, np.uint8, count=h * w * 3, offset=at).reshape(h, w, 3).copy()
        if int(self.headers[slot]["gen"]) != gen:  # rewritten while copied
            self.misses += 1
            return None
        self.hits += 1
        return image, orig_hw, scale

    def put(self, position: int, index: int, image: np.ndarray, orig_hw: tuple[int, int], scale: float) -> bool:
        """Publish image ``index`` read at ``position``; False (nothing written) when another
        live process is writing that slot or the image is larger than a slot."""
        h, w = image.shape[:2]
        if self.map is None or max(h, w) > self.side or image.dtype != np.uint8:
            return False
        slot = position % self.slots
        if not self.claims.try_claim(slot):
            return False
        try:
            gen = int(self.headers[slot]["gen"])
            writing = gen + 1 if gen % 2 == 0 else gen  # odd: a writer died here; the slot is ours now
            header_at = slot * HEADER.itemsize
            os.pwrite(self.fd, np.int64(writing).tobytes(), header_at)
            os.pwrite(self.fd, np.ascontiguousarray(image).data, _pixels_at(self.slots) + slot * slot_bytes(self.side))
            fields = np.array([(writing, index, self.side, h, w, *orig_hw, scale)], HEADER)
            os.pwrite(self.fd, fields.tobytes()[8:], header_at + 8)
            os.pwrite(self.fd, np.int64(writing + 1).tobytes(), header_at)
        finally:
            self.claims.release(slot)
        return True

    def close(self) -> None:
        if self.map is not None:
            self.headers = None
            self.map.close()
            os.close(self.fd)
            self.map = None
