#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the wheel `make wheel` built into a fresh virtual environment and
# uses it as a user would: no compiler, no cmake, no KVFERRY_LIBRARY, outside
# the checkout. The library must come from inside the package, a round trip
# must give back its bytes, KVFERRY_LIBRARY must still override, the kvferry
# command must run from the entry point and as `python -m kvferry`, and the
# Python examples must run against the installed package.
#   test_wheel.sh WHEEL_DIR SOURCE_DIR
set -eu
wheel_dir=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
fail() { echo "test_wheel: $*" >&2; exit 1; }
set -- "$wheel_dir"/kvferry-*manylinux*.whl
[ -f "$1" ] || fail "no manylinux wheel in $wheel_dir (make wheel)"
wheel=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# numpy (the one dependency) from python3's own site-packages where it has
# one, so that the test needs no index then
python3 -m venv --system-site-packages "$tmp/venv"
if "$tmp/venv/bin/python3" -c 'import numpy' 2>/dev/null; then
    "$tmp/venv/bin/python3" -m pip install -q --disable-pip-version-check --no-index "$wheel"
else
    "$tmp/venv/bin/python3" -m pip install -q --disable-pip-version-check "$wheel"
fi

# only the environment's bin on PATH: nothing to compile with
run() { (cd "$tmp" && env -u KVFERRY_LIBRARY -u PYTHONPATH PATH="$tmp/venv/bin" "$@"); }
! run sh -c 'command -v cc || command -v gcc || command -v cmake' >/dev/null 2>&1 ||
    fail "a compiler is reachable"

run python3 - <<'PY' || fail "round trip through the installed wheel"
import os, tempfile
import numpy as np
import kvferry as kvf

pkg = os.path.dirname(kvf.__file__)
assert "site-packages" in pkg, pkg
assert kvf.library_path == os.path.join(pkg, "libkvferry.so"), kvf.library_path
assert kvf.__version__ == kvf.version().split()[0]
rng = np.random.default_rng(7)
with tempfile.TemporaryDirectory() as d, kvf.Engine(backend="host", file_dir=d, file_namespace="wheel") as e:
    g = kvf.Geometry(layers=2, kv_factor=2, kv_heads=4, tokens_per_block=16, head_size=32, dtype="bf16")
    kv = rng.integers(1, 256, (4, g.block_bytes), dtype=np.uint8)
    e.add_pool(g, primary=kv, secondary=4)
    want = kv[0].copy()
    e.offload("disk", [(0, 0x42)]).wait(check=True)
    kv[1] = 0xA5  # poisoned
    e.onboard("disk", [(0x42, 1)]).wait(check=True)
    assert np.array_equal(kv[1], want)
print("wheel: round trip through", kvf.library_path)
PY

# the kvferry command the wheel carries: the console entry point on PATH and
# python -m kvferry, a verified bench through the wheel's own libraries
run kvferry version | grep -q "^kvferry " || fail "the kvferry entry point"
run python3 -m kvferry info | grep -q "host   available" || fail "python -m kvferry info"
run kvferry bench --backend host --blocks 8 --iters 1 | grep -q "verified: every byte" ||
    fail "kvferry bench from the wheel"
set +e
run kvferry bench --blocks 0 2>/dev/null
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "kvferry bench --blocks 0 exited $rc through the entry point, not 2"
case $(basename "$wheel") in
*manylinux_2_28*|*manylinux_2_2[0-7]*|*manylinux_2_1[0-9]*|*manylinux_2_[5-9]_*|*manylinux2014*|*manylinux1*) ;;
*) echo "wheel: $(basename "$wheel"): tagged for a newer glibc than manylinux_2_28 (built against this machine's glibc; build in the manylinux_2_28 image for that tag)" ;;
esac

# an explicit KVFERRY_LIBRARY is never silently replaced by the package's
out=$(cd "$tmp" && PATH="$tmp/venv/bin" KVFERRY_LIBRARY=/nonexistent/libkvferry.so \
      python3 -c 'import kvferry' 2>&1) && fail "KVFERRY_LIBRARY=/nonexistent was ignored"
echo "$out" | grep -q "KVFERRY_LIBRARY: /nonexistent/libkvferry.so does not exist" ||
    fail "KVFERRY_LIBRARY: unexpected message: $out"

# the examples, copied out so that their source-checkout path finds nothing
mkdir "$tmp/examples"
cp "$src"/python/examples/*.py "$tmp/examples/"
# An example's "# requires: MOD ..." line names the modules it needs beyond
# kvferry's (torch, transformers, vllm): skipped, and said so, where one does
# not import; "# manual:" ones (a model to download, a GPU) are never run here.
for ex in "$tmp"/examples/*.py; do
    name=$(basename "$ex")
    if grep -q '^# manual:' "$ex"; then
        echo "wheel: $name skipped ($(sed -n 's/^# manual: //p' "$ex" | head -n 1))"
        continue
    fi
    mods=$(sed -n 's/^# requires: //p' "$ex" | head -n 1)
    missing=""
    for m in $mods; do
        run python3 -c "import $m" >/dev/null 2>&1 || missing="$missing $m"
    done
    if [ -n "$missing" ]; then
        echo "wheel: $name skipped (no$missing here)"
        continue
    fi
    KVF_LOG=error run python3 "$ex" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$name"; }
done
echo "wheel: $(basename "$wheel") installs and works without a compiler"
