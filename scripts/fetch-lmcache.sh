#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Puts LMCache's compiled transfer kernels (lmcache.cuda_ops, from the
# lmcache 0.5.6 wheel on PyPI, built for CUDA 13 and Python 3.12) into
# .deps/lmcache (git-ignored) for bench/lmcache_compare.py on the GPU
# machine: the module alone, gzipped (8 MB of the wheel's 17.7 MB; 47 MB
# unpacked), so it travels with a device call beside .deps' libraries
# within the call's 64 MiB. scripts/gpu-run.sh unpacks it there. Nothing
# else of LMCache is kept: the bench loads only this module, beside the
# machine's own torch.
set -eu
cd "$(dirname "$0")/.."
version=0.5.6
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
sh scripts/pip-download.sh "$dl" --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 "lmcache==$version"
whl=$(ls "$dl"/lmcache-"$version"-*.whl)
mkdir -p .deps/lmcache
python3 - "$whl" .deps/lmcache <<'PY'
import gzip, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.startswith("lmcache/cuda_ops.") and n.endswith(".so"))
    with z.open(name) as src, gzip.open(f"{out}/{name.split('/')[1]}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
PY
echo "lmcache $version" >.deps/lmcache/VERSION
du -sh .deps/lmcache
