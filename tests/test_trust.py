"""Trust nothing that arrives (design §8): images sized from their headers before a decode,
checkpoints that cannot run code, caches that verify themselves. Real files, real processes."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import NARROW_MODEL, REPO, is_root, run_in_process, synthetic_overrides
from test_bad_input import make_dataset, write

from cocodet.data.dataset import DetectionDataset
from cocodet.data.image_reader import CallReads
from cocodet.datasets.index import build_index
from cocodet.errors import BadSampleError
from cocodet.images import decode as decode_module
from cocodet.images.header import header_size
from cocodet.models.checkpoint_file import CheckpointError
from cocodet.transforms.augment import Basic

needs_unshare = pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare")


# --- hostile images ---------------------------------------------------------------------------


def png_bomb(path: Path, side: int = 30000) -> None:
    """A valid grayscale PNG of side x side zeros: a few MB on disk, 2.7 GB as a colour decode."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = bytes(side + 1)  # filter byte 0 + a row of zeros
    idat = b"".join(z.compress(row * 1000) for _ in range(side // 1000)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def jpeg_claiming(path: Path, height: int, width: int) -> None:
    """A complete small JPEG (ends in FFD9) whose SOF header claims height x width."""
    ok, data = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))
    data = bytearray(data.tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    assert data.endswith(b"\xff\xd9")
    path.write_bytes(bytes(data))


# The bomb's id is below any COCO 2017 image id, so it is image 0 (the index sorts by id): what
# the bench's decode probe reads first. The others are above any.
HOSTILE_IDS = [1, 90_000_001, 90_000_002]


def hostile_dataset(coco_tiny: Path, root: Path) -> tuple[Path, dict, int]:
    """8 real images plus three hostile ones, each annotated; returns (root, data, max_pixels)."""
    root, data = make_dataset(coco_tiny, root)
    max_pixels = 10_000_000  # low enough that a real 4000 x 3000 JPEG is above it
    png_bomb(root / "images" / "bomb.png")
    jpeg_claiming(root / "images" / "claims.jpg", 16000, 16000)  # 256 MP: above the limit, below OpenCV's 2^30
    cv2.imwrite(str(root / "images" / "big.jpg"), np.full((3000, 4000, 3), 90, np.uint8))
    for k, (name, h, w) in enumerate(
        [("bomb.png", 30000, 30000), ("claims.jpg", 16000, 16000), ("big.jpg", 3000, 4000)]
    ):
        data["images"].append({"id": HOSTILE_IDS[k], "file_name": name, "height": h, "width": w})
        data["annotations"].append(
            {
                "id": 99_000_000 + k,
                "image_id": HOSTILE_IDS[k],
                "category_id": data["categories"][0]["id"],
                "bbox": [10, 10, 100, 100],
                "area": 1e4,
                "iscrowd": 0,
            }
        )
    return root, data, max_pixels


def test_header_sizes_without_decoding(tmp_path):
    png_bomb(tmp_path / "b.png", side=3000)
    jpeg_claiming(tmp_path / "c.jpg", 1234, 567)
    assert header_size((tmp_path / "b.png").read_bytes()) == (3000, 3000)
    assert header_size((tmp_path / "c.jpg").read_bytes()) == (1234, 567)
    ok, webp = cv2.imencode(".webp", np.zeros((37, 41, 3), np.uint8))
    assert header_size(webp.tobytes()) == (37, 41)  # through PIL's lazy open


@pytest.mark.parametrize("mode", ["skip", "raise"])
def test_hostile_images_are_bad_samples_without_a_decode(coco_tiny, tmp_path, monkeypatch, mode):
    root, data, max_pixels = hostile_dataset(coco_tiny, tmp_path / "ds")
    index = build_index(root / "images", write(root, data))
    decoded = []
    real_decode = decode_module._imdecode

    def watched(blob, reduction=1):
        decoded.append(header_size(blob))
        return real_decode(blob, reduction)

    monkeypatch.setattr(decode_module, "_imdecode", watched)
    dataset = DetectionDataset(index, Basic(128), 0, mode, max_image_pixels=max_pixels)
    hostile = [k for k in range(len(index)) if int(index.image_ids[k]) in HOSTILE_IDS]
    reasons = {}
    for k in hostile:
        if mode == "raise":
            with pytest.raises(BadSampleError) as err:
                dataset[(0, k)]
            reasons[int(index.image_ids[k])] = err.value.reason
        else:
            sample = dataset[(0, k)]
            record = [r for r in sample["skipped"] if r["role"] == "sample"][0]  # the primary (replacements follow)
            reasons[record["image_id"]] = record["reason"]
    assert all("too large" in r and str(max_pixels) in r for r in reasons.values()), reasons
    assert sorted(reasons) == HOSTILE_IDS
    assert not [hw for hw in decoded if hw and hw[0] * hw[1] > max_pixels], decoded  # never decoded
    # Found bad once, remembered by this process: drawn again (as a sample or a partner), it is
    # answered from that memory instead of being read again.
    assert set(hostile) <= set(dataset.reader.bad)
    dataset.reader.index = None  # any read of the index would now fail
    with pytest.raises(BadSampleError, match="too large"):
        dataset.reader.read(hostile[0], None, CallReads(), np.zeros(4))


def test_an_annotation_that_disagrees_with_the_header_is_refused_before_decoding(coco_tiny, tmp_path, monkeypatch):
    root, data = make_dataset(coco_tiny, tmp_path / "ds")
    data["images"][0]["height"] += 10
    index = build_index(root / "images", write(root, data))
    monkeypatch.setattr(decode_module, "_imdecode", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(BadSampleError, match="header size .* differs from the annotation"):
        DetectionDataset(index, Basic(128), 0, "raise")[(0, 0)]


def test_an_opencv_error_is_a_bad_sample(tmp_path, monkeypatch):
    def refuse(*args):
        raise cv2.error("OpenCV(5.0.0) imgcodecs: image size 40000x40000 exceeds the limit")

    monkeypatch.setattr(decode_module.cv2, "imdecode", refuse)
    with pytest.raises(ValueError, match="OpenCV cannot decode it"):
        decode_module.decode_checked(b"\xff\xd8" + b"\x00" * 64 + b"\xff\xd9")


def _peak_rss_of_tree(args: list[str], run_dir: Path) -> tuple[int, dict]:
    """Run train.py in a wrapper process; the largest RSS of any process it waited for
    (train.py and its DataLoader workers: RUSAGE_CHILDREN), in KiB, and the summary."""
    wrapper = (
        "import resource, subprocess, sys; "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return int(lines[-1].split()[1]), json.loads(lines[-2])


@pytest.mark.slow
def test_hostile_images_do_not_raise_any_workers_memory(coco_tiny, tmp_path):
    root, data, max_pixels = hostile_dataset(coco_tiny, tmp_path / "ds")
    write(root, data)
    clean = {
        **data,
        "images": [im for im in data["images"] if im["id"] not in HOSTILE_IDS],
        "annotations": [a for a in data["annotations"] if a["image_id"] not in HOSTILE_IDS],
    }
    (root / "clean.json").write_text(json.dumps(clean))
    common = [
        "mode=bench",
        "dataset=coco",
        f"dataset.root={root}",
        "dataset.train_images=images",
        "dataset.val_images=images",
        "dataset.val_ann=clean.json",
        "dataset.image_size=128",
        "dataset.on_bad_sample=skip",
        f"dataset.max_image_pixels={max_pixels}",
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=4",
        "bench.batches=null",
        "bench.epochs=3",
        "bench.decode_probe=8",
        "dataset.cache_dir=null",
    ]  # the probe reads images 0-7: the bomb first
    clean_kib, _ = _peak_rss_of_tree([*common, "dataset.train_ann=clean.json"], tmp_path / "clean")
    hostile_kib, s = _peak_rss_of_tree([*common, "dataset.train_ann=ann.json"], tmp_path / "hostile")
    assert s["skipped_samples"] >= 3 and s["num_workers"] == 2 and s["decode_ms_per_image"] > 0
    records = [json.loads(ln) for ln in (tmp_path / "hostile" / "bad_samples.jsonl").read_text().splitlines()]
    assert {r["image_id"] for r in records} == set(HOSTILE_IDS)
    print(f"peak RSS KiB: clean {clean_kib}, with the hostile images {hostile_kib} ({hostile_kib / clean_kib:.2f}x)")
    assert hostile_kib <= 1.5 * clean_kib, (hostile_kib, clean_kib)


def test_non_finite_boxes_are_dropped_at_indexing(coco_tiny, tmp_path):
    root, data = make_dataset(coco_tiny, tmp_path / "ds")
    kept = len([a for a in data["annotations"] if not a.get("iscrowd")])
    data["annotations"][0]["iscrowd"] = 0
    data["annotations"][0]["bbox"] = [10, 10, float("inf"), 20]  # json writes Infinity, as a tool might
    data["annotations"][1]["iscrowd"] = 0
    data["annotations"][1]["bbox"] = [float("nan"), 10, 20, 20]
    ann = root / "ann.json"
    ann.write_text(json.dumps(data))
    assert "Infinity" in ann.read_text()
    index = build_index(root / "images", ann)
    assert index.dropped["non_finite_box"] == 2
    assert np.isfinite(index.boxes).all() and len(index.boxes) <= kept - 1
    assert not (index.boxes[:, 2] - index.boxes[:, 0] > 5000).any()


@pytest.mark.parametrize("mode", ["train", "bench"])
def test_verify_keeps_bad_images_out_of_sampling_and_the_summary_counts_them(coco_tiny, tmp_path, mode):
    root, data = make_dataset(coco_tiny, tmp_path / "ds")
    for k in (2, 5):
        (root / "images" / data["images"][k]["file_name"]).write_bytes(b"not an image")
    write(root, data)
    args = [
        "dataset=coco",
        f"dataset.root={root}",
        "dataset.train_images=images",
        "dataset.train_ann=ann.json",
        "dataset.val_images=images",
        "dataset.val_ann=ann.json",
        "dataset.image_size=64",
        "dataset.verify=true",
        "dataset.on_bad_sample=skip",
        "loader.batch_size=4",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "callbacks=none",
        "logger=none",
        "loader=explicit",
        "loader.num_workers=0",
        f"mode={mode}",
        "bench.batches=null",
        "bench.epochs=1",
        "bench.warmup=0",
        "bench.decode_probe=0",
    ]
    s = run_in_process(args, tmp_path / "run")
    train = s["bad_samples"]["train"]
    assert train["excluded_by_verify"] == 2 and train["skipped"] == 0  # never sampled, so nothing was replaced
    assert train["seen"] + train["excluded_by_verify"] + train["skipped"] == train["images"] == len(data["images"])
    if mode == "bench":  # beside the examples it counts, the summary says what it left out
        assert s["excluded_by_verify"] == 2 and s["skipped_samples"] == 0
        assert s["examples"] == len(data["images"]) - 2
    records = [json.loads(ln) for ln in (tmp_path / "run" / "bad_samples.jsonl").read_text().splitlines()]
    assert sorted(r["role"] for r in records if r["stage"] == "train") == ["excluded_by_verify"] * 2


# --- hostile checkpoints ----------------------------------------------------------------------


class _CreatesAFile:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling calls open(): the file appears


def hostile_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    path = tmp_path / "hostile.ckpt"
    import torch

    torch.save({"state_dict": {}, "payload": _CreatesAFile(str(marker))}, path)
    return path, marker


@pytest.mark.parametrize("mode", ["train", "eval", "predict", "export"])
def test_a_checkpoint_that_runs_code_is_refused_in_every_mode(tmp_path, synthetic_root, mode):
    path, marker = hostile_checkpoint(tmp_path)
    args = [
        *synthetic_overrides(synthetic_root),
        f"mode={mode}",
        f"ckpt_path={path}",
        f"predict.source={synthetic_root}/val",
        "trainer.max_epochs=1",
    ]
    with pytest.raises(CheckpointError) as err:
        run_in_process(args, tmp_path / "run")
    text = str(err.value)
    assert str(path) in text and "the global io.open" in text, text
    assert "weights_only=false" in text and "\n" not in text
    assert not marker.exists()


@pytest.mark.slow
def test_hostile_checkpoint_exits_2_with_one_line(tmp_path, synthetic_root):
    path, marker = hostile_checkpoint(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            *synthetic_overrides(synthetic_root),
            "mode=eval",
            f"ckpt_path={path}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("error: ") and "weights_only=false" in proc.stderr
    assert not marker.exists()


def test_a_file_that_is_not_a_checkpoint_gets_one_line(tmp_path, synthetic_root):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"this is not a checkpoint at all " * 8)
    with pytest.raises(CheckpointError, match="is not a torch checkpoint"):
        run_in_process([*synthetic_overrides(synthetic_root), "mode=export", f"ckpt_path={junk}"], tmp_path / "run")


# --- caches that verify themselves --------------------------------------------------------------


def test_a_truncated_index_array_is_rebuilt_not_read(coco_tiny, tmp_path, caplog):
    from cocodet.datasets.index_cache import cached_index

    ann = coco_tiny / "annotations" / "instances_val2017.json"
    expected = np.array(cached_index(coco_tiny / "val2017", ann, True, tmp_path).boxes)  # a copy, not the mapping
    [folder] = [f for f in tmp_path.glob("index-*") if f.is_dir()]
    boxes = folder / "boxes.npy"
    boxes.write_bytes(boxes.read_bytes()[:-64])
    caplog.set_level("WARNING")
    again = cached_index(coco_tiny / "val2017", ann, True, tmp_path)
    assert "boxes.npy has" in caplog.text and "rebuilding" in caplog.text
    assert np.array_equal(np.asarray(again.boxes), expected)


def test_flipped_bytes_in_pixel_offsets_are_rebuilt_not_read(coco_tiny, tmp_path, caplog):
    from cocodet.data.pixel_cache import open_pixel_cache

    index = build_index(coco_tiny / "val2017", coco_tiny / "annotations" / "instances_val2017.json")
    first = open_pixel_cache(index, 64, "disk", tmp_path, "val", 2)
    offsets = first.folder / "offsets.npy"
    raw = bytearray(offsets.read_bytes())
    raw[-5] ^= 0xFF  # same length: only the checksum can tell
    offsets.write_bytes(bytes(raw))
    caplog.set_level("WARNING")
    again = open_pixel_cache(index, 64, "disk", tmp_path, "val", 2)
    assert "offsets.npy does not match its checksum" in caplog.text
    assert np.array_equal(again.offsets, np.load(first.folder / "offsets.npy"))
    assert np.array_equal(again.load(index, 3).image, first.load(index, 3).image)


def _in_read_only_mount(folder: Path, code: str) -> subprocess.CompletedProcess:
    """Run python ``code`` with ``folder`` bind-mounted read-only over itself (a new mount
    namespace; root ignores mode bits, so chmod would prove nothing)."""
    script = f'mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} && exec {sys.executable} -c "$0"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@needs_unshare
def test_a_valid_cache_on_a_read_only_mount_is_used(coco_tiny, tmp_path):
    from cocodet.data.pixel_cache import open_pixel_cache
    from cocodet.datasets.index_cache import cached_index

    ann = coco_tiny / "annotations" / "instances_val2017.json"
    index = cached_index(coco_tiny / "val2017", ann, True, tmp_path)
    open_pixel_cache(index, 64, "disk", tmp_path, "val", 2)
    code = (
        f"import logging; logging.basicConfig(level=logging.INFO)\n"
        "from cocodet.datasets.index_cache import cached_index\n"
        "from cocodet.data.pixel_cache import open_pixel_cache\n"
        f"i = cached_index({str(coco_tiny / 'val2017')!r}, {str(ann)!r}, True, {str(tmp_path)!r})\n"
        f"c = open_pixel_cache(i, 64, 'disk', {str(tmp_path)!r}, 'val', 2)\nprint('OK', len(i), c.count)"
    )
    proc = _in_read_only_mount(tmp_path, code)
    assert proc.returncode == 0 and "OK 80 80" in proc.stdout, proc.stderr[-2000:]
    assert "read the cached index" in proc.stderr


@pytest.mark.slow
@needs_unshare
def test_an_empty_read_only_cache_folder(coco_tiny, tmp_path):
    (tmp_path / "cache").mkdir()
    base = [
        "dataset=coco",
        f"dataset.root={coco_tiny}",
        f"dataset.cache_dir={tmp_path / 'cache'}",
        "dataset.image_size=64",
        "loader.batch_size=4",
        "debug=fast",
        "callbacks=none",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    script = (
        f"mount --bind {tmp_path / 'cache'} {tmp_path / 'cache'} && "
        f"mount -o remount,ro,bind {tmp_path / 'cache'} {tmp_path / 'cache'} && "
        f'{sys.executable} {REPO / "train.py"} "$@" mode=plan; echo PLAN_RC=$?; '
        f'{sys.executable} {REPO / "train.py"} "$@" mode=train dataset.cache=disk; echo CACHE_RC=$?'
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *base],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert "PLAN_RC=0" in out and "without a cache" in out and "dataset.cache_dir=" in out, out[-3000:]
    assert "CACHE_RC=2" in out and "cannot be written and holds no valid" in out, out[-3000:]
    assert list((tmp_path / "cache").iterdir()) == []


def test_every_checkpoint_the_app_writes_loads_with_weights_only(tmp_path, synthetic_root):
    """last.ckpt, best-*.ckpt, and resume.ckpt (written every checkpoint.every_n_steps, and on
    SIGTERM by the same callback): plain types only, so the safe default reads them all."""
    import torch

    s = run_in_process(
        [
            *synthetic_overrides(synthetic_root),
            "dataset.image_size=64",
            "loader.batch_size=16",
            NARROW_MODEL,
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            "trainer.max_epochs=2",
            "checkpoint.every_n_steps=1",
            "logger=none",
        ],
        tmp_path / "run",
    )
    files = sorted((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    names = [f.name for f in files]
    assert "last.ckpt" in names and "resume.ckpt" in names and any(n.startswith("best-") for n in names), names
    for f in files:
        checkpoint = torch.load(f, map_location="cpu", weights_only=True)
        assert checkpoint["state_dict"] and checkpoint["global_step"] >= 1, f.name
    assert s["steps"] == 4
