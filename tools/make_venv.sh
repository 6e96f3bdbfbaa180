#!/usr/bin/env bash
# Creates the project's virtual environment. Usage: make_venv.sh PYTHON VENV TORCH_VERSION TORCH_CPU_INDEX
# - A torch that PYTHON can already import is reused: its site-packages is linked into the venv and its
#   version is pinned by a constraint, so pip never installs a second build over it.
# - Otherwise a CPU build of torch is installed (from the PyTorch CPU index when reachable, else PyPI).
set -euo pipefail
python=$1 venv=$2 torch_version=$3 cpu_index=$4

"$python" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed, found " + sys.version' 
"$python" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
constraints="$venv/constraints.txt"
: > "$constraints"

if existing=$("$python" -c 'import torch, sysconfig; print(torch.__version__); print(sysconfig.get_paths()["purelib"])' 2>/dev/null); then
  version=$(sed -n 1p <<<"$existing"); parent_site=$(sed -n 2p <<<"$existing")
  echo "reusing the installed torch $version from $parent_site"
  echo "$parent_site" > "$site/_parent_env.pth"
  echo "torch==$version" >> "$constraints"
else
  echo "no torch found: installing a CPU build of torch $torch_version"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q --timeout 10 --retries 0 --index-url "$cpu_index" "torch==$torch_version" 2>/dev/null \
    || "$venv/bin/python" -m pip install -q "torch==$torch_version"
fi
"$venv/bin/python" -m pip install -q -c "$constraints" -e ".[dev]"
# litdata (the `stream` extra) requires torchvision, which has no CPU build for every CPU torch: installed without
# its requirements, which the dev extra lists but torchvision (litdata imports it only to decode images itself)
"$venv/bin/python" -m pip install -q -c "$constraints" --no-deps "litdata>=0.2.50"
"$venv/bin/python" -c 'import torch, lightning; print("venv ready: torch", torch.__version__, "lightning", lightning.__version__)'
