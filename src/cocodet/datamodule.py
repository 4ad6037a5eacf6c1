"""The COCO LightningDataModule: the composition root of data, loader and timing.

It builds the splits' datasets and hands them to the loader builder; what it records per batch
it delegates: the train stream's position and digest to a :class:`StreamLedger`, bad samples
to a :class:`BadSampleLedger`, copy times to a :class:`TransferTimer`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import lightning as L
import torch

from cocodet.transforms.recipe import Recipe
from cocodet.coco.bad_samples import BadSampleLedger
from cocodet.errors import BadSampleError
from cocodet.data.dataset import DetectionDataset
from cocodet.loader.epoch_sampler import EpochSampler
from cocodet.loader.grouped_sampler import GroupedEpochSampler
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.data.pixel_cache import open_pixel_cache
from cocodet.data.window_cache import WindowCache
from cocodet.coco.splits import annotation_file, load_splits
from cocodet.loader.stream_end import trainer_stream_end
from cocodet.read_ahead.start import start_train_read_ahead
from cocodet.storage.store import counts as storage_counts, is_remote
from cocodet.images.verify import verify_indexes
from cocodet.errors import UserError
from cocodet.loader.build import build_loader
from cocodet.loader.rank_share import RankOrder
from cocodet.loader.flat_batch import FlatBatch, restore, to_device
from cocodet.loader.plan_record import LoaderPlan
from cocodet.loader.replan import Replanner
from cocodet.loader.stream_ledger import StreamLedger
from cocodet.timing.transfer import TransferTimer

log = logging.getLogger(__name__)


class PixelCacheConfigError(UserError):
    """dataset.cache asked for without a place to keep it."""


class CocoDataModule(L.LightningDataModule):
    """Train/val loaders over COCO-format data, built for a loader plan decided beforehand.

    Batches travel as FlatBatch (8 tensors) and are restored on the destination device in
    ``on_after_batch_transfer``; bad samples replaced in a batch are counted per epoch and
    appended to ``<run_dir>/bad_samples.jsonl``.

    Args:
        root: dataset folder; the split folders and annotation files are relative to it.
        train_images, train_ann, val_images, val_ann: the two splits.
        image_size: letterboxed side (validation) and the train recipe's output side.
        recipe: the train augmentation; validation applies ``recipe.eval_recipe()`` (the
            letterbox, or the model's evaluation resize for the reference presets).
        batch_size, val_batch_size: images per batch (val defaults to batch_size).
        seed: the data stream's seed (design §5).
        plan: the loader plan (worker count and settings) for this rank.
        replanner: what to do when workers die of a resource (``loader/replan.py``); None:
            never re-plan (failures propagate and are explained).
        keep_empty: keep train images without objects as negatives (True), drop them (False), or
            apply torchvision's reference rule ("reference"); None: the recipe's default (True for
            the letterbox family, "reference" for the reference presets).
        on_bad_sample: "raise" or "skip" (replace deterministically and record).
        verify: decode every image once at start and report problems (``verify.json``).
        synthetic: ``{seed, n_train, n_val}`` to generate the synthetic dataset at root first.
        cache_dir: where the flat indexes (and pixel caches) are kept (None: build indexes at every start).
        cache: "none", "ram" or "disk": read images at image_size from a pixel cache shared by
            every worker and rank (``data/pixel_cache.py``) instead of decoding them. Refused for
            recipes that read stored pixels (the reference presets).
        run_dir: where ``bad_samples.jsonl`` and ``verify.json`` go.
        max_image_pixels: images whose header is larger are bad samples, never decoded.
        group_aspect_ratio: train batches from one of 2k + 2 aspect-ratio bins
            (``loader/grouped_sampler.py``); None: batches in shuffled order.
        layout: "coco" (the arguments above), or "yolo": an Ultralytics ``data.yaml`` (``yaml``,
            else ``<root>/data.yaml``) names the splits and classes (``coco/yolo_index.py``).
        remote: a URL root's store settings (``conf/dataset/coco.yaml``); here the read-ahead's
            ``cache_dir``, ``cache_bytes`` and ``concurrency`` (``read_ahead/start.py``). The store
            itself is configured once per run, before any mode reads (``app.run``).
    """

    def __init__(self, root: str, train_images: str, train_ann: str, val_images: str, val_ann: str,
                 image_size: int, recipe: Recipe, batch_size: int, seed: int, plan: LoaderPlan,
                 val_batch_size: int | None = None, keep_empty: bool | str | None = None, on_bad_sample: str = "raise",
                 verify: bool = False, synthetic: dict | None = None, cache_dir: str | None = None,
                 cache: str = "none", run_dir: str | None = None, replanner: Replanner | None = None,
                 max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, group_aspect_ratio: int | None = None,
                 remote: dict | None = None, layout: str = "coco", yaml: str | None = None):
        super().__init__()
        self.stream_batches: tuple[int, int] | None = None  # (train batches from epoch 0, whole epochs): the bench's
        self.read_ahead = None  # a remote root's ReadAhead (read_ahead/start.py), started with the train loader
        self.samples_consumed = 0  # train samples that reached the model (or the bench)
        self.read_ahead_record: dict | None = None  # the read-ahead's summary, kept when it stops
        self.run_dir = Path(run_dir) if run_dir else None
        self.max_image_pixels = max_image_pixels  # every decode of this run's files checks it (images/decode.py)
        self.bad_samples = BadSampleLedger(self.run_dir)
        if cache != "none" and recipe.decode_size is None:
            raise PixelCacheConfigError(
                f"dataset.cache={cache} cannot hold what {type(recipe).__name__} reads: the pixel cache stores images "
                f"letterboxed to dataset.image_size, and the reference presets read stored pixels (COCO train decoded: "
                f"about 100 GB); use dataset.cache=none, or augment=mosaic|basic|none")
        keep_empty = recipe.keep_empty if keep_empty is None else keep_empty
        self.train_index, self.val_index = load_splits(root, train_images, train_ann, val_images, val_ann, keep_empty,
                                                       on_bad_sample, synthetic, cache_dir, layout, yaml)
        self.bad_samples.split_sizes = {"train": len(self.train_index), "val": len(self.val_index)}
        # Where the train split is (a bucket's read-ahead reads it, read_ahead/start.py): a YOLO
        # split's images may be anywhere under data.yaml's path, so their common folder
        if layout == "yolo":
            root, train_images = os.path.commonprefix(self.train_index.paths.tolist()).rsplit("/", 1)[0], ""
        self.train_store = {"root": root, "images": train_images, "remote": dict(remote or {}), "cache_dir": cache_dir}
        if verify:
            self._verify(on_bad_sample, max_image_pixels)
        # COCOeval's local file: the annotation file (fetched once), or a YOLO index's ground truth
        self.train_ann_file, self.val_ann_file = (
            (self.train_index.ann_file, self.val_index.ann_file) if layout == "yolo"
            else (str(annotation_file(root, ann, cache_dir)) for ann in (train_ann, val_ann)))
        self.image_size, self.batch_size, self.seed = image_size, batch_size, seed
        # The plan in force for both loaders; after a re-plan, the smaller one.
        self.replanner = replanner or Replanner(plan)
        self.replanner.step_fn = self._global_step
        self.val_batch_size = val_batch_size or batch_size
        if recipe.image_size != image_size:
            raise ValueError(f"the recipe's image_size {recipe.image_size} differs from dataset.image_size {image_size}")
        train_pixels, val_pixels = self._pixel_caches(cache, cache_dir, plan)
        # Both sets are read only through the FlatBatch collate, which copies every batch.
        self.train_set = DetectionDataset(self.train_index, recipe, seed, on_bad_sample, train_pixels, reuse_outputs=True,
                                          max_image_pixels=max_image_pixels)
        self.eval_recipe = recipe.eval_recipe()  # validation, mode=eval and mode=predict
        self.val_set = DetectionDataset(self.val_index, self.eval_recipe, seed, on_bad_sample, val_pixels,
                                        reuse_outputs=True, max_image_pixels=max_image_pixels)
        self.transfer_timer = TransferTimer()  # train batches' host-to-device copies
        self.fetched_at: float | None = None  # when the last batch left the loader (the wait's end)
        self._pin_checked = False
        self.first_batch_pinned: bool | None = None  # None: no batch went to CUDA
        self.group_aspect_ratio = group_aspect_ratio  # train batches from one aspect-ratio bin (None: not grouped)
        self.stream = StreamLedger(batch_size, seed, group_aspect_ratio, recipe.partner_window or None)  # design §5
        self.window_cache = None  # window partners' shared pixels (data/window_cache.py), made with the train sampler

    def _pixel_caches(self, cache: str, cache_dir: str | None, plan: LoaderPlan) -> tuple:
        """(train, val) pixel caches of ``dataset.cache`` (None, None for none), built with the
        plan's CPUs."""
        if cache == "none":
            return None, None
        if cache_dir is None:
            raise PixelCacheConfigError(f"dataset.cache={cache} needs dataset.cache_dir (it is null): set a folder "
                                        "with room for the images at dataset.image_size, or use dataset.cache=none")
        return tuple(open_pixel_cache(index, self.image_size, cache, cache_dir, split, plan.usable_cpus,
                                      self.max_image_pixels)
                     for index, split in ((self.train_index, "train"), (self.val_index, "val")))

    def _verify(self, on_bad_sample: str, max_image_pixels: int) -> None:
        """dataset.verify: scan every image once. With on_bad_sample=skip, the images found bad
        never enter sampling (and count as skipped); with raise, the run ends on the first
        one as it would when drawing it, before any training."""
        problems = verify_indexes(self.train_index, self.val_index, self.run_dir or Path.cwd(), max_image_pixels)
        for split in ("train", "val"):
            if problems[split] and on_bad_sample == "raise":
                first = problems[split][0]
                raise BadSampleError(first["file"], first["image_id"], first["reason"])
            if problems[split]:
                index = getattr(self, f"{split}_index")
                setattr(self, f"{split}_index", index.without({p["index"] for p in problems[split]}))
                self.bad_samples.exclude(split, problems[split])

    def validate_on_train_split(self) -> None:
        """Make the validation loader read the train split (validation's recipe): ``mode=eval
        eval.split=train``."""
        self.val_index, self.val_ann_file = self.train_index, self.train_ann_file
        self.val_set = DetectionDataset(self.train_index, self.eval_recipe, self.seed,
                                        self.train_set.on_bad_sample, reuse_outputs=True,
                                        max_image_pixels=self.max_image_pixels)

    @property
    def plan(self) -> LoaderPlan:
        return self.replanner.plan

    def _global_step(self) -> int | None:
        return int(self.trainer.global_step) if self.trainer is not None else None

    @property
    def num_classes(self) -> int:
        return self.train_index.num_classes

    def _sampler(self, dataset: DetectionDataset, shuffle: bool) -> EpochSampler:
        rank, world = 0, 1
        if self.trainer is not None:
            rank, world = self.trainer.global_rank, self.trainer.world_size
        if shuffle and self.group_aspect_ratio:  # the train stream; validation keeps its order
            return GroupedEpochSampler(dataset.index.sizes, self.batch_size, self.group_aspect_ratio, self.seed,
                                       rank, world)
        window = dataset.recipe.partner_window if shuffle else 0
        if window:  # window partners index this rank's order; the cache is made once, before any worker forks
            if self.window_cache is None and dataset.pixel_cache is None and self.plan.window_slots:
                self.window_cache = WindowCache(self.plan.window_slots, dataset.recipe.decode_size)
            dataset.use_window(RankOrder(len(dataset), self.seed, rank, world), self.window_cache)
        return EpochSampler(len(dataset), self.seed, shuffle, rank, world, pool=dataset.recipe.partner_pool, window=window)

    def state_dict(self) -> dict:
        """Where the train stream stands and the digest of what it delivered, for checkpoints."""
        epoch_done = None
        if self.trainer is not None:
            epoch_done = bool(self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        return self.stream.state_dict(self._world_size(), epoch_done)

    def load_state_dict(self, state: dict) -> None:
        """Called by Lightning while restoring a checkpoint, before the train loader is built."""
        self.stream.load_state_dict(state, self.trainer.global_rank if self.trainer is not None else 0,
                                    self._world_size())

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        position = self.stream.start(self._world_size())
        sampler = self._sampler(self.train_set, shuffle=True)
        start = self.stream.take_resume_start(sampler)
        if self.read_ahead is None:
            self.read_ahead = start_train_read_ahead(self.train_store, self.train_set, sampler, start, self.plan,
                                                     self.batch_size, self.trainer, self.stream_batches)
        loader = build_loader(self.train_set, sampler, self.batch_size, self.plan, position=position,
                              across_epochs=True, replanner=self.replanner, stage="train", start=start)
        end = trainer_stream_end(self.trainer, self.stream_batches, loader.batch_sampler.batches())
        if end is not None:  # workers streaming on stop at the run's last batch
            loader.batch_sampler.end_at(*end)
        return loader

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return build_loader(self.val_set, self._sampler(self.val_set, shuffle=False), self.val_batch_size, self.plan,
                            replanner=self.replanner, stage="val")

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Bookkeeping on the host copy: reading device tensors back after the transfer would
        make every step wait for the GPU to finish the previous one."""
        self.fetched_at = time.perf_counter()
        if isinstance(batch, FlatBatch):
            training = self.trainer is None or self.trainer.training
            epoch = self.trainer.current_epoch if self.trainer else 0
            self.bad_samples.record(batch.skipped, batch.images.shape[0], "train" if training else "val", epoch)
            if training:
                self.stream.consume(batch, epoch)
                self.note_consumed(batch)
        return batch

    def note_consumed(self, batch: FlatBatch) -> None:
        """A train batch reached the model: the read-ahead may move on (training; the bench)."""
        self.samples_consumed += batch.images.shape[0]
        if self.read_ahead is not None:
            self.read_ahead.advance(batch.images.shape[0])

    def teardown(self, stage: str) -> None:
        if self.window_cache is not None and stage == "fit":
            self.train_set.use_window(self.train_set.rank_order, None)
            self.window_cache.close()
            self.window_cache = None
        if self.read_ahead is not None:
            self.read_ahead.stop()
            self.train_set.reader.copies = None  # its copies' folder is given back: read the store again
            self.read_ahead_record = self.read_ahead.summary()
            self.read_ahead = None

    def remote_summary(self) -> dict | None:
        """What the store served this process and its workers (``summary.json``'s ``remote``)."""
        if not is_remote(self.train_store["root"]):
            return None
        counts = storage_counts()
        samples = max(1, self.samples_consumed)
        return {"gets": int(counts["gets"]), "bytes_fetched": int(counts["bytes_fetched"]),
                "misses": int(counts["misses"]), "retries": int(counts["retries"]),
                "cache_hits": int(counts["cache_hits"]), "gets_per_sample": round(counts["gets"] / samples, 4),
                "read_ahead": self.read_ahead.summary() if self.read_ahead is not None else self.read_ahead_record}

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        if not isinstance(batch, FlatBatch):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if device.type == "cuda" and not self._pin_checked:
            self._pin_checked = True
            self.first_batch_pinned = bool(batch.images.is_pinned())  # summary.json; scripts/gpu_check.sh asserts it
            if self.plan.pin_memory and not self.first_batch_pinned:
                log.warning("loader.pin_memory is on but batches arrive unpinned: copies to %s cannot overlap "
                            "compute. Check that nothing between the DataLoader and the Trainer copies them", device)
        if self.trainer is not None and not self.trainer.training:
            return to_device(batch, device)
        with self.transfer_timer.timing(device):
            return to_device(batch, device)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        return restore(batch) if isinstance(batch, FlatBatch) else batch

    def ddp_summary(self) -> dict:
        """Every rank's consumption, gathered (collective: every rank must call it)."""
        return self.stream.ddp_summary(self._world_size(), len(self.train_set))

    def bad_sample_summary(self) -> dict:
        return self.bad_samples.summary()
