"""The same train recipe built the common way, as the reference the loader is measured against.

What most detection codebases do: PIL decode of every image a sample needs (four for a
mosaic, partners drawn from the whole dataset), one float32 CHW tensor per sample, a target
dict per sample and a list-of-dicts collate (torchvision's references: ``tuple(zip(*batch))``).
The recipe itself is this project's ``Mosaic``, so only the loading differs. One thing it
keeps of cocodet: the header is checked (size limit, annotated size) before PIL opens a file,
so a decompression bomb costs this baseline nothing either.
"""

from __future__ import annotations

import io

import numpy as np
import torch
import torch.utils.data
from PIL import Image

from cocodet.datasets.index import CocoIndex
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS, check_header
from cocodet.storage.store import read_bytes
from cocodet.transforms.recipe import Recipe


class CommonWayDataset(torch.utils.data.Dataset):
    def __init__(self, index: CocoIndex, recipe: Recipe, seed: int = 0, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS):
        self.index, self.recipe, self.seed, self.max_pixels = index, recipe, seed, max_pixels
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.index)

    def _raw(self, k: int):
        data = read_bytes(str(self.index.paths[k]))
        # ValueError before PIL allocates anything (PIL's own bomb check only warns below 2x its limit).
        check_header(data, (int(self.index.sizes[k][0]), int(self.index.sizes[k][1])), self.max_pixels)
        with Image.open(io.BytesIO(data)) as im:
            image = np.asarray(im.convert("RGB"))
        boxes, labels = self.index.targets(k)
        return image, np.array(boxes), np.array(labels)

    def __getitem__(self, i: int):
        rng = np.random.default_rng((self.seed, self.epoch, i))
        partners = [self._raw(int(rng.integers(len(self.index)))) for _ in range(self.recipe.partners(rng))]
        out = self.recipe(self._raw(i), rng, partners)
        image = torch.from_numpy(np.ascontiguousarray(out.image)).permute(2, 0, 1).float().div(255.0)
        target = {
            "boxes": torch.from_numpy(out.boxes),
            "labels": torch.from_numpy(out.labels),
            "image_id": torch.tensor(int(self.index.image_ids[i])),
        }
        return image, target


def list_collate(batch):
    return tuple(zip(*batch))


def common_way_loader(
    index: CocoIndex,
    recipe: Recipe,
    batch_size: int,
    num_workers: int,
    seed: int = 0,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> torch.utils.data.DataLoader:
    kwargs = dict(persistent_workers=True, prefetch_factor=2) if num_workers else {}
    return torch.utils.data.DataLoader(
        CommonWayDataset(index, recipe, seed, max_pixels),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=list_collate,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
