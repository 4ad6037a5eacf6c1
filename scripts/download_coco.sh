#!/usr/bin/env bash
# Download COCO 2017 (train/val images + instances annotations) into ROOT, resumably, and
# check it: every archive passes `unzip -t`, then 118,287 train and 5,000 val images and
# both instances files are present. Re-running skips what is complete and resumes partial
# downloads (wget -c).
#
#   scripts/download_coco.sh data/coco
#   python train.py dataset=coco dataset.root=data/coco
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 ROOT   (about 19 GiB of archives, 20 GiB unpacked)" >&2
  exit 2
fi
root=$1
base_url=${COCO_URL:-http://images.cocodataset.org}
mkdir -p "$root/archives"

archives=(
  "zips/train2017.zip"
  "zips/val2017.zip"
  "annotations/annotations_trainval2017.zip"
)

for path in "${archives[@]}"; do
  file="$root/archives/$(basename "$path")"
  if [[ -f "$file.ok" ]]; then
    echo "have $file"
    continue
  fi
  echo "downloading $base_url/$path"
  wget --continue --tries=20 --retry-connrefused --waitretry=10 -O "$file" "$base_url/$path"
  echo "testing $file"
  if ! unzip -tq "$file" >/dev/null; then
    echo "error: $file is corrupt (unzip -t failed); delete it and run again" >&2
    exit 1
  fi
  touch "$file.ok"
done

for path in "${archives[@]}"; do
  file="$root/archives/$(basename "$path")"
  echo "unpacking $file"
  unzip -qn "$file" -d "$root"
done

count() { find "$1" -maxdepth 1 -name '*.jpg' | wc -l; }
train=$(count "$root/train2017")
val=$(count "$root/val2017")
status=0
if [[ $train -ne 118287 ]]; then echo "error: $root/train2017 holds $train images, expected 118287" >&2; status=1; fi
if [[ $val -ne 5000 ]]; then echo "error: $root/val2017 holds $val images, expected 5000" >&2; status=1; fi
for split in train val; do
  ann="$root/annotations/instances_${split}2017.json"
  if [[ ! -s $ann ]]; then echo "error: $ann missing" >&2; status=1; fi
done
if [[ $status -ne 0 ]]; then
  echo "the download is incomplete; run the same command again to resume" >&2
  exit 1
fi
echo "COCO 2017 ready in $root: $train train and $val val images; run with dataset=coco dataset.root=$root"
