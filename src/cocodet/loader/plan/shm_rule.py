"""How much /dev/shm one rank's loaders may hold, stated once: half the free bytes, split between
the local ranks. The other half is left for whatever else on the host uses /dev/shm, and each
local rank plans alone, so each takes only its share.

The budget (``budget.py``) applies it, the plan's words (``reasons.py``) say it, and a pod's
requests (``pod_requests.py``) invert it: the size of /dev/shm whose share holds what a rank has
in flight.
"""

from __future__ import annotations

from cocodet.units import MiB


def rank_shm_share(free_bytes: int, local_ranks: int) -> int:
    """Bytes of ``free_bytes`` free /dev/shm that one of ``local_ranks`` ranks may hold."""
    return free_bytes // 2 // max(1, local_ranks)


def rank_shm_share_words(free_bytes: int, local_ranks: int) -> str:
    """The rule with its numbers, as the plan table says it."""
    return f"half of {free_bytes / MiB:.1f} MiB free shm / {local_ranks} ranks"


def shm_size_for_share(share_bytes: int, local_ranks: int, step: int) -> int:
    """The least /dev/shm size, in whole ``step`` bytes (at least one), whose rank share holds
    ``share_bytes``: ``rank_shm_share`` inverted. The share grows with the size, so the search
    doubles an upper bound and halves the gap."""
    low, high = 0, 1  # in steps; the answer is in (low, high]
    while rank_shm_share(high * step, local_ranks) < share_bytes:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if rank_shm_share(mid * step, local_ranks) >= share_bytes else (mid, high)
    return high * step
