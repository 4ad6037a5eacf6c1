#!/usr/bin/env bash
# Print the Debian mirror this host's apt uses, for debootstrap: COCODET_DEBIAN_MIRROR when set,
# else the first non-security URI of the deb822 files (sources.list.d/*.sources, "URIs:"
# lines), else of the one-line-style lists (sources.list, sources.list.d/*.list, "deb" lines),
# never a commented line; else http://deb.debian.org/debian.
#
#   scripts/debian_mirror.sh [APT_DIR]     (default /etc/apt)
set -euo pipefail
apt_dir=${1:-/etc/apt}
if [ -n "${COCODET_DEBIAN_MIRROR:-}" ]; then
    echo "$COCODET_DEBIAN_MIRROR"
    exit 0
fi
shopt -s nullglob
deb822=("$apt_dir"/sources.list.d/*.sources)
one_line=()
[ -f "$apt_dir/sources.list" ] && one_line+=("$apt_dir/sources.list")
one_line+=("$apt_dir"/sources.list.d/*.list)
candidates() {
    # deb822: "URIs: a b" (a field may list several); comments start with '#' after any blanks.
    if [ "${#deb822[@]}" -gt 0 ]; then
        awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "${deb822[@]}"
    fi
    # one-line style: deb [options] URI suite components; deb-src lines are not for debootstrap.
    if [ "${#one_line[@]}" -gt 0 ]; then
        awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } if (i <= NF) print $i }' \
            "${one_line[@]}"
    fi
}
mirror=$(candidates | grep -E '^(https?|file)://' | grep -v -- '-security' | grep -v '/security' | head -n 1 || true)
echo "${mirror:-http://deb.debian.org/debian}"
