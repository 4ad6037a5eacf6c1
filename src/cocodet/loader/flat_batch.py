"""Flattened-batch transport (design §4).

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
    to_original  [B, 4] float32       — (orig_h, orig_w, scale_y, scale_x): output pixel / scale = stored pixel
    sample_stats [B, 7] float64       — STATS_COLUMNS: read, decode, geometry, colour, collate seconds, the pad
                                        share and the images decoded (measurement, design §10; never
                                        reaches the model)
Plus ``skipped``: plain records of bad samples replaced in this batch (no tensors), ``part``:
(k, n) when this is part k of a batch shipped in n parts (joined by ``part_joiner.py``),
``epoch_end``: the last batch of its epoch (what a loader streaming across epochs stops at), and
``lease``: a worker's claim on the buffer ``images`` was written into (``loader/shm_pool.py``),
which the worker writes again once the main process has dropped the batch.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from typing import NamedTuple

import cv2
import numpy as np
import torch

from cocodet.loader.plan.flat_layout import STAGE_COLUMNS, STATS_COLUMNS, round_up
from cocodet.loader.shm_pool import BufferPool

_PAD, _DECODES, _COLLATE = (STATS_COLUMNS.index(c) for c in ("pad_share", "decodes", "collate_s"))


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
    part: tuple = ()
    epoch_end: bool = False
    lease: object = None


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
    nbytes = max(1, numel) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)
    if nbytes >= 1 << 20:
        _prefault(storage.data_ptr(), nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # fresh shm files read as zeros


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14


def _prefault(address: int, nbytes: int) -> None:
    """Map a fresh shm segment's pages in one call instead of one page fault per 4 KiB while
    the batch is written (a batch of 32 at 640 px: ~0.3 ms per image saved). A kernel without
    MADV_POPULATE_WRITE refuses the call and pages fault in as before; a full /dev/shm makes
    it fail the same way, and the write that follows raises as it would have."""
    global _madvise
    if _madvise is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _madvise = libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise(address, nbytes, _MADV_POPULATE_WRITE)


_madvise = None


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    out = _alloc(tuple(array.shape), dtype)
    if array.size:
        out.copy_(torch.from_numpy(np.ascontiguousarray(array)))
    return out


class Collate:
    """The loader's collate: :func:`flatten`, writing images into buffers a worker reuses once
    the main process has dropped their batch (``capacity`` of them per worker:
    ``LoaderPlan.reused_buffers``; 0: a fresh buffer every batch). The loader sets ``capacity`` from its plan
    before its workers start; each worker holds its own pool (created in the worker)."""

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self._pool: BufferPool | None = None

    def __call__(self, samples: list[dict]) -> "FlatBatch":
        if torch.utils.data.get_worker_info() is None:
            return flatten(samples)  # in-process: nothing crosses a process boundary
        if self._pool is None or self._pool.capacity != self.capacity:
            self._pool = BufferPool(self.capacity)
        return flatten(samples, self._pool)

    def __getstate__(self):  # a pool belongs to the process that made it
        return {"capacity": self.capacity, "_pool": None}


def flatten(samples: list[dict], pool: BufferPool | None = None) -> FlatBatch:
    """Collate samples (``cocodet.sample.make_sample``) into a FlatBatch; its images written
    into a buffer of ``pool`` where one is free."""
    t0 = time.perf_counter()
    b = len(samples)
    hs = [s["image"].shape[0] for s in samples]
    ws = [s["image"].shape[1] for s in samples]
    shape = (b, 3, round_up(max(hs)), round_up(max(ws)))
    images, lease = pool.take(shape, lambda s: _alloc(s, torch.uint8)) if pool else (_alloc(shape, torch.uint8), None)
    planes = images.numpy()  # shares the (shared-memory) storage
    for k, s in enumerate(samples):
        # HWC -> CHW straight into the batch: cv2.split writes the three planes in place,
        # about 10x faster than a strided torch copy of the permuted image.
        cv2.split(np.ascontiguousarray(s["image"]), [planes[k, c, : hs[k], : ws[k]] for c in range(3)])
        if lease is not None and (hs[k] < shape[2] or ws[k] < shape[3]):  # a reused buffer's old pixels
            planes[k, :, hs[k] :] = 0
            planes[k, :, : hs[k], ws[k] :] = 0
    counts = [len(s["labels"]) for s in samples]
    boxes = np.concatenate([np.asarray(s["boxes"], np.float32).reshape(-1, 4) for s in samples])
    labels = np.concatenate([np.asarray(s["labels"], np.int64).reshape(-1) for s in samples])
    stats = np.zeros((b, len(STATS_COLUMNS)), dtype=np.float64)
    stats[:, : len(STAGE_COLUMNS)] = [s["stage_seconds"] for s in samples]
    stats[:, _PAD] = [s["pad_share"] for s in samples]
    stats[:, _DECODES] = [s.get("decodes", 0) for s in samples]
    stats[:, _COLLATE] = (time.perf_counter() - t0) / b
    return FlatBatch(
        images=images,
        image_sizes=_from_numpy(np.array(list(zip(hs, ws)), np.int64).reshape(b, 2), torch.int64),
        boxes=_from_numpy(boxes, torch.float32),
        labels=_from_numpy(labels, torch.int64),
        box_counts=_from_numpy(np.array(counts, np.int64), torch.int64),
        sample_keys=_from_numpy(
            np.array([(*s["key"], s["image_id"]) for s in samples], np.int64).reshape(b, 3), torch.int64
        ),
        to_original=_from_numpy(np.stack([s["to_original"] for s in samples]).astype(np.float32), torch.float32),
        sample_stats=_from_numpy(stats, torch.float64),
        skipped=tuple(r for s in samples for r in s["skipped"]),
        part=getattr(samples, "part", ()),
        epoch_end=getattr(samples, "epoch_end", False),
        lease=lease,
    )


def restore(flat: FlatBatch) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Rebuild torchvision-detector inputs on whatever device ``flat`` lives on.

    Returns float images in [0, 1] cropped to their valid size (views of one float copy of the
    batch) and target dicts with ``boxes`` [n,4] float32, ``labels`` [n] int64, ``image_id``,
    ``sample_key`` [2] (epoch, index: the sampler's key, for logs) and ``to_original``
    (orig_h, orig_w, scale_y, scale_x) to map predictions back.
    """
    images = flat.images.float().div_(255.0)
    sizes = flat.image_sizes.tolist()
    counts = flat.box_counts.tolist()
    boxes = torch.split(flat.boxes, counts)
    labels = torch.split(flat.labels, counts)
    out_images = [images[k, :, :h, :w] for k, (h, w) in enumerate(sizes)]
    targets = [
        {
            "boxes": boxes[k],
            "labels": labels[k],
            "image_id": flat.sample_keys[k, 2],
            "sample_key": flat.sample_keys[k, :2],
            "to_original": flat.to_original[k],
        }
        for k in range(len(sizes))
    ]
    return out_images, targets


def to_device(batch, device: torch.device):
    """Move a FlatBatch (or any tuple of tensors): non-blocking, which overlaps only from pinned memory."""
    return type(batch)(*(t.to(device, non_blocking=True) if torch.is_tensor(t) else t for t in batch))


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
