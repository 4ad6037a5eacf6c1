"""The datamodule's loaders, as Lightning's loader hooks: each split's sampler (epoch order,
rank share, aspect-ratio groups, the window partners' shared cache), the train loader with the
read-ahead it starts (``read_ahead/start.py``) and the run's last batch it streams to, the val
loader, and what ``teardown`` gives back."""

from __future__ import annotations

import torch

from cocodet.data.dataset import DetectionDataset
from cocodet.data.window_cache import WindowCache
from cocodet.loader.build import build_loader
from cocodet.loader.epoch_sampler import EpochSampler
from cocodet.loader.grouped_sampler import GroupedEpochSampler
from cocodet.loader.rank_share import RankOrder
from cocodet.loader.stream_end import trainer_stream_end
from cocodet.read_ahead.start import start_train_read_ahead


class TrainValLoaders:
    """Lightning's loader hooks for :class:`~cocodet.datamodule.CocoDataModule`, which provides
    what they read: ``trainer``, ``plan``, ``replanner``, ``stream``, ``train_set``, ``val_set``,
    ``train_store``, ``stream_batches``, ``batch_size``, ``val_batch_size``, ``seed``,
    ``group_aspect_ratio`` and ``_world_size()``; they set ``window_cache``, ``read_ahead`` and
    ``read_ahead_record``."""

    def _sampler(self, dataset: DetectionDataset, shuffle: bool) -> EpochSampler:
        rank, world = 0, 1
        if self.trainer is not None:
            rank, world = self.trainer.global_rank, self.trainer.world_size
        if shuffle and self.group_aspect_ratio:  # the train stream; validation keeps its order
            return GroupedEpochSampler(
                dataset.index.sizes, self.batch_size, self.group_aspect_ratio, self.seed, rank, world
            )
        window = dataset.recipe.partner_window if shuffle else 0
        if window:  # window partners index this rank's order; the cache is made once, before any worker forks
            if self.window_cache is None and dataset.pixel_cache is None and self.plan.window_slots:
                self.window_cache = WindowCache(self.plan.window_slots, dataset.recipe.decode_size)
            dataset.use_window(RankOrder(len(dataset), self.seed, rank, world), self.window_cache)
        return EpochSampler(
            len(dataset), self.seed, shuffle, rank, world, pool=dataset.recipe.partner_pool, window=window
        )

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        position = self.stream.start(self._world_size())
        sampler = self._sampler(self.train_set, shuffle=True)
        start = self.stream.take_resume_start(sampler)
        if self.read_ahead is None:
            self.read_ahead = start_train_read_ahead(
                self.train_store,
                self.train_set,
                sampler,
                start,
                self.plan,
                self.batch_size,
                self.trainer,
                self.stream_batches,
            )
        loader = build_loader(
            self.train_set,
            sampler,
            self.batch_size,
            self.plan,
            position=position,
            across_epochs=True,
            replanner=self.replanner,
            stage="train",
            start=start,
        )
        end = trainer_stream_end(self.trainer, self.stream_batches, loader.batch_sampler.batches())
        if end is not None:  # workers streaming on stop at the run's last batch
            loader.batch_sampler.end_at(*end)
        return loader

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return build_loader(
            self.val_set,
            self._sampler(self.val_set, shuffle=False),
            self.val_batch_size,
            self.plan,
            replanner=self.replanner,
            stage="val",
        )

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
