# SPDX-License-Identifier: Apache-2.0
"""kvferry.install_log_handler(): libkvferry's log lines reach Python's
logging module (logger "kvferry") at the matching level, from the library's
threads too, until remove_log_handler()."""

import gc
import logging
import subprocess
import sys

import pytest

import kvferry as kvf
from kvferry import _log


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=1)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def collected():
    logger = logging.getLogger("kvferry")
    handler, old_level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(1)
    c_level = kvf.get_log_level()
    yield handler.records
    kvf.remove_log_handler()
    kvf.set_log_level(c_level)
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _stale_tmp(root, ns="logtest"):
    """A temporary file left by a writer that is gone: opening the directory
    removes it, with a warning (and an info line per file)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = root / ns
    d.mkdir(parents=True, exist_ok=True)
    (d / f".{0x2a:032x}.{dead.pid}.1.tmp").write_bytes(b"x")
    return d


def test_a_warning_reaches_logging(tmp_path, collected):
    assert kvf.install_log_handler() is logging.getLogger("kvferry")
    gc.collect()  # the callback must survive a collection: C holds only its address
    _stale_tmp(tmp_path)
    with kvf.Engine(backend="host", file_dir=str(tmp_path), file_namespace="logtest"):
        pass
    warnings = [r for r in collected if r.levelno == logging.WARNING]
    assert any("stale temporary file of interrupted writes" in r.getMessage() for r in warnings), \
        [r.getMessage() for r in collected]
    assert all(r.name == "kvferry" for r in collected)
    assert not [r for r in collected if r.levelno == logging.INFO]  # the library's level is warn


def test_level_and_removal(tmp_path, collected):
    kvf.install_log_handler(level="info")
    kvf.install_log_handler()  # again: harmless, one callback
    assert kvf.get_log_level() is kvf.LogLevel.INFO
    _stale_tmp(tmp_path)
    with kvf.Engine(backend="host", file_dir=str(tmp_path), file_namespace="logtest"):
        pass
    infos = [r.getMessage() for r in collected if r.levelno == logging.INFO]
    assert any("removed the temporary file of an interrupted write" in m for m in infos), infos
    assert sum("stale temporary file of interrupted writes" in r.getMessage() for r in collected) == 1

    kvf.remove_log_handler()
    assert _log._callback is None
    collected.clear()
    _stale_tmp(tmp_path)
    with kvf.Engine(backend="host", file_dir=str(tmp_path), file_namespace="logtest"):
        pass
    assert collected == []  # back on stderr


def test_errors_are_errors(collected, monkeypatch):
    kvf.install_log_handler()
    monkeypatch.setenv("KVF_FSYNC_METHOD", "sometimes")
    with pytest.raises(kvf.InvalidArgument):
        kvf.Engine(backend="host")
    errors = [r.getMessage() for r in collected if r.levelno == logging.ERROR]
    assert any('KVF_FSYNC_METHOD="sometimes"' in m for m in errors), errors


def test_bad_level():
    with pytest.raises(kvf.InvalidArgument, match="not a LogLevel"):
        kvf.set_log_level("loud")
