#!/bin/sh
# Compiles every ```c block of README.md as written: its #include lines at
# the top of a file, the rest as the body of a function, the names the
# engine around it supplies declared by tests/readme_stubs.h (and nothing
# else: a missing #include fails).
#   test_readme_c.sh SOURCE_DIR [CC]
set -eu
src=$(cd "$1" && pwd)
cc=${2:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk -v dir="$tmp" '
    /^```c$/ { n++; f = dir "/snippet" n; inc = f ".inc"; body = f ".body";
               printf "" > inc; printf "" > body; in_c = 1; next }
    /^```/   { in_c = 0; next }
    in_c && /^#include/ { print > inc; next }
    in_c     { print > body }
' "$src/README.md"
count=0
for inc in "$tmp"/snippet*.inc; do
    [ -f "$inc" ] || break
    f=${inc%.inc}
    {
        cat "$inc"
        echo "#include \"readme_stubs.h\""
        echo "void readme_snippet(void);"
        echo "void readme_snippet(void)"
        echo "{"
        cat "$f.body"
        echo "}"
    } >"$f.c"
    if ! "$cc" -std=c11 -Wall -Wextra -Werror -Wno-unused-variable -I"$src/include" -I"$src/tests" \
        -c "$f.c" -o "$f.o"; then
        echo "test_readme_c: README.md's C block $(basename "$f") does not compile:" >&2
        cat -n "$f.c" >&2
        exit 1
    fi
    count=$((count + 1))
done
[ "$count" -gt 0 ] || { echo "test_readme_c: no C blocks in README.md" >&2; exit 1; }
echo "readme: $count C blocks compile"
