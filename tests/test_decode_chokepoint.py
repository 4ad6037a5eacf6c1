"""Every decode in src/ goes through the one guarded decode (design §8.1): an ast scan finds
each call that turns bytes into pixels, whatever the import spelling, and fails on any outside
the named functions that are allowed to make one."""

from __future__ import annotations

import ast
import textwrap

import pytest
from src_scan import ScopedFinder, calls_in, calls_in_src

# function (module.qualname) -> why it may decode
ALLOWED = {
    "cocodet.images.decode._imdecode": "the one decode; reached only through decode_checked",
    "cocodet.images.header._pil_size": "PIL's lazy open reads the header only",
    "cocodet.datasets.yolo_headers.image_header": "PIL's lazy open of the bytes read_bytes gave: a YOLO image's size "
    "and EXIF orientation",
    "cocodet.bench.common_way.CommonWayDataset._raw": "the PIL baseline; check_header first",
    "cocodet.inference.standalone_predict.read_image": "cannot import cocodet; its own header check first",
    "cocodet.inference.standalone_predict.header_size": "PIL's lazy open reads the header only",
}
DECODERS = {
    "cv2.imdecode",
    "cv2.imread",
    "cv2.imreadmulti",
    "cv2.imdecodemulti",
    "cv2.imreadanimation",
    "cv2.imdecodeanimation",
    "cv2.imcount",
    "PIL.Image.open",
    "torchvision.io.read_image",
    "torchvision.io.image.read_image",
    "skimage.io.imread",
    "imageio.imread",
    "imageio.v3.imread",
}


def is_decoder(name: str) -> bool:
    parts = name.split(".")
    return name in DECODERS or (parts[:2] == ["torchvision", "io"] and parts[-1].startswith("decode_"))


class DecodeFinder(ScopedFinder):
    """Calls of a decoder. Imports are followed wherever they are (module or function level),
    aliases included."""

    def __init__(self):
        super().__init__()
        self.names: dict[str, str] = {}  # local name -> dotted origin

    def visit_Import(self, node):
        for a in node.names:
            if a.asname:
                self.names[a.asname] = a.name
            else:
                self.names[a.name.split(".")[0]] = a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        for a in node.names:
            self.names[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(self, node) -> str | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def match(self, node):
        name = self.dotted(node.func)
        return name if name and is_decoder(name) else None


def decodes_in(source: str) -> list[tuple[str, str, int]]:
    return calls_in(DecodeFinder, source)


def all_decodes() -> dict[str, list[tuple[str, int]]]:
    return calls_in_src(DecodeFinder)


def test_every_decode_in_src_is_in_an_allowed_function():
    outside = {f: calls for f, calls in all_decodes().items() if f not in ALLOWED}
    assert not outside, (
        f"decoding calls outside the guarded decode: {outside}; call "
        "cocodet.images.decode.decode_checked (it checks the header first)"
    )


def test_every_allowed_function_still_decodes():
    """An allowlist entry whose function moved or stopped decoding would hide nothing today but
    could allow a new decode of that name tomorrow."""
    assert set(all_decodes()) >= set(ALLOWED), set(ALLOWED) - set(all_decodes())


@pytest.mark.parametrize(
    "source,expect",
    [
        ("import cv2\ndef f(d):\n    return cv2.imdecode(d, 1)", [("f", "cv2.imdecode")]),
        ("import cv2 as c\nclass A:\n    def g(self, p):\n        return c.imread(p)", [("A.g", "cv2.imread")]),
        ("from cv2 import imdecode as dec\ndef f(d):\n    return dec(d, 1)", [("f", "cv2.imdecode")]),
        ("def f(p):\n    from PIL import Image\n    return Image.open(p)", [("f", "PIL.Image.open")]),
        ("import PIL.Image\ndef f(p):\n    return PIL.Image.open(p)", [("f", "PIL.Image.open")]),
        ("from PIL.Image import open as pil_open\ndef f(p):\n    return pil_open(p)", [("f", "PIL.Image.open")]),
        (
            "import torchvision\ndef f(t):\n    return torchvision.io.decode_jpeg(t)",
            [("f", "torchvision.io.decode_jpeg")],
        ),
        (
            "from torchvision.io import read_image\ndef f(p):\n    return read_image(p)",
            [("f", "torchvision.io.read_image")],
        ),
        ("from torchvision import io\ndef f(t):\n    return io.decode_png(t)", [("f", "torchvision.io.decode_png")]),
        ("import cv2\ndef f(d):\n    return cv2.imencode('.png', d)", []),
        ("def open(p):\n    return p\ndef f(p):\n    return open(p)", []),
    ],
)
def test_the_scan_finds_a_decode_in_any_spelling(source, expect):
    assert [(w, n) for w, n, _ in decodes_in(textwrap.dedent(source))] == expect
