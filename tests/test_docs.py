"""The project documents itself: every `design §N` cited in src/ is a heading of
docs/design.md, README stays the user's page, and every relative link resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def design_sections() -> set[str]:
    """'3', '7.3', ... from headings such as '## 3. Loader policies' or '### 7.3 Ranks'."""
    text = (REPO / "docs" / "design.md").read_text()
    return {m.group(1) for m in re.finditer(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", text, re.M)}


def test_every_section_cited_in_src_exists():
    sections = design_sections()
    assert {"1", "3", "5", "8.1", "7.3"} <= sections, sections
    cited = {}
    for path in (REPO / "src").rglob("*.py"):
        for m in re.finditer(r"§(\d+(?:\.\d+)*)", path.read_text()):
            cited.setdefault(m.group(1), []).append(str(path.relative_to(REPO)))
    assert cited, "src/ cites no design section"
    missing = {s: where for s, where in cited.items() if s not in sections}
    assert not missing, f"cited in src/ but not a heading of docs/design.md: {missing}"


def test_nothing_refers_to_the_shared_design_file():
    pattern = "shared/" + "DESIGN"  # spelt apart, so this file does not match itself
    proc = subprocess.run(
        ["git", "grep", "--untracked", "-n", pattern, "--", "."], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode in (0, 1) and proc.stdout == "", proc.stdout + proc.stderr


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # links in code blocks are not links
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", m)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    assert doc.is_file()
    broken = []
    for link in relative_links(doc):
        target, _, anchor = link.partition("#")
        file = (doc.parent / target).resolve() if target else doc
        if not file.exists():
            broken.append(f"{link}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.name}")
    assert not broken, broken


# A script's path in prose and code blocks alike (folder, slash, name ending .py or .sh), and the
# pathlib form tests use (the folder and the name as two quoted strings joined by " / ").
SCRIPT_PATH = re.compile(
    r"\b(scripts|benchmarks)/([\w.-]+\.(?:py|sh))\b|\"(scripts|benchmarks)\" / \"([\w.-]+\.(?:py|sh))\""
)
SCANNED = [
    REPO / "README.md",
    REPO / "Makefile",
    REPO / "Dockerfile",
    *sorted((REPO / ".ci").glob("*")),
    *(
        p
        for folder in ("docs", "src", "conf", "tests", "scripts", "benchmarks", "deploy")
        for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in (".md", ".py", ".yaml", ".sh", ".txt")
    ),
]


def missing_script_paths(files: list[Path]) -> list[str]:
    missing = []
    for path in files:
        for m in SCRIPT_PATH.finditer(path.read_text()):
            folder, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if not (REPO / folder / name).is_file():
                missing.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}: {folder}/{name}")
    return missing


def test_every_script_path_named_anywhere_exists(tmp_path):
    """The tools a user runs live in scripts/, the studies and benchmarks behind the docs' figures
    in benchmarks/; a path left behind by a move is caught, in code blocks too."""
    assert len(SCANNED) > 100 and missing_script_paths(SCANNED) == []
    planted = tmp_path / "planted.md"
    moved = "scripts" + "/bench_mosaic.py"  # built here, so that this file names no stale path itself
    planted.write_text(f'```\npython {moved}\n```\nand `REPO / "scripts" / "sweep_report.py"`\n')
    assert missing_script_paths([planted]) == [f"planted.md: {moved}"]


def test_scripts_holds_the_tools_and_benchmarks_the_studies():
    tools = {p.name for p in (REPO / "scripts").iterdir()}
    assert tools == {
        "container_check.sh",
        "debian_mirror.sh",
        "download_coco.sh",
        "gpu_check.sh",
        "gpu_wheels.sh",
        "plot_learning_curve.py",
        "sweep_report.py",
    }
    assert {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix == ".py"} >= {
        "bench_mosaic.py",
        "recipe_study.py",
    }
