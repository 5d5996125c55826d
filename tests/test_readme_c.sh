#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Compiles every ```c block of README.md and docs/*.md as written: its
# #include lines at the top of a file, the rest as the body of a function,
# the names the program around it supplies declared by tests/readme_stubs.h
# (and nothing else: a missing #include fails). A block that defines
# functions of its own (a line starting "static " or "int main") is a whole
# file and compiled as it stands; one with "int main" is a whole program,
# linked against LIBRARY (the built libkvferry.so) and run: it must exit 0
# on this machine, GPU or not (README.md's first example is one). FLAGS:
# the library's sanitizer flags, for the program too.
#   test_readme_c.sh SOURCE_DIR [CC [LIBRARY [FLAGS]]]
set -eu
src=$(cd "$1" && pwd)
cc=${2:-cc}
lib=${3:-}
flags=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count=0
ran=0
for md in "$src/README.md" "$src"/docs/*.md; do
    [ -f "$md" ] || continue
    page=${md#"$src"/}
    rm -f "$tmp"/snippet*
    awk -v dir="$tmp" '
        /^```c$/ { n++; f = dir "/snippet" n; inc = f ".inc"; body = f ".body";
                   printf "" > inc; printf "" > body; in_c = 1; next }
        /^```/   { in_c = 0; next }
        in_c && /^#include/ { print > inc; next }
        in_c     { print > body }
    ' "$md"
    for inc in "$tmp"/snippet*.inc; do
        [ -f "$inc" ] || break
        f=${inc%.inc}
        if grep -Eq '^(static |int main)' "$f.body"; then
            { cat "$inc"; echo "#include \"readme_stubs.h\""; cat "$f.body"; } >"$f.c"
        else
            {
                cat "$inc"
                echo "#include \"readme_stubs.h\""
                echo "void readme_snippet(void);"
                echo "void readme_snippet(void)"
                echo "{"
                cat "$f.body"
                echo "}"
            } >"$f.c"
        fi
        # shellcheck disable=SC2086 # flags: words
        if ! "$cc" -std=c11 -Wall -Wextra -Werror -Wno-unused-variable $flags -I"$src/include" \
            -I"$src/tests" -c "$f.c" -o "$f.o"; then
            echo "test_readme_c: $page's C block $(basename "$f") does not compile:" >&2
            cat -n "$f.c" >&2
            exit 1
        fi
        count=$((count + 1))
        if [ -n "$lib" ] && grep -q '^int main' "$f.body"; then
            libdir=$(cd "$(dirname "$lib")" && pwd)
            # shellcheck disable=SC2086
            "$cc" $flags "$f.o" -o "$f.exe" -L"$libdir" -lkvferry -Wl,-rpath,"$libdir" ||
                { echo "test_readme_c: $page's program $(basename "$f") does not link" >&2; exit 1; }
            if ! (cd "$tmp" && "$f.exe" >"$f.out" 2>&1); then
                echo "test_readme_c: $page's program $(basename "$f") failed:" >&2
                cat "$f.out" >&2
                exit 1
            fi
            echo "$page: $(cat "$f.out")"
            ran=$((ran + 1))
        fi
    done
done
[ "$count" -gt 0 ] || { echo "test_readme_c: no C blocks in README.md or docs/" >&2; exit 1; }
[ -z "$lib" ] || [ "$ran" -gt 0 ] || { echo "test_readme_c: README.md has no whole program to run" >&2; exit 1; }
echo "readme and docs: $count C blocks compile, $ran program(s) ran"
