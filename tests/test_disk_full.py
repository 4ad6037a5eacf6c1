"""Full disks lose nothing: a checkpoint save or a pixel-cache build that runs out of space
keeps what was there, ends in one line naming the folder and its free space (exit 2), and the
training summary still reaches stdout. Real ENOSPC from a small tmpfs in a private mount
namespace (needs root, as CI runs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, is_root, synthetic_overrides

needs_root = pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare")


def in_tmpfs(mount: str, size: str, script: str) -> subprocess.CompletedProcess:
    """Run the shell ``script`` in a private mount namespace with a tmpfs of ``size`` on ``mount``
    (the tmpfs ends with the namespace, so the script also inspects what is left in it)."""
    return subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs -o size={size} tmpfs {mount} && {script}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


CHECK_LAST = """
import sys, torch
ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print("LOADED", ckpt["global_step"])
"""


# Which save fills the disk: epoch 1's last.ckpt (the checkpoint folder is a 300 MiB tmpfs for
# last.ckpt alone), or epoch 1's new best (the whole folder is a 600 MiB tmpfs, which holds epoch 0's
# best-000.ckpt and last.ckpt, about 220 MiB each; val/map made to rise, as a learning model's does).
FILLED_BY = {
    "last": ("300m", ["callbacks.last_checkpoint.dirpath={folder}"]),
    "best": (
        "600m",
        [
            "callbacks.last_checkpoint.dirpath={folder}",
            "callbacks.model_checkpoint.dirpath={folder}",
            "+callbacks.rising._target_=signal_at_step.RisingValMap",
        ],
    ),
}


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("filled_by", sorted(FILLED_BY))
def test_checkpoint_save_on_full_disk_keeps_last_and_prints_summary(tmp_path, synthetic_root, filled_by):
    """A checkpoint of epoch 1 does not fit (weights and AdamW state: about 220 MiB): the run ends
    disk_full, epoch 0's checkpoints stay whole, and the summary names the best one on disk."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "check.py").write_text(CHECK_LAST)
    size, placed = FILLED_BY[filled_by]
    train = [
        f"PYTHONPATH={REPO / 'tests'}",
        sys.executable,
        "train.py",
        *synthetic_overrides(synthetic_root),
        "dataset.image_size=64",
        "loader.batch_size=16",
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        *[p.format(folder=folder) for p in placed],
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    script = (
        f"{' '.join(train)} > {tmp_path / 'out'} 2> {tmp_path / 'err'}; echo RC=$?; "
        f"ls -a {folder}; {sys.executable} {tmp_path / 'check.py'} {folder / 'last.ckpt'}"
    )
    proc = in_tmpfs(str(folder), size, script)
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert "RC=2" in proc.stdout, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    full = "last.ckpt" if filled_by == "last" else "best-001.ckpt"
    assert last_line.startswith(f"error: no space left on device saving checkpoint {full} in {folder}"), last_line
    assert f"MiB free of {size[:-1]}.0 MiB" in last_line
    assert "the previous last.ckpt is intact" in last_line or filled_by == "best"
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "disk_full" and summary["steps"] == 2 and "no space left" in summary["error"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "disk_full"
    # Epoch 0's best checkpoint is whole on disk: the summary names it, whichever save failed after it.
    best = (folder if filled_by == "best" else tmp_path / "run" / "checkpoints") / "best-000.ckpt"
    assert summary["best_ckpt"] == str(best), (summary["best_ckpt"], stderr[-2000:])
    assert "best-000.ckpt" in proc.stdout.split() or filled_by == "last"  # listed in the tmpfs before it ended
    assert "LOADED 1" in proc.stdout, proc.stdout + proc.stderr  # epoch 0's checkpoint, whole
    assert f".{full}.tmp" not in proc.stdout  # the partial file was removed


PATCHED_RUN = """
import runpy, sys
import cocodet.data.pixel_cache as pixel_cache
pixel_cache.estimated_bytes = lambda index, size: 1  # the up-front check passes; the disk fills later
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@needs_root
@pytest.mark.slow
def test_pixel_cache_build_on_full_disk_removes_its_partial_build(tmp_path, coco_tiny):
    """coco_tiny at 320 px is ~19 MiB of pixels; the cache folder is a 4 MiB tmpfs."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (tmp_path / "patched.py").write_text(PATCHED_RUN)
    train = [
        sys.executable,
        str(tmp_path / "patched.py"),
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        "dataset.image_size=320",
        "dataset.cache=disk",
        f"dataset.cache_dir={cache}",
        "mode=bench",
        "bench.batches=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    script = f"{' '.join(train)} > {tmp_path / 'out'} 2> {tmp_path / 'err'}; echo RC=$?; ls -a {cache}"
    proc = in_tmpfs(str(cache), "4m", script)
    stderr = (tmp_path / "err").read_text()
    assert "RC=2" in proc.stdout, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert (
        last_line.startswith(
            f"error: dataset.cache=disk: the disk filled while building the train pixel cache in {cache}"
        )
        and "MiB free now; the partial build was removed" in last_line
    )
    left = proc.stdout.split("RC=2", 1)[1].split()
    # No pixel folder, finished or temporary, is left behind (the empty lock file stays, as after any build).
    assert not [name for name in left if name.startswith("pixels-") and not name.endswith(".lock")], left
