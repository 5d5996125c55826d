#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds the Redis client with TLS (hiredis >= 1.0 and hiredis_ssl) for
# kvferry's rediss:// URLs, where the system has none: Debian 12 ships
# hiredis 0.14.1, which has no TLS; later releases ship 1.x with it, and
# then this script does nothing.
#
#   sh scripts/build-hiredis-tls.sh [--print-prefix]
#
# The source is the C client that PyPI's `hiredis` package carries in its
# source distribution (vendor/hiredis), pinned by version and SHA-256. It
# is built once, as static libraries compiled position-independent with
# hidden symbols (they end up inside libkvferry, which exports none of
# them), into a prefix under the cache directory:
#
#   ${KVF_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvferry}/hiredis-<version>-tls
#
# with include/hiredis, lib/objects/*.o (what CMake builds into libkvferry,
# shared and static, so that neither needs a hiredis of the machine it is
# used on), lib/libhiredis{,_ssl}.a and lib/pkgconfig/hiredis{,_ssl}.pc (the
# same, for the tests' own client), and share/doc/hiredis/COPYING (hiredis'
# BSD license, which CMake installs beside libkvferry). CMake looks there
# when pkg-config finds no hiredis_ssl >= 1.0 (CMakeLists.txt). A second
# run finds the prefix complete and does nothing; --print-prefix prints it
# and exits. Needs a C compiler, OpenSSL's headers (libssl-dev) and pip, run to
# download only (nothing is installed into any python).
set -eu

HIREDIS_PY_VERSION=3.1.0  # PyPI hiredis; it carries the C client 1.2.0
HIREDIS_C_VERSION=1.2.0
HIREDIS_SHA256=51d40ac3611091020d7dea6b05ed62cb152bff595fa4f931e7b6479d777acf7c

cache=${KVF_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvferry}
prefix=$cache/hiredis-$HIREDIS_C_VERSION-tls
if [ "${1:-}" = "--print-prefix" ]; then
    echo "$prefix"
    exit 0
fi
if [ -f "$prefix/lib/objects/ssl.o" ] && [ -f "$prefix/lib/pkgconfig/hiredis_ssl.pc" ]; then
    exit 0
fi

sdist=hiredis-$HIREDIS_PY_VERSION.tar.gz
mkdir -p "$cache"
if [ ! -f "$cache/$sdist" ]; then
    echo "build-hiredis-tls: downloading hiredis $HIREDIS_PY_VERSION's source from PyPI"
    dl=$(mktemp -d)
    trap 'rm -rf "$dl"' EXIT
    # pip only downloads, into no python3 (scripts/pip-download.sh)
    sh "$(dirname "$0")/pip-download.sh" "$dl" --no-binary :all: --no-deps "hiredis==$HIREDIS_PY_VERSION"
    mv "$dl/$sdist" "$cache/$sdist.part"
    rm -rf "$dl"
    trap - EXIT
    mv "$cache/$sdist.part" "$cache/$sdist"
fi
echo "$HIREDIS_SHA256  $cache/$sdist" | sha256sum -c --quiet - ||
    { echo "build-hiredis-tls: $cache/$sdist: SHA-256 is not the pinned one" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$cache/$sdist" -C "$work"
src=$work/hiredis-$HIREDIS_PY_VERSION/vendor/hiredis
grep -q "HIREDIS_MINOR 2" "$src/hiredis.h" ||
    { echo "build-hiredis-tls: $sdist does not carry hiredis $HIREDIS_C_VERSION" >&2; exit 1; }
echo "build-hiredis-tls: building hiredis $HIREDIS_C_VERSION with TLS into $prefix"
cc=${CC:-cc}
flags="-O2 -fPIC -fvisibility=hidden -std=c99 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64"
stage=$work/prefix
mkdir -p "$stage/include/hiredis" "$stage/lib/pkgconfig" "$stage/lib/objects" "$stage/share/doc/hiredis"
for f in alloc async hiredis net read sds sockcompat ssl; do
    $cc $flags -c "$src/$f.c" -o "$work/$f.o"
done
(cd "$work" && ar rcs "$stage/lib/libhiredis.a" alloc.o async.o hiredis.o net.o read.o sds.o sockcompat.o)
(cd "$work" && ar rcs "$stage/lib/libhiredis_ssl.a" ssl.o)
cp "$work"/*.o "$stage/lib/objects/"
cp "$src"/*.h "$stage/include/hiredis/"
cp "$src/COPYING" "$stage/share/doc/hiredis/COPYING"
cat >"$stage/lib/pkgconfig/hiredis.pc" <<EOF
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: hiredis
Description: Minimalistic C client library for Redis (static, built by kvferry's scripts/build-hiredis-tls.sh)
Version: $HIREDIS_C_VERSION
Libs: -L\${libdir} -lhiredis
Cflags: -I\${includedir} -I\${includedir}/hiredis -D_FILE_OFFSET_BITS=64
EOF
cat >"$stage/lib/pkgconfig/hiredis_ssl.pc" <<EOF
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: hiredis_ssl
Description: TLS for hiredis (static, built by kvferry's scripts/build-hiredis-tls.sh)
Version: $HIREDIS_C_VERSION
Requires: hiredis openssl
Libs: -L\${libdir} -lhiredis_ssl
Cflags: -I\${includedir}
EOF
# the prefix appears whole or not at all: a run cut short leaves no half
rm -rf "$prefix.part" "$prefix"
cp -r "$stage" "$prefix.part"
mv "$prefix.part" "$prefix"
echo "build-hiredis-tls: done ($prefix)"
