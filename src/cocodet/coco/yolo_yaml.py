"""An Ultralytics ``data.yaml``: where a YOLO-layout dataset's splits are, and its class names.

Ultralytics' rules, restated (its code is not used): ``train`` and ``val`` are each a folder of
images, a text file listing images, or a list of either; ``names`` is a list, or a dict from
class index to name; a ``download:`` key is a script Ultralytics may run, and is never run here.
cocodet's own rules where Ultralytics' depend on its installation: a relative ``path`` is
taken relative to the folder holding ``data.yaml`` (Ultralytics resolves it against its
settings' datasets folder), and so is a split; a Roboflow-style ``../train/images`` that does
not exist there is tried without its ``../``, as Ultralytics does. The file is read with
``yaml.safe_load``: no tag in it can construct an object.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from cocodet.coco.index import DatasetConfigError
from cocodet.storage.store import is_remote

log = logging.getLogger(__name__)

# The image files a split folder is searched for (lower-case suffixes): Ultralytics' image
# formats that cocodet's decode (OpenCV) reads. HEIC, DNG and PFM are Ultralytics' too, but
# need plugins this image does not have.
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
# A data.yaml is a few hundred bytes; one of megabytes is not one.
MAX_YAML_BYTES = 1 << 20


@dataclass(frozen=True)
class YoloLayout:
    """``data.yaml`` read and resolved.

    ``root``: the dataset folder (``path``), absolute: every image must be under it.
    ``splits``: split name -> the folders and list files it names, absolute.
    ``category_ids`` / ``names``: the class indices as ``names`` numbers them, and their names.
    """

    yaml_file: Path
    root: Path
    splits: dict[str, tuple[Path, ...]]
    category_ids: tuple[int, ...]
    names: tuple[str, ...]


def find_data_yaml(yaml_path: str | None, root: str | None) -> Path:
    """``dataset.yaml`` when given, else ``data.yaml`` under ``dataset.root``."""
    for given in (yaml_path, root):
        if given and is_remote(str(given)):
            raise DatasetConfigError(f"dataset=yolo reads a local folder; {given} is a bucket URL. Copy the dataset to "
                                     "a local disk, or convert it to COCO JSON for dataset=coco, which reads buckets")
    if yaml_path:
        path = Path(os.path.expanduser(yaml_path))
        if not path.is_file():
            raise DatasetConfigError(f"dataset.yaml={yaml_path}: no such file (resolved to {path.resolve()})")
        return path.resolve()
    folder = Path(os.path.expanduser(str(root)))
    path = folder / "data.yaml"
    if not path.is_file():
        others = sorted(p.name for p in folder.glob("*.yaml")) if folder.is_dir() else []
        hint = f"; it holds {others}: name one with dataset.yaml=" if others else ""
        raise DatasetConfigError(f"dataset=yolo: no data.yaml in dataset.root={root} (resolved to {folder.resolve()})"
                                 f"{hint}. Set dataset.yaml=PATH/data.yaml, or dataset.root to its folder")
    return path.resolve()


def read_data_yaml(yaml_file: Path) -> YoloLayout:
    """The layout ``yaml_file`` describes; a missing key, a split path that does not exist or
    names that are neither a list nor a dict exit 2 naming them."""
    if yaml_file.stat().st_size > MAX_YAML_BYTES:
        raise DatasetConfigError(f"{yaml_file} is {yaml_file.stat().st_size} bytes, above {MAX_YAML_BYTES}: "
                                 "not a data.yaml")
    try:
        data = yaml.safe_load(yaml_file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DatasetConfigError(f"{yaml_file} is not readable YAML: {e}") from None
    if not isinstance(data, dict):
        raise DatasetConfigError(f"{yaml_file}: a mapping with train, val and names expected, found "
                                 f"{type(data).__name__}")
    if data.get("download"):
        log.info("%s has a download: key; cocodet never runs it (the dataset must be on disk)", yaml_file)
    missing = [k for k in ("train", "val") if not data.get(k)]
    if missing:
        raise DatasetConfigError(f"{yaml_file}: no {' or '.join(missing)} key; data.yaml names each split's images "
                                 "(a folder, a .txt list of images, or a list of either)")
    root = Path(os.path.expanduser(str(data.get("path") or "")))
    root = (root if root.is_absolute() else yaml_file.parent / root).resolve()
    category_ids, names = _names(data, yaml_file)
    splits = {split: tuple(_split_path(root, entry, yaml_file, split) for entry in _entries(data[split]))
              for split in ("train", "val")}
    return YoloLayout(yaml_file, root, splits, category_ids, names)


def _entries(value) -> list[str]:
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def _split_path(root: Path, entry: str, yaml_file: Path, split: str) -> Path:
    path = Path(os.path.expanduser(entry))
    path = path if path.is_absolute() else root / path
    if not path.exists() and entry.startswith("../"):
        path = root / entry[3:]  # Roboflow's exports name ../train/images beside data.yaml
    if not path.exists():
        raise DatasetConfigError(f"{yaml_file}: {split}: {entry} does not exist (resolved to {path.resolve()}, "
                                 f"relative to path: {root})")
    return path.resolve()


def _names(data: dict, yaml_file: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(class indices, names): ``names`` as a list (indices 0..n-1) or a dict {index: name};
    without ``names``, ``nc`` classes named class0, class1, ..."""
    names, nc = data.get("names"), data.get("nc")
    if names is None and isinstance(nc, int) and nc > 0:
        names = [f"class{i}" for i in range(nc)]
    if isinstance(names, list) and names:
        pairs = list(enumerate(names))
    elif isinstance(names, dict) and names and all(isinstance(k, int) and k >= 0 for k in names):
        pairs = sorted(names.items())
    else:
        raise DatasetConfigError(f"{yaml_file}: names must be a list of class names or a mapping from class index "
                                 f"(0, 1, ...) to name; found {names!r}")
    if isinstance(nc, int) and nc != len(pairs):
        raise DatasetConfigError(f"{yaml_file}: nc: {nc} but names lists {len(pairs)} classes; make them agree")
    return tuple(int(k) for k, _ in pairs), tuple(str(v) for _, v in pairs)
