"""How this process talks to a store: one fsspec filesystem per process and protocol, every
call bounded and retried, and the counters and give-up clock its DataLoader workers share.

- s3fs sessions (aiohttp, an event-loop thread) do not survive a fork, so a DataLoader worker
  opens its own filesystem on its first read;
- every call is bounded by ``dataset.remote.timeout_s`` as a whole (s3fs retries a read timeout
  five times with back-off on its own: 24 s for a 2 s timeout, measured), so a store that does
  not answer ends the run in one line instead of hanging it;
- what failed is named: a missing object (404) is a ``FileNotFoundError`` (the caller's bad
  sample), a refusal (401/403, an expired token, an unknown key) a :class:`StoreAccessError`
  that ends the run at the first occurrence whatever ``dataset.on_bad_sample`` says, since
  every other object would be refused the same way.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field

from cocodet.storage.errors import TRANSIENT, StoreAccessError, StoreDown, bucket_of, classified, redact
from cocodet.storage.urls import protocol_of

log = logging.getLogger(__name__)
# How a dataset's StoreDown ends (the checkpoint store's own says which checkpoint is whole instead)
RESUME_ADVICE = (
    " A checkpoint was written if training had started: resume with the same command plus ckpt_path=last once "
    "the store answers"
)
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
    rank: int = 0  # the process's global rank (cocodet/ranks.py), named in each request's User-Agent


_settings = StoreSettings()
# fsspec options by store: "dataset" (the data's, set by configure) and "checkpoint" (the
# checkpoint folder's, configure_checkpoints); both follow the same bounds and retry rules.
_options: dict[str, dict] = {"dataset": {}}
_filesystems: dict[tuple[int, str, str], object] = {}  # (pid, protocol, store) -> this process's filesystem
_counts = None  # multiprocessing.Array of COUNTS (no lock of its own), shared with forked workers
# When the store began failing (time.monotonic(), system-wide on Linux; 0: it answers), shared by
# this process, its workers and the read-ahead's threads: the store is down for all of them
# once no request has succeeded for give_up_s, so they give up together.
_down_since = None
# Both guarded by one SharedLock, which the kernel releases if a worker is killed inside it.
_lock = None


def configure(
    storage_options: dict | None = None,
    timeout_s: float = 60.0,
    retries: int = 5,
    give_up_s: float = 120.0,
    rank: int | None = None,
    **read_ahead,
) -> None:
    """Set how remote URLs are opened, for this process and the workers it forks
    (``rank``: this process's global rank, read once by ``cocodet/ranks.py``; None keeps the one
    configured before, as the datamodule's own call does; ``read_ahead``:
    the remote group's read-ahead keys, used by ``read_ahead/start.py``)."""
    global _settings, _counts, _down_since, _lock
    options = _set(storage_options)
    _options.clear()
    _options["dataset"] = options
    _settings = StoreSettings(
        options, float(timeout_s), int(retries), float(give_up_s), _settings.rank if rank is None else int(rank)
    )
    _filesystems.clear()
    if _counts is None:
        import multiprocessing

        from cocodet.storage.claims import SharedLock

        _counts = multiprocessing.Array("d", len(COUNTS), lock=False)
        _down_since = multiprocessing.Value("d", 0.0, lock=False)
        _lock = SharedLock()
    with _lock:  # a new run counts from zero (several runs share a process in tests and sweeps)
        _counts[:] = [0.0] * len(COUNTS)
        _down_since.value = 0.0


def configure_checkpoints(storage_options: dict | None) -> None:
    """fsspec options of the checkpoint folder's store (``checkpoint.storage_options``, already
    defaulted to the dataset's where the dataset is in a bucket): its own filesystem, the same bounds."""
    _options["checkpoint"] = _set(storage_options)
    for key in [k for k in _filesystems if k[2] == "checkpoint"]:
        del _filesystems[key]


def _set(storage_options: dict | None) -> dict:
    return {k: v for k, v in (storage_options or {}).items() if v is not None}  # null: the default chain's


def _failing_for(now: float) -> float:
    """Note a failure; seconds since the store began failing (this process's view if unshared)."""
    if _down_since is None:
        return 0.0
    with _lock:
        if _down_since.value == 0.0:
            _down_since.value = now
        return now - _down_since.value


def _answered() -> None:
    if _down_since is not None and _down_since.value != 0.0:
        with _lock:
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
        raise StoreDown(
            f"{url}: the store has answered no request for {failing:.0f} s while {operation} waited; "
            f"gave up after dataset.remote.give_up_s={_settings.give_up_s:g} s.{RESUME_ADVICE}"
        )


def count(name: str, amount: float = 1) -> None:
    if _counts is not None:
        with _lock:
            _counts[COUNTS.index(name)] += amount


def counts() -> dict[str, float]:
    """Every counter so far, this process and its workers together."""
    if _counts is None:
        return dict.fromkeys(COUNTS, 0.0)
    with _lock:
        return {name: _counts[k] for k, name in enumerate(COUNTS)}


def settings() -> StoreSettings:
    return _settings


def filesystem(url: str, store: str = "dataset"):
    """This process's fsspec filesystem for ``url``'s protocol and ``store`` (``dataset`` or
    ``checkpoint``: whose options it takes), opened on first use."""
    protocol = protocol_of(url)
    key = (os.getpid(), protocol, store)
    if key not in _filesystems:
        import fsspec

        options = dict(_options.get(store, _options["dataset"]))
        if protocol in ("s3", "s3a"):
            # Each attempt waits at most timeout_s; the whole call is bounded in call() as well.
            config = dict(options.pop("config_kwargs", None) or {})
            config.setdefault("connect_timeout", _settings.timeout_s)
            config.setdefault("read_timeout", _settings.timeout_s)
            # One attempt per request: call() alone retries (back-off with jitter, the give-up
            # clock shared by every process); botocore's and s3fs's own retries would stack.
            config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
            # Which rank asked, in the store's access log: User-Agent "... cocodet/rank-N", the
            # global rank that configure() was given (ranks.py reads it for every launcher).
            config.setdefault("user_agent_extra", f"cocodet/rank-{_settings.rank}")
            options["config_kwargs"] = config
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
        if hasattr(fs, "retries"):
            fs.retries = 1
        _filesystems[key] = fs
    return _filesystems[key]


def call(url: str, operation: str, method, *args, deadline: float | None = None, store: str = "dataset", **kwargs):
    """``method`` of the filesystem of ``url`` (``store``'s) on ``args`` and ``kwargs`` (a callable
    ``method``: awaited as ``method(fs, *args, **kwargs)``): each attempt within ``deadline``
    seconds (default ``timeout_s``), transient failures retried with capped exponential back-off
    and full jitter while fewer than ``retries`` retries were made or less than ``give_up_s``
    has passed since the first failure (whichever allows more), then :class:`StoreDown`."""
    first_failure, retries = None, 0
    while True:
        try:
            result = _attempt(url, operation, method, args, deadline or _settings.timeout_s, kwargs, store)
        except TRANSIENT as e:
            now = time.monotonic()
            first_failure = first_failure or now
            failing = max(now - first_failure, _failing_for(now))
            if retries >= _settings.retries and failing >= _settings.give_up_s:
                raise StoreDown(
                    redact(
                        f"{url}: the store has failed {operation} for {failing:.0f} s ({retries} retries; last: {e}); "
                        f"gave up after dataset.remote.give_up_s={_settings.give_up_s:g} s.{RESUME_ADVICE}"
                    )
                ) from None
            retries += 1
            count("retries")
            pause = random.uniform(0, min(BACKOFF_CAP_S, 0.1 * 2**retries))
            time.sleep(min(pause, max(0.0, _settings.give_up_s - failing)) if retries > _settings.retries else pause)
            continue
        _answered()
        if retries:
            log.warning(
                "%s: %s succeeded after %d retries (%.1f s)", url, operation, retries, time.monotonic() - first_failure
            )
        return result


def _attempt(
    url: str, operation: str, method, args: tuple, deadline: float, kwargs: dict | None = None, store: str = "dataset"
):
    """One request, with the store's failures turned into the errors above."""
    fs = filesystem(url, store)
    try:
        if callable(method):
            from fsspec.asyn import sync

            return sync(fs.loop, method, fs, *args, timeout=deadline, **(kwargs or {}))
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync

            return sync(fs.loop, getattr(fs, "_" + method), *args, timeout=deadline, **(kwargs or {}))
        return getattr(fs, method)(*args, **(kwargs or {}))
    except FileNotFoundError as e:
        if "bucket" in str(e).lower() and "not exist" in str(e).lower():
            raise _worded(
                StoreAccessError(
                    redact(
                        f"{url}: bucket {bucket_of(url)!r} does not exist ({operation}); "
                        "check dataset.root and the endpoint"
                    )
                ),
                store,
            ) from None
        raise FileNotFoundError(f"{url}: no such object (404 on {operation})") from None
    except Exception as e:  # noqa: BLE001 - every other failure is classified below, never swallowed
        endpoint = (
            _options.get(store, _options["dataset"]).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL")
            or "the default endpoint"
        )
        raise _worded(classified(url, operation, e, deadline, endpoint), store) from None


# The settings a store error names, for the checkpoint folder's store (its timeouts and retries
# are the dataset's own: dataset.remote).
_CHECKPOINT_WORDS = {"dataset.root": "checkpoint.dir", "dataset.storage_options": "checkpoint.storage_options"}


def _worded(error: Exception, store: str) -> Exception:
    """``error``, its message naming the settings of ``store`` (errors.py words the dataset's)."""
    if store != "checkpoint":
        return error
    text = str(error)
    for theirs, ours in _CHECKPOINT_WORDS.items():
        text = text.replace(theirs, ours)
    return type(error)(text)
