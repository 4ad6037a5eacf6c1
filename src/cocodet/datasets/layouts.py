"""The dataset layouts, one table: ``dataset.layout`` -> the keys of the dataset group its reader
reads and the reader itself. A layout is added here, by one entry, and nowhere else in the code:
the datamodule and ``mode=plan`` load splits through ``splits.SplitLoader``, which looks the layout
up; config validation and the resume check ask this table for the keys.

A reader is a function ``read_splits(source: Source) -> Splits`` named by "module:function" and
imported when used, so that a layout's own parser is loaded only by runs that use
it, and this table stays importable by ``mode=plan`` and config validation in milliseconds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cocodet.schema import Rule

if TYPE_CHECKING:  # the config's validation reads this table without the index's libraries
    from cocodet.datasets.index import CocoIndex


@dataclass(frozen=True)
class Source:
    """What a reader is given: the dataset's root, the keep_empty rule for the train split (val
    keeps its negatives), the index cache folder (None: no cache), and the layout's own keys
    as the dataset group gives them (absent keys: the reader's defaults)."""

    root: str | None
    keep_empty: bool | str
    cache_dir: str | None
    options: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.options.get(key)
        return default if value is None else value


@dataclass(frozen=True)
class Splits:
    """What a reader returns: the (train, val) indexes; each split's ground truth, a local COCO
    instances JSON that COCOeval scores it by (regions to ignore marked ``iscrowd``); and where
    the train images are, (root, folder under it), for a bucket's read-ahead to list."""

    train: CocoIndex
    val: CocoIndex
    train_ground_truth: str
    val_ground_truth: str
    train_images: tuple[str, str]


@dataclass(frozen=True)
class Layout:
    keys: tuple[str, ...]  # the dataset keys this layout reads besides splits.SOURCE_KEYS
    reader: str  # "module:function" returning Splits from a Source
    rules: tuple[Rule, ...] = ()  # its keys' rules, checked at start with the others (run_spec/validate.py)

    def read(self, source: Source) -> Splits:
        module, function = self.reader.split(":")
        return getattr(importlib.import_module(module), function)(source)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _names(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_text(n) for n in v) and len(set(v)) == len(v)


LAYOUTS: dict[str, Layout] = {
    "coco": Layout(
        ("train_images", "train_ann", "val_images", "val_ann", "synthetic"), "cocodet.datasets.coco_layout:read_splits"
    ),
    "yolo": Layout(
        ("yaml",),
        "cocodet.datasets.yolo_index:read_splits",
        (
            Rule(
                "dataset.yaml",
                _text,
                "the path of a data.yaml (dataset=yolo), or null for <dataset.root>/data.yaml",
                optional=True,
            ),
        ),
    ),
    "voc": Layout(
        ("train_list", "val_list", "classes"),
        "cocodet.datasets.voc:read_splits",
        (
            Rule("dataset.train_list", _text, "a split's id list, relative to dataset.root"),
            Rule("dataset.val_list", _text, "a split's id list, relative to dataset.root"),
            Rule(
                "dataset.classes",
                _names,
                "a list of distinct class names (category id = 1 + position), or "
                "null for every <name> of both splits, sorted",
                optional=True,
            ),
        ),
    ),
}


def layout_keys() -> tuple[str, ...]:
    """Every layout's own keys, in table order, each once: the dataset group may hold any of them
    (a layout's config inherits coco.yaml's keys); the chosen layout reads only its own."""
    return tuple(dict.fromkeys(key for layout in LAYOUTS.values() for key in layout.keys))


def layout_rules() -> tuple[Rule, ...]:
    """``dataset.layout`` is a key of the table, and each layout's own rules."""
    names = list(LAYOUTS)
    allowed = ", ".join(names[:-1]) + " or " + names[-1]
    return (
        Rule("dataset.layout", lambda v: isinstance(v, str) and v in LAYOUTS, allowed),
        *(rule for layout in LAYOUTS.values() for rule in layout.rules),
    )
