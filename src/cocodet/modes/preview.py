"""mode=preview: PNG grids of real train batches, drawn from the restored FlatBatches (boxes and
class names on each image)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from cocodet.loader.flat_batch import restore, unrestore_uint8
from cocodet.loader.plan.records import LoaderPlan
from cocodet.modes.wiring import build_datamodule
from cocodet.run_spec.records import RunSpec


def preview(spec: RunSpec, plan: LoaderPlan, resources) -> dict:
    datamodule = build_datamodule(spec, plan)
    settings = spec.settings("preview")
    try:
        paths, batch_bins = render_previews(
            datamodule, spec.run_dir / "previews", batches=int(settings["batches"]), epoch=int(settings["epoch"])
        )
    finally:
        datamodule.teardown("preview")  # a remote root's read-ahead thread
    return {"mode": "preview", "pngs": [str(p) for p in paths], "batch_bins": batch_bins, **plan.summary()}


def draw_batch(images, targets, names: list[str], columns: int = 4, captions: list[str] | None = None) -> np.ndarray:
    """One RGB grid image: each restored image with its boxes and class names, its size (and
    ``captions``, e.g. its aspect-ratio bin) written in its corner and its edge outlined (the
    reference presets' images vary in size; the grid's black is the batch padding beyond them)."""
    tiles = []
    for k, (image, target) in enumerate(zip(unrestore_uint8(images), targets)):
        tile = np.ascontiguousarray(image.permute(1, 2, 0).cpu().numpy())
        h, w = tile.shape[:2]
        cv2.rectangle(tile, (0, 0), (w - 1, h - 1), (255, 255, 255), 1)
        caption = f"{h}x{w}" + (f" {captions[k]}" if captions else "")
        cv2.putText(tile, caption, (3, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (255, 255, 255), 1, cv2.LINE_AA)
        for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            colour = tuple(int(c) for c in np.random.default_rng(label).integers(64, 256, 3))
            cv2.rectangle(tile, (round(x1), round(y1)), (round(x2), round(y2)), colour, 1)
            cv2.putText(
                tile,
                names[label - 1],
                (round(x1), max(8, round(y1) - 2)),
                cv2.FONT_HERSHEY_SIMPLEX,
                0.3,
                colour,
                1,
                cv2.LINE_AA,
            )
        tiles.append(tile)
    h = max(t.shape[0] for t in tiles)
    w = max(t.shape[1] for t in tiles)
    rows = -(-len(tiles) // columns)
    grid = np.zeros((rows * h, columns * w, 3), dtype=np.uint8)
    for k, tile in enumerate(tiles):
        r, c = divmod(k, columns)
        grid[r * h : r * h + tile.shape[0], c * w : c * w + tile.shape[1]] = tile
    return grid


def render_previews(datamodule, out_dir: str | Path, batches: int = 2, epoch: int = 0) -> tuple[list[Path], list]:
    """``mode=preview``: the first ``batches`` train batches of ``epoch`` as PNG grids, through
    the configured datamodule (decode, augmentation, FlatBatch transport, restore); and, when
    batches are grouped by aspect ratio, each batch's bins (one per image, captioned on its tile)."""
    from cocodet.loader.grouped_sampler import aspect_groups

    k_factor = datamodule.group_aspect_ratio
    bins = aspect_groups(np.asarray(datamodule.train_index.sizes), k_factor) if k_factor else None
    batch_bins = []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    loader = datamodule.train_dataloader()
    loader.set_epoch(epoch)
    paths = []
    for k, flat in enumerate(loader):
        if k >= batches:
            break
        images, targets = restore(flat)
        captions = None
        if bins is not None:
            batch_bins.append([int(bins[i]) for i in flat.sample_keys[:, 1].tolist()])
            captions = [f"bin {b}" for b in batch_bins[-1]]
        grid = draw_batch(images, targets, datamodule.train_index.category_names, captions=captions)
        path = out_dir / f"batch_e{epoch}_{k:03d}.png"
        cv2.imwrite(str(path), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
        paths.append(path)
    return paths, batch_bins
