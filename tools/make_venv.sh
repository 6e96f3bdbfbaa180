#!/usr/bin/env bash
# Creates the project's virtual environment. Usage: make_venv.sh PYTHON VENV TORCH_VERSION TORCH_CPU_INDEX
# - A torch that PYTHON can already import is reused: its site-packages is linked into the venv and its
#   version is pinned by a constraint, so no second build is installed over it.
# - Otherwise a CPU build of torch is installed (from the PyTorch CPU index when reachable, else PyPI).
# - Where torch is installed here, packages go in with uv where it installs (a fresh venv with empty caches on the
#   2-CPU CI machine: 64 s against pip's 87 s, the bytecode compiled on every CPU), else with pip; pip's
#   find-links (PIP_FIND_LINKS: wheels on the machine's disk) are passed on to uv. A reused torch keeps pip: uv
#   does not see packages that a .pth file adds, and would install a second torch over the linked one.
set -euo pipefail
python=$1 venv=$2 torch_version=$3 cpu_index=$4

"$python" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed, found " + sys.version' 
"$python" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
constraints="$venv/constraints.txt"
: > "$constraints"

use_uv=0
install() {  # pip install's arguments, with the constraints
  if [ "$use_uv" = 1 ]; then
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode -c "$constraints" \
      ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} "$@"
  else
    "$venv/bin/python" -m pip install -q -c "$constraints" "$@"
  fi
}

if existing=$("$python" -c 'import torch, sysconfig; print(torch.__version__); print(sysconfig.get_paths()["purelib"])' 2>/dev/null); then
  version=$(sed -n 1p <<<"$existing"); parent_site=$(sed -n 2p <<<"$existing")
  echo "reusing the installed torch $version from $parent_site"
  echo "$parent_site" > "$site/_parent_env.pth"
  echo "torch==$version" >> "$constraints"
else
  echo "no torch found: installing a CPU build of torch $torch_version"
  if "$venv/bin/python" -m pip install -q uv 2>/dev/null; then
    use_uv=1
  else
    echo "uv is not installable here: installing with pip"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  # the CPU index at most 10 s without retries (either installer), then PyPI
  UV_HTTP_TIMEOUT=10 PIP_TIMEOUT=10 PIP_RETRIES=0 install --index-url "$cpu_index" "torch==$torch_version" 2>/dev/null \
    || install "torch==$torch_version"
  echo "torch==$torch_version" >> "$constraints"
fi
install -e ".[dev]"
# litdata (the `stream` extra) requires torchvision, which has no CPU build for every CPU torch: installed without
# its requirements, which the dev extra lists but torchvision (litdata imports it only to decode images itself)
install --no-deps "litdata>=0.2.50"
"$venv/bin/python" -c 'import torch, lightning; print("venv ready: torch", torch.__version__, "lightning", lightning.__version__)'
