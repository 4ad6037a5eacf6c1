"""mode=predict: detections on a folder or file of images, through validation's decode and
resize (the letterbox, or the model's resize with the reference presets), in batches with the loader plan's workers.

Writes ``predictions.json`` (COCO results: original image frame, original category ids),
``images.json`` (the id given to each file, its size), with ``predict.draw`` a PNG per
image, and ``bad_samples.jsonl`` for files that could not be read (``dataset.on_bad_sample``).
An image whose file name is in the dataset's val annotations gets that image id, so the
results of a val folder can be scored by COCOeval directly.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path, PurePosixPath

import numpy as np
import torch
import torch.utils.data
from tqdm import tqdm

from cocodet.datasets.bad_samples import append_records, skip_record
from cocodet.errors import BadSampleError, UserError
from cocodet.images.decode import decode_checked, decode_resized
from cocodet.images.header import DEFAULT_MAX_IMAGE_PIXELS
from cocodet.inference.predict_drawing import image_drawer
from cocodet.loader.build import build_loader
from cocodet.loader.epoch_sampler import EpochSampler
from cocodet.loader.flat_batch import restore, to_device
from cocodet.models.evaluation import coco_results
from cocodet.sample import make_sample
from cocodet.storage.store import is_file, listing, read_bytes
from cocodet.storage.urls import is_remote
from cocodet.transforms.recipe import Recipe, to_original

log = logging.getLogger(__name__)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


class PredictSourceError(UserError):
    """predict.source names nothing to predict on."""


def list_images(source: str) -> list[str]:
    """The image files of ``source`` (a file, a folder searched recursively, or the same as
    a URL: an object or a prefix, listed once), sorted."""
    if is_remote(source):
        files = sorted(url for url in listing(source) if PurePosixPath(url).suffix.lower() in IMAGE_SUFFIXES)
        single = not files and is_file(source)
        kind = "an object nor a prefix holding images"
    else:
        path = Path(source)
        files = (
            sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if path.is_dir()
            else []
        )
        single = path.is_file()
        kind = "a file nor a folder holding images"
    if single:
        return [source]
    if files:
        return files
    raise PredictSourceError(f"predict.source={source} is neither {kind} ({', '.join(sorted(IMAGE_SUFFIXES))})")


class ImageFolderDataset(torch.utils.data.Dataset):
    """Files -> samples in DetectionDataset's format (no targets), through validation's recipe
    (``recipe``: the letterbox, or the model's resize). A file that cannot be read becomes a
    grey sample with ``image_id`` -1 and a skip record (``on_bad_sample=skip``), or raises
    BadSampleError (``raise``)."""

    def __init__(
        self,
        files: list[str],
        image_ids: list[int],
        recipe: Recipe,
        on_bad_sample: str,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        self.files, self.image_ids, self.on_bad_sample = files, image_ids, on_bad_sample
        self.max_pixels = max_pixels
        self.recipe = recipe

    def __len__(self) -> int:
        return len(self.files)

    def _decode(self, data: bytes) -> tuple[np.ndarray, tuple[int, int], float]:
        """(image at the recipe's working resolution, stored (h, w), stored -> working scale).
        No annotation: the header gives the size, checked against max_pixels before a decode."""
        if self.recipe.decode_size is None:
            decoded = decode_checked(data, (0, 0), self.max_pixels)
            return decoded.image, decoded.stored_hw, 1.0
        return decode_resized(data, (0, 0), self.recipe.decode_size, self.max_pixels)

    def __getitem__(self, key) -> dict:
        epoch, i = key[0], key[1]
        path = self.files[i]
        t0 = time.perf_counter()
        try:
            image, orig_hw, scale = self._decode(read_bytes(path))
        except (OSError, ValueError) as e:
            error = BadSampleError(str(path), self.image_ids[i], getattr(e, "strerror", None) or str(e))
            if self.on_bad_sample == "raise":
                raise error from None
            h, w = self.recipe.output_hw or (32, 32)
            image, orig_hw, scale = np.full((h, w, 3), 114, np.uint8), (h, w), 1.0
            skipped = [skip_record(error, epoch, i, "sample")]
            image_id = -1
        else:
            skipped, image_id = [], self.image_ids[i]
        decoded = time.perf_counter()
        out = self.recipe((image, np.zeros((0, 4), np.float32), np.zeros(0, np.int64)), None, [])
        return make_sample(
            out.image,
            out.boxes,
            out.labels,
            (epoch, i),
            image_id,
            to_original(orig_hw, scale, out.scale),
            stage_seconds=np.array([0.0, decoded - t0, time.perf_counter() - decoded, 0.0]),
            pad_share=out.pad_share,
            skipped=skipped,
        )


def assign_ids(files: list[str], known: dict[str, int]) -> list[int]:
    """The val annotations' id for a known file name, else new ids above every known one."""
    next_id = max(known.values(), default=0) + 1
    ids = []
    for f in files:
        name = PurePosixPath(str(f)).name
        if name in known:
            ids.append(known[name])
        else:
            ids.append(next_id)
            next_id += 1
    return ids


def predict(
    module,
    datamodule,
    plan,
    *,
    source: str,
    score_threshold: float,
    draw: bool,
    on_bad_sample: str,
    batch_size: int,
    run_dir: Path,
    device: torch.device,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> dict:
    files = list_images(source)
    index = datamodule.val_index
    ids = assign_ids(files, {PurePosixPath(str(p)).name: int(i) for p, i in zip(index.paths, index.image_ids)})
    dataset = ImageFolderDataset(files, ids, datamodule.eval_recipe, on_bad_sample, max_image_pixels)
    loader = build_loader(dataset, EpochSampler(len(dataset), 0, shuffle=False), batch_size, plan)
    model = module.model.to(device).eval()
    draw_dir = run_dir / "predictions"
    draw_image = None
    if draw:
        draw_dir.mkdir(parents=True, exist_ok=True)
        names = dict(zip(module.category_ids.tolist(), index.category_names))
        draw_image = image_drawer(draw_dir, dict(zip(ids, files)), module.category_ids, names, score_threshold)
    started = time.perf_counter()
    results, bad = _detect(model, loader, device, len(files), module.category_ids, score_threshold, draw_image)
    _write_outputs(run_dir, files, ids, results, bad)
    log.info(
        "predicted %d images (%d unreadable): %d detections >= %.2f in %s",
        len(files),
        len(bad),
        len(results),
        score_threshold,
        run_dir / "predictions.json",
    )
    return {
        "mode": "predict",
        "images": len(files),
        "bad_images": len(bad),
        "detections": len(results),
        "score_threshold": score_threshold,
        "predictions": str(run_dir / "predictions.json"),
        "images_json": str(run_dir / "images.json"),
        "drawn": str(draw_dir) if draw else None,
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _detect(
    model, loader, device: torch.device, total: int, category_ids, score_threshold: float, draw_image
) -> tuple[list, list]:
    """The COCO results of every readable image in ``loader`` and the skip records of the
    unreadable ones; ``draw_image(image, out, image_id)``, when given, draws each readable one."""
    results, bad = [], []
    with torch.no_grad(), tqdm(total=total, desc="predict", unit="image") as bar:
        for batch in loader:
            bad.extend(batch.skipped)
            images, targets = restore(to_device(batch, device))
            outputs = model(images)
            for image, out, target in zip(images, outputs, targets):
                image_id = int(target["image_id"])
                if image_id < 0:
                    continue
                results.extend(coco_results(out, target, category_ids, score_threshold))
                if draw_image is not None:
                    draw_image(image, out, image_id)
            bar.update(len(images))
    return results, bad


def _write_outputs(run_dir: Path, files: list[str], ids: list[int], results: list, bad: list) -> None:
    """``predictions.json``, ``images.json`` (the id given to each file) and the unreadable files' records."""
    with open(run_dir / "predictions.json", "w") as f:
        json.dump(results, f)
    images_meta = [{"id": i, "file_name": str(p)} for p, i in zip(files, ids)]
    (run_dir / "images.json").write_text(json.dumps(images_meta))
    append_records(run_dir, "predict", bad)
