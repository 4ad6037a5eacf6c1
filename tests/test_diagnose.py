"""Which resource a loader failure points at, from the words torch and the kernel use (the
failures README's Troubleshooting lists)."""

from __future__ import annotations

import pytest

from cocodet.loader.failures.classify import classify


@pytest.mark.parametrize(
    "message, kind",
    [
        # vm.max_map_count exhausted by in-flight segments: tiny mappings fail
        (
            "RuntimeError: unable to mmap 96 bytes from file </torch_1234_567_8>: Cannot allocate memory (12)",
            "segments",
        ),
        (
            "RuntimeError: unable to mmap 336 bytes from file </torch_1234_567_8>: Cannot allocate memory (12)",
            "segments",
        ),
        # the pin-memory thread mapping a whole batch when /dev/shm bytes ran out: not the OOM killer
        (
            "RuntimeError: Pin memory thread exited unexpectedly: unable to mmap 78643200 bytes from file "
            "</torch_99_1_2>: Cannot allocate memory (12)",
            "shm",
        ),
        ("RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error.", "shm"),
        ("OSError: [Errno 24] Too many open files", "segments"),
        ("RuntimeError: DataLoader worker (pid 12) is killed by signal: Killed.", "memory"),
        ("RuntimeError: DataLoader worker (pid 12) is killed by signal: Segmentation fault.", "segfault"),
        ("RuntimeError: DataLoader worker (pid(s) 12) exited unexpectedly", "worker"),
        ("ValueError: Caught BadSampleError in DataLoader worker process 0.", None),
        # a full disk that names a file outside shared memory is that disk's (issue 70), torch's own shm files are shm
        (
            "OSError: Caught OSError in DataLoader worker process 1. [Errno 28] No space left on device: "
            "'/data/cache/objects/local-rank-0/train-0/ab12.part'",
            "disk",
        ),
        ("OSError: [Errno 122] Disk quota exceeded: '/home/me/.cache/cocodet/pixels/x.npy'", "disk"),
        ("RuntimeError: unable to write to file </torch_77_1_2>: No space left on device (28)", "shm"),
        ("OSError: [Errno 28] No space left on device: '/dev/shm/torch_12_3'", "shm"),
    ],
)
def test_classify_by_words_and_mapping_size(message, kind):
    assert classify(message) == kind


def test_segfault_diagnosis_suggests_zero_then_one_worker():
    from cocodet.loader.failures.diagnose import explain
    from cocodet.loader.plan.policy import plan_loader
    from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
    from cocodet.loader.plan.resources import probe

    plan = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(4, 1 << 20), probe(), cuda=False)
    text = explain(RuntimeError("DataLoader worker (pid 12) is killed by signal: Segmentation fault."), plan)
    assert "loader.num_workers=0" in text and "1 worker" in text and "fork-safe" in text


def test_a_full_disk_elsewhere_is_named_with_its_free_space_not_blamed_on_shm(tmp_path):
    from cocodet.loader.failures.diagnose import explain
    from cocodet.loader.plan.policy import plan_loader
    from cocodet.loader.plan.records import BatchGeometry, LoaderRequest
    from cocodet.loader.plan.resources import probe

    plan = plan_loader(LoaderRequest("explicit", 2, 2), BatchGeometry(4, 1 << 20), probe(), cuda=False)
    part = tmp_path / "copies" / "ab12.part"
    text = explain(OSError(28, "No space left on device", str(part)), plan)
    assert f"the disk holding {part} is full" in text and "free of" in text and f"at {tmp_path}" in text, text
    assert "/dev/shm ran out" not in text and "--shm-size" not in text
