"""Every option of every config group composes; unknown names fail with the choices."""

from __future__ import annotations

import pytest
from conftest import REPO, run_train
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

CONF = REPO / "conf"
GROUPS = [
    "dataset",
    "loader",
    "augment",
    "model",
    "trainer",
    "experiment",
    "debug",
    "bench",
    "callbacks",
    "logger",
    "preview",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if group == "loader" and option == "explicit":
        overrides.append("loader.num_workers=2")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, "output_dir=/tmp/cocodet-compose"])
    resolved = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    assert resolved["mode"] in ("train", "bench", "plan", "preview")
    for key in ("image_size", "root"):
        assert key in resolved["dataset"]
    assert {"batch_size", "num_workers", "prefetch_factor", "policy"} <= set(resolved["loader"])


def test_readme_lists_exactly_the_options_of_each_group():
    """README's configuration table is what users read: every option it names exists, and every
    option that exists is named (a new preset cannot go undocumented, a removed one cannot linger)."""
    import re

    table = {}
    for line in (REPO / "README.md").read_text().split("## Configuration groups", 1)[1].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] if line.startswith("| `") else []
        if len(cells) == 3:
            for group in re.findall(r"`(\w+)`", cells[0]):
                table.setdefault(group, set()).update(re.findall(r"`(\w+)`", cells[1]))  # a group may take two rows
    for group in ["dataset", "loader", "augment", "model", "trainer", "callbacks", "logger", "experiment", "debug"]:
        named = {o for o in table[group] if (CONF / group / f"{o}.yaml").is_file()}
        assert named == set(options(group)), (group, sorted(named), options(group))


def test_model_base_is_not_offered_as_a_model():
    assert "_base_" not in options("model") and "model_base" not in options("model")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with pytest.raises(MissingConfigException) as e:
            compose(config_name="config", overrides=["model=nope"])
    assert "_base_" not in str(e.value) and "fcos_resnet18_fpn" in str(e.value)


def test_unknown_group_option_lists_choices(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with pytest.raises(MissingConfigException) as e:
            compose(config_name="config", overrides=["model=yolo_v99"])
    assert "fcos_resnet18_fpn" in str(e.value)


@pytest.mark.slow
def test_cli_unknown_model_and_dataset_fail_with_choices(tmp_path):
    proc, _ = run_train(["model=nope"], tmp_path / "a", check=False)
    assert proc.returncode != 0
    assert "fasterrcnn_mobilenet_v3_large_fpn" in proc.stderr
    proc, _ = run_train(["dataset=nope"], tmp_path / "b", check=False)
    assert proc.returncode != 0 and "synthetic" in proc.stderr and "coco" in proc.stderr


def test_every_mode_has_its_function():
    from cocodet.modes import MODE_TABLE
    from cocodet.schema import MODES

    assert tuple(MODE_TABLE) == MODES


def test_the_dataset_keys_are_the_datamodules_and_the_split_loaders_arguments():
    """What the dataset group may name: the datamodule's arguments no other group gives, the
    split loader's, each layout's own keys (the layout table's), its _target_, and
    storage_options (the store's, read into the run specification)."""
    import inspect

    from cocodet.datamodule import CocoDataModule
    from cocodet.datasets.layouts import LAYOUTS, layout_keys
    from cocodet.datasets.splits import SOURCE_KEYS, SplitLoader
    from cocodet.schema import DATASET_KEYS

    runtime = {
        "self",
        "recipe",
        "batch_size",
        "seed",
        "plan",
        "val_batch_size",
        "run_dir",
        "replanner",
        "group_aspect_ratio",
        "dataset",
    }
    arguments = set(inspect.signature(CocoDataModule.__init__).parameters) - runtime
    loader = set(inspect.signature(SplitLoader.__init__).parameters) - {"self", "layout_options"}
    assert loader == set(SOURCE_KEYS)
    assert set(DATASET_KEYS) == arguments | loader | {"_target_", "storage_options"}
    assert not set(DATASET_KEYS) & set(layout_keys())
    for name in LAYOUTS:  # each shipped layout's config names only keys the group declares
        keys = set(compose_dataset(name)) - {"_target_"}
        assert keys <= set(DATASET_KEYS) | set(layout_keys()), (name, keys)
        assert set(LAYOUTS[name].keys) <= keys, name


def compose_dataset(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"dataset={name}", "output_dir=unused"])
    return OmegaConf.to_container(cfg.dataset, resolve=False)
