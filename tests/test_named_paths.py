"""Every repository path that src/'s comments and docs/ name exists: a file path (relative to the
repository, to src/cocodet/ for a module's own folder-relative name, or to conf/ for a group's
option) and a dotted ``cocodet.…`` module path, so that a moved or renamed file leaves no
reader looking for it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from cocodet.compat import MOVED_TARGETS

ROOT = Path(__file__).resolve().parents[1]
FILE = re.compile(r"(?<![\w./~$-])((?:[\w.-]+/)+[\w-]+\.(?:py|yaml|md|sh|json|txt|png|toml))(?![\w/])")
MODULE = re.compile(r"(?<![\w.])(cocodet(?:\.\w+)+)")
# What a run, a user or the host makes (never in the repository), and other repositories' files.
NOT_OURS = (
    "outputs/",
    "multirun/",
    "data/",
    ".hydra/",
    "checkpoints/",
    "../",
    "/tmp",
    "references/detection/",
    "site-packages/",
    "run_dir/",
    "RUN_DIR/",
    "images/train",
    "labels/",
    "annotations/",
    "ultralytics/",
    "torchvision/",
    "hydra/launcher/",
    "train2017/",
    "val2017/",
    "~/",
    "lightning_logs/",
    "mlruns/",
    "ImageSets/",
    "PATH/",
    "models/detection/",
)
BASES = (ROOT, ROOT / "src", ROOT / "src" / "cocodet", ROOT / "conf", ROOT / "tests", ROOT / "docs")


def tag_names() -> set[str]:
    """The run tags and parameters tracking writes under a ``cocodet.`` prefix: names, not modules."""
    from cocodet.tracking.run_record import end_tags

    quoted = re.compile(r"[\"'](cocodet\.[\w.]+)[\"']")
    written = {
        m.group(1)
        for f in (ROOT / "src" / "cocodet" / "tracking").rglob("*.py")
        for m in quoted.finditer(f.read_text())
    }
    return written | set(end_tags({"stream_digest": "x", "batch_digest": "x", "error": "x"}))  # names built in code


def moved(name: str) -> bool:
    """A path users' configs may still name: an old target, or the module or package it lived in."""
    return any(old == name or old.startswith(name + ".") for old in MOVED_TARGETS)


def texts() -> list[tuple[str, str]]:
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "docs").glob("*.md"))
    return [(str(f.relative_to(ROOT)), f.read_text()) for f in files]


def named_files(text: str) -> set[str]:
    return {
        m.group(1)
        for m in FILE.finditer(text)
        if not any(m.group(1).startswith(p) or f"/{p}" in m.group(1) for p in NOT_OURS)
    }


def missing_file(name: str) -> bool:
    return not any((base / name).exists() for base in BASES)


def missing_module(dotted: str) -> bool:
    """True when no prefix of ``dotted`` imports, or the rest is not an attribute chain of it."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return True
            obj = getattr(obj, attr)
        return False
    return True


def test_every_named_path_exists():
    missing, tags = [], tag_names()
    for where, text in texts():
        missing += [f"{where}: {name}" for name in sorted(named_files(text)) if missing_file(name)]
        missing += [
            f"{where}: {name}"
            for name in sorted({m.group(1).rstrip(".") for m in MODULE.finditer(text)})
            if name not in tags and not moved(name) and missing_module(name)
        ]
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "text, found",
    [
        ("see ``run_spec/trained_config.py`` for why", True),  # the folder-relative name of a module that is gone
        ("see ``run_spec/read.py``", False),
        ("the option conf/augment/nope.yaml", True),
        ("(`cocodet.loader.no_such_module`)", True),
        ("(`cocodet.loader.flat_batch.NoSuchName`)", True),
        ("(`cocodet.loader.flat_batch.FlatBatch`)", False),
        ("written under outputs/2026-12-07/run.yaml and /tmp/x/y.py", False),
    ],
)
def test_the_check_finds_a_planted_stale_path(text, found):
    stale = [n for n in named_files(text) if missing_file(n)]
    stale += [m.group(1) for m in MODULE.finditer(text) if missing_module(m.group(1))]
    assert bool(stale) == found, stale
