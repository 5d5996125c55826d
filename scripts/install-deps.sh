#!/bin/sh
# Installs the Debian packages kvferry's build and tests need, and only the
# missing ones: with everything present it does nothing and needs no root.
set -eu
need="cmake make gcc pkg-config"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
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
