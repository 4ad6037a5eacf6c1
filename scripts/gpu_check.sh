#!/usr/bin/env bash
# The one prepared check for a CUDA host: everything in cocodet that only runs on a GPU, each
# part under its own timeout, one table at the end, exit status 1 if any part failed.
#
#   PYTHON=python3 GPU_WHEELS=/path/to/wheels scripts/gpu_check.sh [overrides]
#
# Parts (synthetic data): the plan (pinned memory); the loader-fed vs pre-loaded ratio; a short
# bf16 training (2 epochs, is_pinned() asserted on the first batch); fp16 training with a real
# overflow injected at step 2 (the GradScaler must skip it and back off, and weights and
# buffers must be unchanged and finite across it: tests/signal_at_step.py); mode=eval and
# mode=predict on CUDA; the exported TorchScript model on CUDA; the ONNX model on CUDA where a
# GPU build of onnxruntime is present ("not run" otherwise, not a failure); one epoch of the
# cheapest published recipe (experiment=tv_ssdlite320_mobilenet_v3_large, bf16); DDP over NCCL.
#
# On an image that is not ours (Python 3.12, its own torch >= 2.11, no Hydra, no pycocotools,
# no network), GPU_WHEELS names the folder scripts/gpu_wheels.sh filled: it is installed into
# a private target directory (pip --no-index --target) and cocodet runs from src/.
# On a host without CUDA it still installs the wheels and composes every mode, then exits 0
# with its no-CUDA message.
# GPU_CHECK_REHEARSE=cpu runs the same parts on the CPU (no pinning, fp32, fp16 with the CPU's
# GradScaler, gloo, CPU providers):
# the script's own plumbing proven on a machine without a GPU (GPU_CHECK_TIME_SCALE=4 stretches
# the per-part timeouts, which are sized for a GPU).
# shellcheck disable=SC2329  # the check_* functions run in child shells (export -f)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
python=${PYTHON:-.venv/bin/python}
[[ -x $python ]] || command -v "$python" >/dev/null || python=python3
out=${GPU_CHECK_DIR:-outputs/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rows=()
failed=0

part() {  # part NAME SECONDS COMMAND...: run one part under its timeout, log to $out/NAME.log, record a row
    local name=$1 limit=$(( $2 * ${GPU_CHECK_TIME_SCALE:-1} )) t0 rc note
    shift 2
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    note=$(tail -n 1 "$out/$name.log" | cut -c1-110)
    if [ $rc -eq 0 ]; then
        rows+=("$(printf '%-22s %-8s %5ss  %s' "$name" ok "$(( $(date +%s) - t0 ))" "$note")")
    else
        [ $rc -eq 124 ] && note="timed out after ${limit}s"
        rows+=("$(printf '%-22s %-8s %5ss  %s' "$name" "FAILED" "$(( $(date +%s) - t0 ))" "rc=$rc $note (see $out/$name.log)")")
        failed=1
    fi
    return $rc
}
not_run() { rows+=("$(printf '%-22s %-8s %5s   %s' "$1" "not run" "-" "$2")"); }
table() {
    printf '\n%-22s %-8s %6s  %s\n' part result time "figure / reason"
    printf '%s\n' "${rows[@]}"
}
py() { "$python" "$@"; }
train() {  # train NAME OVERRIDES...: train.py with its summary kept in $out/NAME/stdout
    local name=$1
    shift
    mkdir -p "$out/$name"
    py train.py "$@" "hydra.run.dir=$out/$name" | tee "$out/$name/stdout"
}
field() { py -c "import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(eval(sys.argv[2], {'s': s}))" "$out/$1/stdout" "$2"; }

# --- the interpreter, the wheels, the versions ---------------------------------------------------
if [ -n "${GPU_WHEELS:-}" ]; then
    part wheels 180 "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$out/site" "$GPU_WHEELS"/*.whl
    export PYTHONPATH="$out/site:$REPO/src:$REPO/tests${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$REPO/src:$REPO/tests${PYTHONPATH:+:$PYTHONPATH}"
fi  # tests/: the fp16 part's overflow injector and state probe (tests/signal_at_step.py)
py - <<'PY' | tee "$out/versions.txt"
import importlib, platform
from importlib.metadata import PackageNotFoundError, version
print(f"python {platform.python_version()} ({platform.machine()})")
for name in ("torch", "torchvision", "lightning", "hydra-core", "omegaconf", "pycocotools", "faster-coco-eval",
             "albumentations", "opencv-python-headless", "numpy", "onnxruntime", "onnxruntime-gpu", "onnx"):
    try:
        print(f"{name} {version(name)}")
    except PackageNotFoundError:
        print(f"{name} -")
try:
    import torch
    print(f"cuda {torch.version.cuda}, available: {torch.cuda.is_available()}" + (
        f", {torch.cuda.get_device_name(0)}, bf16: {torch.cuda.is_bf16_supported()}" if torch.cuda.is_available() else ""))
except ImportError as e:
    print(f"torch not importable: {e}")
PY

# Every mode composes with the GPU trainer (Hydra, omegaconf and the configs, no torch needed).
part compose 120 "$python" - <<'PY'
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from cocodet.run_spec.validate import validate
from cocodet.schema import MODES
with initialize_config_dir(config_dir=__import__("os").path.abspath("conf"), version_base="1.3"):
    for mode in MODES:
        for trainer in ("gpu", "ddp"):
            cfg = compose(config_name="config", overrides=[f"mode={mode}", f"trainer={trainer}", "output_dir=x"])
            validate(cfg, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
print(f"{len(MODES)} modes x trainer=gpu,ddp compose and validate")
PY

rehearse=${GPU_CHECK_REHEARSE:-}
if [ -z "$rehearse" ] && ! py -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    table
    echo "gpu_check: no CUDA device visible to torch on this host; the CUDA parts were not run (exit $failed)"
    exit $failed
fi

# --- the CUDA parts --------------------------------------------------------------------------------
# Each part is a function run under `timeout` in a child bash (exported with its helpers).
# shellcheck disable=SC2089,SC2090  # $pinned is a Python expression: its quotes are meant
if [ "$rehearse" = cpu ]; then  # the same parts with what a CPU has in place of each CUDA piece
    dev=cpu trainer=cpu pinned='s["first_batch_pinned"] is None' precision=32-true ddp=ddp_cpu backend=gloo fp16=16-mixed
else
    dev=cuda trainer=gpu pinned='s["first_batch_pinned"] is True' precision=bf16-mixed ddp=ddp backend=nccl fp16=16-mixed
fi
common=("trainer=$trainer" "$@")
recipe_limit=()
fp16_small=()  # fp16 on a CPU has no fast kernels: the rehearsal's fp16 part runs the 64 px, 64-channel model
[ "$rehearse" = cpu ] && recipe_limit=(trainer.limit_train_batches=3 trainer.limit_val_batches=1) &&
    fp16_small=(dataset.image_size=64 model.detector.fpn_channels=64 trainer.limit_val_batches=1)
tiny=(dataset.image_size=256 loader.batch_size=8 trainer.limit_train_batches=5 trainer.limit_val_batches=2)
bench=(loader.batch_size=16 bench.consumer=model "bench.batches=${GPU_CHECK_BATCHES:-30}" bench.warmup=5)
ckpt=$out/train/checkpoints/last.ckpt
mapfile -t images < <(find data/synthetic/val -name '*.jpg' 2>/dev/null | sort | head -4)
check() { [ "$(field "$1" "$2")" = True ] || { echo "check failed on $1: $2"; return 1; }; }
check_plan() {
    train plan mode=plan "${common[@]}" >/dev/null && check plan "s['pin_memory'] is ('$dev' == 'cuda')" &&
        field plan '(s["num_workers"], "workers, pin_memory", s["pin_memory"])'
}
check_ratio() {
    train loader mode=bench "${common[@]}" "${bench[@]}" >/dev/null &&
        train preloaded mode=bench bench.preload=true "${common[@]}" "${bench[@]}" >/dev/null &&
        py -c 'import json, sys
f, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:])
ratio, fed, bound, h2d = f["examples_per_s"] / b["examples_per_s"], f["examples_per_s"], b["examples_per_s"], f["h2d_mean_ms"]
print(f"{ratio:.2f} ({fed} vs {bound} ex/s; h2d {h2d} ms)")' \
            "$out/loader/stdout" "$out/preloaded/stdout"
}
check_train() {
    train train "${common[@]}" "${tiny[@]}" trainer.max_epochs=2 "trainer.precision=$precision" >/dev/null &&
        check train "s['status'] == 'completed' and '${precision%%-*}' in s['precision'] and $pinned" &&
        field train '(s["precision"], "steps", s["steps"], "first batch pinned", s["first_batch_pinned"], "h2d ms", s["loader_wait"].get("h2d_mean_ms"))'
}
check_fp16() {  # a real fp16 overflow at step 2: the GradScaler skips it and backs off, and the step leaves no trace (design §12)
    train fp16 "${common[@]}" "${tiny[@]}" "${fp16_small[@]}" trainer.max_epochs=1 "trainer.precision=$fp16" \
        +callbacks.overflow._target_=signal_at_step.OverflowAt +callbacks.overflow.step=2 \
        +callbacks.probe._target_=signal_at_step.StateAcrossSteps "+callbacks.probe.path=$out/fp16/state" \
        "+callbacks.probe.steps=[2]" >/dev/null &&
        check fp16 "s['status'] == 'completed' and s['precision'] == '16-mixed' and s['health']['amp_skipped_steps'] >= 1 and s['health']['skipped_nonfinite_steps'] == 0" &&
        py -c 'import json, sys
row = json.loads(open(sys.argv[1]).read().splitlines()[0])
assert row["step"] == 2 and row["scale_after"] < row["scale_before"], ("the scaler did not skip step 2", row)
assert row["params_changed"] == 0 and row["n_buffers_changed"] == 0 and row["finite"], ("step 2 left a trace", row)
print("overflow at step 2: skipped by the scaler, scale", row["scale_before"], "->", row["scale_after"], end="; ")' \
            "$out/fp16/state.rank0" &&
        field fp16 '("weights and buffers unchanged and finite; scaler skipped", s["health"]["amp_skipped_steps"], "of", s["steps"], "steps")'
}
check_eval() {
    train eval mode=eval "${common[@]}" "${tiny[@]}" "ckpt_path=$ckpt" >/dev/null &&
        field eval '("map50", s["map50"], "backend", s["eval_backend"])'
}
check_predict() {
    train predict mode=predict "${common[@]}" "${tiny[@]}" "ckpt_path=$ckpt" predict.source=data/synthetic/val >/dev/null &&
        field predict '(s["images"], "images,", s["detections"], "detections")'
}
check_export() {  # check_export FORMAT: export, then the standalone script on CUDA
    train "export_$1" mode=export "${common[@]}" "${tiny[@]}" "ckpt_path=$ckpt" "export.format=$1" >/dev/null &&
        py "$(field "export_$1" 's["predict_script"]')" --device "$dev" --model "$(field "export_$1" 's["model_file"]')" \
            "${images[@]}" --out "$out/$1.json" 2> "$out/$1.provider" && cat "$out/$1.provider" &&
        { [ "$1" != onnx ] || [ "$dev" != cuda ] || grep -q "provider: CUDAExecutionProvider" "$out/$1.provider"; } &&
        echo "$1 on $dev: $(py -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$out/$1.json") detections"
}
check_recipe() {  # the cheapest published recipe (docs/reference.md "Published recipes"): one epoch, bf16
    train recipe experiment=tv_ssdlite320_mobilenet_v3_large dataset=synthetic "${common[@]}" trainer.max_epochs=1 \
        "trainer.precision=$precision" "${recipe_limit[@]}" >/dev/null &&
        check recipe "s['status'] == 'completed' and s['global_batch'] == 24" &&
        field recipe '("steps", s["steps"], "global batch", s["global_batch"], "lr", s["effective_lr"], "map50", s["map50"])'
}
check_ddp() {
    train ddp "trainer=$ddp" trainer.devices=1 "${tiny[@]}" trainer.max_epochs=1 > "$out/ddp.out" 2>&1
    grep -q "distributed_backend=$backend" "$out/ddp.out" && check ddp 's["status"] == "completed"' &&
        echo "DDP over $backend: 1 rank, $(field ddp 's["steps"]') steps"
}
# shellcheck disable=SC2090
export python out ckpt dev pinned precision ddp backend fp16
export -f py train field check check_plan check_ratio check_train check_fp16 check_eval check_predict check_export check_recipe check_ddp
run_part() { local name=$1 limit=$2 fn=$3; shift 3; part "$name" "$limit" bash -c "$fn"' "$@"' _ "$@"; }
# Arrays do not cross `bash -c`: each function reads them from its own definition below.
export_arrays="common=($(printf '%q ' "${common[@]}")); tiny=($(printf '%q ' "${tiny[@]}")); bench=($(printf '%q ' "${bench[@]}")); images=($(printf '%q ' "${images[@]}")); recipe_limit=($(printf '%q ' "${recipe_limit[@]}")); fp16_small=($(printf '%q ' "${fp16_small[@]}"))"
run_part plan 90 "$export_arrays; check_plan"
run_part loader_vs_preloaded 240 "$export_arrays; check_ratio"
run_part train_bf16 240 "$export_arrays; check_train"
run_part "train_fp16_$dev" 180 "$export_arrays; check_fp16"
run_part "eval_$dev" 120 "$export_arrays; check_eval"
run_part "predict_$dev" 120 "$export_arrays; check_predict"
run_part "torchscript_$dev" 150 "$export_arrays; check_export torchscript"
if [ "$dev" = cpu ] || py -c 'import sys, onnxruntime as o; sys.exit(0 if "CUDAExecutionProvider" in o.get_available_providers() else 1)' 2>/dev/null; then
    run_part "onnx_$dev" 150 "$export_arrays; check_export onnx"
else
    not_run onnx_cuda "no GPU build of onnxruntime ($(py -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())' 2>&1 | tail -1)); its wheel is too large to carry"
fi
run_part "recipe_ssdlite_$dev" 300 "$export_arrays; check_recipe"
run_part "ddp_$backend" 240 "$export_arrays; check_ddp"

table
echo "gpu_check: $([ $failed -eq 0 ] && echo 'every part passed' || echo 'a part FAILED'); logs and summaries in $out"
exit $failed
