"""The package layering (design §1, README "Project layout") read from the source: every import, those
inside functions and under ``TYPE_CHECKING`` included, followed transitively.

How modules are classified: a module inside a package (``cocodet.datasets.index``) belongs to that
package (``datasets``); a top-level module is a unit of its own: ``errors``, ``sample``, ``ranks``,
``units``, ``host``, ``schema`` and ``window_slot`` (the bottom layer), ``config`` (start-up validation),
``datamodule`` (the composition root), ``preview``, ``app`` and ``cli``; ``modes`` is the wiring
package (one module per mode). No module re-exports another's names: old ``_target_`` paths go
through one map (``cocodet/compat.py``), a name is imported from the module that defines it, and
no module imports a cocodet name it does not use.

The data side is four packages, one job each, stacked bytes < COCO index < pixels < transforms,
with ``data`` composing them; ``loader`` plans and moves batches and imports none of them.
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
# Every cocodet class or function a shipped YAML named as _target_ before the re-layout, and
# those named since that still live where they were.
OLD_TARGETS = [
    "cocodet.bench.callback.LoaderTimingCallback",
    "cocodet.data.augment.Basic",
    "cocodet.data.augment.Letterbox",
    "cocodet.data.augment.Mosaic",
    "cocodet.data.datamodule.CocoDataModule",
    "cocodet.models.detector.DetectorModule",
    "cocodet.models.preemption.PreemptionCheckpoint",
    "cocodet.models.zoo.build_detector",
    "cocodet.data.reference_presets.HFlip",
    "cocodet.data.reference_presets.MultiScale",
    "cocodet.data.reference_presets.LargeScaleJitter",
    "cocodet.data.ssd_presets.SingleShotPreset",
    "cocodet.datamodule.CocoDataModule",
    "cocodet.transforms.augment.Letterbox",
]
# The index package's public names before it was renamed coco/ -> datasets/.
OLD_DATASETS_TARGETS = [
    f"cocodet.coco.{module}.{name}"
    for module, names in {
        "index": (
            "CocoIndex",
            "DatasetConfigError",
            "build_index",
            "load_coco_json",
            "resolve_inside",
            "remote_inside",
        ),
        "index_cache": ("cached_index", "through_cache", "index_key"),
        "splits": ("annotation_file",),
        "bad_samples": ("BadSampleLedger", "skip_record", "append_records"),
        "synthetic": ("ensure_synthetic",),
        "yolo_index": (
            "yolo_splits",
            "split_index",
            "list_images",
            "files_key",
            "image_ids",
            "build_split_index",
            "write_ground_truth",
        ),
        "yolo_labels": ("Labels", "label_path", "read_labels"),
        "yolo_yaml": ("YoloLayout", "resolve", "parent", "find_data_yaml", "read_data_yaml"),
    }.items()
    for name in names
]
OLD_TARGETS += OLD_DATASETS_TARGETS
# The loader's public names before it was split into plan/ (no torch) and failures/.
OLD_LOADER_TARGETS = [
    f"cocodet.loader.{module}.{name}"
    for module, names in {
        "plan_record": (
            "WorkerCap",
            "ShmCheck",
            "Budget",
            "LoaderDraft",
            "Window",
            "LoaderRequest",
            "RecipeShape",
            "BatchGeometry",
            "LoaderPlan",
        ),
        "plan_table": ("shm_split_text", "side_text", "plan_table"),
        "plan_reasons": (
            "explain",
            "shm_size_for",
            "cpu_reason",
            "no_shm_reason",
            "shm_reason",
            "in_parts",
            "in_process",
            "memory_reason",
            "over_cpus",
            "over_shm",
            "over_memory",
            "near_nofile",
            "near_max_map_count",
            "window_note",
        ),
        "budget": (
            "shm_budget",
            "host_budget",
            "loader_draft",
            "parts_that_fit",
            "memory_limit",
            "worker_memory",
            "inflight_fds",
            "explicit_part_images",
            "decide_workers",
            "window_cache",
            "finished_plan",
        ),
        "policy": ("plan_loader",),
        "pod_requests": ("pod_requests", "pod_requests_text"),
        "resources": ("HostResources", "shm_space", "probe", "raise_nofile_limit"),
        "window_plan": ("slot_pixels", "slot_bytes", "window_slots"),
        "flat_layout": ("round_up", "batch_bytes", "batch_geometry"),
        "worker_request": ("loader_request", "worker_request"),
        "diagnose": (
            "LoaderFailure",
            "full_disk_path",
            "classify",
            "worker_signals",
            "failure_kind",
            "explain",
            "explained_loader_failures",
        ),
        "replan": ("default_on_failure", "next_rung", "describe", "Replanner"),
        "hang": ("LoaderTimeout", "stacks_dir", "register_stack_dump", "worker_stacks", "watchdog"),
        "worker_deaths": ("WorkerDied", "dead_worker_error", "fetching"),
        "worker_shutdown": ("shut_down_workers",),
        "flat_batch": ("PartJoiner",),
    }.items()
    for name in names
]
OLD_TARGETS += OLD_LOADER_TARGETS
BOTTOM = {"errors", "sample", "ranks"}
# What each data-side package and the loader may import (besides itself), transitively.
BELOW = {"errors", "sample", "ranks", "units", "host", "schema", "window_slot"}
ALLOWED = {
    "storage": BELOW,
    "datasets": BELOW | {"storage"},
    "images": BELOW | {"storage", "datasets"},
    "transforms": BELOW | {"storage", "datasets", "images"},
    "loader": BELOW,
    "read_ahead": BELOW | {"storage", "loader"},
    "data": BELOW | {"storage", "datasets", "images", "transforms"},
}
MAX_MODULE_LINES = 300


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
    return direct_imports()


def test_no_cycle_between_units(graph):
    edges = {(unit(m), unit(d)) for m, deps in graph.items() for d in deps if unit(m) != unit(d)}
    units = {unit(m) for m in graph}
    reach = {u: {b for a, b in edges if a == u} for u in units}
    for _ in units:  # transitive closure
        for u in units:
            reach[u] |= {c for b in reach[u] for c in reach[b]}
    cycles = sorted(u for u in units if u in reach[u])
    assert not cycles, f"units on an import cycle: {cycles}; edges {sorted(edges)}"


def layer_violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """'module -> unit' for each unit a layered package's module reaches that its layer may not."""
    bad = []
    for module in sorted(m for m in graph if unit(m) in allowed):
        reached = {unit(d) for d in closure(graph, module, set())} - {unit(module)}
        bad += [f"{module} -> {u}" for u in sorted(reached - allowed[unit(module)])]
    return bad


def test_each_package_imports_only_the_layers_below_it(graph):
    assert not layer_violations(graph, ALLOWED)


def test_the_layering_check_catches_a_back_arrow(graph):
    planted = {**graph, "cocodet.images.decode": graph["cocodet.images.decode"] | {"cocodet.transforms.recipe"}}
    assert "cocodet.images.decode -> transforms" in layer_violations(planted, ALLOWED)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_anywhere_in_src():
    """Counting imports inside functions and under TYPE_CHECKING: a circle there still ties two
    modules into one (neither can be read, tested or moved alone)."""
    assert import_cycles(direct_imports()) == []


def test_the_circle_check_catches_a_planted_circle():
    graph = direct_imports()
    budget, policy = "cocodet.loader.plan.budget", "cocodet.loader.plan.policy"
    planted = {**graph, budget: graph[budget] | {policy}}
    assert any({budget, policy} <= set(c) for c in import_cycles(planted))


def module_level(tree: ast.Module):
    """The nodes of a module's own scope (under ``if`` and ``try`` too), not those of its functions and classes."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def is_cocodet(module: str | None) -> bool:
    return module == "cocodet" or (module or "").startswith("cocodet.")


def names_in_quoted_annotations(tree: ast.Module) -> set[str]:
    """The names a quoted annotation (``position: "StreamPosition"``) uses."""
    annotations = [
        n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation is not None
    ] + [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    quoted = [
        c.value for a in annotations for c in ast.walk(a) if isinstance(c, ast.Constant) and isinstance(c.value, str)
    ]
    return {n.id for q in quoted for n in ast.walk(ast.parse(q, mode="eval")) if isinstance(n, ast.Name)}


def unused_cocodet_imports(root: Path) -> list[str]:
    """'path:line: name' for each cocodet name a module under ``root`` imports and never uses: a
    name imported only for others to import from there (a ``noqa: F401`` hides it from ruff)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | names_in_quoted_annotations(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and is_cocodet(node.module):
                bound = [a.asname or a.name for a in node.names]
            elif isinstance(node, ast.Import):
                bound = [a.asname or a.name.split(".")[0] for a in node.names if is_cocodet(a.name)]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno}: {b}" for b in bound if b not in used]
    return found


def names_not_from_their_module(root: Path, importers: list[Path]) -> list[str]:
    """'path:line: name from module' for each ``from cocodet.m import name`` in ``importers`` where
    ``m`` (a module under ``root``) has ``name`` only by importing it from cocodet: a re-export,
    relied on. So is ``m.name`` through a module alias, unless the file patches that name there
    (``monkeypatch.setattr(m, "name", ...)``: where ``m``'s callers look it up)."""
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in root.rglob("*.py")
    }
    imported: dict[str, set[str]] = {}
    for name, path in modules.items():
        nodes = list(module_level(ast.parse(path.read_text())))
        imported[name] = {
            (a.asname or a.name).split(".")[0]
            for n in nodes
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
            if is_cocodet(n.module if isinstance(n, ast.ImportFrom) else a.name)
        }
    found = []
    for path in importers:
        tree = ast.parse(path.read_text())
        aliases = {}  # a name bound to a module under root (``from cocodet.storage import store as storage``)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules and not node.level:
                for a in node.names:
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    elif a.name in imported[node.module]:
                        found.append(f"{path}:{node.lineno}: {a.name} from {node.module}")
            elif isinstance(node, ast.Import):
                aliases |= {a.asname: a.name for a in node.names if a.asname and a.name in modules}
        patched = {
            (c.args[0].id, c.args[1].value)
            for c in ast.walk(tree)
            if isinstance(c, ast.Call)
            and getattr(c.func, "attr", "") == "setattr"
            and len(c.args) >= 2
            and isinstance(c.args[0], ast.Name)
            and isinstance(c.args[1], ast.Constant)
        }
        found += [  # storage.configure, with configure imported by store.py
            f"{path}:{n.lineno}: {n.attr} from {aliases[n.value.id]}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in aliases
            and n.attr in imported[aliases[n.value.id]]
            and (n.value.id, n.attr) not in patched
        ]
    return found


def test_no_module_imports_a_cocodet_name_it_does_not_use(tmp_path):
    """No module re-exports another's names (design §1): an import kept for its side effect
    (``import torchvision``, which registers ops) is no cocodet name, and stays."""
    assert unused_cocodet_imports(SRC.parent) == []
    (tmp_path / "cocodet").mkdir()
    (tmp_path / "cocodet" / "planted.py").write_text(
        "from cocodet.schema import MODES  # noqa: F401  (re-exported)\nfrom cocodet.units import GiB\nx = GiB\n"
    )
    (tmp_path / "cocodet" / "used.py").write_text("def f():\n    import cocodet.units as u\n\n    return u\n")
    assert unused_cocodet_imports(tmp_path) == ["cocodet/planted.py:1: MODES"]


def test_names_are_imported_from_the_module_that_defines_them(tmp_path):
    """Importers in src/, tests/, benchmarks/ and scripts/ name the defining module, never one
    that only imports the name (which would have to keep importing it for them)."""
    importers = [
        p for folder in ("src", "tests", "benchmarks", "scripts") for p in sorted((REPO / folder).rglob("*.py"))
    ]
    assert len(importers) > 200
    assert names_not_from_their_module(SRC.parent, importers) == []
    planted = tmp_path / "cocodet"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "defines.py").write_text("THING = 1\n")
    (planted / "passes_on.py").write_text("from cocodet.defines import THING\n\nTWICE = 2 * THING\n")
    (planted / "reader.py").write_text(
        "from cocodet import defines, passes_on as other\nfrom cocodet.passes_on import THING, TWICE\n"
        "print(defines.THING, other.TWICE, other.THING)\n"
    )
    (planted / "patcher.py").write_text(  # patched where its callers look it up: not a reader of the re-export
        "from cocodet import passes_on\n\ndef test(monkeypatch):\n"
        "    real = passes_on.THING\n    monkeypatch.setattr(passes_on, 'THING', real + 1)\n"
    )
    assert names_not_from_their_module(tmp_path, [planted / "reader.py", planted / "patcher.py"]) == [
        f"{planted / 'reader.py'}:2: THING from cocodet.passes_on",
        f"{planted / 'reader.py'}:3: THING from cocodet.passes_on",
    ]


def long_modules(root: Path) -> list[str]:
    return [
        f"{p.relative_to(root)}: {n} lines"
        for p in sorted(root.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]


def test_no_module_is_over_300_lines(tmp_path):
    assert long_modules(SRC) == []
    (tmp_path / "planted.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(tmp_path) == [f"planted.py: {MAX_MODULE_LINES + 1} lines"]


def test_no_package_holds_more_than_a_quarter_of_src():
    lines = {}
    for path in SRC.rglob("*.py"):
        lines[unit(module_name(path))] = lines.get(unit(module_name(path)), 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    assert max(lines.values()) <= total / 4, sorted(lines.items(), key=lambda kv: -kv[1])[:3]


def heavy_imports(modules: list[str], path: Path | None = None) -> set[str]:
    """The heavy libraries importing ``modules`` pulls in, in a fresh interpreter."""
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cv2', 'torchvision', 'lightning'}))"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(path)} if path else None
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(eval(proc.stdout.strip().splitlines()[-1]))


# The packages below the modes receive the run specification's parts, never the config tree
# (design §1); tracking/ may keep the tree, which it logs as the run's parameters.
SPEC_ONLY = ("loader", "data", "storage", "images", "datasets", "transforms", "models")


def config_tree_readers(src: Path, packages=SPEC_ONLY) -> list[str]:
    """Modules of ``packages`` under ``src`` that import omegaconf or hydra."""
    found = []
    for package in packages:
        for path in sorted((src / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.split(".")[0] in ("omegaconf", "hydra") for n in names):
                    found.append(str(path.relative_to(src)))
    return sorted(set(found))


def test_no_package_below_the_modes_reads_the_config_tree(tmp_path):
    assert config_tree_readers(SRC) == []
    (tmp_path / "loader").mkdir()
    (tmp_path / "loader" / "planted.py").write_text("def f():\n    from omegaconf import OmegaConf\n")
    assert config_tree_readers(tmp_path, ("loader",)) == ["loader/planted.py"]


def test_the_dataset_only_maps():
    """key -> partners -> images -> recipe: the partner sources and the image reader are
    modules of their own, and nothing asks a sample key what type its fields are."""
    text = (SRC / "data" / "dataset.py").read_text()
    assert len(text.splitlines()) <= 160
    calls = [
        n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "isinstance"
    ]
    assert [ast.unparse(c.args[0]) for c in calls] == ["keys"], "isinstance only on the batch's BatchKeys"


def test_the_storage_package_imports_neither_torch_nor_cv2(tmp_path):
    """Bytes need no image code: a tool that only reads a bucket stays light."""
    storage = sorted(module_name(p) for p in (SRC / "storage").glob("*.py"))
    assert len(storage) >= 6 and heavy_imports(storage) == set()
    planted = tmp_path / "planted_storage"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "store.py").write_text("import torch  # a storage module that imports torch\n")
    assert "torch" in heavy_imports(["planted_storage.store"], tmp_path)


def test_the_loader_plan_imports_no_torch_and_holds_what_the_plan_mode_needs(graph):
    """loader/plan/ is what mode=plan plans with; loader/failures/ and the rest of loader/ may
    import torch, so the plan mode's own imports of the loader stay inside plan/."""
    plan = sorted(module_name(p) for p in (SRC / "loader" / "plan").glob("*.py"))
    assert len(plan) >= 10 and heavy_imports(plan) == set()
    top = [
        n.module
        for n in ast.parse((SRC / "modes" / "plan.py").read_text()).body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("cocodet.loader")
    ]
    assert top and all(m.startswith("cocodet.loader.plan.") for m in top), top
    assert all(
        d.startswith("cocodet.loader.plan.") for m in plan for d in closure(graph, m, set()) if unit(d) == "loader"
    ), "loader/plan/ imports only itself of the loader"


def test_bottom_layer_imports_nothing_of_cocodet(graph):
    for name in BOTTOM:
        assert graph[f"cocodet.{name}"] == set()


def test_only_the_bench_mode_imports_bench(graph):
    for module, deps in graph.items():
        if unit(module) == "bench" or module == "cocodet.modes.bench":
            continue
        reached = {d for d in closure(graph, module, {"cocodet.modes.bench"}) if unit(d) == "bench"}
        assert not reached, f"{module} imports {sorted(reached)}"


@pytest.mark.parametrize("target", OLD_TARGETS)
def test_old_target_paths_still_resolve(target):
    """Through the map when the class moved (to a path that imports), else where it was."""
    from cocodet.compat import MOVED_TARGETS

    module, name = MOVED_TARGETS.get(target, target).rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))


def test_an_old_target_is_mapped_with_one_warning_naming_the_new_path(caplog):
    from cocodet import compat

    tree = {
        "augment": {"_target_": "cocodet.data.augment.Mosaic"},
        "callbacks": {"timing": {"_target_": "cocodet.bench.callback.LoaderTimingCallback"}},
        "model": {"_target_": "cocodet.models.detector.DetectorModule"},
    }
    compat._warned.clear()
    with caplog.at_level("WARNING", logger="cocodet.compat"):
        assert compat.current_targets(tree) == ["augment._target_", "callbacks.timing._target_"]
        compat.current_targets({"augment": {"_target_": "cocodet.data.augment.Mosaic"}})
    assert tree["augment"]["_target_"] == "cocodet.transforms.augment.Mosaic"
    assert tree["callbacks"]["timing"]["_target_"] == "cocodet.timing.callback.LoaderTimingCallback"
    assert tree["model"]["_target_"] == "cocodet.models.detector.DetectorModule"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "cocodet.transforms.augment.Mosaic" in lines[0], lines


def test_each_old_datasets_path_is_mapped_with_one_warning_naming_the_new_path(caplog):
    from cocodet import compat

    compat._warned.clear()
    with caplog.at_level("WARNING", logger="cocodet.compat"):
        for old in OLD_DATASETS_TARGETS:
            for _ in range(2):
                tree = {"dataset": {"hook": {"_target_": old}}}
                assert compat.current_targets(tree) == ["dataset.hook._target_"], old
                assert tree["dataset"]["hook"]["_target_"] == compat.MOVED_TARGETS[old]
                assert tree["dataset"]["hook"]["_target_"].startswith("cocodet.datasets."), old
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(OLD_DATASETS_TARGETS), lines
    assert all(compat.MOVED_TARGETS[old] in line for old, line in zip(OLD_DATASETS_TARGETS, lines))


def test_each_old_loader_path_is_mapped_with_one_warning_naming_the_new_path(caplog):
    from cocodet import compat

    compat._warned.clear()
    with caplog.at_level("WARNING", logger="cocodet.compat"):
        for old in OLD_LOADER_TARGETS:
            for _ in range(2):
                tree = {"loader": {"hook": {"_target_": old}}}
                assert compat.current_targets(tree) == ["loader.hook._target_"], old
                assert tree["loader"]["hook"]["_target_"] == compat.MOVED_TARGETS[old]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(OLD_LOADER_TARGETS), lines
    assert all(compat.MOVED_TARGETS[old] in line for old, line in zip(OLD_LOADER_TARGETS, lines))


def test_letterbox_named_through_augment_py_is_mapped_with_one_warning_naming_recipe_py(caplog):
    """transforms/augment.py once re-exported recipe.Letterbox; a config naming that path runs on."""
    from cocodet import compat

    compat._warned.clear()
    with caplog.at_level("WARNING", logger="cocodet.compat"):
        for _ in range(2):
            tree = {"augment": {"_target_": "cocodet.transforms.augment.Letterbox", "image_size": 640}}
            assert compat.current_targets(tree) == ["augment._target_"]
            assert tree["augment"]["_target_"] == "cocodet.transforms.recipe.Letterbox"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cocodet.transforms.recipe.Letterbox" in lines[0], lines


@pytest.mark.parametrize(
    "augment,old,new",
    [
        ("mosaic", "cocodet.data.augment.Mosaic", "cocodet.transforms.augment.Mosaic"),
        ("none", "cocodet.transforms.augment.Letterbox", "cocodet.transforms.recipe.Letterbox"),
    ],
)
def test_a_run_with_an_old_target_path_runs_and_says_the_new_one(tmp_path, augment, old, new):
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "mode=plan",
            f"augment={augment}",
            f"augment._target_={old}",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [
        line for line in (proc.stdout + proc.stderr).splitlines() if "is an old path" in line
    ]  # Hydra's log: stdout
    assert len(warned) == 1 and new in warned[0], proc.stdout[-2000:]


OLD_RECIPE_PATHS = {
    "hflip": "cocodet.data.reference_presets.HFlip",
    "multiscale": "cocodet.data.reference_presets.MultiScale",
    "lsj": "cocodet.data.reference_presets.LargeScaleJitter",
    "ssd": "cocodet.data.ssd_presets.SingleShotPreset",
    "mosaic": "cocodet.data.augment.Mosaic",
    "basic": "cocodet.data.augment.Basic",
    "none": "cocodet.data.augment.Letterbox",
}


@pytest.mark.parametrize("augment", sorted(OLD_RECIPE_PATHS))
def test_a_recipe_named_by_its_old_path_is_sized_as_by_its_new_one(augment):
    """The wiring dispatches on the recipe's class: an old path is the same class, so the loader
    sizes images for the model exactly as through the shipped config."""
    from hydra import compose, initialize_config_dir

    from cocodet.run_spec.read import read_spec

    model = (
        ["model=ssd300_vgg16"] if augment == "ssd" else ["model=fasterrcnn_resnet50_fpn"] if augment != "mosaic" else []
    )
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        new = compose(
            config_name="config",
            overrides=[f"augment={augment}", "loader.group_aspect_ratio=2", *model, "output_dir=unused"],
        )
        old = compose(
            config_name="config",
            overrides=[
                f"augment={augment}",
                "loader.group_aspect_ratio=2",
                *model,
                f"augment._target_={OLD_RECIPE_PATHS[augment]}",
                "output_dir=unused",
            ],
        )
    assert old.augment._target_ != new.augment._target_
    old, new = read_spec(old), read_spec(new)
    assert (
        old.recipe.resizes_as_model == new.recipe.resizes_as_model == (augment in ("hflip", "multiscale", "lsj", "ssd"))
    )
    assert old.loader.batches == new.loader.batches
    assert old.dataset.get("keep_empty") == new.dataset.get("keep_empty")


def test_shipped_configs_name_current_paths():
    """Every cocodet _target_ in conf/ imports, and none is an old path (compat.py maps those)."""
    from cocodet.compat import MOVED_TARGETS

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
        assert target not in MOVED_TARGETS, f"{target}: shipped configs use the new path"
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

    conf, overrides = str(REPO / "conf"), [*synthetic_overrides(synthetic_root), "debug=fast", f"output_dir={tmp_path}"]
    script = textwrap.dedent(f"""
        import sys
        from hydra import compose, initialize_config_dir
        from cocodet.app import run
        with initialize_config_dir(config_dir={conf!r}, version_base="1.3"):
            cfg = compose(config_name="config", overrides={overrides!r})
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

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.argv = sys.argv[1:]; "
            "import atexit; atexit.register(lambda: print('HEAVY', sorted({m.split('.')[0] for m in "
            "sys.modules} & {'torch', 'lightning', 'torchvision', 'pytorch_lightning'})))\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')",
            str(REPO / "train.py"),
            *synthetic_overrides(synthetic_root),
            "mode=plan",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"mode": "plan"' in proc.stdout and "HEAVY []" in proc.stdout, proc.stdout[-500:]
