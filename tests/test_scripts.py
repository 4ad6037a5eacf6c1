"""Scripts that run on a stock host: the Debian mirror container_check.sh hands debootstrap,
read from apt's own sources in either format, never from a comment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

MIRROR = REPO / "scripts" / "debian_mirror.sh"
# Debian 12's stock deb822 file: the first URL on the page is a comment.
DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.example.org/debian-security
Suites: bookworm-security
Components: main
"""
ONE_LINE = """# deb http://commented.example.org/debian bookworm main
deb-src http://src.example.org/debian bookworm main
deb http://security.example.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://list.example.org/debian bookworm main
"""


def mirror_of(apt_dir: Path, **env) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "COCODET_DEBIAN_MIRROR"}
    proc = subprocess.run(
        ["bash", str(MIRROR), str(apt_dir)], capture_output=True, text=True, timeout=30, env={**environment, **env}
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def apt_dir(
    tmp_path: Path, sources: str | None = None, one_line: str | None = None, extra_list: str | None = None
) -> Path:
    (tmp_path / "sources.list.d").mkdir(parents=True)
    if sources is not None:
        (tmp_path / "sources.list.d" / "debian.sources").write_text(sources)
    if one_line is not None:
        (tmp_path / "sources.list").write_text(one_line)
    if extra_list is not None:
        (tmp_path / "sources.list.d" / "extra.list").write_text(extra_list)
    return tmp_path


@pytest.mark.parametrize(
    "layout,expect",
    [
        ("deb822 only", "http://deb.example.org/debian"),
        ("one-line list only", "http://list.example.org/debian"),
        ("both", "http://deb.example.org/debian"),
        ("comments first", "http://deb.example.org/debian"),
        ("a .list in sources.list.d", "http://list.example.org/debian"),
        ("neither", "http://deb.debian.org/debian"),
    ],
)
def test_the_mirror_comes_from_apt_sources_never_from_comments(tmp_path, layout, expect):
    folder = {
        "deb822 only": lambda: apt_dir(tmp_path, sources=DEB822),
        "one-line list only": lambda: apt_dir(tmp_path, one_line=ONE_LINE),
        "both": lambda: apt_dir(tmp_path, sources=DEB822, one_line=ONE_LINE),
        "comments first": lambda: apt_dir(
            tmp_path,
            sources="# URIs: http://c.example.org/debian\n#deb http://d.example.org/debian bookworm main\n" + DEB822,
        ),
        "a .list in sources.list.d": lambda: apt_dir(tmp_path, extra_list=ONE_LINE),
        "neither": lambda: apt_dir(tmp_path),
    }[layout]()
    assert mirror_of(folder) == expect


def test_the_mirror_variable_overrides_the_sources(tmp_path):
    folder = apt_dir(tmp_path, sources=DEB822)
    assert mirror_of(folder, COCODET_DEBIAN_MIRROR="http://mine.example.org/debian") == "http://mine.example.org/debian"


def test_container_check_takes_its_mirror_from_the_detector():
    """The script that failed on a stock Debian 12 host grepped sources itself; now it asks
    debian_mirror.sh, and a failing debootstrap or import shows its log and names the step."""
    text = (REPO / "scripts" / "container_check.sh").read_text()
    assert '"$REPO/scripts/debian_mirror.sh"' in text and "/etc/apt/sources.list" not in text
    assert '> "$WORK/debootstrap.log" 2>&1' in text and 'fail "base image: debootstrap' in text
    assert 'fail "base image: $ENGINE import' in text


@pytest.mark.parametrize("named", [False, True])
def test_ci_fails_at_once_when_its_test_data_is_missing(tmp_path, named):
    """A clean clone without ../shared/data/coco_tiny (or with COCODET_COCO_TINY naming an
    empty folder): .ci/run stops before installing anything, naming the folder it looked in,
    instead of letting 34 files' tests skip and pass green (issue 70)."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    (clone / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    (clone / "Makefile").write_text("test:\n\ttouch ran-make\ntest-slow:\n\ttouch ran-make\n")
    env = {k: v for k, v in os.environ.items() if k != "COCODET_COCO_TINY"}
    if named:
        env["COCODET_COCO_TINY"] = str(tmp_path / "elsewhere")
    proc = subprocess.run(["bash", str(clone / ".ci" / "run")], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode != 0 and not (clone / "ran-make").exists(), proc.stderr
    folder = tmp_path / "elsewhere" if named else tmp_path / "shared" / "data" / "coco_tiny"
    assert f"the test data coco_tiny is missing: no annotations/instances_val2017.json under {folder}" in proc.stderr
    assert ("named by COCODET_COCO_TINY" if named else "beside the checkout") in proc.stderr


def test_ci_runs_the_suites_when_its_test_data_is_there(tmp_path):
    """The same check passes with the data in place, and the suites run with CI=true (under
    which tests needing coco_tiny fail rather than skip: tests/conftest.py)."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    (clone / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    (clone / "Makefile").write_text(
        'lint:\n\techo lint >> ran-make\ntest:\n\techo "CI=$$CI" >> ran-make\ntest-slow:\n\techo slow >> ran-make\n'
    )
    data = tmp_path / "data" / "annotations"
    data.mkdir(parents=True)
    (data / "instances_val2017.json").write_text("{}")
    env = {**os.environ, "COCODET_COCO_TINY": str(data.parent)}
    proc = subprocess.run(["bash", str(clone / ".ci" / "run")], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (clone / "ran-make").read_text().split() == ["lint", "CI=true", "slow"]  # the linter first
