"""Every read of dataset bytes in src/ goes through ``cocodet.storage.store.read_bytes``, the one
reader that knows remote roots (a bucket URL): an ast scan finds each binary read (``open``
in a binary read mode, ``Path.read_bytes``, ``np.fromfile``, a decoder given a path) and fails
on any outside the functions allowed to make one, each for a reason that is not a dataset file."""

from __future__ import annotations

import ast
import textwrap

import pytest
from src_scan import ScopedFinder, calls_in, calls_in_src

ALLOWED = {
    "cocodet.storage.store.read_bytes": "the one reader: a local file, or the object at a URL",
    "cocodet.storage.cache_files._sha256": "checksums of cocodet's own cache files",
    "cocodet.data.pixel_cache.PixelCache.preload": "cocodet's own pixel file, read through once (dataset.cache=ram)",
    "cocodet.datasets.index_cache.index_key": "hashes the annotation file: local, or the local copy of a URL",
    "cocodet.datasets.index.load_coco_json": "parses the annotation file: local, or the local copy of a URL",
    "cocodet.inference.standalone_predict.read_image": "the shipped predict.py: cannot import cocodet",
    "cocodet.read_ahead.object_cache.ObjectCache._read_copy": (
        "the read-ahead's local copies of objects read_bytes fetched"
    ),
}


def _binary_mode(call: ast.Call, position: int = 1) -> bool:
    """Whether the call's mode argument (``open(path, mode)``; ``path.open(mode)``: position 0)
    reads bytes."""
    mode = (
        call.args[position]
        if len(call.args) > position
        else next((k.value for k in call.keywords if k.arg == "mode"), None)
    )
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and "b" in mode.value
        and not any(c in mode.value for c in "wax+")
    )


class ReadFinder(ScopedFinder):
    """Binary reads."""

    def match(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and _binary_mode(node):
            return "open(rb)"
        if isinstance(func, ast.Attribute) and func.attr == "open" and _binary_mode(node, 0):
            return "x.open(rb)"
        if isinstance(func, ast.Attribute) and func.attr in ("read_bytes", "fromfile", "imread"):
            return func.attr
        return None


def reads_in(source: str) -> list[tuple[str, str, int]]:
    return calls_in(ReadFinder, source)


def all_reads() -> dict[str, list[tuple[str, int]]]:
    return calls_in_src(ReadFinder)


def test_every_binary_read_in_src_is_in_an_allowed_function():
    outside = {f: calls for f, calls in all_reads().items() if f not in ALLOWED}
    assert not outside, (
        f"binary reads outside the storage reader: {outside}; call "
        "cocodet.storage.store.read_bytes (it reads local paths and bucket URLs alike)"
    )


def test_every_allowed_function_still_reads():
    assert set(all_reads()) >= set(ALLOWED), set(ALLOWED) - set(all_reads())


@pytest.mark.parametrize(
    "source,expect",
    [
        ("def f(p):\n    with open(p, 'rb') as f:\n        return f.read()", [("f", "open(rb)")]),
        ("def f(p):\n    return open(p, mode='rb').read()", [("f", "open(rb)")]),
        (
            "from pathlib import Path\nclass A:\n    def g(self, p):\n        return Path(p).read_bytes()",
            [("A.g", "read_bytes")],
        ),
        ("import numpy as np\ndef f(p):\n    return np.fromfile(p, np.uint8)", [("f", "fromfile")]),
        ("def f(p):\n    return p.open('rb')", [("f", "x.open(rb)")]),
        ("def f(p):\n    return open(p, 'wb')", []),
        ("def f(p):\n    return open(p)", []),
    ],
)
def test_the_scan_finds_a_binary_read_in_any_spelling(source, expect):
    assert [(w, k) for w, k, _ in reads_in(textwrap.dedent(source))] == expect
