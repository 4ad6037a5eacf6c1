"""README is checked against the program: its size and shape, every section cited elsewhere,
every `$ python train.py ...` example shown with its output (README and docs/), the option
lists named in prose, and the commands of "Your own data", "Resuming" and the GPU section,
run on coco_tiny from a scratch folder as a new user would."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
HEADINGS = (
    "Setup",
    "Your own data",
    "Watching a run",
    "Tracking runs in MLflow",
    "Resuming",
    "GPU hosts and containers",
    "Beyond one machine",
    "Kubernetes",
    "Data in a bucket",
    "Published recipes",
    "Reference presets",
    "Using a trained detector",
    "Sweeping the loader",
    "Configuration groups",
    "Troubleshooting",
)


def headings(text: str) -> set[str]:
    out, in_code = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{2,4} ", line):
            out.add(line.lstrip("#").strip())
    return out


def long_cells(text: str, limit: int = 300) -> list[str]:
    """Table cells over ``limit`` characters (an escaped ``\\|`` stays inside its cell)."""
    cells = (
        c.strip() for line in text.splitlines() if line.startswith("|") for c in re.split(r"(?<!\\)\|", line)[1:-1]
    )
    return [c[:60] + "..." for c in cells if len(c) > limit]


def test_readme_is_a_short_page_of_user_sections():
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    assert long_cells(text) == []
    assert set(HEADINGS) <= headings(text), set(HEADINGS) - headings(text)
    assert long_cells("| a | " + "x" * 301 + " |\n| `a\\|b` | y |") == ["x" * 60 + "..."]


# `README "Data in a bucket"`, `README, "Kubernetes"`, `README's "Resuming"`: a section by its heading.
CITATION = re.compile(r"README(?:'s)?,? \\?\"([^\"\\]+)\\?\"")
CITING = [
    REPO / "Dockerfile",
    *(
        p
        for folder in ("src", "conf", "scripts", "deploy", "benchmarks", "tests")
        for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in (".py", ".yaml", ".sh")
    ),
]


def uncited_sections(files: list[Path], sections: set[str]) -> list[str]:
    missing = []
    for path in files:
        text = path.read_text()
        for m in CITATION.finditer(text):
            if m.group(1) not in sections:
                missing.append(f"{path.name}: {m.group(1)}")
        missing += [f"{path.name}: {m.group(0)}" for m in re.finditer(r"README, [A-Z]\w+[:)]", text)]  # unquoted
    return missing


def test_every_readme_section_cited_exists(tmp_path):
    sections = headings(README.read_text())
    cited = [m.group(1) for p in CITING for m in CITATION.finditer(p.read_text())]
    assert len(cited) >= 8
    assert uncited_sections(CITING, sections) == []
    planted = tmp_path / "planted.py"
    readme = "READ" + "ME"  # spelt apart, so that this file cites nothing itself
    planted.write_text(f'"""see {readme} "Data and caches" and ({readme}, Layout)."""\n')
    assert uncited_sections([planted], sections) == ["planted.py: Data and caches", f"planted.py: {readme}, Layout)"]


# ---- `$ python train.py ...` examples shown with their output ---------------------------------


def shown_examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each ``$ python train.py`` line of a code
    block: its output runs to the next ``$`` line or the end of the block."""
    out, in_code, current = [], False, None
    for line in re.sub(r"\\\n\s*", "", text).splitlines():  # a command's continuation lines joined
        if line.startswith("```"):
            in_code, current = not in_code, None
        elif in_code and line.startswith("$ python train.py"):
            current = []
            out.append((line[2:].split(" #")[0].strip(), current))
        elif in_code and line.startswith("$"):
            current = None
        elif current is not None and line:
            current.append(line)
    return out


def plan_rows(lines: list[str]) -> list[str]:
    """The row names of a loader plan table: each indented line's text before its padding."""
    return [re.split(r"\s{2,}", ln.strip())[0] for ln in lines if ln.startswith("  ")]


def run_example(command: str, cwd: Path, coco_tiny: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command.replace("../shared/data/coco_tiny", str(coco_tiny)))[2:]
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={cwd / 'run'}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def example_mismatches(text: str, cwd: Path, coco_tiny: Path) -> list[str]:
    """Each shown example run now: an error (exit 2) compared exactly, a plan by its row names."""
    wrong = []
    for command, shown in shown_examples(text):
        proc = run_example(command, cwd, coco_tiny)
        if shown and shown[0].startswith("error:"):
            got = proc.stderr.strip().splitlines()
            if proc.returncode != 2 or got != shown:
                wrong.append(f"{command}: shown {shown}, printed (exit {proc.returncode}) {got[-3:]}")
        elif "mode=plan" in command:
            log = proc.stdout + proc.stderr  # Hydra's log handler writes to stdout
            table = log.split("loader plan:", 1)[-1].split("\n[", 1)[0].splitlines() if "loader plan:" in log else []
            if proc.returncode != 0 or plan_rows(table) != plan_rows(shown):
                wrong.append(f"{command}: rows shown {plan_rows(shown)}, printed {plan_rows(table)}")
        else:
            wrong.append(f"{command}: an example with output that is neither an error nor a plan")
    return wrong


def test_every_shown_example_prints_what_it_shows(coco_tiny, tmp_path):
    examples = {doc.name: shown_examples(doc.read_text()) for doc in DOCS}
    assert sum(map(len, examples.values())) >= 3, examples
    wrong = [w for doc in DOCS if examples[doc.name] for w in example_mismatches(doc.read_text(), tmp_path, coco_tiny)]
    assert wrong == []


def test_a_stale_example_is_caught(coco_tiny, tmp_path):
    stale = (
        "```\n$ python train.py experiment=coco_tinyy\nerror: In 'config': Could not find 'experiment/coco_tinyy' "
        "Available options in 'experiment': coco_gpu coco_tiny\n```\n"
        "```\n$ python train.py mode=plan\n  workers   2 (source: auto)\n  shm cap   <= 9\n```\n"
    )
    wrong = example_mismatches(stale, tmp_path, coco_tiny)
    assert len(wrong) == 2 and "coco_tinyy" in wrong[0] and "rows shown ['workers', 'shm cap']" in wrong[1]


# ---- option lists named in prose ----------------------------------------------------------------


def named_list(text: str, lead: str) -> set[str]:
    """The backquoted names after ``lead`` up to the end of its sentence or parenthesis."""
    start = text.index(lead) + len(lead)
    end = re.search(r"\.(\s|$)|\)" if lead.startswith("(") else r"\.(\s|$)", text[start:]).start() + start
    return set(re.findall(r"`(\w+)`", text[start:end]))


def code_lists() -> dict[str, set[str]]:
    from cocodet.errors import RUN_STATUSES
    from cocodet.models.pretrained_files import BACKBONES
    from cocodet.transforms.model_resize import BUILDER_SIZES, FIXED_SIZES

    backbones = {name + ("_features" if "FEATURES" in str(weights) else "") for name, weights in BACKBONES.values()}
    return {
        "Models `augment=hflip|multiscale|lsj` take:": set(BUILDER_SIZES),
        "Models `augment=ssd|ssdlite` take:": set(FIXED_SIZES),
        "and `status`, one of": set(RUN_STATUSES),
        "(an ImageNet state dict:": backbones,
    }


def list_mismatches(text: str) -> list[str]:
    return [
        f"{lead} {sorted(named_list(text, lead))} != {sorted(names)}"
        for lead, names in code_lists().items()
        if named_list(text, lead) != names
    ]


def test_option_lists_in_prose_are_the_programs():
    assert list_mismatches(README.read_text()) == []
    design = (REPO / "docs" / "design.md").read_text()
    from cocodet.errors import RUN_STATUSES

    assert (
        re.findall(r"`(\w+)`", design.split("`last_ckpt`, `status`", 1)[1].split("`health`", 1)[0])
        == ["completed", "preempted", "interrupted", "store_down", "disk_full", "diverged", "collapsed", "nonfinite"]
        == list(RUN_STATUSES)
    )
    stale = README.read_text().replace("`ssd300_vgg16`, `ssdlite320", "`ssdlite320")
    assert list_mismatches(stale) == [
        "Models `augment=ssd|ssdlite` take: ['ssdlite320_mobilenet_v3_large'] != "
        "['ssd300_vgg16', 'ssdlite320_mobilenet_v3_large']"
    ]


def test_every_status_the_code_sets_is_listed():
    from cocodet.errors import RUN_STATUSES

    source = "\n".join(p.read_text() for p in (REPO / "src" / "cocodet").rglob("*.py"))
    set_here = set(re.findall(r'^    status = "(\w+)"', source, re.M)) - {
        "stopped"
    }  # RunStopped's own: never raised bare
    fit = (REPO / "src" / "cocodet" / "modes" / "train.py").read_text()
    set_here |= set(re.findall(r'return "(\w+)", None', fit))  # completed / preempted / interrupted
    set_here |= set(re.findall(r'TrainingStopped\([^\n]*"(\w+)"\)', source))
    assert set_here == set(RUN_STATUSES), set_here ^ set(RUN_STATUSES)


# ---- the commands of "Your own data", "Resuming" and the GPU section, run as a user would -------


def section(name: str) -> str:
    return README.read_text().split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


def commands(text: str) -> list[str]:
    """The ``python train.py`` commands of a section's bash blocks: continuations joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [ln.split(" #")[0].strip() for ln in joined.splitlines() if ln.startswith("python train.py")]


def run_user_command(command: str, cwd: Path, swaps: dict[str, str], extra: list[str]) -> subprocess.CompletedProcess:
    for old, new in swaps.items():
        command = command.replace(old, new)
    argv = [sys.executable, str(REPO / "train.py"), *shlex.split(command)[2:], *extra]
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )


SMALL = ["dataset.image_size=64", "loader.batch_size=8"]


def gpu(command: str) -> bool:
    return "trainer=gpu" in command or "trainer=ddp" in command


@pytest.fixture
def user_folder(tmp_path, coco_tiny):
    """A scratch working folder, the other layouts of "Your own data" built from coco_tiny, and weight files."""
    import torch
    import torchvision.models as tvm

    shop = tmp_path / "shop"
    (shop / "images").mkdir(parents=True)
    (shop / "labels").mkdir()
    (shop / "images" / "train").symlink_to(coco_tiny / "train2017")
    (shop / "images" / "val").symlink_to(coco_tiny / "val2017")
    (shop / "labels" / "train.json").symlink_to(coco_tiny / "annotations" / "instances_train2017.json")
    (shop / "labels" / "val.json").symlink_to(coco_tiny / "annotations" / "instances_val2017.json")
    # ... and the YOLO layout's data.yaml beside them, over coco_tiny written as YOLO (dataset=yolo)
    from yolo_layout import coco_as_yolo

    for split in ("train2017", "val2017"):
        names = coco_as_yolo(
            coco_tiny / "annotations" / f"instances_{split}.json", coco_tiny / split, shop / "yolo", split
        )
    (shop / "data.yaml").write_text(
        yaml.safe_dump({"path": "yolo", "train": "images/train2017", "val": "images/val2017", "names": names})
    )
    (tmp_path / "weights").mkdir()
    torch.save(tvm.resnet18().state_dict(), tmp_path / "weights" / "resnet18-f37072fd.pth")
    work = tmp_path / "work"
    work.mkdir()
    return work, {"/data/coco": str(coco_tiny), "/data/shop": str(shop), "/weights/": f"{tmp_path / 'weights'}/"}


@pytest.mark.slow
def test_your_own_data_and_the_gpu_commands_run_as_written(user_folder):
    work, swaps = user_folder
    own = commands(section("Your own data"))
    # The GPU section's and the recipes' (trainer=ddp, the reference presets' 800-1333 px) as plans.
    planned = commands(section("GPU hosts and containers")) + commands(section("Published recipes"))
    assert len(own) == 5 and len(planned) == 5 and sum(map(gpu, own)) == 1
    for command in own + planned:
        if gpu(command) or command in planned:
            extra = ["mode=plan"]
        else:
            extra = ["debug=fast", *SMALL, "model.detector.fpn_channels=64"]
        proc = run_user_command(command, work, swaps, extra)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
        if "mode=verify" in command:
            assert list(work.glob("outputs/*/*/verify.json")), "verify wrote no report"


@pytest.mark.slow
def test_the_resuming_commands_run_as_written(user_folder):
    work, swaps = user_folder
    steps = [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "model.detector.fpn_channels=64",
        "trainer.enable_progress_bar=false",
        *SMALL,
    ]
    first, last, if_any = commands(section("Resuming"))
    assert "ckpt_path" not in first and "ckpt_path=last" in last and "ckpt_path=last_if_any" in if_any
    assert run_user_command(first, work, swaps, steps).returncode == 0
    (run_a,) = [p.parent.parent for p in work.glob("outputs/*/*/checkpoints/last.ckpt")]
    proc = run_user_command(last, work, swaps, steps)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("ckpt_path=last:"))
    assert f"resuming run outputs/{run_a.parent.name}/{run_a.name} from last.ckpt" in line
    assert f"hydra.run.dir={run_a.resolve()}" in line
    fresh = run_user_command(if_any, work, swaps, steps)
    assert fresh.returncode == 0 and (work / "runs" / "coco" / "checkpoints" / "last.ckpt").is_file()
    again = run_user_command(if_any, work, swaps, steps)
    assert again.returncode == 0 and "ckpt_path=last_if_any: resuming " in again.stdout
    assert f"resuming {work / 'runs' / 'coco' / 'checkpoints' / 'last.ckpt'}" in again.stdout


@pytest.mark.slow
def test_ckpt_path_last_resumes_a_run_stopped_before_its_first_epoch_end(coco_tiny, tmp_path):
    """Run A completes; run B is stopped by SIGTERM at step 4, before its first epoch end, and
    holds only resume.ckpt. ``ckpt_path=last`` must resume B, the newest, not A."""
    base = [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "model.detector.fpn_channels=64",
        "trainer.enable_progress_bar=false",
        *SMALL,
    ]
    sigterm = ["+callbacks.signal_at._target_=signal_at_step.SignalAtStep", "+callbacks.signal_at.step=4"]
    run = lambda *extra: run_user_command("python train.py", tmp_path, {}, [*base, *extra])  # noqa: E731
    assert run("hydra.run.dir=outputs/a/run", "trainer.limit_train_batches=3").returncode == 0  # resumed: 3 steps
    b = run("hydra.run.dir=outputs/b/run", "trainer.limit_train_batches=6", *sigterm)
    assert b.returncode == 0 and '"status": "preempted"' in b.stdout
    assert [p.name for p in (tmp_path / "outputs" / "b" / "run" / "checkpoints").iterdir()] == ["resume.ckpt"]
    resumed = run("ckpt_path=last", "trainer.limit_train_batches=6")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 6, summary["steps"]  # B's 4 steps, then its remaining 2 (A would give its 3)
    line = [ln for ln in resumed.stderr.splitlines() if ln.startswith("ckpt_path=last:")]
    assert len(line) == 1 and line[0].startswith(
        "ckpt_path=last: resuming run outputs/b/run from resume.ckpt; this run writes to "
    )
    assert line[0].endswith(f"pass hydra.run.dir={(tmp_path / 'outputs' / 'b' / 'run').resolve()}")
