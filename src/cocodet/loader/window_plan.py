"""How many slots the window cache gets (``data/window_cache.py``; design §5): enough for the
window and the positions in flight, within the memory the workers leave this rank. The slots
change how often a partner is read instead of decoded, never which partner it is.

The cache lives in anonymous shared memory (a memfd), not in /dev/shm: a container's 64 MB
shm stays for the batches in flight, and the memory it takes is counted here, against the
same room the workers' footprints and queues are planned in.
"""

from __future__ import annotations

from cocodet.loader.budget import Budget, Draft, worker_memory
from cocodet.units import MiB

HEADER_BYTES = 64  # a slot's header: generation, dataset index, size, h, w, stored h, w, scale


def slot_bytes(side: int) -> int:
    """One slot: a side x side x 3 image and its header."""
    return side * side * 3 + HEADER_BYTES


def window_slots(window: int, side: int, batch_size: int, train: Draft, budget: Budget) -> tuple[int, str]:
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
