#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Engine and cache tickets are distinct types: tests/compile/ticket_control.c
# compiles against the public header, and each ticket_mixup*.c, which passes
# one kind of ticket where the other is expected, is refused by the compiler
# for that argument (not for another reason: the control shares its flags).
#   test_ticket_types.sh SOURCE_DIR [CC]
set -eu
src=$(cd "$1" && pwd)
cc=${2:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags="-std=c11 -fsyntax-only -Wall -I$src/include"
if ! $cc $flags "$src/tests/compile/ticket_control.c" 2>"$tmp/control.err"; then
    echo "FAIL: the control does not compile:"
    cat "$tmp/control.err"
    exit 1
fi
for f in ticket_mixup.c ticket_mixup_cache.c; do
    if $cc $flags "$src/tests/compile/$f" 2>"$tmp/$f.err"; then
        echo "FAIL: $f compiles: an engine and a cache ticket can be mixed up"
        exit 1
    fi
    # the refusal names the call or the ticket type, as gcc and clang word it
    if ! grep -Eq "kvf_wait|kvf_cache_wait|ticket" "$tmp/$f.err"; then
        echo "FAIL: $f is refused, but not for its ticket:"
        cat "$tmp/$f.err"
        exit 1
    fi
done
echo "ok: tickets of the engine and the cache cannot be mixed up"
