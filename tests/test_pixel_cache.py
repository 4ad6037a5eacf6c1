"""dataset.cache: the images at the working resolution in one shared file, and the reduced decode
both the cache and the uncached loader use."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import run_in_process

from cocodet.data import pixel_cache
from cocodet.data.pixel_cache import CacheSpaceError, open_pixel_cache
from cocodet.datasets.index import build_index
from cocodet.errors import BadSampleError
from cocodet.images.decode import decode_reduction
from cocodet.images.read import load_resized


def write_dataset(root: Path, images: dict[str, np.ndarray], boxes: dict[str, list[float]]) -> Path:
    """A one-category COCO dataset of the given RGB images (JPEG, quality 95), one box each."""
    (root / "img").mkdir(parents=True)
    data = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for k, (name, image) in enumerate(images.items(), start=1):
        cv2.imwrite(str(root / "img" / name), cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
        h, w = image.shape[:2]
        data["images"].append({"id": k, "file_name": name, "height": h, "width": w})
        x0, y0, x1, y1 = boxes[name]
        data["annotations"].append(
            {
                "id": k,
                "image_id": k,
                "category_id": 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": (x1 - x0) * (y1 - y0),
                "iscrowd": 0,
            }
        )
    ann = root / "ann.json"
    ann.write_text(json.dumps(data))
    return ann


def red_square(h: int, w: int, box: list[int]) -> np.ndarray:
    image = np.full((h, w, 3), 40, np.uint8)
    x0, y0, x1, y1 = box
    image[y0:y1, x0:x1] = (230, 20, 20)
    return image


def red_extent(image: np.ndarray) -> tuple[float, float, float, float]:
    ys, xs = np.nonzero((image[..., 0] > 150) & (image[..., 1] < 90))
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_large_jpeg_is_decoded_reduced_and_boxes_follow(tmp_path):
    box = [1000, 600, 1800, 1400]
    ann = write_dataset(tmp_path, {"big.jpg": red_square(2400, 3200, box)}, {"big.jpg": box})
    index = build_index(tmp_path / "img", ann)
    data = (tmp_path / "img" / "big.jpg").read_bytes()
    assert decode_reduction(data, (2400, 3200), 640) == 4  # 3200 / 4 = 800 >= 640 > 3200 / 8
    assert decode_reduction(data, (2400, 3200), 2000) == 1
    timings = np.zeros(4)
    src = load_resized(index, 0, 640, timings)
    assert src.image.shape == (480, 640, 3) and src.orig_hw == (2400, 3200)
    assert src.scale == pytest.approx(0.2)
    x0, y0, x1, y1 = red_extent(src.image)
    assert np.allclose(src.boxes[0], [x0, y0, x1, y1], atol=2.0), (src.boxes[0], (x0, y0, x1, y1))
    assert np.allclose(src.boxes[0], np.float32(box) * 0.2)


def test_cache_is_built_once_and_matches_the_decoded_images(coco_tiny, tmp_path, monkeypatch):
    index = build_index(coco_tiny / "val2017", coco_tiny / "annotations" / "instances_val2017.json")
    cache = open_pixel_cache(index, 256, "disk", tmp_path, "val")
    for k in (0, 7, len(index) - 1):
        want, got = load_resized(index, k, 256), cache.load(index, k)
        assert np.array_equal(want.image, got.image) and np.array_equal(want.boxes, got.boxes)
        assert want.orig_hw == got.orig_hw and want.scale == pytest.approx(got.scale)
        assert not got.image.flags.writeable  # a view of the shared mapping
    monkeypatch.setattr(pixel_cache, "_build", lambda *a: (_ for _ in ()).throw(AssertionError("rebuilt")))
    again = open_pixel_cache(index, 256, "ram", tmp_path, "val")
    assert again.folder == cache.folder
    assert len(list(tmp_path.glob("pixels-*/meta.json"))) == 1


def _open(args) -> str:
    ann, images, cache_dir = args
    index = build_index(images, ann)
    return str(open_pixel_cache(index, 128, "disk", cache_dir, "val").folder)


def test_concurrent_processes_build_one_cache(coco_tiny, tmp_path):
    args = (coco_tiny / "annotations" / "instances_val2017.json", coco_tiny / "val2017", tmp_path)
    with mp.get_context("fork").Pool(3) as pool:
        folders = pool.map(_open, [args] * 3)
    assert len(set(folders)) == 1
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    assert len(list(tmp_path.glob("pixels-*/meta.json"))) == 1


def test_a_changed_image_or_size_gets_its_own_cache_and_bad_images_stay_bad(tmp_path):
    box = [10, 10, 60, 60]
    ann = write_dataset(
        tmp_path / "ds",
        {"a.jpg": red_square(100, 120, box), "b.jpg": red_square(90, 80, box)},
        {"a.jpg": box, "b.jpg": box},
    )
    index = build_index(tmp_path / "ds" / "img", ann)
    first = open_pixel_cache(index, 64, "disk", tmp_path / "c", "train")
    open_pixel_cache(index, 96, "disk", tmp_path / "c", "train")
    (tmp_path / "ds" / "img" / "b.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # changed and now corrupt
    changed = open_pixel_cache(index, 64, "disk", tmp_path / "c", "train")
    assert changed.folder != first.folder and len(list((tmp_path / "c").glob("pixels-*/meta.json"))) == 3
    with pytest.raises(BadSampleError) as err:
        changed.load(index, 1)
    assert err.value.image_id == 2 and "b.jpg" in err.value.path and "truncated" in err.value.reason
    with pytest.raises(BadSampleError):
        load_resized(index, 1, 64)  # the uncached path says the same


def test_a_cache_that_does_not_fit_is_refused_with_the_numbers(coco_tiny, tmp_path, monkeypatch):
    index = build_index(coco_tiny / "val2017", coco_tiny / "annotations" / "instances_val2017.json")
    need = pixel_cache.estimated_bytes(index, 640)
    assert 60 << 20 < need < 80 << 20  # 80 images of about 640 x 480 x 3
    monkeypatch.setattr(pixel_cache, "memory_available", lambda: (100 << 20, "test"))
    with pytest.raises(CacheSpaceError, match=r"needs \d+ MiB resident but only 100 MiB of memory"):
        open_pixel_cache(index, 640, "ram", tmp_path, "val")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(pixel_cache.shutil, "disk_usage", lambda p: usage._replace(free=10 << 20))
    with pytest.raises(CacheSpaceError, match=r"needs \d+ MiB but .* has 10 MiB free"):
        open_pixel_cache(index, 640, "disk", tmp_path, "val")
    assert list(tmp_path.glob("pixels-*/")) == [] and not list(tmp_path.glob("*.tmp-*"))  # nothing half-built


def test_cache_without_cache_dir_is_a_user_error(synthetic_root, tmp_path):
    from cocodet.errors import UserError

    with pytest.raises(UserError, match="dataset.cache=ram needs dataset.cache_dir"):
        run_in_process(
            [
                f"dataset.root={synthetic_root}",
                "mode=bench",
                "dataset.cache=ram",
                "dataset.cache_dir=null",
                "bench.batches=1",
                "bench.warmup=0",
                "bench.decode_probe=0",
            ],
            tmp_path / "r",
        )
