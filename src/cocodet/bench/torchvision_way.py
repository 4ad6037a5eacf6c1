"""The data path a user writes today with torchvision's public API for the reference's
``multiscale`` preset, as the baseline grouped batches are measured against
(``benchmarks/batch_padding.py``):

``torchvision.datasets.CocoDetection`` (PIL decode) wrapped by ``wrap_dataset_for_transforms_v2``,
the v2 transforms of ``references/detection/presets.py`` (shortest side, flip, float conversion,
box sanitising), a grouped batch sampler written from the reference's description (it is not
part of torchvision's API) and a list collate.

The sampler, as ``references/detection/group_by_aspect_ratio.py`` describes it: a shuffled
order is walked, each image joins its aspect-ratio bin's buffer, a full buffer is a batch; an
epoch has len(dataset) // batch_size batches, and when the walk ends short of that the fullest
unfinished buffers are completed by repeating images of their own bin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.utils.data


class ReferenceGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of indices from one aspect-ratio group each, the reference's way (see above)."""

    def __init__(self, groups: np.ndarray, batch_size: int, seed: int = 0):
        self.groups, self.batch_size, self.seed, self.epoch = np.asarray(groups), batch_size, seed, 0

    def __len__(self) -> int:
        return len(self.groups) // self.batch_size

    def __iter__(self):
        order = torch.randperm(
            len(self.groups), generator=torch.Generator().manual_seed(self.seed + self.epoch)
        ).tolist()
        self.epoch += 1
        buffers: dict[int, list[int]] = {}
        members: dict[int, list[int]] = {}
        made = 0
        for i in order:
            g = int(self.groups[i])
            buffers.setdefault(g, []).append(i)
            members.setdefault(g, []).append(i)
            if len(buffers[g]) == self.batch_size:
                yield buffers.pop(g)
                made += 1
        for g, buffer in sorted(buffers.items(), key=lambda kv: len(kv[1]), reverse=True):
            if made >= len(self) or not buffer:
                break
            pool = members[g]
            yield buffer + [pool[j % len(pool)] for j in range(self.batch_size - len(buffer))]
            made += 1


def list_collate(batch):
    return tuple(zip(*batch))


def torchvision_multiscale_loader(
    root: Path, image_ids: list[int], groups: np.ndarray, batch_size: int, num_workers: int, seed: int = 0
) -> torch.utils.data.DataLoader:
    """The loader over the train split's ``image_ids`` (the same images as cocodet's index, in
    its order), batches grouped by ``groups`` (each image's bin)."""
    from torchvision import datasets, tv_tensors
    from torchvision.transforms import v2

    transforms = v2.Compose(
        [
            v2.RandomShortestSize(min_size=list(range(480, 801, 32)), max_size=1333),
            v2.RandomHorizontalFlip(0.5),
            v2.ToImage(),
            v2.ToDtype(torch.float, scale=True),
            v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
            v2.SanitizeBoundingBoxes(),
            v2.ToPureTensor(),
        ]
    )
    dataset = datasets.CocoDetection(
        str(Path(root) / "train2017"),
        str(Path(root) / "annotations" / "instances_train2017.json"),
        transforms=transforms,
    )
    dataset = datasets.wrap_dataset_for_transforms_v2(dataset, target_keys=("boxes", "labels", "image_id"))
    position = {image_id: k for k, image_id in enumerate(dataset.ids)}
    subset = torch.utils.data.Subset(dataset, [position[i] for i in image_ids])
    kwargs = dict(persistent_workers=True, prefetch_factor=2) if num_workers else {}
    return torch.utils.data.DataLoader(
        subset,
        batch_sampler=ReferenceGroupedBatchSampler(groups, batch_size, seed),
        num_workers=num_workers,
        collate_fn=list_collate,
        **kwargs,
    )
