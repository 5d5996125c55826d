# SPDX-License-Identifier: Apache-2.0
"""python/examples/serving_offload.py runs and checks itself."""

import os
import subprocess
import sys
from pathlib import Path

import kvferry


def test_serving_offload_example():
    ex = Path(__file__).resolve().parent.parent / "examples" / "serving_offload.py"
    env = dict(os.environ, KVFERRY_LIBRARY=kvferry.library_path, KVF_LOG="error")
    p = subprocess.run([sys.executable, str(ex)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "restored byte-exact" in p.stdout and "ERR_CORRUPT" in p.stdout


def test_cache_serving_example():
    ex = Path(__file__).resolve().parent.parent / "examples" / "cache_serving.py"
    env = dict(os.environ, KVFERRY_LIBRARY=kvferry.library_path, KVF_LOG="error")
    p = subprocess.run([sys.executable, str(ex)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every restored block byte-exact" in p.stdout
