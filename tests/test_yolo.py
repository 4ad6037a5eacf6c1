"""dataset=yolo: Ultralytics' layout read by its rules into the COCO index (issue 73).

Small layouts are written here with PIL; the parity with COCO JSON on coco_tiny's real images
is ``test_yolo_parity.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO
from PIL import Image, ImageOps

from cocodet.datasets.index import DatasetConfigError
from cocodet.datasets.splits import SplitLoader
from cocodet.datasets.yolo_index import image_ids, yolo_splits
from cocodet.datasets.yolo_labels import label_path
from cocodet.datasets.yolo_yaml import find_data_yaml, read_data_yaml

NAMES = ["cat", "dog", "bird"]


def write_image(path, size=(64, 48), color=(40, 40, 40), **save):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, **save)
    return path


def write_label(root, split, stem, lines):
    path = root / "labels" / split / f"{stem}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def layout(root, train="images/train", val="images/val", names=NAMES, **more):
    (root / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": train, "val": val, "names": names, **more}))
    return root / "data.yaml"


@pytest.fixture
def small(tmp_path):
    """Two train images (one box each, one negative without a label file) and one val image."""
    root = tmp_path / "ds"
    for split, stems in (("train", ["000001", "000002", "000003"]), ("val", ["000010"])):
        for stem in stems:
            write_image(root / "images" / split / f"{stem}.jpg")
    write_label(root, "train", "000001", ["0 0.5 0.5 0.5 0.5"])
    write_label(root, "train", "000002", ["2 0.25 0.25 0.25 0.5"])
    write_label(root, "val", "000010", ["1 0.5 0.5 1.0 1.0"])
    layout(root)
    return root


def test_a_layout_reads_into_the_coco_index_with_pixel_boxes_and_its_ground_truth(small, tmp_path):
    train, val = yolo_splits(str(small / "data.yaml"), None, True, str(tmp_path / "cache"))
    assert train.image_ids.tolist() == [1, 2, 3] and train.sizes.tolist() == [[48, 64]] * 3
    np.testing.assert_allclose(train.targets(0)[0], [[16, 12, 48, 36]])
    np.testing.assert_allclose(train.targets(1)[0], [[8, 0, 24, 24]])
    assert len(train.targets(2)[0]) == 0  # no label file: a negative
    assert train.category_ids.tolist() == [0, 1, 2] and train.category_names == NAMES
    assert train.label_to_category(train.targets(1)[1]).tolist() == [2]
    gt = json.loads(open(val.ann_file).read())
    assert gt["annotations"] == [
        {"id": 1, "image_id": 10, "iscrowd": 0, "category_id": 1, "bbox": [0.0, 0.0, 64.0, 48.0], "area": 64.0 * 48.0}
    ]
    assert [c["name"] for c in gt["categories"]] == NAMES
    dropped, _ = yolo_splits(str(small / "data.yaml"), None, False, str(tmp_path / "cache"))
    assert dropped.image_ids.tolist() == [1, 2] and dropped.dropped["empty_image"] == 1


def test_data_yaml_rules(tmp_path):
    root = tmp_path / "rf"
    write_image(root / "train" / "images" / "a.jpg")
    write_image(root / "valid" / "images" / "b.png")
    write_image(root / "extra" / "c.jpg")
    (root / "lists").mkdir()
    (root / "lists" / "val.txt").write_text("../valid/images/b.png\n\n./../extra/c.jpg\n")
    marker = tmp_path / "downloaded"
    # Roboflow's ../train/images beside data.yaml; names as a dict; val as a list of a list file;
    # a download script that must never run.
    data = root / "data.yaml"
    data.write_text(
        yaml.safe_dump(
            {
                "train": "../train/images",
                "val": ["lists/val.txt"],
                "names": {0: "a", 5: "f"},
                "download": f"import pathlib; pathlib.Path('{marker}').write_text('ran')",
            }
        )
    )
    found = read_data_yaml(find_data_yaml(None, str(root)))
    assert found.root == str(root.resolve()) and found.category_ids == (0, 5) and found.names == ("a", "f")
    assert found.splits["train"] == (str((root / "train" / "images").resolve()),)
    train, val = yolo_splits(None, str(root), True, None)
    assert [os.path.basename(p) for p in val.paths] == ["c.jpg", "b.png"] and val.image_ids.tolist() == [0, 1]
    assert not marker.exists()
    data.write_text("train: !!python/object/apply:os.system ['touch " + str(marker) + "']\nval: x\nnames: [a]\n")
    with pytest.raises(DatasetConfigError, match="not readable YAML"):
        read_data_yaml(str(data))
    assert not marker.exists()


@pytest.mark.parametrize(
    "content, named",
    [
        ({"val": "v", "names": ["a"]}, "no train key"),
        ({"train": "t", "val": "nowhere", "names": ["a"]}, "val: nowhere does not exist"),
        ({"train": "t", "val": "t", "names": "a"}, "names must be a list"),
        ({"train": "t", "val": "t", "names": ["a", "b"], "nc": 3}, "nc: 3 but names lists 2"),
    ],
)
def test_a_data_yaml_that_cannot_be_used_is_refused_naming_the_key(tmp_path, content, named):
    (tmp_path / "t").mkdir()
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(content))
    with pytest.raises(DatasetConfigError, match=named):
        read_data_yaml(str(tmp_path / "data.yaml"))


def test_a_missing_data_yaml_exits_2_in_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "mode=plan",
            "dataset=yolo",
            f"dataset.root={tmp_path}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "no data.yaml in dataset.root=" in last and "dataset.yaml=PATH/data.yaml" in last, last


def test_label_files_are_found_by_ultralytics_rule():
    assert label_path("/d/images/train/images/x.jpeg") == "/d/images/train/labels/x.txt"
    assert label_path("/d/images/a.b.png") == "/d/labels/a.b.txt"
    assert label_path("/d/pics/x.jpg") == "/d/pics/x.txt"


def test_image_ids_are_numeric_stems_else_positions():
    assert image_ids(["/a/000000000139.jpg", "/a/7.jpg"]) == [139, 7]
    assert image_ids(["/a/1.jpg", "/b/001.jpg"]) == [0, 1]  # not distinct as numbers
    assert image_ids(["/a/1.jpg", "/a/cat.jpg"]) == [0, 1]


def test_a_segment_line_becomes_its_bounding_box(tmp_path):
    root = tmp_path / "seg"
    write_image(root / "images" / "train" / "1.jpg", size=(100, 50))
    write_image(root / "images" / "val" / "2.jpg", size=(100, 50))
    write_label(root, "train", "1", ["1 0.1 0.2 0.5 0.1 0.3 0.9 0.2 0.6", "0 0.5 0.5 0.2 0.2"])
    layout(root)
    train, _ = yolo_splits(str(root / "data.yaml"), None, True, None)
    # The second line, in a file of segments, is two points (Ultralytics' rule for the whole file).
    np.testing.assert_allclose(train.targets(0)[0], [[10, 5, 50, 45], [20, 10, 50, 25]], atol=1e-4)


# PIL's exif_transpose turns the stored image into the displayed one; its inverse writes a
# stored image whose display is the one drawn.
INVERSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_labels_of_the_oriented_image_land_on_its_stored_pixels(tmp_path, orientation):
    from cocodet.images.read import load_raw

    shown = Image.new("RGB", (80, 50), (0, 0, 0))
    shown.paste((255, 0, 0), (10, 5, 30, 45))  # the object: x 10..30, y 5..45 of the displayed image
    stored = shown.transpose(INVERSE[orientation]) if orientation > 1 else shown
    exif = Image.Exif()
    exif[0x0112] = orientation
    root = tmp_path / "rot"
    (root / "images" / "train").mkdir(parents=True)
    stored.save(root / "images" / "train" / "1.png", exif=exif)
    write_image(root / "images" / "val" / "2.png")
    with Image.open(root / "images" / "train" / "1.png") as im:
        assert ImageOps.exif_transpose(im).tobytes() == shown.tobytes()  # what Ultralytics' labels describe
    write_label(root, "train", "1", [f"0 {20 / 80} {25 / 50} {20 / 80} {40 / 50}"])
    layout(root)
    train, _ = yolo_splits(str(root / "data.yaml"), None, True, None)
    image, boxes, _ = load_raw(train, 0)
    assert tuple(train.sizes[0]) == image.shape[:2] == (stored.height, stored.width)
    red = np.argwhere((image[..., 0] > 200) & (image[..., 1] < 50))
    (y0, x0), (y1, x1) = red.min(0), red.max(0) + 1
    np.testing.assert_allclose(boxes, [[x0, y0, x1, y1]], atol=1e-4)


def test_an_image_outside_the_dataset_folder_is_refused(tmp_path, small):
    outside = write_image(tmp_path / "elsewhere" / "000004.jpg")
    os.symlink(outside, small / "images" / "train" / "000004.jpg")
    with pytest.raises(DatasetConfigError, match="resolves outside the dataset folder"):
        SplitLoader("yolo", str(small)).load()
    train = SplitLoader("yolo", str(small), on_bad_sample="skip").load().train
    assert train.problems.tolist().count("") == 3 and "000004.jpg" in "".join(train.problems.tolist())


def test_the_cached_index_is_rebuilt_when_a_label_or_image_changes(small, tmp_path, caplog):
    import logging

    cache = str(tmp_path / "cache")
    caplog.set_level(logging.INFO, logger="cocodet.datasets.index_cache")

    def index():
        caplog.clear()
        train, _ = yolo_splits(str(small / "data.yaml"), None, True, cache)
        return train, any("built the index" in r.message and " train " in r.message for r in caplog.records)

    assert index()[1]
    assert not index()[1]  # unchanged: read from the cache
    label = small / "labels" / "train" / "000001.txt"
    label.write_text("1 0.5 0.5 0.25 0.25\n")  # modified
    train, built = index()
    assert built and train.labels.tolist()[0] == 2
    write_label(small, "train", "000003", ["0 0.5 0.5 0.5 0.5"])  # added
    train, built = index()
    assert built and len(train.targets(2)[0]) == 1
    label.unlink()  # removed
    train, built = index()
    assert built and len(train.targets(0)[0]) == 0
    write_image(small / "images" / "train" / "000005.jpg")  # an image added
    train, built = index()
    assert built and train.image_ids.tolist() == [1, 2, 3, 5]


# One train image per bad-input class (item 3 of issue 73), and two good ones.
BAD_LINES = {  # stem: (label lines, the problem's words, or None where boxes are dropped and counted)
    "000011": (["0 nan 0.5 0.2 0.2", "1 0.5 0.5 0.2 0.2"], None),  # one non-finite box dropped
    "000012": (["0 0.5 0.5 0.0 0.2", "1 0.5 0.5 0.2 0.2"], None),  # one box of zero area dropped
    "000013": (["0 0.5 0.5 0.2 0.2 0.9"], "line 1: 6 fields, expected 5"),
    "000014": (["1 0.5 0.5 0.2 0.2", "0 0.5 abc 0.2 0.2"], "line 2: non-numeric text"),
    "000015": (["7 0.5 0.5 0.2 0.2"], "line 1: class 7 is not in data.yaml's names"),
    "000016": (["0 0.5 0.5 0.2 1.5"], "line 1: coordinate 1.5 is outside [0, 1] by more than 0.01"),
}


@pytest.fixture
def bad(tmp_path):
    root = tmp_path / "bad"
    for stem in ["000001", "000002", *BAD_LINES, "000017"]:
        write_image(root / "images" / "train" / f"{stem}.jpg")
    write_image(root / "images" / "val" / "000020.jpg")
    write_label(
        root, "train", "000001", ["0 0.5 0.5 0.5 0.5", "2 1.004 0.5 0.1 0.1"]
    )  # 0.4% past the edge: clipped later
    write_label(root, "train", "000002", ["1 0.5 0.5 0.5 0.5"])
    for stem, (lines, _) in BAD_LINES.items():
        write_label(root, "train", stem, lines)
    big = write_label(root, "train", "000017", ["0 0.5 0.5 0.1 0.1"] * 200_000)  # 3.6 MB of boxes
    big.write_text(big.read_text() * 2)  # above the 4 MiB bound
    layout(root)
    return root


def test_each_bad_label_line_is_named_with_its_file_and_line(bad):
    with pytest.raises(DatasetConfigError, match="5 images refused at start") as refused:
        SplitLoader("yolo", str(bad), yaml=str(bad / "data.yaml")).load()
    assert "labels/train/000013.txt line 1: 6 fields" in str(refused.value)
    train = SplitLoader("yolo", str(bad), on_bad_sample="skip").load().train
    problems = dict(zip(train.image_ids.tolist(), train.problems.tolist()))
    for stem, (_, words) in BAD_LINES.items():
        assert (words or "") in problems[int(stem)] and bool(problems[int(stem)]) == bool(words), (
            stem,
            problems[int(stem)],
        )
    assert "above 4194304; not read" in problems[17]
    assert train.dropped == {"non_finite_box": 1, "degenerate_box": 1, "empty_image": 0}
    np.testing.assert_allclose(train.targets(0)[0][1], [61.056, 21.6, 67.456, 26.4], atol=1e-3)


def test_bad_labels_are_skipped_and_counted_in_the_summaries(bad, tmp_path):
    """mode=verify counts the refused images and the dropped boxes exactly; a bench under skip
    draws every train image once and skips exactly the 5 bad ones, with their records."""
    common = [
        sys.executable,
        str(REPO / "train.py"),
        "dataset=yolo",
        f"dataset.yaml={bad / 'data.yaml'}",
        "dataset.on_bad_sample=skip",
        "dataset.image_size=64",
    ]
    proc = subprocess.run(
        [*common, "mode=verify", f"hydra.run.dir={tmp_path / 'verify'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 2 and summary["problems"] == {"train": 5, "val": 0}, proc.stderr[-2000:]
    assert summary["dropped_annotations"]["train"] == {"non_finite_box": 1, "degenerate_box": 1, "empty_image": 0}
    proc = subprocess.run(
        [
            *common,
            "mode=bench",
            "bench.batches=null",
            "bench.warmup=0",
            "bench.decode_probe=0",
            "loader.batch_size=3",
            "augment=none",
            f"hydra.run.dir={tmp_path / 'bench'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (tmp_path / "bench" / "bad_samples.jsonl").read_text().splitlines()]
    counts = summary["bad_samples"]["train"]  # bad replacements of bad images are recorded, not counted twice
    assert (counts["skipped"], counts["seen"], counts["images"]) == (5, 4, 9), counts
    assert sorted(r["image_id"] for r in records if r["role"] == "sample") == [13, 14, 15, 16, 17], records
    assert any("000016.txt line 1: coordinate 1.5" in r["reason"] for r in records), records
