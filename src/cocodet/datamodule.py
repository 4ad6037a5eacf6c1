"""The LightningDataModule: the composition root of data, loader and timing.

It reads the splits through ``datasets/splits.py`` (any layout), builds their datasets
(``data/split_datasets.py``) and their loaders (``train_val_loaders.py``); what it records per batch
it delegates: the train stream's position and digest to a :class:`StreamLedger`, bad samples to a
:class:`BadSampleLedger`, copy times to a :class:`TransferTimer` (``batch_transfer.py``).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from cocodet.batch_transfer import BatchTransfer
from cocodet.data.dataset import DetectionDataset
from cocodet.data.split_datasets import pixel_caches, refuse_uncacheable, split_datasets, verified_indexes
from cocodet.datasets.bad_samples import BadSampleLedger
from cocodet.datasets.splits import SplitLoader
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.loader.failures.replan import Replanner
from cocodet.loader.plan.records import LoaderPlan
from cocodet.loader.stream_ledger import StreamLedger
from cocodet.storage.session import counts as storage_counts
from cocodet.storage.urls import is_remote
from cocodet.timing.transfer import TransferTimer
from cocodet.train_val_loaders import TrainValLoaders
from cocodet.transforms.recipe import Recipe


class CocoDataModule(BatchTransfer, TrainValLoaders, L.LightningDataModule):
    """Train/val loaders over a detection dataset, built for a loader plan decided beforehand.

    Batches travel as FlatBatch (8 tensors) and are restored on the destination device in
    ``on_after_batch_transfer``; bad samples replaced in a batch are counted per epoch and
    appended to ``<run_dir>/bad_samples.jsonl``. The splits are read in :meth:`setup`.

    Args:
        image_size: letterboxed side (validation) and the train recipe's output side.
        recipe: the train augmentation; validation applies ``recipe.eval_recipe()``.
        batch_size, val_batch_size: images per batch (val defaults to batch_size).
        seed: the data stream's seed (design §5).
        plan: the loader plan (worker count and settings) for this rank.
        replanner: what to do when workers die of a resource (``loader/failures/replan.py``); None: never re-plan.
        on_bad_sample: "raise" or "skip" (replace deterministically and record).
        verify: decode every image once at start and report problems (``verify.json``).
        cache_dir: where the flat indexes (and pixel caches) are kept (None: build indexes at every start).
        cache: "none", "ram" or "disk": read images at image_size from a pixel cache shared by
            every worker and rank (``data/pixel_cache.py``). Refused for recipes that read stored pixels.
        run_dir: where ``bad_samples.jsonl`` and ``verify.json`` go.
        max_image_pixels: images whose header is larger are bad samples, never decoded.
        group_aspect_ratio: train batches from one of 2k + 2 aspect-ratio bins
            (``loader/grouped_sampler.py``); None: batches in shuffled order.
        remote: a URL root's read-ahead settings (``read_ahead/start.py``); the store itself is
            configured once per run, before any mode reads (``app.run``).
        **dataset: where the splits are and how they are read: ``layout``, ``root``,
            ``keep_empty`` (None: the recipe's default) and the layout's own keys, taken by
            ``datasets/splits.py``'s ``SplitLoader`` (``conf/dataset/*.yaml``), not here.
    """

    def __init__(
        self,
        image_size: int,
        recipe: Recipe,
        batch_size: int,
        seed: int,
        plan: LoaderPlan,
        val_batch_size: int | None = None,
        on_bad_sample: str = "raise",
        verify: bool = False,
        cache_dir: str | None = None,
        cache: str = "none",
        run_dir: str | None = None,
        replanner: Replanner | None = None,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        group_aspect_ratio: int | None = None,
        remote: dict | None = None,
        **dataset,
    ):
        super().__init__()
        refuse_uncacheable(cache, recipe)
        if recipe.image_size != image_size:
            raise ValueError(
                f"the recipe's image_size {recipe.image_size} differs from dataset.image_size {image_size}"
            )
        keep_empty = dataset.pop("keep_empty", None)
        self.split_loader = SplitLoader(
            **dataset,
            keep_empty=recipe.keep_empty if keep_empty is None else keep_empty,
            on_bad_sample=on_bad_sample,
            cache_dir=cache_dir,
        )
        self.stream_batches: tuple[int, int] | None = None  # (train batches from epoch 0, whole epochs): the bench's
        self.read_ahead = None  # a remote root's ReadAhead (read_ahead/start.py), started with the train loader
        self.samples_consumed = 0  # train samples that reached the model (or the bench)
        self.read_ahead_record: dict | None = None  # the read-ahead's summary, kept when it stops
        self.run_dir = Path(run_dir) if run_dir else None
        self.max_image_pixels = max_image_pixels  # every decode of this run's files checks it (images/decode.py)
        self.bad_samples = BadSampleLedger(self.run_dir)
        self.verify, self.cache, self.cache_dir, self.remote = verify, cache, cache_dir, dict(remote or {})
        self.image_size, self.batch_size, self.seed, self.recipe = image_size, batch_size, seed, recipe
        # The plan in force for both loaders; after a re-plan, the smaller one.
        self.replanner = replanner or Replanner(plan)
        self.replanner.step_fn = self._global_step
        self.val_batch_size = val_batch_size or batch_size
        self.eval_recipe = recipe.eval_recipe()  # validation, mode=eval and mode=predict
        self.train_set = self.val_set = self.train_index = self.val_index = None  # made by setup()
        self.transfer_timer = TransferTimer()  # train batches' host-to-device copies
        self.fetched_at: float | None = None  # when the last batch left the loader (the wait's end)
        self.first_batch_pinned: bool | None = None  # None: no batch went to CUDA
        self.group_aspect_ratio = group_aspect_ratio  # train batches from one aspect-ratio bin (None: not grouped)
        self.stream = StreamLedger(batch_size, seed, group_aspect_ratio, recipe.partner_window or None)  # design §5
        self.window_cache = None  # window partners' shared pixels (data/window_cache.py), made with the train sampler

    def setup(self, stage: str | None = None) -> None:
        """Read both splits and build their datasets, once, whatever the stage (validation is part
        of fit, and mode=eval reads either split). ``modes/wiring.py`` calls it before the model
        is built, which is sized by the classes and scored against the ground truth; Lightning's
        own calls then find it done."""
        if self.train_set is not None:
            return
        splits = self.split_loader.load()
        self.train_index, self.val_index = splits.train, splits.val
        self.train_ann_file, self.val_ann_file = splits.train_ground_truth, splits.val_ground_truth  # COCOeval's
        self.bad_samples.split_sizes = {"train": len(self.train_index), "val": len(self.val_index)}
        root, images = splits.train_images  # where a bucket's read-ahead lists the train split
        self.train_store = {"root": root, "images": images, "remote": self.remote, "cache_dir": self.cache_dir}
        on_bad_sample = self.split_loader.on_bad_sample
        if self.verify:  # before the pixel caches: they hold only the images kept
            self.train_index, self.val_index = verified_indexes(
                self.train_index,
                self.val_index,
                self.run_dir or Path.cwd(),
                self.max_image_pixels,
                on_bad_sample,
                self.bad_samples,
            )
        pixels = pixel_caches(
            self.train_index,
            self.val_index,
            self.image_size,
            self.cache,
            self.cache_dir,
            None if self.plan is None else self.plan.usable_cpus,
            self.max_image_pixels,
        )
        self.train_set, self.val_set = split_datasets(
            self.train_index,
            self.val_index,
            self.recipe,
            self.eval_recipe,
            self.seed,
            on_bad_sample,
            pixels,
            self.max_image_pixels,
        )

    def validate_on_train_split(self) -> None:
        """Make the validation loader read the train split (validation's recipe): ``mode=eval
        eval.split=train``."""
        self.val_index, self.val_ann_file = self.train_index, self.train_ann_file
        self.val_set = DetectionDataset(
            self.train_index,
            self.eval_recipe,
            self.seed,
            self.train_set.on_bad_sample,
            reuse_outputs=True,
            max_image_pixels=self.max_image_pixels,
        )

    @property
    def plan(self) -> LoaderPlan:
        return self.replanner.plan

    def _global_step(self) -> int | None:
        return int(self.trainer.global_step) if self.trainer is not None else None

    @property
    def num_classes(self) -> int:
        return self.train_index.num_classes

    def state_dict(self) -> dict:
        """Where the train stream stands and the digest of what it delivered, for checkpoints."""
        epoch_done = None
        if self.trainer is not None:
            epoch_done = bool(self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        return self.stream.state_dict(self._world_size(), epoch_done)

    def load_state_dict(self, state: dict) -> None:
        """Called by Lightning while restoring a checkpoint, before the train loader is built."""
        self.stream.load_state_dict(
            state, self.trainer.global_rank if self.trainer is not None else 0, self._world_size()
        )

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def remote_summary(self) -> dict | None:
        """What the store served this process and its workers (``summary.json``'s ``remote``)."""
        if not is_remote(self.train_store["root"]):
            return None
        counts = storage_counts()
        samples = max(1, self.samples_consumed)
        return {
            "gets": int(counts["gets"]),
            "bytes_fetched": int(counts["bytes_fetched"]),
            "misses": int(counts["misses"]),
            "retries": int(counts["retries"]),
            "cache_hits": int(counts["cache_hits"]),
            "gets_per_sample": round(counts["gets"] / samples, 4),
            "read_ahead": self.read_ahead.summary() if self.read_ahead is not None else self.read_ahead_record,
        }

    def ddp_summary(self) -> dict:
        """Every rank's consumption, gathered (collective: every rank must call it)."""
        return self.stream.ddp_summary(self._world_size(), len(self.train_set))

    def bad_sample_summary(self) -> dict:
        return self.bad_samples.summary()
