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
import posixpath
from dataclasses import dataclass

import yaml

from cocodet.datasets.index import DatasetConfigError
from cocodet.storage.store import is_dir, is_file, object_info, read_bytes
from cocodet.storage.urls import is_remote, join

log = logging.getLogger(__name__)

# The image files a split folder is searched for (lower-case suffixes): Ultralytics' image
# formats that cocodet's decode (OpenCV) reads. HEIC, DNG and PFM are Ultralytics' too, but
# need plugins this image does not have.
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
# A data.yaml is a few hundred bytes; one of megabytes is not one.
MAX_YAML_BYTES = 1 << 20


@dataclass(frozen=True)
class YoloLayout:
    """``data.yaml`` read and resolved; every location a local absolute path or a URL.

    ``root``: the dataset folder (``path``): every image must be under it.
    ``splits``: split name -> the folders and list files it names.
    ``category_ids`` / ``names``: the class indices as ``names`` numbers them, and their names.
    """

    yaml_file: str
    root: str
    splits: dict[str, tuple[str, ...]]
    category_ids: tuple[int, ...]
    names: tuple[str, ...]


def resolve(base: str, relative: str) -> str:
    """``relative`` under the folder ``base`` (itself if absolute), ``..`` folded: a real path
    locally, a URL's key normalised in a bucket."""
    if is_remote(relative):
        return relative
    if is_remote(base):
        protocol, key = base.split("://", 1)
        return f"{protocol}://{posixpath.normpath(posixpath.join(key, relative))}"
    return os.path.realpath(os.path.join(base, os.path.expanduser(relative)))


def parent(location: str) -> str:
    return location.rsplit("/", 1)[0] if is_remote(location) else os.path.dirname(location)


def find_data_yaml(yaml_path: str | None, root: str | None) -> str:
    """``dataset.yaml`` when given, else ``data.yaml`` under ``dataset.root``."""
    if yaml_path:
        path = yaml_path if is_remote(yaml_path) else os.path.realpath(os.path.expanduser(yaml_path))
        if not is_file(path):
            raise DatasetConfigError(f"dataset.yaml={yaml_path}: no such file (resolved to {path})")
        return path
    folder = str(root) if is_remote(str(root)) else os.path.realpath(os.path.expanduser(str(root)))
    path = join(folder, "data.yaml")
    if not is_file(path):
        others = sorted(f for f in os.listdir(folder) if f.endswith(".yaml")) if os.path.isdir(folder) else []
        hint = f"; it holds {others}: name one with dataset.yaml=" if others else ""
        raise DatasetConfigError(
            f"dataset=yolo: no data.yaml in dataset.root={root} (resolved to {folder})"
            f"{hint}. Set dataset.yaml=PATH/data.yaml, or dataset.root to its folder"
        )
    return path


def read_data_yaml(yaml_file: str) -> YoloLayout:
    """The layout ``yaml_file`` describes; a missing key, a split path that does not exist or
    names that are neither a list nor a dict exit 2 naming them."""
    size = object_info(yaml_file)["size"] if is_remote(yaml_file) else os.stat(yaml_file).st_size
    if size > MAX_YAML_BYTES:
        raise DatasetConfigError(f"{yaml_file} is {size} bytes, above {MAX_YAML_BYTES}: not a data.yaml")
    try:
        data = yaml.safe_load(read_bytes(yaml_file).decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DatasetConfigError(f"{yaml_file} is not readable YAML: {e}") from None
    if not isinstance(data, dict):
        raise DatasetConfigError(
            f"{yaml_file}: a mapping with train, val and names expected, found {type(data).__name__}"
        )
    if data.get("download"):
        log.info("%s has a download: key; cocodet never runs it (the dataset must be on disk)", yaml_file)
    missing = [k for k in ("train", "val") if not data.get(k)]
    if missing:
        raise DatasetConfigError(
            f"{yaml_file}: no {' or '.join(missing)} key; data.yaml names each split's images "
            "(a folder, a .txt list of images, or a list of either)"
        )
    root = resolve(parent(yaml_file), str(data.get("path") or "."))
    category_ids, names = _names(data, yaml_file)
    splits = {
        split: tuple(_split_path(root, entry, yaml_file, split) for entry in _entries(data[split]))
        for split in ("train", "val")
    }
    return YoloLayout(yaml_file, root, splits, category_ids, names)


def _entries(value) -> list[str]:
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def _split_path(root: str, entry: str, yaml_file: str, split: str) -> str:
    path = resolve(root, entry)
    if not _exists(path) and entry.startswith("../"):
        path = resolve(root, entry[3:])  # Roboflow's exports name ../train/images beside data.yaml
    if not _exists(path):
        raise DatasetConfigError(
            f"{yaml_file}: {split}: {entry} does not exist (resolved to {path}, relative to path: {root})"
        )
    return path


def _exists(location: str) -> bool:
    return is_dir(location) or is_file(location)


def _names(data: dict, yaml_file: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
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
        raise DatasetConfigError(
            f"{yaml_file}: names must be a list of class names or a mapping from class index "
            f"(0, 1, ...) to name; found {names!r}"
        )
    if isinstance(nc, int) and nc != len(pairs):
        raise DatasetConfigError(f"{yaml_file}: nc: {nc} but names lists {len(pairs)} classes; make them agree")
    return tuple(int(k) for k, _ in pairs), tuple(str(v) for _, v in pairs)
