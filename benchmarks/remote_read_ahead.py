"""The read-ahead against local disk, side by side in one run (issue 43; docs/benchmarks.md,
"Data in a bucket"): coco_tiny's train images under 2,000 distinct keys in a SeaweedFS bucket,
behind a proxy that adds 20 ms to every request (a real bucket's first byte), and the same
2,000 files on local disk; ``mode=bench``, 2 workers, mosaic at 640 px with the default
partners (``--partners`` adds overrides, e.g. ``augment.partner_pool=8``), two whole epochs each.

    python benchmarks/remote_read_ahead.py --out /tmp/read_ahead          # about 6 minutes on 2 CPUs

Prints one table: examples/s of each epoch, its ratio to the local root's, GETs per sample,
bytes fetched per epoch, misses, and the CPU seconds the store and the proxy took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test helpers that start a store and fill it

from moto_store import DUMMY_KEYS, free_port, s3_client  # noqa: E402
from seaweed_store import SeaweedStore  # noqa: E402

BUCKET = "coco-ahead"
PARTNERS: list[str] = []  # the default recipe's partners unless --partners says otherwise


def build_dataset(src: Path, out: Path, objects: int) -> None:
    """``out``: coco_tiny's train images repeated under ``objects`` distinct names (copies:
    cocodet refuses a symlink that leaves the image root),
    an annotation file listing them, and coco_tiny's val split as it is."""
    data = json.loads((src / "annotations" / "instances_train2017.json").read_text())
    images, anns, by_image = [], [], {}
    for a in data["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    (out / "train2017").mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(exist_ok=True)
    for n in range(objects):
        img = data["images"][n % len(data["images"])]
        name = f"r{n // len(data['images']):03d}_{img['file_name']}"
        link = out / "train2017" / name
        if not link.exists():
            shutil.copyfile(src / "train2017" / img["file_name"], link)
        images.append({**img, "id": n + 1, "file_name": name})
        for a in by_image.get(img["id"], []):
            anns.append({**a, "id": len(anns) + 1, "image_id": n + 1})
    (out / "annotations" / "instances_train2017.json").write_text(
        json.dumps({**data, "images": images, "annotations": anns})
    )
    (out / "annotations" / "instances_val2017.json").write_text(
        (src / "annotations" / "instances_val2017.json").read_text()
    )
    if not (out / "val2017").exists():
        shutil.copytree(src / "val2017", out / "val2017")


def upload(endpoint: str, root: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    client = s3_client(endpoint)
    client.create_bucket(Bucket=BUCKET)
    files = [p for p in root.rglob("*") if p.is_file()]
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda p: client.put_object(Bucket=BUCKET, Key=p.relative_to(root).as_posix(), Body=p.read_bytes()),
                files,
            )
        )


def start_proxy(upstream: str, delay_s: float) -> tuple[str, threading.Thread]:
    """A reverse proxy on a free port that waits ``delay_s`` before forwarding each request."""
    import aiohttp
    from aiohttp import web

    port = free_port()
    ready = threading.Event()

    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        async with request.app["session"].request(
            request.method, upstream + request.path_qs, headers=headers, data=body, allow_redirects=False
        ) as r:
            payload = await r.read()
            drop = ("transfer-encoding", "content-encoding", "connection") + (
                () if request.method == "HEAD" else ("content-length",)
            )
            out = {k: v for k, v in r.headers.items() if k.lower() not in drop}
            return web.Response(status=r.status, body=None if request.method == "HEAD" else payload, headers=out)

    def serve():
        async def main():
            app = web.Application(client_max_size=1 << 30)
            app["session"] = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=256))
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(30)
    return f"http://127.0.0.1:{port}", thread


def bench(root: str, run_dir: Path, cache: Path, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "mode=bench",
        "dataset=coco",
        f"dataset.root={root}",
        "dataset.image_size=640",
        "augment=mosaic",
        *PARTNERS,
        "loader=explicit",
        "loader.num_workers=2",
        "loader.batch_size=8",
        "bench.batches=null",
        "bench.epochs=2",
        "bench.warmup=0",
        "bench.decode_probe=0",
        f"dataset.cache_dir={cache}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **DUMMY_KEYS}, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"bench failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO.parent / "shared" / "data" / "coco_tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--partners", nargs="*", default=[], help="overrides, e.g. augment.partner_pool=8")
    args = parser.parse_args()
    PARTNERS[:] = args.partners
    local = args.out / "dataset"
    build_dataset(args.src, local, args.objects)
    store = SeaweedStore(args.out / "seaweed")
    store.start()
    try:
        upload(store.endpoint, local)
        proxy, _ = start_proxy(store.endpoint, args.delay_ms / 1000)
        remote = [f"dataset.storage_options.endpoint_url={proxy}"]
        rows = {}
        weed = psutil.Process(store.proc.pid)
        me = psutil.Process()
        rows["local disk"] = bench(str(local), args.out / "local", args.out / "cache_local", [])
        for name, extra in {
            "bucket, read-ahead": remote,
            "bucket, no read-ahead": [*remote, "dataset.remote.cache_bytes=0", "bench.epochs=1"],
        }.items():
            cpu0 = (weed.cpu_times(), me.cpu_times())
            rows[name] = bench(
                f"s3://{BUCKET}",
                args.out / name.replace(", ", "_").replace(" ", "_"),
                args.out / f"cache_{len(rows)}",
                extra,
            )
            cpu1 = (weed.cpu_times(), me.cpu_times())
            rows[name]["store_cpu_s"] = round(sum(cpu1[0][:2]) - sum(cpu0[0][:2]), 1)
            rows[name]["proxy_cpu_s"] = round(sum(cpu1[1][:2]) - sum(cpu0[1][:2]), 1)
    finally:
        store.stop()
    report(rows, args.objects, args.delay_ms)


def report(rows: dict, objects: int, delay_ms: float) -> None:
    base = [e["examples_per_s"] for e in rows["local disk"]["epochs"]]
    print(
        f"\n{objects} objects, {delay_ms:g} ms added per request, 2 workers, mosaic 640 px, batch 8, "
        f"partners: {' '.join(PARTNERS) or 'the default'}\n"
    )
    print(
        "| source | epoch | examples/s | vs local | GETs/sample | MB fetched | misses | retries | store CPU s "
        "| proxy CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, s in rows.items():
        remote = s.get("remote") or {}
        for e in s["epochs"]:
            ratio = e["examples_per_s"] / base[e["epoch"]] if e["epoch"] < len(base) else None
            print(
                f"| {name} | {e['epoch']} | {e['examples_per_s']:.1f} | {ratio:.2f}x | "
                f"{remote.get('gets_per_sample', '-')} | {remote.get('bytes_fetched', 0) / 1e6:.0f} | "
                f"{remote.get('misses', '-')} | {remote.get('retries', '-')} | {s.get('store_cpu_s', '-')} | "
                f"{s.get('proxy_cpu_s', '-')} |"
            )
    print("\nGETs, bytes, misses and retries are per run (both epochs); JSON summaries under --out.")


if __name__ == "__main__":
    main()
