#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Unpacks, into .deps (git-ignored), the Debian libraries and programs the GPU
# machine's image lacks, so they can travel with a device call (carry .deps):
# liburing, hiredis, libxxhash's header, libyaml and cJSON for the build (.deps/root/usr), redis-server with the
# libraries it links (.deps/redis/bin, .deps/redis/lib) for the remote tier's
# tests, and LMCache's transfer kernels (scripts/fetch-lmcache.sh) for
# bench/lmcache_compare.py. scripts/gpu-run.sh uses .deps when it is there.
# Needs no root. About 16 MB in all: a device call carries 64 MiB.
set -eu
cd "$(dirname "$0")/.."
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
(cd "$dl" && apt-get download -q liburing2 liburing-dev libhiredis0.14 libhiredis-dev \
    libxxhash-dev libyaml-0-2 libyaml-dev libcjson1 libcjson-dev redis-server redis-tools libjemalloc2 liblzf1 >/dev/null)
rm -rf .deps
mkdir -p .deps/root .deps/redis/bin .deps/redis/lib
for f in "$dl"/*.deb; do
    case $(basename "$f") in
    redis-* | libjemalloc* | liblzf*) dpkg -x "$f" "$dl/redis-root" ;;
    *) dpkg -x "$f" .deps/root ;;
    esac
done
cp -P "$dl"/redis-root/usr/bin/redis-server "$dl"/redis-root/usr/bin/redis-cli \
    "$dl"/redis-root/usr/bin/redis-check-* .deps/redis/bin/ 2>/dev/null || true
cp -P "$dl"/redis-root/usr/lib/x86_64-linux-gnu/lib* .deps/redis/lib/
# the -dev packages' .so links are absolute-free already; pkg-config files
# name /usr, which PKG_CONFIG_SYSROOT_DIR in gpu-run.sh maps into .deps/root
# LMCache's transfer kernels for bench/lmcache_compare.py (PyPI), into
# .deps/lmcache; without them that bench says so and measures the rest
sh scripts/fetch-lmcache.sh >/dev/null || echo "fetch-gpu-deps: no LMCache module (scripts/fetch-lmcache.sh failed)" >&2
du -sh .deps
