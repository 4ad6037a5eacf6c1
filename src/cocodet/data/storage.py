"""Where dataset bytes come from: a local path, or an fsspec URL (``s3://bucket/prefix/key``).

Every read of image or annotation bytes in cocodet goes through :func:`read_bytes` (and
``tests/test_storage_chokepoint.py`` reads ``src/`` to keep it so). For a remote URL it:

- opens one filesystem per process and protocol: s3fs sessions (aiohttp, an event-loop
  thread) do not survive a fork, so a DataLoader worker opens its own on its first read;
- bounds every call by ``dataset.remote.timeout_s`` as a whole (s3fs retries a read timeout
  five times with back-off on its own: 24 s for a 2 s timeout, measured), so a store that
  does not answer ends the run in one line instead of hanging it;
- names what failed: a missing object (404) is a ``FileNotFoundError`` (the caller's bad
  sample), a refusal (401/403, an expired token, an unknown key) a :class:`StoreAccessError`
  that ends the run at the first occurrence whatever ``dataset.on_bad_sample`` says, since
  every other object would be refused the same way.

Credentials never pass through here: they come from the environment or the standard AWS chain
(``cli.refuse_credentials`` refuses them as overrides), and every message is scrubbed of the
environment's credential values before it is raised.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cocodet.data.store_errors import (  # noqa: F401  (re-exported: the errors readers of this module catch)
    TRANSIENT, StoreAccessError, StoreDown, StoreError, StoreTimeout, StoreTransient, StoreUnreachable, bucket_of,
    classified, redact)

log = logging.getLogger(__name__)
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
BACKOFF_CAP_S = 5.0  # the longest pause between two attempts (full jitter below it)
# What this process and the workers it forks counted (shared memory, created by configure()).
COUNTS = ("gets", "bytes_fetched", "misses", "retries", "cache_hits")


@dataclass(frozen=True)
class StoreSettings:
    """``dataset.storage_options`` (passed to fsspec; never credentials) and
    ``dataset.remote.timeout_s``."""

    options: dict = field(default_factory=dict)
    timeout_s: float = 60.0
    retries: int = 5
    give_up_s: float = 120.0


_settings = StoreSettings()
_filesystems: dict[tuple[int, str], object] = {}  # (pid, protocol) -> this process's filesystem
_counts = None  # multiprocessing.Array of COUNTS, shared with forked workers
# When the store began failing (time.monotonic(), system-wide on Linux; 0: it answers), shared by
# this process, its workers and the read-ahead's threads: the store is down for all of them
# once no request has succeeded for give_up_s, so they give up together.
_down_since = None
_object_cache = None  # the node-local read-ahead cache (data/object_cache.py), when one is in use


def configure(storage_options: dict | None = None, timeout_s: float = 60.0, retries: int = 5,
              give_up_s: float = 120.0, **read_ahead) -> None:
    """Set how remote URLs are opened, for this process and the workers it forks
    (``read_ahead``: the remote group's read-ahead keys, used by ``data/prefetch.py``)."""
    global _settings, _counts, _object_cache, _down_since
    options = {k: v for k, v in (storage_options or {}).items() if v is not None}  # null: the default chain's
    _settings = StoreSettings(options, float(timeout_s), int(retries), float(give_up_s))
    _filesystems.clear()
    _object_cache = None
    if _counts is None:
        import multiprocessing

        _counts = multiprocessing.Array("d", len(COUNTS))
        _down_since = multiprocessing.Value("d", 0.0)
    with _counts.get_lock():  # a new run counts from zero (several runs share a process in tests and sweeps)
        _counts[:] = [0.0] * len(COUNTS)
    _down_since.value = 0.0


def _failing_for(now: float) -> float:
    """Note a failure; seconds since the store began failing (this process's view if unshared)."""
    if _down_since is None:
        return 0.0
    with _down_since.get_lock():
        if _down_since.value == 0.0:
            _down_since.value = now
        return now - _down_since.value


def _answered() -> None:
    if _down_since is not None and _down_since.value != 0.0:
        with _down_since.get_lock():
            _down_since.value = 0.0


def down_for() -> float:
    """Seconds no request has succeeded since one failed (0: the store answers)."""
    since = _down_since.value if _down_since is not None else 0.0
    return time.monotonic() - since if since else 0.0


def check_store_up(url: str, operation: str) -> None:
    """Raise :class:`StoreDown` if the store has failed every request for ``give_up_s``: for
    a reader that waits on another process's request instead of making its own."""
    failing = down_for()
    if failing > _settings.give_up_s:
        raise StoreDown(f"{url}: the store has answered no request for {failing:.0f} s while {operation} waited; "
                        f"gave up after dataset.remote.give_up_s={_settings.give_up_s:g} s. A checkpoint was written "
                        "if training had started: resume with the same command plus ckpt_path=last once the store "
                        "answers")


def count(name: str, amount: float = 1) -> None:
    if _counts is not None:
        with _counts.get_lock():
            _counts[COUNTS.index(name)] += amount


def counts() -> dict[str, float]:
    """Every counter so far, this process and its workers together."""
    return {name: (_counts[k] if _counts is not None else 0.0) for k, name in enumerate(COUNTS)}


def use_object_cache(cache) -> None:
    """Route reads of remote objects through ``cache`` (``cache.read(url) -> bytes | None``):
    set in the main process before the workers fork."""
    global _object_cache
    _object_cache = cache


def settings() -> StoreSettings:
    return _settings


def is_remote(path: str | os.PathLike) -> bool:
    return isinstance(path, str) and _URL.match(path) is not None


def join(root: str | os.PathLike, *parts: str) -> str:
    """``root`` and relative ``parts`` joined: with ``/`` for a URL (``Path`` would fold
    ``s3://`` into ``s3:/``), as ``os.path.join`` locally."""
    if not is_remote(root):
        return os.path.join(root, *parts)
    return "/".join([str(root).rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])


def filesystem(url: str):
    """This process's fsspec filesystem for ``url``'s protocol, opened on first use."""
    protocol = _URL.match(url).group(1).lower()
    key = (os.getpid(), protocol)
    if key not in _filesystems:
        import fsspec

        options = dict(_settings.options)
        if protocol in ("s3", "s3a"):
            # Each attempt waits at most timeout_s; the whole call is bounded in _call as well.
            config = dict(options.pop("config_kwargs", None) or {})
            config.setdefault("connect_timeout", _settings.timeout_s)
            config.setdefault("read_timeout", _settings.timeout_s)
            # One attempt per request: _call alone retries (back-off with jitter, the give-up
            # clock shared by every process); botocore's and s3fs's own retries would stack.
            config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
            # Which rank asked, in the store's access log: User-Agent "... cocodet/rank-N" (RANK,
            # else LOCAL_RANK: Lightning's launcher sets only the latter on one host).
            rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
            config.setdefault("user_agent_extra", f"cocodet/rank-{rank}")
            options["config_kwargs"] = config
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
        if hasattr(fs, "retries"):
            fs.retries = 1
        _filesystems[key] = fs
    return _filesystems[key]


def _call(url: str, operation: str, method: str, *args, deadline: float | None = None):
    """``method`` of the filesystem of ``url`` on ``args``: each attempt within ``deadline``
    seconds (default ``timeout_s``), transient failures retried with capped exponential back-off
    and full jitter while fewer than ``retries`` retries were made or less than ``give_up_s``
    has passed since the first failure (whichever allows more), then :class:`StoreDown`."""
    first_failure, retries = None, 0
    while True:
        try:
            result = _attempt(url, operation, method, args, deadline or _settings.timeout_s)
        except TRANSIENT as e:
            now = time.monotonic()
            first_failure = first_failure or now
            failing = max(now - first_failure, _failing_for(now))
            if retries >= _settings.retries and failing >= _settings.give_up_s:
                raise StoreDown(redact(
                    f"{url}: the store has failed {operation} for {failing:.0f} s ({retries} retries; last: {e}); "
                    f"gave up after dataset.remote.give_up_s={_settings.give_up_s:g} s. A checkpoint was written "
                    "if training had started: resume with the same command plus ckpt_path=last once the store "
                    "answers")) from None
            retries += 1
            count("retries")
            pause = random.uniform(0, min(BACKOFF_CAP_S, 0.1 * 2 ** retries))
            time.sleep(min(pause, max(0.0, _settings.give_up_s - failing)) if retries > _settings.retries else pause)
            continue
        _answered()
        if retries:
            log.warning("%s: %s succeeded after %d retries (%.1f s)", url, operation, retries,
                        time.monotonic() - first_failure)
        return result


def _attempt(url: str, operation: str, method: str, args: tuple, deadline: float):
    """One request, with the store's failures turned into the errors above."""
    fs = filesystem(url)
    try:
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync

            return sync(fs.loop, getattr(fs, "_" + method), *args, timeout=deadline)
        return getattr(fs, method)(*args)
    except FileNotFoundError as e:
        if "bucket" in str(e).lower() and "not exist" in str(e).lower():
            raise StoreAccessError(redact(f"{url}: bucket {bucket_of(url)!r} does not exist ({operation}); "
                                          "check dataset.root and the endpoint")) from None
        raise FileNotFoundError(f"{url}: no such object (404 on {operation})") from None
    except Exception as e:  # noqa: BLE001 - every other failure is classified below, never swallowed
        endpoint = _settings.options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint"
        raise classified(url, operation, e, deadline, endpoint) from None


def read_bytes(path: str | os.PathLike) -> bytes:
    """Every byte of the file or object at ``path``: the one reader of image bytes.

    Raises FileNotFoundError / OSError for a missing or unreadable file or object (a bad
    sample to the caller), :class:`StoreError` for a store that cannot serve the run."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    if _object_cache is not None:
        data = _object_cache.read(str(path))  # the read-ahead's copy, or a counted direct GET (a miss)
        if data is not None:
            return data
    return get_object(str(path))


def get_object(url: str) -> bytes:
    """One GET of the object at ``url`` (retried as :func:`_call` says), counted."""
    data = _call(url, "GetObject", "cat_file", url)
    count("gets")
    count("bytes_fetched", len(data))
    return data


def object_info(url: str) -> dict:
    """``{"size": bytes, "etag": str}`` of one object (one HEAD request)."""
    info = _call(url, "HeadObject", "info", url)
    return {"size": int(info.get("size", 0)), "etag": str(info.get("ETag", "")).strip('"')}


def listing(prefix: str) -> dict[str, dict]:
    """Every object under ``prefix`` (recursive), by URL: ``{"size", "etag"}``. One LIST
    request per thousand objects: what the pixel cache's key and the plan's byte count read."""
    protocol = prefix.split("://", 1)[0]
    found = _call(prefix, "ListObjectsV2", "find", prefix.rstrip("/") + "/", None, False, True,
                  deadline=_settings.timeout_s * 10)
    return {f"{protocol}://{name}": {"size": int(meta.get("size", 0)), "etag": str(meta.get("ETag", "")).strip('"')}
            for name, meta in found.items() if meta.get("type", "file") == "file"}


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
    return bool(_call(str(path), "ListObjectsV2", "isdir", str(path).rstrip("/")))


def is_file(path: str | os.PathLike) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    try:
        object_info(str(path))
    except FileNotFoundError:
        return False
    return True


def local_copy(url: str, cache_dir: str | os.PathLike | None) -> Path:
    """A local file with the object's bytes, for readers that need a path (the annotation
    parse, COCOeval). Kept in ``<cache_dir>/remote/`` keyed by URL and ETag, so a second
    start makes one HEAD request and downloads nothing; ``cache_dir`` None: a temporary
    folder removed at exit. Built as ``cache_files`` builds every cache (atomic, verified)."""
    import hashlib

    from cocodet.data.cache_files import build_atomically, build_once, ensure_folder

    info = object_info(url)
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if cache_dir is None:
        return _download(url, info, Path(_temporary_folder()) / name)
    base = Path(os.path.expanduser(str(cache_dir))) / "remote"
    ensure_folder(base)
    tag = re.sub(r"[^A-Za-z0-9]", "", info["etag"])[:40] or str(info["size"])
    folder = base / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{tag}"
    build_once(folder, lambda: build_atomically(folder, lambda tmp: _fetched(url, info, tmp / name)),
               {"format": 1, "url": url, "etag": info["etag"]})
    return folder / name


def _fetched(url: str, info: dict, path: Path) -> dict:
    _download(url, info, path)
    return {"format": 1, "url": url, "etag": info["etag"]}


def _download(url: str, info: dict, path: Path) -> Path:
    # A large file may take longer than one timeout: allow 1 MB/s on top of it.
    data = _call(url, "GetObject", "cat_file", url, deadline=_settings.timeout_s + info["size"] / 1e6)
    if len(data) != info["size"]:
        raise StoreError(f"{url}: read {len(data)} bytes, the store lists {info['size']}; the object changed "
                         "while it was read, start again")
    path.write_bytes(data)
    return path


def _temporary_folder() -> str:
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="cocodet-remote-")
    atexit.register(shutil.rmtree, folder, True)
    return folder
