"""dataset=voc: Pascal VOC's layout read by its rules into the flat index (``datasets/voc.py``).

coco_tiny written as VOC (``voc_layout.coco_as_voc``) gives the stream of its XML converted back
to COCO JSON by an independent converter (``voc_layout.voc_as_coco``). Small folders written
here show the ids, the classes, the corner mapping, a difficult object ignored by COCOeval, and
each bad input refused at start or skipped with a record. One checkpoint scoring both ground
truths alike is ``test_overfit_real.py``'s."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_in_process
from PIL import Image
from voc_layout import coco_as_voc, voc_as_coco

from cocodet.datasets.index import DatasetConfigError
from cocodet.datasets.splits import SplitLoader


@pytest.fixture(scope="module")
def voc_tiny(coco_tiny, tmp_path_factory):
    """coco_tiny's two splits as one VOC folder (crowd regions as difficult objects)."""
    out = tmp_path_factory.mktemp("voc_tiny")
    for split in ("train", "val"):
        coco_as_voc(coco_tiny / "annotations" / f"instances_{split}2017.json", coco_tiny / f"{split}2017", out, split)
    return out


@pytest.mark.slow
def test_voc_and_its_coco_json_give_the_same_stream(voc_tiny, tmp_path):
    """The train loader's epoch 0 (mosaic) and the val loader's batches: the same pixels, image
    ids and labels, boxes within 1e-3 px, categories by name over both splits."""
    from test_yolo_parity import differences, stream

    jsons = {s: voc_as_coco(voc_tiny, s, ("train", "val"), tmp_path / f"{s}.json") for s in ("train", "val")}
    voc = stream(["dataset=voc", f"dataset.root={voc_tiny}"], tmp_path / "voc")
    coco = stream(
        [
            "dataset=coco",
            f"dataset.root={voc_tiny}",
            "dataset.train_images=JPEGImages",
            f"dataset.train_ann={jsons['train']}",
            "dataset.val_images=JPEGImages",
            f"dataset.val_ann={jsons['val']}",
        ],
        tmp_path / "coco",
    )
    assert len(voc) == 20 and sum(len(t) for _, t in voc) == 160
    assert sum(len(t["boxes"]) for _, targets in voc for t in targets) > 400
    assert differences(voc, coco) == []
    splits = SplitLoader("voc", str(voc_tiny)).load()
    categories = json.loads(jsons["val"].read_text())["categories"]
    assert splits.val.category_names == [c["name"] for c in categories] == sorted(c["name"] for c in categories)
    assert splits.train.dropped["difficult"] == 6 and splits.val.dropped["difficult"] == 11  # coco_tiny's crowds


def annotation(filename: str, objects: list, size=(64, 48), doctype: str = "") -> str:
    """A VOC XML: ``objects`` as (name, difficult, (xmin, ymin, xmax, ymax)); text as given."""
    body = "".join(
        f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
        f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
        for n, d, (x0, y0, x1, y1) in objects
    )
    return (
        f'<?xml version="1.0"?>{doctype}<annotation><filename>{filename}</filename><size><width>{size[0]}'
        f"</width><height>{size[1]}</height><depth>3</depth></size>{body}</annotation>"
    )


def write_voc(root, splits: dict[str, dict[str, str]], images=True):
    """``splits``: split -> {id: XML text}; each id's image ``<id>.jpg`` (64 x 48)."""
    for split, items in splits.items():
        (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{i}\n" for i in items))
        for i, text in items.items():
            (root / "Annotations").mkdir(exist_ok=True)
            (root / "Annotations" / f"{i}.xml").write_text(text)
            (root / "JPEGImages").mkdir(exist_ok=True)
            if images:
                Image.new("RGB", (64, 48), (40, 40, 40)).save(root / "JPEGImages" / f"{i}.jpg")
    return root


def test_ids_classes_corners_and_difficult_objects(tmp_path):
    root = write_voc(
        tmp_path / "voc",
        {
            "train": {
                "2008_000002": annotation("2008_000002.jpg", [("dog", 0, (1, 1, 10, 20)), ("cat", 1, (5, 5, 9, 9))]),
                "2008_000001": annotation("2008_000001.jpg", [("bird", 0, (33, 2, 64, 48))]),
            },
            "val": {"000007": annotation("000007.jpg", [("zebra", 0, (1, 1, 64, 48))])},
        },
    )
    splits = SplitLoader("voc", str(root), cache_dir=str(tmp_path / "cache")).load()
    train, val = splits.train, splits.val
    assert train.image_ids.tolist() == [0, 1] and val.image_ids.tolist() == [7]  # positions; numeric ids
    assert train.category_names == ["bird", "cat", "dog", "zebra"] and train.category_ids.tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(train.targets(1)[0], [[0, 0, 10, 20]])  # 1-based inclusive corners
    assert train.targets(1)[1].tolist() == [3] and train.dropped["difficult"] == 1  # the cat: no target
    truth = json.loads(open(splits.train_ground_truth).read())
    assert [(a["image_id"], a["category_id"], a["bbox"], a["area"], a["iscrowd"]) for a in truth["annotations"]] == [
        (0, 1, [32.0, 1.0, 32.0, 47.0], 32.0 * 47.0, 0),
        (1, 3, [0.0, 0.0, 10.0, 20.0], 200.0, 0),
        (1, 2, [4.0, 4.0, 5.0, 5.0], 25.0, 1),
    ]  # the difficult cat: a region COCOeval ignores
    named = SplitLoader("voc", str(root), classes=["zebra", "dog", "cat", "bird"]).load().train
    assert named.category_names == ["zebra", "dog", "cat", "bird"] and named.targets(1)[1].tolist() == [2]
    assert SplitLoader("voc", str(root), cache_dir=str(tmp_path / "cache")).load().train.ann_file == train.ann_file


def test_a_difficult_object_is_ignored_by_cocoeval(tmp_path):
    """Against the reader's ground truth, missing the difficult object costs nothing and a
    detection on it is no false positive; as a plain box, or left out, it would cost AP."""
    from cocodet.models.evaluation import evaluate, load_ground_truth

    root = write_voc(
        tmp_path / "voc",
        {
            s: {"000001": annotation("000001.jpg", [("dog", 0, (1, 1, 20, 20)), ("dog", 1, (31, 21, 60, 46))])}
            for s in ("train", "val")
        },
    )
    truth = json.loads(open(SplitLoader("voc", str(root)).load().val.ann_file).read())
    assert [a["iscrowd"] for a in truth["annotations"]] == [0, 1]
    dog = {"image_id": 1, "category_id": 1, "bbox": [0, 0, 20, 20], "score": 0.5}
    on_difficult = {**dog, "bbox": [30, 20, 30, 26], "score": 0.9}

    def ap(gt: dict, results: list[dict]) -> float:
        path = tmp_path / f"gt{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(gt))
        return evaluate(load_ground_truth(path, "pycocotools"), results, backend="pycocotools")["map50"]

    assert ap(truth, [dog]) == pytest.approx(1.0) and ap(truth, [dog, on_difficult]) == pytest.approx(1.0)
    plain = {**truth, "annotations": [{**a, "iscrowd": 0} for a in truth["annotations"]]}
    absent = {**truth, "annotations": truth["annotations"][:1]}
    assert ap(plain, [dog]) < 0.6 and ap(absent, [dog, on_difficult]) < 0.6


DTD = '<!DOCTYPE annotation [<!ENTITY who "dog">]>'
# One val image per bad-input class, with the words its problem must hold (file and object named).
BAD = {
    "000011": (
        annotation("000011.jpg", [("dog", 0, (1, 1, 9, 9)), ("dog", 0, (3, 3, 70, 20))]),
        "000011.xml <object> 2 of 2: box xmin=3 ymin=3 xmax=70 ymax=20 lies outside the 64x48 image",
    ),
    "000012": (
        annotation("000012.jpg", [("dog", 0, (9, 9, 7, 20))]),
        "000012.xml <object> 1 of 1: box xmin=9 ymin=9 xmax=7 ymax=20 has no area",
    ),
    "000013": (
        annotation("000013.jpg", [("dog", 0, (1, 1, 9, 9)), ("horse", 0, (1, 1, 9, 9))]),
        "000013.xml <object> 2 of 2: class 'horse' is not in dataset.classes",
    ),
    "000014": (annotation("000014.jpg", [("dog", 0, (1, 1, 9, 9))])[:-5], "000014.xml: not well-formed XML"),
    "000015": (
        annotation("000015.jpg", [("&who;", 0, (1, 1, 9, 9))], doctype=DTD),
        "000015.xml: refused unread: it declares a DTD or entities (DTDForbidden)",
    ),
    "000016": (annotation("absent.jpg", [("dog", 0, (1, 1, 9, 9))]), "JPEGImages/absent.jpg not found"),
    "000017": (
        annotation("../000001.jpg", [("dog", 0, (1, 1, 9, 9))]),
        "<filename> '../000001.jpg' resolves outside the dataset root",
    ),
}


@pytest.fixture
def bad(tmp_path):
    good = {i: annotation(f"{i}.jpg", [("dog", 0, (1, 1, 30, 30))]) for i in ("000001", "000002")}
    return write_voc(tmp_path / "bad", {"train": good, "val": {**good, **{i: text for i, (text, _) in BAD.items()}}})


def test_each_bad_input_is_refused_at_start_naming_file_and_object(bad):
    refused_words = f"dataset.layout=voc, val split: {len(BAD)} images refused at start"
    with pytest.raises(DatasetConfigError, match=refused_words) as refused:
        SplitLoader("voc", str(bad), classes=["dog"]).load()
    assert BAD["000011"][1] in str(refused.value) and "dataset.on_bad_sample=skip" in str(refused.value)
    val = SplitLoader("voc", str(bad), classes=["dog"], on_bad_sample="skip").load().val
    problems = dict(zip(val.image_ids.tolist(), val.problems.tolist()))
    assert problems[1] == problems[2] == ""
    for i, (_, words) in BAD.items():
        assert words in problems[int(i)], (i, problems[int(i)])
    assert len(val.targets(val.image_ids.tolist().index(15))[0]) == 0  # nothing of the refused file is read


def test_bad_input_is_skipped_and_recorded(bad, tmp_path):
    """A whole epoch of mode=bench over them under skip: each bad image replaced, with its record."""
    s = run_in_process(
        [
            "mode=bench",
            "dataset=voc",
            f"dataset.root={bad}",
            "dataset.classes=[dog]",
            "dataset.on_bad_sample=skip",
            "dataset.image_size=64",
            "augment=none",
            "dataset.train_list=ImageSets/Main/val.txt",
            "loader=explicit",
            "loader.num_workers=0",
            "loader.batch_size=3",
            "bench.batches=null",
            "bench.warmup=0",
            "bench.decode_probe=0",
        ],
        tmp_path / "bench",
    )
    records = [json.loads(line) for line in (tmp_path / "bench" / "bad_samples.jsonl").read_text().splitlines()]
    assert s["examples"] == len(BAD) + 2 and s["bad_samples"]["train"]["images"] == len(BAD) + 2
    reasons = {r["image_id"]: r["reason"] for r in records if r["role"] == "sample"}
    assert sorted(reasons) == sorted(int(i) for i in BAD)  # each bad image at its own position, no good one
    assert all(words in reasons[int(i)] for i, (_, words) in BAD.items()), reasons


def test_voc_keys_are_checked_at_start(tmp_path):
    from conftest import REPO
    from hydra import compose, initialize_config_dir

    from cocodet.errors import ConfigError
    from cocodet.run_spec.read import read_spec

    for override, words in (
        ("dataset.classes=[]", "dataset.classes=[] is not allowed: expected a list of distinct"),
        ("+dataset.train_lists=x", "did you mean dataset.train_list?"),
        ("dataset.layout=pascal", "expected coco, yolo or voc"),
    ):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["dataset=voc", override, f"output_dir={tmp_path}"])
        with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
            read_spec(cfg)
