# SPDX-License-Identifier: Apache-2.0
"""The kvferry command through the package: `python -m kvferry` (and the
`kvferry` entry point, the same function) runs the C command with its
arguments and exit status."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvferry
from kvferry import __main__ as entry


def run(*args):
    # this very package, wherever the tests imported it from
    env = dict(os.environ, PYTHONPATH=str(Path(kvferry.__file__).resolve().parent.parent))
    return subprocess.run([sys.executable, "-m", "kvferry", *args], capture_output=True, text=True, env=env)


@pytest.mark.skipif(entry.command_path() is None, reason="no kvferry command beside this library")
def test_python_m_runs_the_command():
    r = run("version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kvferry "), r.stdout
    r = run("bench", "--blocks", "0")  # its own usage error, its own exit code
    assert r.returncode == 2 and "--blocks: 0 is out of range" in r.stderr, r


def test_no_command_is_said(monkeypatch, capsys):
    monkeypatch.setattr(entry, "command_path", lambda: None)
    assert entry.main(["version"]) == 3
    assert "has no kvferry command" in capsys.readouterr().err
