"""The same folder as YOLO and as COCO JSON gives the same stream (issue 73, item 4).

coco_tiny's train split is written as Ultralytics' layout (``yolo_layout.coco_as_yolo``), then
those labels are converted back to COCO JSON by an independent converter
(``yolo_layout.yolo_as_coco``: PIL sizes, its own parse). Both datasets go through cocodet's
datamodule with mosaic (the default recipe) and their epoch-0 train stream, drawn by the train
loader, and the val loader's batches must match at every position: the same images (pixels),
labels and boxes to 1e-3 px.
A changed label line is seen. The ground truths are compared by one checkpoint's COCOeval in
``test_overfit_real.py``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from yolo_layout import coco_as_yolo, link_or_copy, write_data_yaml, yolo_as_coco

COMMON = [
    "dataset.image_size=192",
    "loader=explicit",
    "loader.num_workers=0",
    "loader.batch_size=8",
    "model.detector.fpn_channels=64",
]


@pytest.fixture(scope="module")
def two_layouts(coco_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """(YOLO folder with data.yaml, COCO JSON of its labels): train and val are coco_tiny's train."""
    out = tmp_path_factory.mktemp("yolo_tiny")
    names = coco_as_yolo(
        coco_tiny / "annotations" / "instances_train2017.json", coco_tiny / "train2017", out, "train2017"
    )
    write_data_yaml(out, "images/train2017", "images/train2017", names)
    return out, yolo_as_coco(out, "train2017", names, out / "instances_from_labels.json")


def stream(overrides: list[str], run_dir: Path) -> list:
    """Epoch 0's train batches as the train loader draws them, then the val loader's (the
    letterbox keeps every box, where mosaic's crop may not), restored: (images, targets)."""
    from hydra import compose, initialize_config_dir

    from cocodet.loader.flat_batch import restore
    from cocodet.modes.wiring import build_datamodule, build_plan
    from cocodet.run_spec.read import read_spec

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        spec = read_spec(compose(config_name="config", overrides=[*overrides, *COMMON, f"output_dir={run_dir}"]))
    dm = build_datamodule(spec, build_plan(spec)[0])
    return [restore(flat) for loader in (dm.train_dataloader(), dm.val_dataloader()) for flat in loader]


def differences(ours: list, theirs: list) -> list[str]:
    found = []
    for b, ((images_a, targets_a), (images_b, targets_b)) in enumerate(zip(ours, theirs, strict=True)):
        for i, (a, t) in enumerate(zip(targets_a, targets_b, strict=True)):
            if not np.array_equal(images_a[i].numpy(), images_b[i].numpy()):
                found.append(f"batch {b} image {i}: pixels differ")
            if t["image_id"] != a["image_id"] or not np.array_equal(a["labels"], t["labels"]):
                found.append(f"batch {b} image {i}: image id or labels differ")
            elif not np.allclose(a["boxes"].numpy(), t["boxes"].numpy(), atol=1e-3, rtol=0):
                found.append(
                    f"batch {b} image {i}: boxes differ by {(a['boxes'] - t['boxes']).abs().max().item():.4f} px"
                )
    return found


def test_yolo_and_its_coco_json_give_the_same_stream(two_layouts, coco_tiny, tmp_path):
    yolo_root, coco_json = two_layouts
    yolo = stream(["dataset=yolo", f"dataset.yaml={yolo_root / 'data.yaml'}"], tmp_path / "yolo")
    coco = stream(
        [
            "dataset=coco",
            f"dataset.root={yolo_root}",
            "dataset.train_images=images/train2017",
            f"dataset.train_ann={coco_json}",
            "dataset.val_images=images/train2017",
            f"dataset.val_ann={coco_json}",
        ],
        tmp_path / "coco",
    )
    assert len(yolo) == 20 and sum(len(t) for _, t in yolo) == 160
    assert sum(len(t["boxes"]) for _, targets in yolo for t in targets) > 400  # mosaic's boxes, not empty samples
    assert differences(yolo, coco) == []

    # On a copy, its images linked: the module's layout stays as the tests after this one expect.
    copy = tmp_path / "moved_layout"
    shutil.copytree(yolo_root / "images", copy / "images", copy_function=lambda a, b: link_or_copy(Path(a), Path(b)))
    shutil.copytree(yolo_root / "labels", copy / "labels")
    shutil.copy(yolo_root / "data.yaml", copy)
    label = sorted((copy / "labels" / "train2017").iterdir())[3]
    lines = label.read_text().splitlines()
    c, cx, cy, w, h = lines[0].split()
    lines[0] = f"{c} {float(cx) + 0.01} {cy} {w} {h}"  # one box moved by 1% of the image's width
    label.write_text("\n".join(lines) + "\n")
    moved = stream(["dataset=yolo", f"dataset.yaml={copy / 'data.yaml'}"], tmp_path / "moved")
    assert differences(moved, coco), "a changed label line went unseen"
    assert (yolo_root / "labels" / "train2017" / label.name).read_text() != label.read_text(), (
        "the module's layout was edited in place"
    )


def test_the_yolo_stream_keeps_the_stream_contract(two_layouts, tmp_path):
    """The same digest at 0 and 2 workers and under the auto plan with a pixel cache; with a
    reference preset's aspect-ratio groups, the same at 0 and 2 workers; mode=verify passes it."""
    from conftest import run_in_process

    yolo_root, _ = two_layouts
    base = [
        "mode=bench",
        "dataset=yolo",
        f"dataset.yaml={yolo_root / 'data.yaml'}",
        "dataset.image_size=160",
        "loader.batch_size=4",
        "bench.batches=12",
        "bench.warmup=0",
        "bench.digest_batches=12",
        "bench.decode_probe=0",
    ]
    runs = {
        "w0": ["loader=explicit", "loader.num_workers=0"],
        "w2": ["loader=explicit", "loader.num_workers=2"],
        "auto_cached": ["dataset.cache=disk"],
    }
    digests = {name: run_in_process([*base, *extra], tmp_path / name)["batch_digest"] for name, extra in runs.items()}
    assert len(set(digests.values())) == 1, digests
    grouped = {
        w: run_in_process(
            [*base, "loader=explicit", f"loader.num_workers={w}", "augment=hflip", "loader.group_aspect_ratio=3"],
            tmp_path / f"g{w}",
        )
        for w in (0, 2)
    }
    assert grouped[0]["group_aspect_ratio"] == 3 and grouped[0]["batch_digest"] == grouped[2]["batch_digest"], grouped
    verified = run_in_process(
        ["mode=verify", "dataset=yolo", f"dataset.yaml={yolo_root / 'data.yaml'}"], tmp_path / "verify"
    )
    assert verified["problems"] == {"train": 0, "val": 0} and verified["train_images"] == 80


def test_a_reference_preset_trains_a_step_on_yolo(two_layouts, tmp_path):
    """augment=hflip (the reference's keep_empty rule and aspect-ratio groups) on the YOLO layout."""
    from conftest import run_in_process

    yolo_root, _ = two_layouts
    s = run_in_process(
        [
            "dataset=yolo",
            f"dataset.yaml={yolo_root / 'data.yaml'}",
            "augment=hflip",
            "loader.group_aspect_ratio=preset",
            "+model.detector.min_size=160",
            "+model.detector.max_size=256",
            "model.detector.fpn_channels=64",
            "debug=fast",
            "loader.batch_size=2",
        ],
        tmp_path / "run",
    )
    assert s["steps"] == 1 and s["plan"]["group_aspect_ratio"] == 3


def test_a_yolo_layout_in_a_bucket_gives_the_local_stream(two_layouts, tmp_path, caplog):
    """The same folder uploaded to a moto_server bucket: dataset.yaml=s3://... reads it with the
    local folder's digest at 0 and 2 workers; a label object replaced in the bucket rebuilds the
    cached index (its ETag is in the key), and the changed box is in the stream."""
    from conftest import run_in_process
    from moto_store import filled_store, s3_client

    yolo_root, _ = two_layouts
    base = [
        "mode=bench",
        "dataset=yolo",
        "dataset.image_size=160",
        "loader=explicit",
        "loader.batch_size=4",
        "bench.batches=12",
        "bench.warmup=0",
        "bench.digest_batches=12",
        "bench.decode_probe=0",
        f"dataset.cache_dir={tmp_path / 'cache'}",
    ]
    local = run_in_process(
        [*base, f"dataset.yaml={yolo_root / 'data.yaml'}", "loader.num_workers=0"], tmp_path / "local"
    )
    with filled_store(yolo_root, "yolo-tiny") as (endpoint, _):
        bucket = ["dataset.yaml=s3://yolo-tiny/data.yaml", f"dataset.storage_options.endpoint_url={endpoint}"]
        digests = {
            w: run_in_process([*base, *bucket, f"loader.num_workers={w}"], tmp_path / f"s3_{w}")["batch_digest"]
            for w in (0, 2)
        }
        assert set(digests.values()) == {local["batch_digest"]}, (local["batch_digest"], digests)
        client = s3_client(endpoint)
        for label in sorted((yolo_root / "labels" / "train2017").iterdir())[:20]:  # a fourth of the labels replaced
            client.put_object(Bucket="yolo-tiny", Key=f"labels/train2017/{label.name}", Body=b"0 0.5 0.5 0.9 0.9\n")
        caplog.set_level("INFO", logger="cocodet.datasets.index_cache")
        changed = run_in_process([*base, *bucket, "loader.num_workers=0"], tmp_path / "s3_changed")
        assert changed["batch_digest"] != local["batch_digest"]
        assert "built the index of s3://yolo-tiny/data.yaml train" in caplog.text
