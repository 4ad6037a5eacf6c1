"""What the loader group asks of the plan (design §3): the worker count from the command line,
a preset or the environment, with the policy its source gives it, and the queue settings."""

from __future__ import annotations

import logging

from cocodet.errors import ConfigError
from cocodet.loader.plan.records import LoaderRequest

log = logging.getLogger(__name__)


def loader_request(loader: dict, overrides: list[str], environ: dict[str, str]) -> LoaderRequest:
    """The loader group's keys (plain values), this run's command-line overrides and the
    environment as the plan's request."""
    policy, requested = worker_request(
        str(loader["policy"]), loader.get("num_workers"), list(loader.get("inherit_from") or []), overrides, environ
    )
    footprint_mb = loader.get("worker_footprint_mb")
    return LoaderRequest(
        policy,
        requested,
        int(loader["prefetch_factor"]),
        pin_memory=loader["pin_memory"],
        persistent_workers=bool(loader["persistent_workers"]),
        worker_footprint_bytes=int(footprint_mb) << 20 if footprint_mb else None,
        part_images=loader.get("part_images"),
        timeout_s=float(loader.get("timeout", 0)),
    )


def worker_request(
    policy: str, num_workers: int | None, inherit_from: list[str], overrides: list[str], environ: dict[str, str]
) -> tuple[str, int | None]:
    """Turn the policy name, this run's overrides and the environment into (source, count).

    A count named on this run's command line is explicit. A count that arrives any other way
    (a preset or experiment file, or a scheduler variable for ``loader=inherited``) is
    inherited. ``auto`` without a count computes its own (count None).
    """
    named_here = any(o.lstrip("+~").split("=", 1)[0] == "loader.num_workers" for o in overrides)
    if policy == "explicit":
        if num_workers is None:
            raise ConfigError("loader=explicit needs a count: add loader.num_workers=N (or use loader=auto)")
        return "explicit", int(num_workers)
    if policy == "auto":
        if num_workers is None:
            return "auto", None
        return ("explicit" if named_here else "inherited"), int(num_workers)
    if named_here:  # inherited, but this run names its own count
        return "explicit", int(num_workers)
    for var in inherit_from:  # inherited: a scheduler's variable, else a preset's count
        value = environ.get(var, "")
        if value.strip().isdigit():
            log.info("inherited worker count %s from $%s", value, var)
            return "inherited", int(value)
    if num_workers is not None:
        return "inherited", int(num_workers)
    raise ConfigError(
        f"loader=inherited found no count: none of ${', $'.join(inherit_from)} is set and "
        "loader.num_workers is null. Set one of them, or use loader=auto"
    )
