#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Puts LMCache's compiled transfer kernels (lmcache.cuda_ops of the
# lmcache 0.5.6 wheel on PyPI, lmcache.c_ops of 0.5.3, both built for
# CUDA 13 and Python 3.12) into .deps/lmcache/<version>/ (git-ignored) for
# bench/lmcache_compare.py on the GPU machine: each module alone, gzipped
# (8 and 7 MB), so they travel with a device call beside .deps' libraries
# within the call's 64 MiB. scripts/gpu-run.sh unpacks them there. Two
# versions because a module is built against one torch: 0.5.6's needs a
# c10 symbol the GPU image's torch 2.11 lacks, 0.5.3's (August 2026) does
# not; the bench takes the first that loads and says which. Nothing else
# of LMCache is kept: the bench loads only the module, beside the
# machine's own torch.
set -eu
cd "$(dirname "$0")/.."
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
rm -f .deps/lmcache/*.so.gz .deps/lmcache/VERSION # the layout before versions had folders
for version in 0.5.6 0.5.3; do
    [ -n "$(ls .deps/lmcache/$version/*.so.gz 2>/dev/null)" ] && continue
    sh scripts/pip-download.sh "$dl" --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 "lmcache==$version"
    whl=$(ls "$dl"/lmcache-"$version"-*.whl)
    mkdir -p .deps/lmcache/$version
    python3 - "$whl" .deps/lmcache/$version <<'PY'
import gzip, re, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    # the transfer kernels' extension: cuda_ops from 0.5.6 on, c_ops before
    name = next(n for n in z.namelist() if re.fullmatch(r"lmcache/(cuda_ops|c_ops)\.[^/]*\.so", n))
    with z.open(name) as src, gzip.open(f"{out}/{name.split('/')[1]}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
PY
done
du -sh .deps/lmcache/*
