"""Test helpers for the Pascal VOC layout: COCO splits written as VOC's folders, and the reverse,
an independent converter from VOC XML to COCO JSON (the standard library's parser and PIL's
sizes, not cocodet's reader: it shares no code with ``cocodet/datasets/voc.py`` or its XML
reader ``cocodet/datasets/voc_xml.py``, so a fault there cannot cancel out in a parity test)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from PIL import Image
from yolo_layout import link_or_copy


def coco_as_voc(ann_file: Path, image_dir: Path, out: Path, split: str) -> list[str]:
    """Write ``out/JPEGImages/``, ``out/Annotations/<stem>.xml`` and
    ``out/ImageSets/Main/<split>.txt`` from a COCO split: crowd regions become ``difficult``
    objects, corners are VOC's 1-based inclusive pixels at full precision (xmin = x + 1,
    xmax = x + w); returns the split's ids."""
    data = json.loads(ann_file.read_text())
    names = {c["id"]: c["name"] for c in data["categories"]}
    objects: dict[int, list] = {}
    for a in data["annotations"]:
        objects.setdefault(a["image_id"], []).append(a)
    ids = []
    for im in data["images"]:
        stem = Path(im["file_name"]).stem
        link_or_copy(image_dir / im["file_name"], out / "JPEGImages" / im["file_name"])
        root = ET.Element("annotation")
        ET.SubElement(root, "folder").text = "VOC"
        ET.SubElement(root, "filename").text = im["file_name"]
        size = ET.SubElement(root, "size")
        for key, value in (("width", im["width"]), ("height", im["height"]), ("depth", 3)):
            ET.SubElement(size, key).text = str(value)
        for a in objects.get(im["id"], []):
            x, y, w, h = a["bbox"]
            obj = ET.SubElement(root, "object")
            ET.SubElement(obj, "name").text = names[a["category_id"]]
            ET.SubElement(obj, "difficult").text = str(int(a.get("iscrowd", 0)))
            box = ET.SubElement(obj, "bndbox")
            for key, value in (("xmin", x + 1), ("ymin", y + 1), ("xmax", x + w), ("ymax", y + h)):
                ET.SubElement(box, key).text = repr(float(value))
        (out / "Annotations").mkdir(parents=True, exist_ok=True)
        ET.ElementTree(root).write(out / "Annotations" / f"{stem}.xml", encoding="utf-8", xml_declaration=True)
        ids.append(stem)
    listing = out / "ImageSets" / "Main" / f"{split}.txt"
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text("".join(f"{i}\n" for i in ids))
    return ids


def voc_as_coco(root: Path, split: str, class_splits: tuple[str, ...], out: Path, classes: list | None = None) -> Path:
    """The independent converter: the split's ids (image id = the numeric id), sizes from the
    images, ``classes`` or those sorted by name over ``class_splits`` (category id = 1 +
    position), each object as ``[xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1]`` with
    ``area`` = w * h and ``iscrowd`` = difficult."""

    def ids(s: str) -> list[str]:
        return (root / "ImageSets" / "Main" / f"{s}.txt").read_text().split()

    def parsed(i: str) -> ET.Element:
        return ET.parse(root / "Annotations" / f"{i}.xml").getroot()

    classes = classes or sorted(
        {o.findtext("name") for s in class_splits for i in ids(s) for o in parsed(i).iter("object")}
    )
    images, annotations = [], []
    for i in ids(split):
        tree = parsed(i)
        with Image.open(root / "JPEGImages" / tree.findtext("filename")) as im:
            w, h = im.size
        images.append({"id": int(i), "file_name": tree.findtext("filename"), "width": w, "height": h})
        for o in tree.iter("object"):
            x0, y0, x1, y1 = (float(o.find("bndbox").findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
            box = [x0 - 1, y0 - 1, x1 - x0 + 1, y1 - y0 + 1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": int(i),
                    "bbox": box,
                    "area": box[2] * box[3],
                    "category_id": classes.index(o.findtext("name")) + 1,
                    "iscrowd": int(o.findtext("difficult") == "1"),
                }
            )
    categories = [{"id": k + 1, "name": n} for k, n in enumerate(classes)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return out
