"""Where dataset bytes come from: a local path, or an fsspec URL (``s3://bucket/prefix/key``).

Every read of image or annotation bytes in cocodet goes through :func:`read_bytes` (and
``tests/test_storage_chokepoint.py`` reads ``src/`` to keep it so); how a remote call is made,
bounded, retried and counted is ``storage/session.py``'s (readers configure and count there),
the store's errors are ``storage/errors.py``'s and telling URLs apart is ``storage/urls.py``'s.

Credentials never pass through here: they come from the environment or the standard AWS chain
(``cli.refuse_credentials`` refuses them as overrides), and every message is scrubbed of the
environment's credential values before it is raised.
"""

from __future__ import annotations

import os

from cocodet.storage.session import call, count, settings
from cocodet.storage.urls import is_remote


def read_bytes(path: str | os.PathLike, via=None, limit: int | None = None) -> bytes:
    """Every byte of the file or object at ``path``: the one reader of image bytes. ``via``: for
    an object, a reader tried first (the read-ahead's copies, ``read_ahead/object_cache.py``:
    ``via.read(url) -> bytes | None``, None for an object it does not hold). ``limit``: only the
    first ``limit`` bytes (a header; one ranged GET for an object).

    Raises FileNotFoundError / OSError for a missing or unreadable file or object (a bad
    sample to the caller), :class:`~cocodet.storage.errors.StoreError` for a store that cannot serve the run."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read(-1 if limit is None else limit)
    if limit is not None:
        data = call(str(path), "GetObject", "cat_file", str(path), start=0, end=limit)
        count("gets")
        count("bytes_fetched", len(data))
        return data
    if via is not None:
        data = via.read(str(path))  # the read-ahead's copy, or a counted direct GET (a miss)
        if data is not None:
            return data
    return get_object(str(path))


def get_object(url: str) -> bytes:
    """One GET of the object at ``url`` (retried as :func:`call` says), counted."""
    data = call(url, "GetObject", "cat_file", url)
    count("gets")
    count("bytes_fetched", len(data))
    return data


def object_info(url: str) -> dict:
    """``{"size": bytes, "etag": str}`` of one object (one HEAD request)."""
    info = call(url, "HeadObject", "info", url)
    return {"size": int(info.get("size", 0)), "etag": str(info.get("ETag", "")).strip('"')}


def listing(prefix: str) -> dict[str, dict]:
    """Every object under ``prefix`` (recursive), by URL: ``{"size", "etag"}``. One LIST
    request per thousand objects: what the pixel cache's key and the plan's byte count read."""
    protocol = prefix.split("://", 1)[0]
    found = call(
        prefix, "ListObjectsV2", "find", prefix.rstrip("/") + "/", None, False, True, deadline=settings().timeout_s * 10
    )
    return {
        f"{protocol}://{name}": {"size": int(meta.get("size", 0)), "etag": str(meta.get("ETag", "")).strip('"')}
        for name, meta in found.items()
        if meta.get("type", "file") == "file"
    }


def file_stamps(paths) -> list[str]:
    """What identifies each file's content without reading it, one string per path: size and
    mtime of a local file, size and ETag of an object (from one listing of the objects' common
    prefix, not a HEAD per object: at COCO scale, 118 LIST requests instead of 118,287 HEADs)."""
    paths = [str(p) for p in paths]
    remote = [p for p in paths if is_remote(p)]
    listed = listing(_common_prefix(remote)) if remote else {}
    stamps = []
    for path in paths:
        if is_remote(path):
            meta = listed.get(path)
            stamps.append(f"{meta['size']}\0{meta['etag']}" if meta else "missing")
            continue
        try:
            st = os.stat(path)
            stamps.append(f"{st.st_size}\0{st.st_mtime_ns}")
        except OSError:
            stamps.append("missing")
    return stamps


def _common_prefix(urls: list[str]) -> str:
    """The deepest folder-like prefix every URL is under (``s3://bucket/train2017``)."""
    prefix = os.path.commonprefix(urls)
    return prefix if prefix.endswith("/") and len(urls) > 1 else prefix.rsplit("/", 1)[0]


def is_dir(path: str | os.PathLike) -> bool:
    """A local folder, or a prefix that holds at least one object."""
    if not is_remote(path):
        return os.path.isdir(path)
    return bool(call(str(path), "ListObjectsV2", "isdir", str(path).rstrip("/")))


def is_file(path: str | os.PathLike) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    try:
        object_info(str(path))
    except FileNotFoundError:
        return False
    return True
