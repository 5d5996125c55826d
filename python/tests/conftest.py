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


def redis_server(tmp_path, *args):
    """A context manager: a redis-server of the caller's own on a loopback
    port, with extra command-line args; yields its port (skips the test
    without redis-server or without the Redis client in libkvferry)."""
    import contextlib
    import shutil
    import socket
    import subprocess
    import time

    if not shutil.which("redis-server") or not any(s.name == "redis" and s.built
                                                    for s in kvferry.info().stores):
        pytest.skip("no redis-server, or libkvferry built without hiredis")

    @contextlib.contextmanager
    def run():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path), *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and p.poll() is None, "redis-server did not start"
                    time.sleep(0.05)
            yield port
        finally:
            p.kill()
            p.wait()

    return run()


@pytest.fixture
def redis_url(tmp_path):
    """redis://127.0.0.1:<port> of a redis-server of this test's own."""
    with redis_server(tmp_path) as port:
        yield f"redis://127.0.0.1:{port}"
