"""A search space as Hydra's sweep syntax, read into the study's distributions.

``hydra.sweeper.params`` maps an override key to a sweep: ``choice(0, 1, 2, 4)`` (categorical),
``int(interval(1, 8))`` (integers, bounds included), ``interval(0.3, 0.9)`` (floats),
``tag(log, interval(1e-4, 1e-2))`` (sampled on a log scale), ``range(2, 10, 2)`` (integers on a
step). A key that ends in a list index (``augment.scale.0``) searches one element of a list
setting: the trial's override carries the whole list, its other elements as configured.
"""

from __future__ import annotations

import re

from cocodet.errors import ConfigError

LIST_ELEMENT = re.compile(r"^(?P<key>.+)\.(?P<index>\d+)$")


def distributions(params: dict) -> dict:
    """``{key: optuna distribution}`` from ``{key: sweep string}``; a ConfigError names a key
    whose value is not a sweep this space can search."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    parser, out = OverridesParser.create(), {}
    for key, text in (params or {}).items():
        try:
            sweep = parser.parse_override(f"{key}={text}").value()
        except Exception as e:  # noqa: BLE001 - the grammar's own words, on one line
            raise ConfigError(f"hydra.sweeper.params.{key}={text!r} is not a sweep: {' '.join(str(e).split())}") from e
        log = "log" in (getattr(sweep, "tags", None) or ())
        if isinstance(sweep, ChoiceSweep):
            out[key] = CategoricalDistribution(list(sweep.list))
        elif isinstance(sweep, RangeSweep):
            out[key] = IntDistribution(int(sweep.start), int(sweep.stop) - 1, step=int(sweep.step or 1))
        elif isinstance(sweep, IntervalSweep) and isinstance(sweep.start, int) and isinstance(sweep.end, int):
            out[key] = IntDistribution(sweep.start, sweep.end, log=log)
        elif isinstance(sweep, IntervalSweep):
            out[key] = FloatDistribution(float(sweep.start), float(sweep.end), log=log)
        else:
            raise ConfigError(
                f"hydra.sweeper.params.{key}={text!r} is not a sweep: expected choice(...), range(...), "
                "interval(a, b), int(interval(a, b)) or tag(log, interval(a, b))"
            )
    return out


def overrides(params: dict, configured: dict) -> list[str]:
    """The command-line overrides of one trial's ``params``. ``configured``: the composed value
    of each list setting an element of which is searched (``{"augment.scale": [0.5, 1.5]}``)."""
    out, lists = [], {}
    for key, value in params.items():
        element = LIST_ELEMENT.match(key)
        if element is None:
            out.append(f"{key}={_word(value)}")
            continue
        name = element["key"]
        lists.setdefault(name, list(configured.get(name) or []))
        index = int(element["index"])
        if index >= len(lists[name]):
            raise ConfigError(f"hydra.sweeper.params.{key}: {name} has {len(lists[name])} elements")
        lists[name][index] = value
    out += [f"{name}=[{','.join(_word(v) for v in values)}]" for name, values in lists.items()]
    return out


def list_settings(params: dict) -> list[str]:
    """The list settings that ``params`` search an element of."""
    return sorted({m["key"] for m in map(LIST_ELEMENT.match, params or {}) if m is not None})


def _word(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return str(value)
