# SPDX-License-Identifier: Apache-2.0
"""The package version: KVF_VERSION_STRING of include/kvferry.h, written into
_build_version.py when the package is built, read from the header in a
source checkout."""

import re
from pathlib import Path


def header_version(header):
    m = re.search(r'#define\s+KVF_VERSION_STRING\s+"([^"]+)"', Path(header).read_text())
    if not m:
        raise RuntimeError(f"{header}: no KVF_VERSION_STRING")
    return m.group(1)


def package_version():
    try:
        from ._build_version import version  # written by the wheel build (CMakeLists.txt)

        return version
    except ImportError:
        pass
    header = Path(__file__).resolve().parent.parent.parent / "include" / "kvferry.h"
    if header.exists():
        return header_version(header)
    return None
