"""Bad input, built from real coco_tiny images: repaired, skipped with a record, or refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import REPO
from PIL import Image

from cocodet.data.dataset import DetectionDataset
from cocodet.datamodule import CocoDataModule
from cocodet.datasets.index import DatasetConfigError, build_index
from cocodet.errors import BadSampleError
from cocodet.images.decode import decode_checked
from cocodet.images.read import load_raw
from cocodet.loader.flat_batch import flatten
from cocodet.transforms.augment import Basic, Mosaic

N = 8


def make_dataset(coco_tiny: Path, root: Path, n: int = N) -> tuple[Path, dict]:
    """Copy n real images (with their annotations) into root/images + root/ann.json."""
    raw = json.loads((coco_tiny / "annotations" / "instances_val2017.json").read_text())
    images = sorted(raw["images"], key=lambda im: im["id"])[:n]
    ids = {im["id"] for im in images}
    (root / "images").mkdir(parents=True)
    for im in images:
        shutil.copy(coco_tiny / "val2017" / im["file_name"], root / "images" / im["file_name"])
    data = {
        "images": images,
        "annotations": [a for a in raw["annotations"] if a["image_id"] in ids],
        "categories": raw["categories"],
    }
    return root, data


def write(root: Path, data: dict) -> Path:
    ann = root / "ann.json"
    ann.write_text(json.dumps(data))
    return ann


@pytest.fixture
def ds(coco_tiny, tmp_path):
    return make_dataset(coco_tiny, tmp_path / "ds")


def path_of(root: Path, data: dict, k: int) -> Path:
    return root / "images" / data["images"][k]["file_name"]


def corrupt(kind: str, root: Path, data: dict) -> str:
    """Apply one corruption to image 0; return the reason fragment expected for it."""
    p = path_of(root, data, 0)
    if kind == "missing":
        p.unlink()
        return "cannot read"
    if kind == "zero_byte":
        p.write_bytes(b"")
        return "empty"
    if kind == "truncated":
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return "truncated JPEG"
    if kind == "not_image":
        p.write_bytes(b"<html>this is not an image</html>" * 10)
        return "not a decodable image"
    if kind == "wrong_size":
        im = cv2.imread(str(p))
        cv2.imwrite(str(p), cv2.resize(im, (im.shape[1] // 2, im.shape[0] // 2)))
        return "differs from the annotation"
    if kind == "traversal":
        data["images"][0]["file_name"] = "../../etc/passwd"
        return "outside the image root"
    raise ValueError(kind)


KINDS = ["missing", "zero_byte", "truncated", "not_image", "wrong_size", "traversal"]


@pytest.mark.parametrize("kind", KINDS)
def test_bad_sample_raise_names_file_id_reason(kind, ds):
    root, data = ds
    reason = corrupt(kind, root, data)
    image_id = data["images"][0]["id"]
    with pytest.raises((BadSampleError, ValueError)) as e:
        index = build_index(root / "images", write(root, data))
        CocoDataModule(
            root=str(root),
            train_images="images",
            train_ann="ann.json",
            val_images="images",
            val_ann="ann.json",
            image_size=64,
            recipe=Basic(64),
            batch_size=4,
            seed=0,
            plan=None,
        ).setup()
        DetectionDataset(index, Basic(64), 0, "raise")[0]
    text = str(e.value)
    assert reason in text and str(image_id) in text


@pytest.mark.parametrize("kind", KINDS)
def test_bad_sample_skip_accounts_for_every_sample(kind, ds, tmp_path):
    root, data = ds
    reason = corrupt(kind, root, data)
    ann = write(root, data)
    from cocodet.loader.plan.policy import plan_loader
    from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
    from cocodet.loader.plan.resources import probe

    plan = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(4, 1 << 20), probe(), cuda=False)
    dm = CocoDataModule(
        root=str(root),
        train_images="images",
        train_ann=ann.name,
        val_images="images",
        val_ann=ann.name,
        image_size=64,
        recipe=Mosaic(64),
        batch_size=4,
        seed=0,
        plan=plan,
        on_bad_sample="skip",
        run_dir=str(tmp_path),
    )
    dm.setup()
    for batch in dm.train_dataloader():  # real workers: records travel with the batches
        dm.bad_samples.record(batch.skipped, batch.images.shape[0], "train", 0)
    stats = dm.bad_sample_summary()["train"]
    assert stats["seen"] + stats["skipped"] == len(dm.train_index) == N
    assert stats["skipped"] == 1
    records = [json.loads(line) for line in (tmp_path / "bad_samples.jsonl").read_text().splitlines()]
    primary = [r for r in records if r["role"] == "sample"]
    assert len(primary) == 1 and reason in primary[0]["reason"]
    assert primary[0]["image_id"] == data["images"][0]["id"]


def test_raise_inside_worker_names_image(ds):
    root, data = ds
    corrupt("truncated", root, data)
    ann = write(root, data)
    dataset = DetectionDataset(build_index(root / "images", ann), Basic(64), 0, "raise")
    loader = torch.utils.data.DataLoader(dataset, batch_size=N, num_workers=1, collate_fn=flatten)
    with pytest.raises(Exception) as e:
        next(iter(loader))
    text = str(e.value)
    assert "truncated JPEG" in text and str(data["images"][0]["id"]) in text
    assert "Traceback" in text  # the worker's original traceback is kept


def test_repaired_formats(ds):
    root, data = ds
    src = path_of(root, data, 0)
    stored = cv2.imread(str(src))
    pil = Image.open(src).convert("RGB")
    cases = {}
    pil.save(root / "png.jpg", format="PNG")  # PNG bytes behind a .jpg name
    cases["png"] = root / "png.jpg"
    pil.convert("L").save(root / "gray.jpg")
    cases["gray"] = root / "gray.jpg"
    pil.convert("CMYK").save(root / "cmyk.jpg")
    cases["cmyk"] = root / "cmyk.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": COCO boxes are in stored order, so ignore it
    pil.save(root / "exif.jpg", exif=exif)
    cases["exif"] = root / "exif.jpg"
    pil.convert("P").save(root / "palette.png")
    cases["palette"] = root / "palette.png"
    for name, p in cases.items():
        im = decode_checked(p.read_bytes()).image
        assert im.shape == stored.shape and im.dtype == np.uint8, name
        assert im.std() > 5, name


def test_boxes_outside_are_clipped_or_dropped_and_degenerate_dropped(ds):
    root, data = ds
    image = data["images"][0]
    w, h = image["width"], image["height"]
    base = {"image_id": image["id"], "category_id": data["categories"][0]["id"], "iscrowd": 0, "area": 1.0}
    data["annotations"] = [
        {**base, "id": 1, "bbox": [w - 10, h - 10, 50, 50]},  # partly outside -> clipped
        {**base, "id": 2, "bbox": [w + 5, h + 5, 20, 20]},  # wholly outside -> dropped
        {**base, "id": 3, "bbox": [5, 5, 0, 10]},  # zero width -> dropped at index
        {**base, "id": 4, "bbox": [5, 5, 10, -3]},  # negative height -> dropped at index
        {**base, "id": 5, "image_id": 424242, "bbox": [1, 1, 5, 5]},  # image id not in images
    ]
    index = build_index(root / "images", write(root, data))
    assert index.dropped["degenerate_box"] == 2 and index.dropped["missing_image"] == 1
    _, boxes, labels = load_raw(index, int(np.searchsorted(index.image_ids, image["id"])))
    assert len(boxes) == 1 and len(labels) == 1
    assert np.allclose(boxes[0], [w - 10, h - 10, w, h])


def test_refused_at_start(ds):
    root, data = ds
    bad = json.loads(json.dumps(data))
    bad["annotations"][0]["category_id"] = 999
    with pytest.raises(DatasetConfigError, match="999"):
        build_index(root / "images", write(root, bad))
    bad = json.loads(json.dumps(data))
    bad["images"].append(dict(bad["images"][0]))
    with pytest.raises(DatasetConfigError, match="duplicate image ids"):
        build_index(root / "images", write(root, bad))
    (root / "broken.json").write_text('{"images": [')
    with pytest.raises(DatasetConfigError, match="not valid JSON"):
        build_index(root / "images", root / "broken.json")


def test_symlink_out_of_root_is_refused(ds, tmp_path):
    root, data = ds
    outside = tmp_path / "outside.jpg"
    shutil.copy(path_of(root, data, 1), outside)
    path_of(root, data, 0).unlink()
    path_of(root, data, 0).symlink_to(outside)
    index = build_index(root / "images", write(root, data))
    assert "outside the image root" in index.problems[0]


def verify_only(root: Path, ann: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """``mode=verify`` on a dataset whose two splits are the same folder and annotation file."""
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "mode=verify",
            "dataset=coco",
            f"dataset.root={root}",
            "dataset.train_images=images",
            f"dataset.train_ann={ann.name}",
            "dataset.val_images=images",
            f"dataset.val_ann={ann.name}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_verify_alone_names_the_bad_files_and_trains_nothing(ds, tmp_path):
    root, data = ds
    corrupt("truncated", root, data)
    path_of(root, data, 1).write_bytes(b"<html>this is not an image</html>" * 10)
    proc = verify_only(root, write(root, data), tmp_path / "run")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert "4 image(s)" in err[0] and data["images"][0]["file_name"] in err[0] and "truncated JPEG" in err[0], err
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "verify" and summary["problems"] == {"train": 2, "val": 2}, summary
    report = json.loads((tmp_path / "run" / "verify.json").read_text())
    assert {p["file"].rsplit("/", 1)[-1] for p in report["train"]} == {data["images"][k]["file_name"] for k in (0, 1)}
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_verify_alone_passes_a_clean_dataset_without_training(coco_tiny, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "mode=verify",
            "dataset=coco",
            f"dataset.root={coco_tiny}",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["problems"] == {"train": 0, "val": 0} and summary["train_images"] == 80, summary
    assert (tmp_path / "verify.json").is_file() and not (tmp_path / "checkpoints").exists()
