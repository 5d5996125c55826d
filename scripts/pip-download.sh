#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Downloads from PyPI without installing anything into a python3:
#   sh scripts/pip-download.sh DIR PIP-DOWNLOAD-ARGUMENTS...
# runs `pip download -d DIR ...` with python3's own pip where it has one,
# else with the pip of a throwaway virtual environment (python3-venv),
# since Debian's python3 may lack pip and is externally managed (PEP 668).
# The scripts that fetch a pinned package (build-hiredis-tls.sh,
# install-seaweedfs.sh) use it.
set -eu
dir=${1:?"pip-download: usage: pip-download.sh DIR ARGS..."}
shift
if python3 -m pip --version >/dev/null 2>&1; then
    exec python3 -m pip download -q --disable-pip-version-check -d "$dir" "$@"
fi
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv" >/dev/null 2>&1 && [ -x "$venv/bin/pip" ] ||
    { echo "pip-download: no pip for python3 and no python3 -m venv (apt-get install python3-venv)" >&2; exit 1; }
"$venv/bin/pip" download -q --disable-pip-version-check -d "$dir" "$@"
