#!/usr/bin/env bash
# Build the cocodet image with the container engine found, then prove the container path
# (README, "GPU hosts and containers"): the plan inside --shm-size=64m --cpus=1, a training run as
# an arbitrary --user, the cache volume, a bench in 64 MB, a stop/resume with an equal
# stream_digest, and the image's size and build times.
#
#   scripts/container_check.sh
#
# Environment (all optional):
#   BASE_IMAGE           the Dockerfile's base (default: python:3.11-slim-bookworm if the engine
#                        has or can pull it, else a Debian bookworm base built with debootstrap)
#   COCODET_BUILD_OPTS   extra build options (e.g. -v mounts of a wheel folder)
#   COCODET_HOST_PIP=0   do not hand the host's pip configuration to the build
#   COCODET_DEBIAN_MIRROR  the mirror debootstrap uses (default: apt's, from scripts/debian_mirror.sh)
#   COCODET_COCO_TINY    the coco_tiny folder (default ../shared/data/coco_tiny)
#   COCODET_SCALE_ROOT   a COCO-2017-sized set from benchmarks/make_scale_coco.py for the cache check
#                        (118,287 train images: the index build shows); default coco_tiny
#   ENGINE_OPTS          global engine options (podman default: --runtime runc --cgroup-manager=cgroupfs)
#   RUN_OPTS             options for every run/build (podman default: --network=host and ulimits)
#   STEPS                the checks to run (default "6 1 2 3 4 5"; without 6, an ordinary cached build)
# Exits 0 with a message where no engine answers.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
COCO_TINY=$(realpath "${COCODET_COCO_TINY:-$REPO/../shared/data/coco_tiny}")
IMAGE=localhost/cocodet:check
WORK=$(mktemp -d /tmp/cocodet-container-check.XXXXXX)
chmod 755 "$WORK"  # the arbitrary uid of the checks below must reach its bind mounts
trap 'rm -rf "$WORK"' EXIT

if command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1; then
    ENGINE=podman
    read -r -a ENGINE_ARGS <<< "${ENGINE_OPTS:---runtime runc --cgroup-manager=cgroupfs}"
    # The default bridge network changes a global sysctl (net.ipv4.ip_forward): host network only.
    read -r -a RUN_ARGS <<< "${RUN_OPTS:---network=host --ulimit nofile=20000:20000 --ulimit nproc=32768:32768}"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
    read -r -a ENGINE_ARGS <<< "${ENGINE_OPTS:-}"
    read -r -a RUN_ARGS <<< "${RUN_OPTS:-}"
else
    echo "container_check: no container engine answers ('podman info' and 'docker info' both failed): nothing to check"
    exit 0
fi
eng() { "$ENGINE" "${ENGINE_ARGS[@]}" "$@"; }
say() { printf '\n== %s\n' "$*"; }
fail() { echo "container_check: FAILED: $*" >&2; exit 1; }
summary_of() { python3 -c 'import json,sys; lines=[l for l in sys.stdin.read().splitlines() if l.strip()]; print(json.dumps(json.loads(lines[-1])))'; }
field() { python3 -c "import json,sys; s=json.load(sys.stdin); print(eval(sys.argv[1], {'s': s}))" "$1"; }
echo "engine: $ENGINE ($("$ENGINE" --version))"

# --- the base image -------------------------------------------------------------------------
if [ -z "${BASE_IMAGE:-}" ]; then
    if eng image exists python:3.11-slim-bookworm 2>/dev/null || eng pull -q python:3.11-slim-bookworm >/dev/null 2>&1; then
        BASE_IMAGE=python:3.11-slim-bookworm
    else
        BASE_IMAGE=localhost/debian-bookworm:base
        if ! eng image exists "$BASE_IMAGE" 2>/dev/null; then
            command -v debootstrap >/dev/null || fail "no registry and no debootstrap: set BASE_IMAGE to a local Debian-based Python image"
            mirror=$("$REPO/scripts/debian_mirror.sh")  # apt's own mirror (deb822 or one-line lists; COCODET_DEBIAN_MIRROR)
            say "no registry: building $BASE_IMAGE from Debian ($mirror)"
            debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
                "$WORK/rootfs" "$mirror" > "$WORK/debootstrap.log" 2>&1 \
                || { tail -n 25 "$WORK/debootstrap.log" >&2; fail "base image: debootstrap from $mirror (set COCODET_DEBIAN_MIRROR to another mirror, or BASE_IMAGE to a local image)"; }
            tar -C "$WORK/rootfs" -c . | eng import - "$BASE_IMAGE" > "$WORK/import.log" 2>&1 \
                || { tail -n 25 "$WORK/import.log" >&2; fail "base image: $ENGINE import of the debootstrap tree"; }
            rm -rf "$WORK/rootfs"
        fi
    fi
fi
echo "base image: $BASE_IMAGE"

# --- build options: the CA bundle and the host's pip configuration ----------------------------
BUILD_ARGS=()
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}  # Debian's system bundle
[ -f "$CA_BUNDLE" ] && BUILD_ARGS+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
if [ "${COCODET_HOST_PIP:-1}" != 0 ] && python3 -m pip --version >/dev/null 2>&1; then
    # The host's pip settings (its index, wheel folders, constraints) as one pip.conf, and every
    # local folder or file they name, mounted read-only at the same path: without them a build
    # downloads about 3 GB of torch and CUDA wheels each time.
    python3 -m pip config list 2>/dev/null | sed -E "s/^:env:\./global./; s/^([a-z]+)\.([^=]+)='(.*)'$/\1 \2 \3/" \
        | awk '$1=="global"{k=$2; $1=$2=""; sub(/^  /,""); print k " = " $0}' | sort -u -k1,1 > "$WORK/pip.conf.body"
    { echo "[global]"; cat "$WORK/pip.conf.body"; } > "$WORK/pip.conf"
    BUILD_ARGS+=(-v "$WORK/pip.conf:/etc/pip.conf:ro")
    while read -r path; do
        target=$path
        # A local index's pages link to files beside its simple/ folder: mount the folder above.
        case $path in */simple|*/simple/) target=$(dirname "$path") ;; esac
        [ -e "$target" ] || target=$(dirname "$path")
        if [ -e "$target" ]; then BUILD_ARGS+=(-v "$target:$target:ro"); fi
    done < <(grep -oE '(file://)?/[^ ]+' "$WORK/pip.conf.body" | sed 's#^file://##' | sort -u)
fi
read -r -a EXTRA_BUILD <<< "${COCODET_BUILD_OPTS:-}"

build() {  # build CONTEXT [extra options]: prints the seconds it took
    local ctx=$1; shift
    local t0; t0=$(date +%s.%N)
    eng build "${RUN_ARGS[@]}" "${BUILD_ARGS[@]}" "${EXTRA_BUILD[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -t "$IMAGE" "$@" "$ctx" > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; fail "image build ($ENGINE build $*)"; }
    python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.0f}')" "$t0"
}
# The build context: the working tree as .dockerignore leaves it, copied, so the rebuild's
# one-line change never touches the checkout.
mkdir -p "$WORK/ctx"
tar -C "$REPO" --exclude=.git --exclude=.venv --exclude=outputs --exclude=multirun --exclude=./data \
    --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -C "$WORK/ctx" -xf -

STEPS=" ${STEPS:-6 1 2 3 4 5} "
step() { [[ "$STEPS" == *" $1 "* ]]; }

if step 6; then
say "6. build (cold: --no-cache)"
cold_s=$(build "$WORK/ctx" --no-cache)
echo "# one-line change in src/" >> "$WORK/ctx/src/cocodet/__init__.py"
rebuild_s=$(build "$WORK/ctx")
cached=$(grep -c "Using cache" "$WORK/build.log" || true)
size_mb=$(eng image inspect --format '{{.Size}}' "$IMAGE" | python3 -c 'import sys; print(round(int(sys.stdin.read())/2**20))')
grep -q "Using cache" "$WORK/build.log" || fail "the rebuild after a change in src/ reused no layer"
echo "image size ${size_mb} MiB; cold build ${cold_s} s; rebuild after a one-line change in src/ ${rebuild_s} s (${cached} layers from cache)"
else
    echo "build (layers from cache where they match): $(build "$WORK/ctx") s"
fi

# Runs as a container would be run: the image's entry point with train.py overrides.
drun() { eng run --rm "${RUN_ARGS[@]}" "$@"; }
DATA=(-v "$COCO_TINY:/data/coco_tiny:ro")

if step 1; then
say "1. plan inside --shm-size=64m --cpus=1 (batch 64, 640 px)"
drun --shm-size=64m --cpus=1 "${DATA[@]}" "$IMAGE" mode=plan dataset=coco dataset.root=/data/coco_tiny \
    loader.batch_size=64 dataset.image_size=640 > "$WORK/plan.out" 2> "$WORK/plan.err" || { cat "$WORK/plan.err"; fail "plan"; }
plan=$(summary_of < "$WORK/plan.out")
grep -h -A12 "loader plan" "$WORK/plan.out" "$WORK/plan.err" | head -14 || true
echo "$plan" | field 's["usable_cpus"] == 1 and s["host"]["cgroup_cpus"] == 1.0' | grep -q True \
    || fail "usable CPUs should be 1 from the quota: $(echo "$plan" | field 's["host"]')"
echo "$plan" | field 's["host"]["shm_total_bytes"] == 64 * 2**20' | grep -q True || fail "shm total is not 64 MiB"
echo "$plan" | field 's["num_workers"] >= 1 and s["part_images"] is not None' | grep -q True || fail "no workers in parts"
echo "plan: $(echo "$plan" | field '(s["num_workers"], "workers, parts of", s["part_images"], "images; usable CPUs", s["usable_cpus"], "from quota", s["host"]["cgroup_cpus"], "; shm total MiB", s["host"]["shm_total_bytes"] / 2**20)')"
fi

TRAIN=(dataset.synthetic.n_train=64 dataset.synthetic.n_val=16 dataset.image_size=128 loader.batch_size=8
       trainer.max_epochs=1)
if step 2; then
say "2. one-epoch training as --user 1234:1234 on bind mounts owned by 1234"
mkdir -p "$WORK/runs" "$WORK/cache"
chown 1234:1234 "$WORK/runs" "$WORK/cache"
drun --user 1234:1234 -v "$WORK/runs:/runs" -v "$WORK/cache:/cache" "$IMAGE" "${TRAIN[@]}" hydra.run.dir=/runs/train \
    > "$WORK/train.out" 2> "$WORK/train.err" || { tail -30 "$WORK/train.err"; fail "training as uid 1234"; }
train=$(summary_of < "$WORK/train.out") || fail "the last stdout line is not the summary"
echo "$train" | field 's["mode"] == "train" and s["status"] == "completed"' | grep -q True || fail "train summary: $train"
echo "summary (last stdout line): $(echo "$train" | field '{k: s[k] for k in ("status", "epochs", "steps", "map50", "last_ckpt")}')"
find "$WORK/runs" "$WORK/cache" -mindepth 1 ! -uid 1234 | head -3 | grep . && fail "files not owned by uid 1234"
echo "written: $(find "$WORK/runs" -type f | wc -l) files in the run dir, $(find "$WORK/cache" -type f | wc -l) in the cache"
setpriv --reuid=1234 --regid=1234 --clear-groups find "$WORK/runs" "$WORK/cache" -mindepth 1 -delete \
    || fail "uid 1234 cannot delete what the run wrote"
[ -z "$(find "$WORK/runs" "$WORK/cache" -mindepth 1 -print -quit)" ] || fail "left behind: $(find "$WORK/runs" "$WORK/cache" -mindepth 1 | head)"
echo "uid 1234 deleted everything the run wrote"
fi

if step 3; then
say "3. the cache volume: two starts with the same COCODET_CACHE_DIR mount"
mkdir -p "$WORK/cache3"
chown 1000:1000 "$WORK/cache3"  # the image's own user (uid 1000) owns the cache volume
if [ -n "${COCODET_SCALE_ROOT:-}" ]; then  # its image folders are coco_tiny's, mounted where the JSON expects them
    scale=$(realpath "$COCODET_SCALE_ROOT")
    SETS=(-v "$scale/annotations:/data/set/annotations:ro" -v "$COCO_TINY/train2017:/data/set/train2017:ro"
          -v "$COCO_TINY/val2017:/data/set/val2017:ro")
else
    SETS=(-v "$COCO_TINY:/data/set:ro")
fi
for start in first second; do
    t0=$(date +%s.%N)
    drun -v "$WORK/cache3:/cache" "${SETS[@]}" "$IMAGE" mode=plan dataset=coco dataset.root=/data/set \
        > "$WORK/$start.out" 2> "$WORK/$start.err" || { tail "$WORK/$start.err"; fail "plan with a cache mount"; }
    echo "$start start: $(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0") s" \
         "($(grep -ohE '(built the|read the cached) index of [^ ]*' "$WORK/$start.out" "$WORK/$start.err" | head -1 || true))"
done
cat "$WORK/second.out" "$WORK/second.err" | grep -q "read the cached index" || fail "the second start did not use the cached index"
fi

if step 4; then
say "4. bench in --shm-size=64m: batch 64, 640 px, coco_tiny read-only"
drun --shm-size=64m "${DATA[@]}" "$IMAGE" mode=bench dataset=coco dataset.root=/data/coco_tiny loader.batch_size=64 \
    dataset.image_size=640 bench.batches=4 bench.warmup=1 bench.decode_probe=0 > "$WORK/bench.out" 2> "$WORK/bench.err" \
    || { tail -30 "$WORK/bench.err"; fail "bench in 64 MB"; }
bench=$(summary_of < "$WORK/bench.out")
echo "$bench" | field 's["num_workers"] >= 1' | grep -q True || fail "the bench ran without workers"
echo "bench: $(echo "$bench" | field '{k: s[k] for k in ("examples_per_s", "num_workers", "part_images", "peak_shm_mb", "batches")}')"
fi

if step 5; then
say "5. preemption: stop in the middle of an epoch, resume with the same command"
RESUME=("${TRAIN[@]}" trainer.max_epochs=2 dataset.synthetic.n_train=128 ckpt_path=last_if_any hydra.run.dir=/runs/pre)
mkdir -p "$WORK/pre"
chown 1234:1234 "$WORK/pre"
eng run -d --name cocodet-check-pre "${RUN_ARGS[@]}" --user 1234:1234 -v "$WORK/pre:/runs" "$IMAGE" "${RESUME[@]}" >/dev/null
trap 'eng rm -f cocodet-check-pre >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
mid_epoch=""
for _ in $(seq 1200); do  # until the second epoch is a few steps in (at most 10 minutes)
    if eng logs cocodet-check-pre 2>&1 | tr '\r' '\n' | grep -qE "Epoch 1: +[0-9]+%.* [3-9]/"; then mid_epoch=1; break; fi
    sleep 0.5
done
[ -n "$mid_epoch" ] || fail "the run never reached the middle of its second epoch"
t0=$(date +%s.%N)
eng stop -t 60 cocodet-check-pre >/dev/null
stop_s=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0")
code=$(eng inspect --format '{{.State.ExitCode}}' cocodet-check-pre)
eng logs cocodet-check-pre 2>/dev/null > "$WORK/pre.out"
eng rm cocodet-check-pre >/dev/null
pre=$(summary_of < "$WORK/pre.out") || fail "no summary after SIGTERM"
echo "$pre" | field 's["status"] == "preempted"' | grep -q True || fail "not preempted: $pre"
[ -f "$WORK/pre/pre/checkpoints/resume.ckpt" ] || fail "no resume.ckpt on the mount"
echo "stopped in ${stop_s} s (grace 60 s), exit code $code: $(echo "$pre" | field '(s["status"], "at step", s["steps"], "position", s["stream_position"])')"
drun --user 1234:1234 -v "$WORK/pre:/runs" "$IMAGE" "${RESUME[@]}" > "$WORK/resumed.out" 2> "$WORK/resumed.err" \
    || { tail -30 "$WORK/resumed.err"; fail "resume"; }
resumed=$(summary_of < "$WORK/resumed.out")
mkdir -p "$WORK/straight"
chown 1234:1234 "$WORK/straight"
drun --user 1234:1234 -v "$WORK/straight:/runs" "$IMAGE" "${RESUME[@]}" > "$WORK/straight.out" 2> "$WORK/straight.err" \
    || { tail -30 "$WORK/straight.err"; fail "uninterrupted run"; }
straight=$(summary_of < "$WORK/straight.out")
a=$(echo "$resumed" | field 's["stream_digest"]')
b=$(echo "$straight" | field 's["stream_digest"]')
echo "resumed: $(echo "$resumed" | field '(s["status"], "steps", s["steps"])') digest ${a:0:16}; uninterrupted: digest ${b:0:16}"
[ "$a" = "$b" ] || fail "stream_digest differs after the resume"
fi

say "container_check: all passed"
echo "steps run:${STEPS}"
