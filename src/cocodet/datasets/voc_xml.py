"""One Pascal VOC annotation file read (``Annotations/<id>.xml``), and each of its objects
checked; the split's reader (``voc.py``) builds the index from what these return.

The XML is parsed by defusedxml with DTDs and entities refused, so a file that declares them
is never expanded; a file above ``MAX_XML_BYTES`` is not read. What cannot be used comes back as
a problem string naming the file, never as an exception: the reader records it on the image.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from cocodet.storage.store import read_bytes

MAX_XML_BYTES = 1 << 20  # a VOC annotation is a few KB; a larger file is not read
# Corners this far past the edge are clipped later, as COCO's are: 0-based ones (xmin = 0) are common
EDGE_PX = 1.0
CORNERS = ("xmin", "ymin", "xmax", "ymax")


class Annotation(NamedTuple):
    """One XML read; ``objects``: (name, difficult, VOC corners or None); ``problem``: why not usable, or ""."""

    filename: str
    hw: tuple[int, int]
    objects: list[tuple[str, bool, tuple[float, ...] | None]]
    problem: str


def read_xml(path: str, stamp: str) -> Annotation:
    """The annotation at ``path`` (``stamp``: its ``storage.store.file_stamps`` stamp)."""
    bad = lambda why: Annotation("", (0, 0), [], f"{path}: {why}")  # noqa: E731
    if stamp == "missing":
        return bad("no such annotation file (the split's list names its id)")
    if (size := int(stamp.split("\0")[0])) > MAX_XML_BYTES:
        return bad(f"{size} bytes, above {MAX_XML_BYTES}; not read")
    try:
        tree = fromstring(read_bytes(path), forbid_dtd=True)  # entities and external references: refused too
    except DefusedXmlException as e:
        return bad(
            f"refused unread: it declares a DTD or entities ({type(e).__name__}); a VOC annotation needs "
            "neither, remove the <!DOCTYPE> declaration"
        )
    except ParseError as e:
        return bad(f"not well-formed XML ({e})")
    except OSError as e:
        return bad(f"cannot be read ({e})")
    try:
        hw = (int(tree.findtext("size/height")), int(tree.findtext("size/width")))
    except (TypeError, ValueError):
        hw = (0, 0)
    filename = (tree.findtext("filename") or "").strip()
    if not filename or min(hw) <= 0:
        return bad("needs <filename> and a <size> with positive integer <width> and <height>")
    objects = []
    for obj in tree.findall("object"):
        try:
            corners = tuple(float(obj.findtext(f"bndbox/{c}")) for c in CORNERS)
        except (TypeError, ValueError):
            corners = None
        difficult = (obj.findtext("difficult") or "0").strip() in ("1", "true", "True")
        objects.append(((obj.findtext("name") or "").strip(), difficult, corners))
    return Annotation(filename, hw, objects, "")


def object_problem(name: str, corners: tuple[float, ...] | None, hw: tuple[int, int], category: dict) -> str:
    """Why an object cannot be a target (no class or one outside ``category``, corners missing,
    without area or past the image's edge by more than ``EDGE_PX``), or ""."""
    if not name or name not in category:
        return "no <name>" if not name else f"class {name!r} is not in dataset.classes (its {len(category)} names)"
    if corners is None or not all(math.isfinite(c) for c in corners):
        return f"<bndbox> needs numeric {', '.join(CORNERS)}"
    (xmin, ymin, xmax, ymax), (h, w) = corners, hw
    shown = f"box xmin={xmin:g} ymin={ymin:g} xmax={xmax:g} ymax={ymax:g}"
    if not (xmax - xmin + 1 > 0 and ymax - ymin + 1 > 0):
        return f"{shown} has no area (corners are 1-based and inclusive: xmax >= xmin, ymax >= ymin)"
    if xmin - 1 < -EDGE_PX or ymin - 1 < -EDGE_PX or xmax > w + EDGE_PX or ymax > h + EDGE_PX:
        return f"{shown} lies outside the {w}x{h} image (corners run 1..{w} and 1..{h})"
    return ""
