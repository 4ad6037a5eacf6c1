"""The 30000 x 30000 PNG (2.6 MB on disk, 2.7 GB decoded) at index 0 of train and of val,
under a record that says 640 x 480, through every path that decodes: a training epoch with
the prediction grid, mode=predict on a folder holding it, and the exported standalone script
on that folder (mode=bench with the decode probe: test_trust.py). Each run's peak RSS (the
largest of any process in its tree) stays within 1.5x of the same run without the file, and
the skip records or the output name the file. Real files, real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NARROW_MODEL, REPO, run_in_process
from test_bad_input import make_dataset
from test_trust import png_bomb

pytestmark = pytest.mark.slow
BOMB_ID = 1  # below every COCO 2017 id: the index sorts by id, so the bomb is image 0


def peak_rss(cmd: list[str], cwd: Path = REPO) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``cmd`` under a wrapper; the largest RSS (KiB) of any process the wrapper's tree
    waited for (the command and its DataLoader workers: RUSAGE_CHILDREN), and its output."""
    wrapper = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=cwd, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("MAXRSS"), proc.stderr[-3000:]
    proc.stdout = "\n".join(lines[:-1])
    return proc, int(lines[-1].split()[1])


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sets(coco_tiny, tmp_path_factory):
    """root with ann.json (the bomb at index 0) and clean.json (the same without it), used as
    both splits; a prediction folder with and one without the bomb."""
    base = tmp_path_factory.mktemp("hostile_paths")
    root, data = make_dataset(coco_tiny, base / "ds", n=8)
    clean = {**data}
    png_bomb(root / "images" / "bomb.png")
    data = {
        **data,
        "images": [{"id": BOMB_ID, "file_name": "bomb.png", "height": 480, "width": 640}, *data["images"]],
        "annotations": [
            {
                "id": 1,
                "image_id": BOMB_ID,
                "category_id": data["categories"][0]["id"],
                "bbox": [10, 10, 100, 100],
                "area": 1e4,
                "iscrowd": 0,
            },
            *data["annotations"],
        ],
    }
    (root / "ann.json").write_text(json.dumps(data))
    (root / "clean.json").write_text(json.dumps(clean))
    folders = {}
    for name, with_bomb in (("clean", False), ("hostile", True)):
        folder = base / f"predict_{name}"
        folder.mkdir()
        for im in clean["images"][:3]:
            shutil.copy(root / "images" / im["file_name"], folder / im["file_name"])
        if with_bomb:
            shutil.copy(root / "images" / "bomb.png", folder / "bomb.png")
        folders[name] = folder
    yield {"root": root, "base": base, "folders": folders}
    shutil.rmtree(
        base, ignore_errors=True
    )  # a module's training runs leave checkpoints (about 0.2 GB each): gone when it ends


def dataset_args(sets, ann: str) -> list[str]:
    return [
        "dataset=coco",
        f"dataset.root={sets['root']}",
        "dataset.train_images=images",
        "dataset.val_images=images",
        f"dataset.train_ann={ann}",
        f"dataset.val_ann={ann}",
        "dataset.image_size=320",
        "dataset.on_bad_sample=skip",
        "dataset.cache_dir=null",
        "loader=explicit",
        "loader.num_workers=1",
        "loader.batch_size=5",
        "logger=none",
        NARROW_MODEL,
    ]  # what is measured is the bomb's cost beside the same model's, whatever its width


@pytest.fixture(scope="module")
def trained(sets):
    """A one-epoch training run on each annotation file (9 or 8 images: 2 batches of each
    split, so the bomb is drawn in both), the prediction grid on."""
    runs = {}
    for name, ann in (("clean", "clean.json"), ("hostile", "ann.json")):
        run_dir = sets["base"] / f"train_{name}"
        proc, kib = peak_rss(
            [
                sys.executable,
                str(REPO / "train.py"),
                *dataset_args(sets, ann),
                "trainer.max_epochs=1",
                "trainer.num_sanity_val_steps=0",
                f"hydra.run.dir={run_dir}",
            ]
        )
        runs[name] = (summary_of(proc), kib, run_dir)
    return runs


def test_training_with_the_grid_holds_memory_and_names_the_file(trained):
    (_, clean_kib, _), (hostile, hostile_kib, run_dir) = trained["clean"], trained["hostile"]
    assert hostile["status"] == "completed" and (run_dir / "val_predictions.png").is_file()
    assert hostile["bad_samples"]["train"]["skipped"] >= 1 and hostile["bad_samples"]["val"]["skipped"] >= 1
    records = [json.loads(ln) for ln in (run_dir / "bad_samples.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in records if r["file"].endswith("bomb.png")} == {"train", "val"}
    assert all("too large" in r["reason"] or "header size" in r["reason"] for r in records), records
    print(f"peak RSS KiB: clean {clean_kib}, with the bomb {hostile_kib} ({hostile_kib / clean_kib:.2f}x)")
    assert hostile_kib <= 1.5 * clean_kib, (hostile_kib, clean_kib)


def test_predict_on_a_folder_holding_the_bomb_holds_memory(sets, trained):
    ckpt = trained["hostile"][0]["last_ckpt"]
    results = {}
    for name, folder in sets["folders"].items():
        run_dir = sets["base"] / f"predict_run_{name}"
        proc, kib = peak_rss(
            [
                sys.executable,
                str(REPO / "train.py"),
                *dataset_args(sets, "clean.json"),
                "mode=predict",
                f"ckpt_path={ckpt}",
                f"predict.source={folder}",
                f"hydra.run.dir={run_dir}",
            ]
        )
        results[name] = (summary_of(proc), kib, run_dir)
    (clean, clean_kib, _), (hostile, hostile_kib, run_dir) = results["clean"], results["hostile"]
    assert clean["bad_images"] == 0 and hostile["images"] == 4 and hostile["bad_images"] == 1
    [record] = [json.loads(ln) for ln in (run_dir / "bad_samples.jsonl").read_text().splitlines()]
    assert record["file"].endswith("bomb.png") and "too large" in record["reason"]
    print(f"peak RSS KiB: clean {clean_kib}, with the bomb {hostile_kib} ({hostile_kib / clean_kib:.2f}x)")
    assert hostile_kib <= 1.5 * clean_kib, (hostile_kib, clean_kib)


def test_the_standalone_script_skips_the_bomb_undecoded(sets, trained):
    e = run_in_process(
        [
            *dataset_args(sets, "clean.json"),
            "mode=export",
            f"ckpt_path={trained['hostile'][0]['last_ckpt']}",
            "export.format=torchscript",
        ],
        sets["base"] / "export",
    )
    script, model = e["predict_script"], e["model_file"]
    outputs = {}
    for name, folder in sets["folders"].items():
        files = sorted(str(p) for p in folder.iterdir())
        proc, kib = peak_rss([sys.executable, script, "--model", model, *files], cwd=Path(script).parent)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[name] = (json.loads(proc.stdout), proc.stderr, kib)
    (clean, _, clean_kib), (hostile, err, hostile_kib) = outputs["clean"], outputs["hostile"]
    assert "skipped" in err and "bomb.png" in err and "too large" in err and "--max-image-pixels" in err, err
    assert not [r for r in hostile if r["file"].endswith("bomb.png")]
    assert sorted(r["file"].rsplit("/", 1)[-1] for r in hostile) == sorted(r["file"].rsplit("/", 1)[-1] for r in clean)
    print(f"peak RSS KiB: clean {clean_kib}, with the bomb {hostile_kib} ({hostile_kib / clean_kib:.2f}x)")
    assert hostile_kib <= 1.5 * clean_kib, (hostile_kib, clean_kib)
    # The limit is the user's to raise: a lower one skips the real images too, by their headers.
    low = sorted(str(p) for p in sets["folders"]["clean"].iterdir())
    proc = subprocess.run(
        [sys.executable, script, "--model", model, "--max-image-pixels", "1000", *low],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(script).parent,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == [] and proc.stderr.count("skipped") == len(low)
