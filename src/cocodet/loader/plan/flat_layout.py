"""FlatBatch's layout in numbers, without torch: what the loader plan budgets (design §3, §4).

Kept apart from ``flat_batch`` so that ``mode=plan`` can size workers without importing torch.
"""

from __future__ import annotations

from cocodet.loader.plan.records import BatchGeometry, RecipeShape

PAD_MULTIPLE = 32  # image height and width are padded to a multiple of this
# A sample's stage seconds (the recipe's split into geometry and colour), then the pad share and decodes.
STATS_COLUMNS = ("read_s", "decode_s", "geometry_s", "colour_s", "collate_s", "pad_share", "decodes")
STAGE_COLUMNS = STATS_COLUMNS[:4]  # what a sample's stage_seconds holds, in this order


def round_up(x: int, m: int = PAD_MULTIPLE) -> int:
    return -(-x // m) * m


def batch_bytes(batch_size: int, image_size: int, boxes_per_image: int = 100) -> int:
    """Bytes of one transported FlatBatch at a square ``image_size`` (what the shm cap budgets)."""
    side = round_up(image_size)
    per_image = 3 * side * side + 2 * 8 + 8 + 3 * 8 + 3 * 4 + len(STATS_COLUMNS) * 8 + boxes_per_image * (4 * 4 + 8)
    return batch_size * per_image


def batch_geometry(
    batch_size: int, val_batch_size: int | None, group_aspect_ratio, shape: RecipeShape
) -> BatchGeometry:
    """The train and val batches, in images and FlatBatch bytes, each at the largest image its
    recipe can produce (the reference presets: not dataset.image_size); ``group_aspect_ratio``
    resolved: ``preset`` is what the recipe's family uses (every torchvision reference recipe's
    --aspect-ratio-group-factor 3), and a grouping of square outputs is ignored, with a note."""
    batch, val = int(batch_size), int(val_batch_size) if val_batch_size else None
    val_bytes = batch_bytes(val or batch, shape.val_side) if val or shape.val_side != shape.train_side else None
    group, note = (shape.preset_grouping if group_aspect_ratio == "preset" else group_aspect_ratio), None
    if group_aspect_ratio != "preset" and group is not None and shape.square_outputs:
        group, note = (
            None,
            (
                f"loader.group_aspect_ratio={group_aspect_ratio} is ignored: mosaic's outputs are all "
                f"{shape.image_size}x{shape.image_size}, so every batch is one aspect ratio already"
            ),
        )
    return BatchGeometry(
        batch,
        batch_bytes(batch, shape.train_side),
        val_batch_size=val,
        val_batch_bytes=val_bytes,
        partner_pool=shape.partner_pool,
        partner_window=shape.partner_window,
        image_side=round_up(shape.train_side),
        val_image_side=round_up(shape.val_side),
        group_aspect_ratio=int(group) if group is not None else None,
        group_note=note,
        worker_working_bytes=shape.working_bytes,
    )
