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
    proc = subprocess.run(["git", "grep", "--untracked", "-n", pattern, "--", "."], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode in (0, 1) and proc.stdout == "", proc.stdout + proc.stderr


def test_readme_is_the_users_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 450
    for heading in ("## Quick start", "## Configuration groups", "## Loader policies", "## Docker and Kubernetes",
                    "## Data and caches", "## Troubleshooting", "## Headline figures"):
        assert heading in text, heading


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
