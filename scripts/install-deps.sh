#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what kvferry's build and tests need, and only what is missing:
# with everything present it does nothing and needs no root.
#
#   sh scripts/install-deps.sh                  the C build's Debian packages
#   sh scripts/install-deps.sh --python VENV    those, and a virtual environment
#                                               VENV with pytest and numpy for
#                                               the Python binding's tests
#   sh scripts/install-deps.sh --list [--python VENV]
#                                               the Debian packages it would
#                                               install, installing nothing
#
# Nothing is ever installed into a python3's own site-packages, by pip or by
# apt: a Debian python3 is externally managed (PEP 668) and its packages are
# the system's, and another one (pyenv, a conda base) is the user's. The
# tests run in VENV, which the build directory owns; it is made with
# --system-site-packages, so pytest and numpy already installed for python3
# are used from there, and pip installs the missing ones into VENV only. For
# Debian's python3 the one package added is python3-venv, without which no
# virtual environment can be made (it adds no module to python3).
set -eu
venv=""
list=0
if [ "${1:-}" = "--list" ]; then
    list=1
    shift
fi
if [ "${1:-}" = "--python" ]; then
    venv=${2:?"install-deps: --python needs a directory"}
fi

# liburing-dev: the file tier's io_uring path; libhiredis-dev, redis-server and
# redis-tools: the remote tier and the real servers its tests start;
# libxxhash-dev: XXH3-128 of the block keys (header only, 0.8+); libyaml-dev: config files;
# libcjson-dev: the kvferry CLI's JSON writers; libssl-dev, openssl and
# python3-venv: the Redis client with TLS where the system's hiredis has none
# (scripts/build-hiredis-tls.sh, below: a throwaway environment's pip only
# downloads its source); libcurl4-openssl-dev and libexpat1-dev: the S3 store
# (SigV4 requests, listings).
need="cmake make gcc pkg-config liburing-dev libhiredis-dev redis-server redis-tools libxxhash-dev libyaml-dev libcjson-dev"
need="$need libssl-dev openssl python3-venv libcurl4-openssl-dev libexpat1-dev"

py=""
if [ -n "$venv" ]; then
    if py=$(command -v python3); then
        # the interpreter itself, not a shim (pyenv) or a symlink
        real=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
        if dpkg-query -S "$real" >/dev/null 2>&1; then
            # the environment itself; pytest and numpy go into it, not here
            need="$need python3-venv"
        fi
    else
        echo "install-deps: no python3 on PATH: the Python binding's tests are skipped"
        venv=""
    fi
fi

# clang-14 and libclang-rt-14-dev (libFuzzer): `make fuzz`; valgrind: `make valgrind`.
need="$need clang-14 libclang-rt-14-dev valgrind"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ "$list" -eq 1 ]; then
    echo "needs:$need"
    echo "missing:$missing"
    exit 0
fi
if [ -n "$missing" ]; then
    echo "install-deps: installing$missing"
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root for apt-get" >&2; exit 1; }
        SUDO=sudo
    else
        SUDO=
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# rediss:// needs hiredis >= 1.0 with hiredis_ssl: the system's where it has
# one, else a pinned build of it in the cache (done once; CMake finds it).
# Failing to make one (offline, say) is no reason to stop: that build
# refuses rediss:// and says why, and `kvferry info` shows it.
if ! pkg-config --atleast-version=1.0 hiredis_ssl 2>/dev/null; then
    sh "$(dirname "$0")/build-hiredis-tls.sh" ||
        echo "install-deps: WARNING: no hiredis with TLS built; this build will refuse rediss:// (run sh scripts/build-hiredis-tls.sh when PyPI is reachable)" >&2
fi
[ -n "$venv" ] || exit 0

# ---- the Python tests' environment. A VENV made from another interpreter
# (PATH changed since) is made again: its system site-packages would be the
# wrong ones.
base=$(python3 -c 'import sys; print(sys.base_prefix)')
if [ -x "$venv/bin/python3" ] &&
   [ "$("$venv/bin/python3" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" = "$base" ]; then
    :
else
    rm -rf "$venv"
    echo "install-deps: making $venv from $py"
    python3 -m venv --system-site-packages "$venv"
fi
pymissing=$("$venv/bin/python3" -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' pytest numpy)
[ -z "$pymissing" ] && exit 0
echo "install-deps: pip installing $pymissing into $venv (not into $py)"
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check $pymissing
