"""A worker count from the command line, a preset or the environment (design §3): which
policy's source it has, before any plan is made."""

from __future__ import annotations

import logging

from cocodet.errors import ConfigError

log = logging.getLogger(__name__)


def worker_request(policy: str, num_workers: int | None, inherit_from: list[str], overrides: list[str],
                   environ: dict[str, str]) -> tuple[str, int | None]:
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
    raise ConfigError(f"loader=inherited found no count: none of ${', $'.join(inherit_from)} is set and "
                      "loader.num_workers is null. Set one of them, or use loader=auto")
