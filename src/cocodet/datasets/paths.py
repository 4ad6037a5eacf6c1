"""Where a dataset's image may be: under its root, symlinks resolved, or under a remote root's
prefix. Every layout's reader applies the same rule to the names its annotations give."""

from __future__ import annotations

import os
from pathlib import Path

from cocodet.storage.urls import join


def resolve_inside(root: Path, file_name: str, real_dirs: dict[str, str] | None = None) -> Path | None:
    """Return the path of ``file_name`` under ``root`` or None if it escapes the root.

    Rejects absolute names, ``..`` components and symlinks that point outside the root.
    ``real_dirs`` caches the resolved folders between calls: at COCO scale a full
    ``realpath`` per image (an lstat per path component) costs more than the JSON parse.
    """
    if os.path.isabs(file_name) or ".." in Path(file_name).parts:
        return None
    path = root / file_name
    cache = real_dirs if real_dirs is not None else {}
    folder = str(path.parent)
    if folder not in cache:
        cache[folder] = os.path.realpath(folder)
    if str(root) not in cache:
        cache[str(root)] = os.path.realpath(root)
    real_root = cache[str(root)]
    real = os.path.realpath(path) if os.path.islink(path) else os.path.join(cache[folder], path.name)
    if os.path.commonpath([real_root, real]) != real_root:
        return None
    return path


def remote_inside(root: str, file_name: str) -> str | None:
    """The URL of ``file_name`` under the remote ``root``, or None if it names another place
    (an absolute name, a URL of its own, a ``..`` component: a store has no symlinks to follow)."""
    if file_name.startswith("/") or "://" in file_name or ".." in file_name.split("/"):
        return None
    return join(root, file_name)
