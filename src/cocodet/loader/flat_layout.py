"""FlatBatch's layout in numbers, without torch: what the loader plan budgets (design §3, §4).

Kept apart from ``flat_batch`` so that ``mode=plan`` can size workers without importing torch.
"""

from __future__ import annotations

PAD_MULTIPLE = 32  # image height and width are padded to a multiple of this
STATS_COLUMNS = ("read_s", "decode_s", "augment_s", "collate_s", "pad_share", "decodes")


def round_up(x: int, m: int = PAD_MULTIPLE) -> int:
    return -(-x // m) * m


def batch_bytes(batch_size: int, image_size: int, boxes_per_image: int = 100) -> int:
    """Bytes of one transported FlatBatch at a square ``image_size`` (what the shm cap budgets)."""
    side = round_up(image_size)
    per_image = (3 * side * side + 2 * 8 + 8 + 3 * 8 + 3 * 4 + len(STATS_COLUMNS) * 8
                 + boxes_per_image * (4 * 4 + 8))
    return batch_size * per_image
