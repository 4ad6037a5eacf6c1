"""The detector module's validation: each rank's detections of the val split as COCO results,
COCOeval once on rank 0 over every rank's (padded repeats removed), its numbers broadcast and
logged, and the prediction-collapse watch fed from them."""

from __future__ import annotations

import logging

import numpy as np
import torch

from cocodet import schema
from cocodet.errors import TrainingStopped
from cocodet.models.evaluation import ALL_STAT_NAMES, coco_results, evaluate, load_ground_truth
from cocodet.models.health import confident_count

log = logging.getLogger(__name__)


class CocoValidation:
    """The validation hooks of :class:`~cocodet.models.detector.DetectorModule`, which it
    inherits first (before ``LightningModule``); they use its ``model``, ``health`` and
    ``warmup_end()``."""

    def init_validation(
        self, val_ann_file: str, category_ids: list[int], eval_max_images: int | None, eval_backend: str
    ) -> None:
        self.val_ann_file = val_ann_file
        self.eval_max_images = eval_max_images
        self.eval_backend = schema.check("model.eval_backend", eval_backend)
        self.category_ids = np.asarray(category_ids, dtype=np.int64)
        self._gt = None
        self._by_image: dict[int, list[dict]] = {}  # this rank's detections of each val image
        self.last_metrics: dict[str, float] = {}
        self.val_images_evaluated = 0  # distinct images in the last COCOeval (padded repeats removed)
        self.val_repeats_removed = 0
        self.last_coco_eval = None  # the last validation's COCOeval (mode=eval's tables and plot)
        self.last_detections: dict[int, list[dict]] = {}  # rank 0: every rank's, by image (prediction grid)

    def on_validation_epoch_start(self):
        self._by_image = {}

    def validation_step(self, batch, batch_idx):
        images, targets = batch
        if self.eval_max_images is not None and len(self._by_image) >= self.eval_max_images:
            return
        room = None if self.eval_max_images is None else self.eval_max_images - len(self._by_image)
        images, targets = images[:room], targets[:room]
        outputs = self.model(images)
        for out, target in zip(outputs, targets):
            # A rank's share is padded by repeating images (DistributedSampler's rule) when the
            # split does not divide by the rank count; an image counts once.
            self._by_image.setdefault(int(target["image_id"]), coco_results(out, target, self.category_ids))

    def on_validation_epoch_end(self):
        """COCOeval once, on rank 0, over every rank's detections with padded repeats removed;
        its numbers are broadcast, so every rank logs (and selects checkpoints by) the same."""
        world = self.trainer.world_size
        shares = [self._by_image]
        if world > 1:
            shares = [None] * world if self.trainer.is_global_zero else None
            torch.distributed.gather_object(self._by_image, shares, dst=0)
        outcome = None  # (stats, images evaluated, padded repeats removed), from rank 0
        if self.trainer.is_global_zero:
            by_image, repeats = merge_rank_detections(shares)
            self.last_detections = by_image
            if self._gt is None:
                self._gt = load_ground_truth(self.val_ann_file, self.eval_backend)
            results = [r for detections in by_image.values() for r in detections]
            stats = evaluate(self._gt, results, list(by_image), backend=self.eval_backend)
            self.last_coco_eval = stats.pop("coco_eval")
            report = stats.pop("report", "")
            confident = confident_count(results, self.health.config.score_threshold)
            outcome = (stats, len(by_image), repeats, confident)
            if not self.trainer.sanity_checking:
                log.info(
                    "COCOeval (epoch %d, %d images%s, %d detections, %d scoring >= %g; %s backend):\n%s",
                    self.current_epoch,
                    len(by_image),
                    f", {repeats} padded repeats removed" if repeats else "",
                    len(results),
                    confident,
                    self.health.config.score_threshold,
                    self.eval_backend,
                    report,
                )
        if world > 1:
            box = [outcome]
            torch.distributed.broadcast_object_list(box, src=0)
            outcome = box[0]
        stats, self.val_images_evaluated, self.val_repeats_removed, confident = outcome
        if not self.trainer.sanity_checking:
            self.last_metrics = stats
        # Identical on every rank: "max" reduces them to the same value exactly.
        self.log_dict(
            {f"val/{k}": stats[k] for k in ALL_STAT_NAMES if k != "map50"}, sync_dist=world > 1, reduce_fx="max"
        )
        self.log("val/map50", stats["map50"], prog_bar=True, sync_dist=world > 1, reduce_fx="max")
        self.log("val/confident_predictions", float(confident), sync_dist=world > 1, reduce_fx="max")
        if not self.trainer.sanity_checking and self.trainer.state.fn == "fit":  # a run's validation, not mode=eval
            self.health.watch_predictions(confident, self.global_step, self.warmup_end())
            if self.health.stop_reason is not None:  # the same verdict on every rank (broadcast outcome)
                raise TrainingStopped(self.health.stop_reason, "collapsed")


def merge_rank_detections(shares: list[dict[int, list[dict]]]) -> tuple[dict[int, list[dict]], int]:
    """One entry per image from every rank's ``{image_id: detections}``, the lowest rank's
    first (a padded repeat of an image is the same image through the same weights), and the
    number of repeats dropped."""
    merged: dict[int, list[dict]] = {}
    repeats = 0
    for share in shares:
        for image_id, detections in share.items():
            if image_id in merged:
                repeats += 1
            else:
                merged[image_id] = detections
    return merged, repeats
