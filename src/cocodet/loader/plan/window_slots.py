"""How many slots the window cache gets (``data/window_cache.py``; design §5): enough for the
window and the positions in flight, within the memory the workers leave this rank. The slots
change how often a partner is read instead of decoded, never which partner it is.

The cache lives in anonymous shared memory (a memfd), not in /dev/shm: a container's 64 MB
shm stays for the batches in flight, and the memory it takes is counted here, against the
same room the workers' footprints and queues are planned in.
"""

from __future__ import annotations

from cocodet.loader.plan.records import Window
from cocodet.window_slot import slot_bytes


def window_slots(window: int, in_flight: int, side: int, room: int) -> Window:
    """The window's positions plus those in flight, in slots of ``side`` px images, at most as
    many as fit ``room`` bytes (0, no cache, when not even one does: every partner decodes)."""
    want, slot = window + in_flight, slot_bytes(side)
    fit = max(0, room // slot)
    return Window(min(want, fit), want, fit, room, in_flight, slot)
