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


@needs_root
@pytest.mark.slow
def test_checkpoint_save_on_full_disk_keeps_last_and_prints_summary(tmp_path, synthetic_root):
    """The checkpoint folder is a 300 MiB tmpfs: epoch 0's last.ckpt (about 230 MiB: weights
    and AdamW state) fits, epoch 1's cannot be written beside it."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "check.py").write_text(CHECK_LAST)
    train = [
        sys.executable,
        "train.py",
        *synthetic_overrides(synthetic_root),
        "dataset.image_size=64",
        "loader.batch_size=16",
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        f"callbacks.last_checkpoint.dirpath={folder}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    script = (
        f"{' '.join(train)} > {tmp_path / 'out'} 2> {tmp_path / 'err'}; echo RC=$?; "
        f"ls -a {folder}; {sys.executable} {tmp_path / 'check.py'} {folder / 'last.ckpt'}"
    )
    proc = in_tmpfs(str(folder), "300m", script)
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert "RC=2" in proc.stdout, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: no space left on device saving checkpoint last.ckpt in " + str(folder))
    assert "MiB free of 300.0 MiB" in last_line and "the previous last.ckpt is intact" in last_line
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "disk_full" and summary["steps"] == 2 and "no space left" in summary["error"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "disk_full"
    assert "LOADED 1" in proc.stdout, proc.stdout + proc.stderr  # epoch 0's checkpoint, whole
    assert ".last.ckpt.tmp" not in proc.stdout  # the partial file was removed


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
