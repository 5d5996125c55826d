# SPDX-License-Identifier: Apache-2.0
"""Runs the tests against python/kvferry of this checkout (not an installed
copy); the library is found as kvferry does: KVFERRY_LIBRARY first (CTest
sets it to the build's libkvferry.so), then the repository's build/."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kvferry  # noqa: E402


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(int(os.environ.get("KVF_TEST_SEED", "1234")))


def random_bytes(rng, n):
    """Random bytes, never zero: a copy that did nothing cannot pass."""
    return rng.integers(1, 256, n, dtype="uint8")


@pytest.fixture
def geometry():
    return kvferry.Geometry(layers=2, kv_factor=2, kv_heads=4, tokens_per_block=16, head_size=32,
                            dtype=kvferry.Dtype.FP16, order=kvferry.Order.HEAD_MAJOR)


@pytest.fixture
def engine(tmp_path):
    with kvferry.Engine(backend=kvferry.Backend.HOST, threads=2, file_dir=str(tmp_path / "kv"),
                        file_namespace="pytest") as e:
        yield e


def torch_cuda():
    """torch, when it has CUDA and libkvferry a usable CUDA backend; else
    skips the calling test module."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device", allow_module_level=True)
    info = kvferry.info()
    if not info.cuda_built or info.cuda_devices == 0:
        pytest.skip(f"libkvferry has no usable CUDA backend ({info.cuda_error or 'built without CUDA'})",
                    allow_module_level=True)
    return torch
