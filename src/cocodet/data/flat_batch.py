"""Flattened-batch transport (DESIGN §4).

A natural detection batch is ~7 tensors per image; with torch's ``file_descriptor`` sharing
strategy each storage crossing the worker boundary costs a shm segment, an fd and an mmap.
A FlatBatch is a fixed 8 tensors whatever the batch size and box count.

Shapes (B images, N boxes in the whole batch, H/W padded to a multiple of 32):
    images       [B, 3, H, W] uint8   — 4x fewer shm bytes than float32; normalised on device
    image_sizes  [B, 2] int64         — valid (h, w) of each image inside the padding
    boxes        [N, 4] float32       — xyxy, all images concatenated
    labels       [N] int64
    box_counts   [B] int64            — boxes of image b are the slice after sum(box_counts[:b])
    sample_keys  [B, 3] int64         — (epoch, index, image_id): the sampler's key and the image it gave
    to_original  [B, 3] float32       — (orig_h, orig_w, scale): output pixel / scale = stored pixel
    sample_stats [B, 5] float64       — STATS_COLUMNS: read, decode, augment, collate seconds and the
                                        pad share (measurement, DESIGN §6; never reaches the model)
Plus ``skipped``: plain records of bad samples replaced in this batch (no tensors).
"""

from __future__ import annotations

import hashlib
import time
from typing import NamedTuple

import cv2
import numpy as np
import torch

from cocodet.data.flat_layout import STATS_COLUMNS, batch_bytes, round_up  # noqa: F401  (batch_bytes: re-exported)



class FlatBatch(NamedTuple):
    images: torch.Tensor
    image_sizes: torch.Tensor
    boxes: torch.Tensor
    labels: torch.Tensor
    box_counts: torch.Tensor
    sample_keys: torch.Tensor
    to_original: torch.Tensor
    sample_stats: torch.Tensor
    skipped: tuple = ()


def _alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor; in a DataLoader worker it is created directly in shared memory.

    Otherwise torch copies each storage into shm while pickling, in the result queue's feeder
    thread, where a full /dev/shm is only printed and the batch silently lost (the main
    process then waits forever). Allocating here makes a full /dev/shm raise in the worker,
    where the DataLoader reports it, and saves one copy of every batch.
    """
    if torch.utils.data.get_worker_info() is None:
        return torch.zeros(shape, dtype=dtype)
    numel = 1
    for d in shape:
        numel *= d
    storage = torch.UntypedStorage._new_shared(max(1, numel) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # fresh shm files read as zeros


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    out = _alloc(tuple(array.shape), dtype)
    if array.size:
        out.copy_(torch.from_numpy(np.ascontiguousarray(array)))
    return out


def flatten(samples: list[dict]) -> FlatBatch:
    """Collate samples from :class:`~cocodet.data.dataset.DetectionDataset` into a FlatBatch."""
    t0 = time.perf_counter()
    b = len(samples)
    hs = [s["image"].shape[0] for s in samples]
    ws = [s["image"].shape[1] for s in samples]
    images = _alloc((b, 3, round_up(max(hs)), round_up(max(ws))), torch.uint8)
    planes = images.numpy()  # shares the (shared-memory) storage
    for k, s in enumerate(samples):
        # HWC -> CHW straight into the batch: cv2.split writes the three planes in place,
        # about 10x faster than a strided torch copy of the permuted image.
        cv2.split(np.ascontiguousarray(s["image"]), [planes[k, c, : hs[k], : ws[k]] for c in range(3)])
    counts = [len(s["labels"]) for s in samples]
    boxes = np.concatenate([np.asarray(s["boxes"], np.float32).reshape(-1, 4) for s in samples])
    labels = np.concatenate([np.asarray(s["labels"], np.int64).reshape(-1) for s in samples])
    stats = np.zeros((b, len(STATS_COLUMNS)), dtype=np.float64)
    stats[:, :3] = [s["stage_seconds"] for s in samples]
    stats[:, 4] = [s["pad_share"] for s in samples]
    stats[:, 3] = (time.perf_counter() - t0) / b
    return FlatBatch(
        images=images,
        image_sizes=_from_numpy(np.array(list(zip(hs, ws)), np.int64).reshape(b, 2), torch.int64),
        boxes=_from_numpy(boxes, torch.float32),
        labels=_from_numpy(labels, torch.int64),
        box_counts=_from_numpy(np.array(counts, np.int64), torch.int64),
        sample_keys=_from_numpy(np.array([(*s["key"], s["image_id"]) for s in samples], np.int64).reshape(b, 3),
                                torch.int64),
        to_original=_from_numpy(np.stack([s["to_original"] for s in samples]).astype(np.float32), torch.float32),
        sample_stats=_from_numpy(stats, torch.float64),
        skipped=tuple(r for s in samples for r in s["skipped"]),
    )


def restore(flat: FlatBatch) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Rebuild torchvision-detector inputs on whatever device ``flat`` lives on.

    Returns float images in [0, 1] cropped to their valid size (views of one float copy of the
    batch) and target dicts with ``boxes`` [n,4] float32, ``labels`` [n] int64, ``image_id`` and
    ``to_original`` (orig_h, orig_w, scale) to map predictions back.
    """
    images = flat.images.float().div_(255.0)
    sizes = flat.image_sizes.tolist()
    counts = flat.box_counts.tolist()
    boxes = torch.split(flat.boxes, counts)
    labels = torch.split(flat.labels, counts)
    out_images = [images[k, :, :h, :w] for k, (h, w) in enumerate(sizes)]
    targets = [
        {"boxes": boxes[k], "labels": labels[k], "image_id": flat.sample_keys[k, 2], "to_original": flat.to_original[k]}
        for k in range(len(sizes))
    ]
    return out_images, targets


def unrestore_uint8(images: list[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of restore's image conversion (exact for images that came from uint8)."""
    return [im.mul(255.0).round_().to(torch.uint8) for im in images]


def update_digest(h: "hashlib._Hash", flat: FlatBatch) -> None:
    """Fold what the model sees of a batch into a running hash, image by image: valid pixels,
    size, image id, boxes and labels. Padding, field names, layout and timings do not count,
    so the digest survives a change of transport."""
    images = flat.images.detach().cpu()
    sizes = flat.image_sizes.cpu().tolist()
    counts = flat.box_counts.cpu().tolist()
    boxes = torch.split(flat.boxes.detach().cpu().float(), counts)
    labels = torch.split(flat.labels.cpu(), counts)
    for k, (height, width) in enumerate(sizes):
        h.update(np.array([height, width, int(flat.sample_keys[k, 2]), counts[k]], np.int64).tobytes())
        h.update(images[k, :, :height, :width].contiguous().numpy().tobytes())
        h.update(boxes[k].contiguous().numpy().tobytes())
        h.update(labels[k].contiguous().numpy().astype(np.int64).tobytes())


def chain_stream_digest(previous: str, flat: FlatBatch) -> str:
    """The next link of a training stream's digest: SHA-256 over the previous hex digest and
    this batch's (epoch, index) keys, image ids, boxes and labels, in order.

    A chain (rather than one running hash) so that its state is a short string a checkpoint
    can carry: the value after a resume covers the batches of both parts.
    """
    h = hashlib.sha256(previous.encode())
    for t in (flat.sample_keys, flat.box_counts, flat.boxes, flat.labels):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
