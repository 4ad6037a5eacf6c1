"""Local paths and store URLs told apart and joined: string work only, no request."""

from __future__ import annotations

import os
import re

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")


def protocol_of(url: str) -> str:
    """``s3`` for ``s3://bucket/key`` (lower case)."""
    return _URL.match(url).group(1).lower()


def is_remote(path: str | os.PathLike) -> bool:
    return isinstance(path, str) and _URL.match(path) is not None


def join(root: str | os.PathLike, *parts: str) -> str:
    """``root`` and relative ``parts`` joined: with ``/`` for a URL (``Path`` would fold
    ``s3://`` into ``s3:/``), as ``os.path.join`` locally."""
    if not is_remote(root):
        return os.path.join(root, *parts)
    return "/".join([str(root).rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])
