"""How many slots the window cache gets (``data/window_cache.py``; design §5): enough for the
window and the positions in flight, within the memory the workers leave this rank. The slots
change how often a partner is read instead of decoded, never which partner it is.

The cache lives in anonymous shared memory (a memfd), not in /dev/shm: a container's 64 MB
shm stays for the batches in flight, and the memory it takes is counted here, against the
same room the workers' footprints and queues are planned in.
"""

from __future__ import annotations

import numpy as np

from cocodet.loader.budget import Budget, LoaderDraft, worker_memory
from cocodet.units import MiB

# A slot's header (the cache's layout, ``data/window_cache.py``, reads and writes it): 64 bytes.
SLOT_HEADER = np.dtype([("gen", "<i8"), ("index", "<i8"), ("size", "<i8"), ("h", "<i8"), ("w", "<i8"),
                        ("orig_h", "<i8"), ("orig_w", "<i8"), ("scale", "<f8")])


def slot_pixels(side: int) -> int:
    """One slot's pixel area, for images whose long side is ``side``."""
    return side * side * 3


def slot_bytes(side: int) -> int:
    """One slot: its pixel area and its header."""
    return slot_pixels(side) + SLOT_HEADER.itemsize


def window_slots(window: int, side: int, batch_size: int, train: LoaderDraft, budget: Budget) -> tuple[int, str]:
    """(slots, why): the window plus every position the workers may hold in flight (each worker
    its prefetched batches, and the batch the main process holds), capped by the memory left
    after the workers; 0 (no cache: every partner decodes) when not even one slot fits."""
    in_flight = (max(1, train.workers) * train.prefetch + 1) * batch_size
    want = window + in_flight
    room = budget.mem_room - worker_memory(train.workers, train.prefetch, budget)
    fit = max(0, room // slot_bytes(side))
    slots = min(want, fit)
    why = (f"partner_window {window} + {in_flight} positions in flight ((workers {max(1, train.workers)} x prefetch "
           f"{train.prefetch} + 1) x batch {batch_size}) = {want} slots of {slot_bytes(side) / MiB:.2f} MiB")
    if slots < want:
        why += f"; {fit} fit the {max(0, room) / MiB:.0f} MiB of memory the workers leave: fewer partners are read, more decoded"
    return slots, why
