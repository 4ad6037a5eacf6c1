"""Every option of every config group composes; unknown names fail with the choices."""

from __future__ import annotations


import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from conftest import REPO, run_train

CONF = REPO / "conf"
GROUPS = ["dataset", "loader", "augment", "model", "trainer", "experiment", "debug", "bench", "callbacks", "logger",
          "preview"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if p.stem != "_base_")  # _base_: shared, not an option


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


def test_groups_have_options():
    for group in ["dataset", "loader", "augment", "model", "trainer"]:
        assert options(group), group
    assert {"synthetic", "coco"} <= set(options("dataset"))
    assert {"auto", "explicit", "inherited"} <= set(options("loader"))
    assert {"mosaic", "basic", "none"} <= set(options("augment"))
    assert {"ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_fpn", "fasterrcnn_resnet50_fpn_v2",
            "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn"} <= set(options("model"))
    assert {"cpu", "gpu", "ddp"} <= set(options("trainer"))


def test_unknown_group_option_lists_choices(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with pytest.raises(MissingConfigException) as e:
            compose(config_name="config", overrides=["model=yolo_v99"])
    assert "fcos_resnet18_fpn" in str(e.value)


def test_cli_unknown_model_and_dataset_fail_with_choices(tmp_path):
    proc, _ = run_train(["model=nope"], tmp_path / "a", check=False)
    assert proc.returncode != 0
    assert "fasterrcnn_mobilenet_v3_large_fpn" in proc.stderr
    proc, _ = run_train(["dataset=nope"], tmp_path / "b", check=False)
    assert proc.returncode != 0 and "synthetic" in proc.stderr and "coco" in proc.stderr
