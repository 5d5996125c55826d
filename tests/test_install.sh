#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs kvferry the README's two ways (make install PREFIX=..., cmake
# --install --prefix ...) into prefixes other than the configured one, then
# builds the examples against each install with the README's commands:
# pkg-config (shared and static) and CMake's find_package; README.md's first
# example, cut from README.md, built with the README's own pkg-config line
# and run with nothing telling the loader where libkvferry.so.0 is; the CLI
# finds its plot script in the prefix.
#   test_install.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: $*" >&2; exit 1; }

# the README's commands, at prefixes the build was not configured for
make -s -C "$src" install BUILD="$build" PREFIX="$tmp/made" >/dev/null
cmake --install "$build" --prefix "$tmp/inst" >/dev/null

# what the exported targets link to: names found on the consumer's machine
# (kvferry::hiredis, CUDA::cudart_static, ...), never a path of this one
if grep -n 'INTERFACE_LINK_LIBRARIES.*"[^"]*/' "$tmp"/inst/lib/cmake/kvferry/*Targets.cmake; then
    fail "an exported target names a library by its path"
fi

# README.md's first C block and its pkg-config line, as a user pastes them
awk '/^```c$/ { n++; if (n == 1) { on = 1; next } } /^```/ { on = 0 } on' "$src/README.md" >"$tmp/app.c"
cc_line=$(grep -m1 '^cc app.c ' "$src/README.md") || fail "README.md: no 'cc app.c' line"
grep -q '^int main' "$tmp/app.c" || fail "README.md's first C block is not a whole program"

for prefix in "$tmp/made" "$tmp/inst"; do
    test -f "$prefix/include/kvferry.h" || fail "$prefix: no kvferry.h"
    test -f "$prefix/lib/libkvferry.a" || fail "$prefix: no libkvferry.a"
    ls "$prefix"/lib/libkvferry.so* >/dev/null
    test -f "$prefix/lib/cmake/kvferry/kvferryConfig.cmake" || fail "$prefix: no kvferryConfig.cmake"
    out=$tmp/out-$(basename "$prefix")
    mkdir "$out"
    run_path="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

    # pkg-config, as the README has it (no --define-prefix: the .pc file
    # itself must name where it was installed)
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
    pkg-config --variable=includedir kvferry | grep -q "^$prefix/lib/pkgconfig/" ||
        fail "$prefix: kvferry.pc has includedir $(pkg-config --variable=includedir kvferry)"
    cc -std=c11 "$src/examples/offload_host.c" -o "$out/a_pc" $(pkg-config --cflags --libs kvferry)
    LD_LIBRARY_PATH="$run_path" "$out/a_pc" "$out/files1" >/dev/null
    cc -std=c11 "$src/examples/cache_prefix.c" -o "$out/c_pc" $(pkg-config --cflags --libs kvferry)
    LD_LIBRARY_PATH="$run_path" "$out/c_pc" "$out/files5" |
        grep -q "request 1: 6 blocks, 4 from the cache" || fail "$prefix: cache_prefix"
    # pkg-config, the static library
    cc -std=c11 "$src/examples/offload_host.c" -o "$out/a_pcs" $(pkg-config --cflags kvferry) \
        "$prefix/lib/libkvferry.a" $(pkg-config --static --libs kvferry | sed 's/-lkvferry / /')
    "$out/a_pcs" "$out/files2" >/dev/null
    # the README's first example: its line, then run with nothing on
    # LD_LIBRARY_PATH that names the prefix (the caller's own entries stay:
    # where hiredis or liburing live outside the system's paths, as on a
    # machine given them in a folder, libkvferry still needs them)
    mkdir "$out/app"
    cp "$tmp/app.c" "$out/app/app.c"
    (cd "$out/app" && eval "$cc_line") || fail "$prefix: README.md's line does not build app.c"
    (cd "$out/app" && ./app) >"$out/app.out" ||
        fail "$prefix: README.md's first example failed: $(cat "$out/app.out")"
    grep -q "block 40 back as block 5" "$out/app.out" || fail "$prefix: app printed $(cat "$out/app.out")"
    unset PKG_CONFIG_PATH

    # the plot script, where the installed CLI looks for it
    if [ -x "$prefix/bin/kvferry" ]; then
        test -f "$prefix/share/kvferry/plot_compare.py" || fail "$prefix: no share/kvferry/plot_compare.py"
        "$prefix/bin/kvferry" bench --compare --plot "$out/p.png" --backend host --blocks 1 --iters 1 \
            >/dev/null 2>"$out/plot.err" || true
        if grep -q "plot_compare.py not found" "$out/plot.err"; then
            fail "$prefix: the installed kvferry does not find its plot script"
        fi
    fi

    # CMake package config, both libraries
    cmake -S "$src/examples/consumer" -B "$out/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
    cmake --build "$out/consumer" >/dev/null
    LD_LIBRARY_PATH="$run_path" "$out/consumer/offload_host" "$out/files3" >/dev/null
    "$out/consumer/offload_host_static" "$out/files4" >/dev/null
done

# the shared library's users need no CUDA toolkit, even from a CUDA build;
# asking for the static library there says what it misses
mkdir "$tmp/shared_only"
cat >"$tmp/shared_only/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(kvferry_shared_only C)
find_package(kvferry REQUIRED)
add_executable(offload_host $src/examples/offload_host.c)
target_link_libraries(offload_host PRIVATE kvferry::kvferry)
EOF
cmake -S "$tmp/shared_only" -B "$tmp/shared_only/b" -DCMAKE_PREFIX_PATH="$tmp/inst" \
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON >/dev/null
cmake --build "$tmp/shared_only/b" >/dev/null
LD_LIBRARY_PATH="$tmp/inst/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$tmp/shared_only/b/offload_host" "$tmp/files6" >/dev/null
echo "install: make install and cmake --install at any prefix; pkg-config and CMake config usable"
