# SPDX-License-Identifier: Apache-2.0
"""``kvferry`` and ``python -m kvferry``: the kvferry command (tools/, in C)
that the package carries in kvferry/bin, run with these arguments; in a
source checkout, the one beside the library it loads (build/kvferry)."""

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def command_path():
    """The kvferry executable this package runs, or None."""
    from . import _lib

    tries = [_HERE / "bin" / "kvferry"]
    if os.sep in _lib.path:  # not a bare name the loader resolved
        tries.append(Path(_lib.path).resolve().parent / "kvferry")
    for p in tries:
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    exe = command_path()
    if exe is None:
        print("kvferry: this install of the Python package has no kvferry command (it was built "
              "without libcjson: install libcjson-dev and reinstall, or build it with `make` in "
              "a checkout)", file=sys.stderr)
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(str(exe), [str(exe)] + argv)


if __name__ == "__main__":
    sys.exit(main())
