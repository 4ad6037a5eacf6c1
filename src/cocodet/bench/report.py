"""Turn a Hydra multirun of mode=bench into a markdown table and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

COLUMNS = [
    "num_workers",
    "prefetch_factor",
    "batch_size",
    "examples_per_s",
    "wait_mean_ms",
    "wait_p50_ms",
    "wait_p95_ms",
    "wait_max_ms",
    "work_mean_ms",
    "wait_fraction",
    "first_batch_s",
    "peak_rss_mb",
    "peak_shm_mb",
    "decode_bound",
    "batches",
]


def load_sweep(sweep_dir: str | Path) -> list[dict]:
    """One row per job: its overrides plus its summary.json (jobs without one are skipped)."""
    rows = []
    for summary in sorted(Path(sweep_dir).glob("*/summary.json"), key=lambda p: (len(p.parent.name), p.parent.name)):
        row = json.loads(summary.read_text())
        overrides = summary.parent / ".hydra" / "overrides.yaml"
        row["overrides"] = " ".join(yaml.safe_load(overrides.read_text()) or []) if overrides.exists() else ""
        row["job"] = summary.parent.name
        rows.append(row)
    if not rows:
        raise FileNotFoundError(
            f"no */summary.json under {sweep_dir}: is it a `python train.py -m mode=bench ...` sweep dir?"
        )
    # Keep only the overrides that differ between jobs: the rest is the sweep's constant setting.
    common = set.intersection(*(set(r["overrides"].split()) for r in rows))
    for r in rows:
        r["overrides"] = " ".join(o for o in r["overrides"].split() if o not in common)
    return rows


def markdown_table(rows: list[dict]) -> str:
    cols = ["job", "overrides"] + [c for c in COLUMNS if any(c in r for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def plot(rows: list[dict], out_png: str | Path) -> Path:
    """examples/s against workers (one line per prefetch/other setting) with wait p50/p95 and work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = {}
    for r in rows:
        key = " ".join(o for o in r.get("overrides", "").split() if not o.startswith("loader.num_workers"))
        groups.setdefault(key or "all", []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["num_workers"])
        x = [r["num_workers"] for r in rs]
        ax1.plot(x, [r["examples_per_s"] for r in rs], marker="o", label=key)
        (line,) = ax2.plot(x, [r["wait_p50_ms"] for r in rs], marker="o", label=f"wait p50 {key}")
        ax2.plot(
            x,
            [r["wait_p95_ms"] for r in rs],
            marker="^",
            linestyle="--",
            color=line.get_color(),
            label=f"wait p95 {key}",
        )
        ax2.plot(
            x, [r["work_mean_ms"] for r in rs], marker="s", linestyle=":", color=line.get_color(), label=f"work {key}"
        )
    ax1.set(xlabel="num_workers", ylabel="examples/s (the verdict)", title="Throughput")
    ax2.set(xlabel="num_workers", ylabel="ms per batch", title="Wait (p50, p95) and work")
    ax1.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
