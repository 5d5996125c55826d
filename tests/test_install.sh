#!/bin/sh
# Installs kvferry into a temporary prefix and builds the example against it
# twice, the two usual ways: pkg-config, and CMake's find_package.
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/kvferry.h"
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -n1 | xargs dirname)
# the shared consumers find the install first, and what the caller needs after it
run_path="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
test -f "$libdir/libkvferry.a"
ls "$libdir"/libkvferry.so* >/dev/null
test -f "$libdir/cmake/kvferry/kvferryConfig.cmake"

# pkg-config, with the shared library
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists kvferry
cc -std=c11 "$src/examples/offload_host.c" -o "$tmp/a_pc" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --define-prefix --cflags --libs kvferry)
LD_LIBRARY_PATH="$run_path" "$tmp/a_pc" "$tmp/files1"
cc -std=c11 "$src/examples/cache_prefix.c" -o "$tmp/c_pc" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --define-prefix --cflags --libs kvferry)
LD_LIBRARY_PATH="$run_path" "$tmp/c_pc" "$tmp/files5" | grep -q "request 1: 6 blocks, 4 from the cache"
# pkg-config, static
cc -std=c11 "$src/examples/offload_host.c" -o "$tmp/a_pcs" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --define-prefix --cflags kvferry) \
    "$libdir/libkvferry.a" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --define-prefix --static --libs kvferry |
        sed 's/-lkvferry / /')
"$tmp/a_pcs" "$tmp/files2"

# CMake package config
cmake -S "$src/examples/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$run_path" "$tmp/consumer/offload_host" "$tmp/files3"
"$tmp/consumer/offload_host_static" "$tmp/files4"
echo "install: header, libraries, pkg-config and CMake config all usable"
