#!/usr/bin/env bash
# One prepared check for a CUDA host: the loader plan, then a short training-step run (batch 16,
# bf16 where the GPU has it) with the loader timing (wait fraction, examples/s, step time,
# host-to-device ms), then the same steps on batches pre-loaded on the GPU (the upper bound
# the loader is measured against), and the ratio of the two. Exits 0 with a message on a
# host without CUDA.
#
#   scripts/gpu_check.sh                       # synthetic data
#   scripts/gpu_check.sh dataset=coco dataset.root=/data/coco dataset.image_size=640
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[[ -x $python ]] || python=python3

if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible to torch on this host; nothing to check (exit 0)"
  exit 0
fi

out=${GPU_CHECK_DIR:-outputs/gpu_check/$(date +%Y%m%d-%H%M%S)}
common=(trainer=gpu loader.batch_size=16 bench.consumer=model "bench.batches=${GPU_CHECK_BATCHES:-60}" bench.warmup=10 "$@")

"$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16: {torch.cuda.is_bf16_supported()}")'
"$python" train.py mode=plan "${common[@]}" "hydra.run.dir=$out/plan" | tail -n 1 >/dev/null
"$python" train.py mode=bench "${common[@]}" "hydra.run.dir=$out/loader" | tail -n 1 >"$out/loader.json"
"$python" train.py mode=bench bench.preload=true "${common[@]}" "hydra.run.dir=$out/preloaded" | tail -n 1 >"$out/preloaded.json"

"$python" - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
fed, bound = (json.loads((out / f"{name}.json").read_text()) for name in ("loader", "preloaded"))
print(f"{'':28}{'through the loader':>20}{'pre-loaded on GPU':>20}")
for key in ("examples_per_s", "wait_fraction", "wait_p50_ms", "step_mean_ms", "work_mean_ms", "h2d_mean_ms", "precision"):
    print(f"{key:28}{str(fed.get(key)):>20}{str(bound.get(key)):>20}")
ratio = fed["examples_per_s"] / bound["examples_per_s"]
print(f"loader-fed / upper bound: {ratio:.2f} ({fed['num_workers']} workers, batch {fed['batch_size']}); summaries in {out}")
PY
