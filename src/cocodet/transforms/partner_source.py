"""A mosaic's partner keys (``augment.partners``, ``partner_window``, ``partner_pool``) read into
one answer, for the recipe (``transforms/augment.py:Mosaic``) and the plan's recipe shape alike.
"""

from __future__ import annotations

from cocodet.errors import ConfigError


def partner_source(partners: str | None, partner_window: int | None, partner_pool: int | None) -> str:
    """``window``, ``pool`` or ``dataset``: where a mosaic's partners come from, as the augment
    keys say it (the plan's recipe shape and the recipe read them through this one function;
    each key's own rule is checked earlier, by the config's validation or
    :class:`~cocodet.transforms.augment.Mosaic`)."""
    if partner_pool is not None and partners in (None, "window", "pool"):
        return "pool"  # an integer pool selects pools, as it did before windows
    if partners is None:
        return "dataset"
    if partners == "pool":
        raise ConfigError("augment.partners=pool needs augment.partner_pool (the pool's size, e.g. 8)")
    if partners == "dataset" and partner_pool is not None:
        raise ConfigError(
            f"augment.partners=dataset and augment.partner_pool={partner_pool} contradict each "
            "other: set augment.partner_pool=null, or augment.partners=pool"
        )
    if partners == "window" and partner_window is None:
        raise ConfigError("augment.partners=window needs augment.partner_window (positions, e.g. 48)")
    return partners
