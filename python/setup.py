"""Builds libkvferry with CMake and ships it inside the package.

The version is KVF_VERSION_STRING of ../include/kvferry.h, read here at build
time. Environment:
  KVFERRY_SOURCE_DIR   the repository root (default: this file's parent)
  KVFERRY_CMAKE_ARGS   extra arguments for the CMake configure step,
                       e.g. "-DKVF_CUDA=OFF"
  KVFERRY_LIBRARY_PREBUILT  ship this libkvferry.so instead of building one
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SRC = Path(os.environ.get("KVFERRY_SOURCE_DIR", HERE.parent)).resolve()
HEADER = SRC / "include" / "kvferry.h"

sys.path.insert(0, str(HERE / "kvferry"))
from _version import header_version  # noqa: E402  (no import of the package itself)

sys.path.pop(0)

if not HEADER.exists():
    sys.exit(f"kvferry: {HEADER} not found; build from the repository (pip install ./python) "
             f"or set KVFERRY_SOURCE_DIR")
VERSION = header_version(HEADER)


def build_library(dest: Path):
    prebuilt = os.environ.get("KVFERRY_LIBRARY_PREBUILT")
    if prebuilt:
        shutil.copyfile(os.path.realpath(prebuilt), dest)
        return
    if not shutil.which("cmake"):
        sys.exit("kvferry: cmake is needed to build libkvferry (scripts/install-deps.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="kvferry-cmake-") as bdir:
        cfg = ["cmake", "-S", str(SRC), "-B", bdir, "-DCMAKE_BUILD_TYPE=Release",
               "-DKVF_BUILD_TESTS=OFF", "-DKVF_BUILD_TOOLS=OFF"]
        cfg += shlex.split(os.environ.get("KVFERRY_CMAKE_ARGS", ""))
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(cfg)
        subprocess.check_call(["cmake", "--build", bdir, "--target", "kvferry", "-j", jobs])
        lib = Path(bdir) / "libkvferry.so"
        shutil.copyfile(os.path.realpath(lib), dest)  # the real file, not the symlink


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = Path(self.build_lib) / "kvferry"
        pkg.mkdir(parents=True, exist_ok=True)
        build_library(pkg / "libkvferry.so")
        (pkg / "_build_version.py").write_text(f'version = "{VERSION}"\n')


cmdclass = {"build_py": BuildPy}

# The wheel carries a native library: platform-specific, any Python 3.
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:

    class BdistWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

setup(version=VERSION, cmdclass=cmdclass)
