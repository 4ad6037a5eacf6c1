"""Shared fixtures: a small synthetic dataset, the coco_tiny path, a train.py runner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cocodet  # noqa: F401  (registers the groups' schemas and resolvers: tests compose configs with Hydra's API)

# Under pytest-xdist (make test, make test-slow) two test processes share the 2 CPUs: each
# process, and every train.py it starts, computes on one thread, so that two tests' trainings do
# not fight over the cores. A step costs 1.4-1.8x on one thread what it costs on two
# (benchmarks/step_cost.py), but a test spends much of its time on one core anyway (imports,
# checkpoint writes, COCOeval, start-up): alone, the slow suite kept 1.37 of the 2 cores busy.
# Set before torch is imported anywhere in this process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

# MLflow's telemetry would try to reach the internet from every test that tracks a run.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

REPO = Path(__file__).resolve().parents[1]
# The shared data folder sits beside the checkout (../shared), also in CI; override with
# COCODET_COCO_TINY when the checkout lives elsewhere.
COCO_TINY = Path(os.environ.get("COCODET_COCO_TINY", REPO.parent / "shared" / "data" / "coco_tiny")).resolve()


@pytest.fixture(scope="session", autouse=True)
def isolated_index_cache(tmp_path_factory):
    """Tests (and the train.py processes they start) cache indexes in a folder of their own,
    not in the user's ~/.cache/cocodet."""
    previous = os.environ.get("COCODET_CACHE_DIR")
    os.environ["COCODET_CACHE_DIR"] = str(tmp_path_factory.mktemp("index_cache"))
    yield
    if previous is None:
        os.environ.pop("COCODET_CACHE_DIR", None)
    else:
        os.environ["COCODET_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def coco_tiny() -> Path:
    if not (COCO_TINY / "annotations" / "instances_val2017.json").is_file():
        message = f"coco_tiny not found at {COCO_TINY} (COCODET_COCO_TINY names another folder)"
        pytest.skip(message)  # a failure under CI=true (ALLOWED_SKIPS): .ci/run checks for the data first
    return COCO_TINY


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    from cocodet.datasets.synthetic import ensure_synthetic

    return ensure_synthetic(tmp_path_factory.mktemp("synthetic") / "ds", seed=0, n_train=48, n_val=16)


# The zoo's fcos_resnet18_fpn at 64 channels (not 256): for tests of the pipeline around the
# detector (loaders, resume, ranks, faults), where only the model's cost matters. A step at 64 px
# is 2.2x cheaper and a checkpoint 140 MB, not 230. Tests of what the default model learns, and
# of make train's recipe, keep the default width.
NARROW_MODEL = "model.detector.fpn_channels=64"


def synthetic_overrides(root: Path) -> list[str]:
    return [f"dataset.root={root}", "dataset.synthetic.n_train=48", "dataset.synthetic.n_val=16"]


def run_train(
    args: list[str],
    run_dir: Path,
    env: dict | None = None,
    timeout: int = 600,
    prefix: list[str] | None = None,
    check: bool = True,
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run train.py as a user would; return the process and the summary (last stdout line)."""
    cmd = [*(prefix or []), sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    summary = None
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    if lines:
        try:
            summary = json.loads(lines[-1])
        except json.JSONDecodeError:
            summary = None
    if check and proc.returncode != 0:
        raise AssertionError(
            f"train.py failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
        )
    return proc, summary


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def run_in_process(overrides: list[str], run_dir: Path) -> dict:
    """Compose the config as train.py would (Hydra's compose API) and run it in this process:
    for wiring tests where a subprocess adds nothing but start-up time."""
    from hydra import compose, initialize_config_dir

    from cocodet.app import run

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"output_dir={run_dir}"])
    return run(cfg)


# The order in which the two xdist processes take test files (longest first, so that neither
# process is left alone with a long file at the end): seconds per file on one thread beside
# another test process, from `CI=true PYTEST_ARGS=--durations=0 bash .ci/run`. Files not listed
# follow in their usual order. Only the order changes, never which tests run.
LONGEST_FILES = {  # the larger of a file's seconds in the two suites
    "test_use_checkpoint.py": 230,
    "test_ddp.py": 300,
    "test_output_parity.py": 196,
    "test_overfit_real.py": 145,
    "test_resume.py": 132,
    "test_long_run.py": 125,
    "test_mlflow_blink.py": 116,
    "test_mlflow_close.py": 105,
    "test_search.py": 100,
    "test_readme.py": 122,
    "test_mlflow_runs.py": 107,
    "test_loader_faults.py": 101,
    "test_store_outage.py": 84,
    "test_hostile_paths.py": 70,
    "test_reference_presets.py": 74,
    "test_remote_root.py": 68,
    "test_skipped_step.py": 67,
    "test_recipe_parity.py": 66,
    "test_scale.py": 62,
    "test_replan.py": 56,
    "test_train.py": 52,
    "test_ssd_presets.py": 50,
    "test_read_ahead.py": 48,
    "test_export_resize.py": 46,
    "test_health.py": 44,
    "test_mlflow_default_store.py": 37,
    "test_loader_hang.py": 31,
    "test_recipes.py": 28,
    "test_trust.py": 28,
    "test_user_errors.py": 26,
    "test_determinism.py": 25,
    "test_mlflow_guard.py": 21,
    "test_disk_full.py": 20,
    "test_yolo_parity.py": 19,
    "test_window_partners.py": 15,
    "test_object_cache.py": 15,
    "test_tools.py": 14,
    "test_pretrained_files.py": 12,
    "test_bad_input.py": 11,
    "test_container.py": 11,
    "test_dead_lock_holders.py": 10,
    "test_layout.py": 9,
    "test_bench.py": 8,
}


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -LONGEST_FILES.get(item.path.name, 0))  # stable: a file's tests keep their order


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_xdist_process():
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    yield


# A test that skips passes green without testing anything. Under CI=true a skip is a failure
# unless its reason is one of these: what a CI host can never offer, by name and the pattern of
# the reason the test gives. Everything else a test needs there (root and unshare, the pinned
# packages and test servers, coco_tiny) is the host's to provide.
ALLOWED_SKIPS = {
    "no CUDA device": r"needs CUDA",
    "a CUDA host (its own check is scripts/gpu_check.sh)": r"this host has CUDA",
}


def under_ci() -> bool:
    return os.environ.get("CI") == "true"


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def allowed_skip(reason: str) -> str | None:
    """The ALLOWED_SKIPS name whose pattern ``reason`` matches, or None."""
    return next((name for name, pattern in ALLOWED_SKIPS.items() if re.search(pattern, reason)), None)


def fail_a_ci_skip(report):
    """Under CI=true, a skip whose reason is not allowed becomes a failure, in the process that
    ran the test (an xdist worker too), so the run's exit status and summary count it."""
    if not (under_ci() and report.skipped and not hasattr(report, "wasxfail")):
        return report
    reason = skip_reason(report)
    if allowed_skip(reason) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true: {reason}. A skip passes green without testing anything: give "
            "this host what the test needs, or, if no CI host can ever have it, add the reason to "
            "ALLOWED_SKIPS in tests/conftest.py"
        )
        # A collection report has no user_properties of its own; an attribute travels from an xdist worker too.
        report.user_properties = [*getattr(report, "user_properties", ()), ("skip_under_ci", reason)]
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return fail_a_ci_skip((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return fail_a_ci_skip((yield))  # a module-level skip (pytest.importorskip) skips every test of its file


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The skips CI allows, then every test that skipped, and every skip CI failed."""
    tr = terminalreporter
    skipped = [r for r in tr.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    refused = [
        (r, dict(r.user_properties)["skip_under_ci"])
        for kind in ("failed", "error")
        for r in tr.stats.get(kind, [])
        if "skip_under_ci" in dict(getattr(r, "user_properties", ()))
    ]
    tr.section("skips")
    tr.write_line(f"allowed under CI=true (ALLOWED_SKIPS, tests/conftest.py): {'; '.join(ALLOWED_SKIPS)}")
    for r in skipped:
        tr.write_line(
            f"skipped {r.nodeid}: {skip_reason(r)} ({allowed_skip(skip_reason(r)) or 'a failure under CI=true'})"
        )
    for r, reason in refused:
        tr.write_line(f"failed (a skip under CI=true) {r.nodeid}: {reason}")
    if not skipped and not refused:
        tr.write_line("no test skipped")
