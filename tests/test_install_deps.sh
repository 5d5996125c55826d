#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# scripts/install-deps.sh under Debian's PATH (its python3) installs nothing
# into that python3: no python3-pytest, python3-numpy or other python3-*
# package but python3-venv (which adds no module); pytest and numpy go into
# the virtual environment only. Asked with --list, which installs nothing.
#   test_install_deps.sh SOURCE_DIR
set -eu
src=$(cd "$1" && pwd)
command -v dpkg-query >/dev/null 2>&1 || { echo "test_install_deps: not a Debian system"; exit 77; }
[ -x /usr/bin/python3 ] || { echo "test_install_deps: no /usr/bin/python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PATH=/usr/sbin:/usr/bin:/sbin:/bin sh "$src/scripts/install-deps.sh" --list --python "$tmp/venv" >"$tmp/out"
needs=$(sed -n 's/^needs://p' "$tmp/out")
[ -n "$needs" ] || { cat "$tmp/out" >&2; echo "test_install_deps: no needs: line" >&2; exit 1; }
for p in $needs; do
    case $p in
    python3-venv) ;;
    python3*) echo "test_install_deps: it would apt-install $p into Debian's python3" >&2; exit 1 ;;
    esac
done
[ ! -e "$tmp/venv" ] || { echo "test_install_deps: --list made the environment" >&2; exit 1; }
echo "install-deps: nothing for Debian's python3 itself (needs:$needs)"
