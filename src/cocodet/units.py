"""Byte units, formatted one way everywhere (plan tables, diagnoses, cache messages)."""

MiB = 1 << 20


def mib(x: float | None, missing: str = "-") -> str:
    """``x`` bytes as ``"12.3 MiB"``; ``missing`` when unknown."""
    return missing if x is None else f"{x / MiB:.1f} MiB"
