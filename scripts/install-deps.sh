#!/bin/sh
# Installs the Debian packages kvferry's build and tests need, and only the
# missing ones: with everything present it does nothing and needs no root.
set -eu
# liburing-dev: the file tier's io_uring path; libhiredis-dev, redis-server and
# redis-tools: the remote tier and the real servers its tests start;
# libcjson-dev: the kvferry CLI's JSON writers.
need="cmake make gcc pkg-config liburing-dev libhiredis-dev redis-server redis-tools libcjson-dev"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done

# ---- Python binding's tests (python/tests): pytest and numpy from PyPI, only
# when python3 is here and they are missing.
if command -v python3 >/dev/null 2>&1; then
    pymissing=$(python3 -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' pytest numpy)
    if [ -n "$pymissing" ]; then
        echo "install-deps: pip installing $pymissing"
        python3 -m pip install --quiet $pymissing
    fi
fi

[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing"
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root for apt-get" >&2; exit 1; }
    SUDO=sudo
else
    SUDO=
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
