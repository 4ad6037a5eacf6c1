"""The package layering (README, Layout) read from the source: every import, those inside
functions included, followed transitively.

How modules are classified: a module inside a package (``cocodet.data.coco``) belongs to that
package (``data``); a top-level module is a unit of its own: ``errors`` and ``sample`` (the
bottom layer), ``config`` (start-up validation), ``datamodule`` (the composition root),
``preview``, ``app`` and ``cli``; ``modes`` is the wiring package (one module per mode). The
re-export modules that keep old ``_target_`` paths importing are exempt, by name.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO

SRC = REPO / "src" / "cocodet"
# Modules that hold nothing but a re-export of a class shipped configs named before the re-layout.
REEXPORTS = {"cocodet.data.datamodule", "cocodet.bench.callback"}
# Every cocodet class or function a shipped YAML named as _target_ before the re-layout.
OLD_TARGETS = ["cocodet.bench.callback.LoaderTimingCallback", "cocodet.data.augment.Basic",
               "cocodet.data.augment.Letterbox", "cocodet.data.augment.Mosaic",
               "cocodet.data.datamodule.CocoDataModule", "cocodet.models.detector.DetectorModule",
               "cocodet.models.preemption.PreemptionCheckpoint", "cocodet.models.zoo.build_detector"]
BOTTOM = {"errors", "sample", "ranks"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def direct_imports() -> dict[str, set[str]]:
    """module -> the cocodet modules it imports anywhere in its body."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cocodet"):
                for alias in node.names:  # `from cocodet.x import y` may name a module y
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("cocodet")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "cocodet"


def closure(graph: dict[str, set[str]], start: str, exempt: set[str]) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen and nxt not in exempt:
                seen.add(nxt)
                stack.append(nxt)
    return seen


@pytest.fixture(scope="module")
def graph():
    return {m: deps for m, deps in direct_imports().items() if m not in REEXPORTS}


def test_no_cycle_between_units(graph):
    edges = {(unit(m), unit(d)) for m, deps in graph.items() for d in deps if unit(m) != unit(d)}
    units = {unit(m) for m in graph}
    reach = {u: {b for a, b in edges if a == u} for u in units}
    for _ in units:  # transitive closure
        for u in units:
            reach[u] |= {c for b in reach[u] for c in reach[b]}
    cycles = sorted(u for u in units if u in reach[u])
    assert not cycles, f"units on an import cycle: {cycles}; edges {sorted(edges)}"


@pytest.mark.parametrize("package", ["data", "loader"])
def test_data_and_loader_stay_at_the_bottom(graph, package):
    other = {"data": "loader", "loader": "data"}[package]
    for module in (m for m in graph if unit(m) == package):
        reached = {unit(d) for d in closure(graph, module, REEXPORTS)}
        bad = reached & {other, "bench", "models", "inference", "timing", "datamodule", "modes", "app", "cli"}
        assert not bad, f"{module} imports (transitively) {sorted(bad)}"


def test_bottom_layer_imports_nothing_of_cocodet(graph):
    for name in BOTTOM:
        assert graph[f"cocodet.{name}"] == set()


def test_only_the_bench_mode_imports_bench(graph):
    for module, deps in graph.items():
        if unit(module) == "bench" or module == "cocodet.modes.bench":
            continue
        reached = {d for d in closure(graph, module, REEXPORTS | {"cocodet.modes.bench"}) if unit(d) == "bench"}
        assert not reached, f"{module} imports {sorted(reached)}"


def test_reexport_modules_hold_only_the_reexport():
    for name in REEXPORTS:
        tree = ast.parse((SRC.parent / Path(*name.split("."))).with_suffix(".py").read_text())
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert len(body) == 1 and isinstance(body[0], ast.ImportFrom), name


@pytest.mark.parametrize("target", OLD_TARGETS)
def test_old_target_paths_still_import(target):
    module, name = target.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))


def test_shipped_configs_name_current_paths():
    """Every cocodet _target_ in conf/ imports, and none goes through a re-export module."""
    targets = set()
    for path in (REPO / "conf").rglob("*.yaml"):
        stack = [yaml.safe_load(path.read_text())]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                t = node.get("_target_")
                if isinstance(t, str) and t.startswith("cocodet."):
                    targets.add(t)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    assert len(targets) >= 7
    for target in targets:
        module, name = target.rsplit(".", 1)
        assert module not in REEXPORTS, f"{target}: shipped configs use the new path"
        assert callable(getattr(importlib.import_module(module), name)), target


def test_app_is_wiring_and_functions_are_short():
    assert len((SRC / "app.py").read_text().splitlines()) <= 150
    long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{module_name(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


@pytest.mark.slow
def test_a_training_run_imports_nothing_from_bench(tmp_path, synthetic_root):
    """_target_ imports made by configs at run time are invisible to the source graph."""
    from conftest import synthetic_overrides

    script = textwrap.dedent(f"""
        import sys
        from hydra import compose, initialize_config_dir
        from cocodet.app import run
        with initialize_config_dir(config_dir={str(REPO / 'conf')!r}, version_base="1.3"):
            cfg = compose(config_name="config", overrides={[*synthetic_overrides(synthetic_root), 'debug=fast',
                                                           f'output_dir={tmp_path}']!r})
        summary = run(cfg)
        assert summary["steps"] == 1
        print("BENCH_MODULES", sorted(m for m in sys.modules if m.startswith("cocodet.bench")))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BENCH_MODULES []" in proc.stdout, proc.stdout[-500:]


@pytest.mark.slow
def test_plan_mode_imports_neither_torch_nor_lightning(tmp_path, synthetic_root):
    """README promises mode=plan answers in about a second: the whole path, summary included."""
    from conftest import synthetic_overrides

    proc = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = sys.argv[1:]; "
                           "import atexit; atexit.register(lambda: print('HEAVY', sorted({m.split('.')[0] for m in "
                           "sys.modules} & {'torch', 'lightning', 'torchvision', 'pytorch_lightning'})))\n"
                           "runpy.run_path(sys.argv[0], run_name='__main__')",
                           str(REPO / "train.py"), *synthetic_overrides(synthetic_root), "mode=plan",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"mode": "plan"' in proc.stdout and "HEAVY []" in proc.stdout, proc.stdout[-500:]
