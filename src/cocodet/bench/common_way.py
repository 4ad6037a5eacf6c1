"""The same train recipe built the common way, as the reference the loader is measured against.

What most detection codebases do: PIL decode of every image a sample needs (four for a
mosaic, partners drawn from the whole dataset), one float32 CHW tensor per sample, a target
dict per sample and a list-of-dicts collate (torchvision's references: ``tuple(zip(*batch))``).
The recipe itself is this project's ``Mosaic``, so only the loading differs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.data
from PIL import Image

from cocodet.data.augment import Recipe
from cocodet.data.coco import CocoIndex


class CommonWayDataset(torch.utils.data.Dataset):
    def __init__(self, index: CocoIndex, recipe: Recipe, seed: int = 0):
        self.index, self.recipe, self.seed = index, recipe, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.index)

    def _raw(self, k: int):
        with Image.open(str(self.index.paths[k])) as im:
            image = np.asarray(im.convert("RGB"))
        boxes, labels = self.index.targets(k)
        return image, np.array(boxes), np.array(labels)

    def __getitem__(self, i: int):
        rng = np.random.default_rng((self.seed, self.epoch, i))
        partners = [self._raw(int(rng.integers(len(self.index)))) for _ in range(self.recipe.partners(rng))]
        out = self.recipe(self._raw(i), rng, partners)
        image = torch.from_numpy(np.ascontiguousarray(out.image)).permute(2, 0, 1).float().div(255.0)
        target = {"boxes": torch.from_numpy(out.boxes), "labels": torch.from_numpy(out.labels),
                  "image_id": torch.tensor(int(self.index.image_ids[i]))}
        return image, target


def list_collate(batch):
    return tuple(zip(*batch))


def common_way_loader(index: CocoIndex, recipe: Recipe, batch_size: int, num_workers: int,
                      seed: int = 0) -> torch.utils.data.DataLoader:
    kwargs = dict(persistent_workers=True, prefetch_factor=2) if num_workers else {}
    return torch.utils.data.DataLoader(CommonWayDataset(index, recipe, seed), batch_size=batch_size, shuffle=True,
                                       num_workers=num_workers, collate_fn=list_collate,
                                       generator=torch.Generator().manual_seed(seed), **kwargs)
