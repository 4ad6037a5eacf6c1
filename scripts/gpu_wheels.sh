#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels scripts/gpu_check.sh needs on a CUDA host whose
# image is not ours: Python 3.12, manylinux x86_64, its own torch, torchvision, Lightning,
# OpenCV, NumPy, SciPy, Matplotlib, TensorBoard and psutil, no network. Only what such an image
# lacks is fetched, each package once (--no-deps, the list below is the closure), at the pins
# of requirements.txt; sdist-only packages (antlr4-python3-runtime) are built into wheels.
#
#   scripts/gpu_wheels.sh DIR            # then, on the host: PYTHON=python3 scripts/gpu_check.sh
#
# PYTHON_VERSION (default 3.12) picks the target interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu_wheels.sh DIR}
py=${PYTHON_VERSION:-3.12}
mkdir -p "$dir"

pin() { grep -E "^$1==" requirements.txt | head -1; }
# The closure of what the check imports beyond such an image: Hydra (+ omegaconf, antlr4),
# pycocotools, faster-coco-eval, albumentations (+ albucore and its kernels, pydantic and its
# core, their typing helpers). Versions the requirements do not pin are the ones pip resolves
# for albumentations==2.0.8 today.
binary=("$(pin hydra-core)" "$(pin omegaconf)" "$(pin pycocotools)" "$(pin faster-coco-eval)" "$(pin albumentations)"
        albucore==0.0.24 stringzilla==5.3.2 simsimd==6.5.16 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5)
platforms=()
for n in 17 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform any)

python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    "${platforms[@]}" -d "$dir" "${binary[@]}"
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 requires) is published as source only.
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$dir" antlr4-python3-runtime==4.9.3

echo "gpu_wheels: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sm "$dir" | cut -f1) MiB in $dir"
