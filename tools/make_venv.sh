#!/usr/bin/env bash
# Creates the project's virtual environment. Usage: make_venv.sh PYTHON VENV TORCH_VERSION TORCH_CPU_INDEX
# - A torch that PYTHON can already import is reused: its site-packages is linked into the venv and its
#   version is pinned by a constraint, so no second build is installed over it.
# - Otherwise a CPU build of torch is installed (from the PyTorch CPU index when reachable, else PyPI).
# - Where torch is installed here, packages go in with uv where it installs (a fresh venv with empty caches on the
#   2-CPU CI machine: 64 s against pip's 87 s), else with pip; pip's find-links (PIP_FIND_LINKS: wheels on the
#   machine's disk) are passed on to uv. A reused torch keeps pip: uv does not see packages that a .pth file adds,
#   and would install a second torch over the linked one.
# - uv compiles no bytecode ahead: compiling every module of the venv cost 31 s of the 2-CPU machine's 60 s here,
#   most of it for modules nothing imports. The last step imports torch and Lightning with bytecode writing on
#   (even where PYTHONDONTWRITEBYTECODE is set), so that their modules are compiled once, here; `make test` writes
#   the bytecode of whatever else its processes import, the first time they do.
set -euo pipefail
python=$1 venv=$2 torch_version=$3 cpu_index=$4

"$python" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed, found " + sys.version' 
"$python" -m venv --without-pip "$venv"  # pip only where it installs (ensure_pip): uv needs none
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
constraints="$venv/constraints.txt"
: > "$constraints"

use_uv=0
ensure_pip() { [ -x "$venv/bin/pip" ] || "$venv/bin/python" -m ensurepip -q; }
install() {  # pip install's arguments, with the constraints
  if [ "$use_uv" = 1 ]; then
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" -c "$constraints" \
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
  ensure_pip
else
  echo "no torch found: installing a CPU build of torch $torch_version"
  # uv into the venv by the outer pip (--python: no pip of the venv's own to install first), else by the venv's pip
  if "$python" -m pip --python "$venv/bin/python" install -q uv >/dev/null 2>&1 \
    || { ensure_pip && "$venv/bin/python" -m pip install -q uv 2>/dev/null; }; then
    use_uv=1
  else
    echo "uv is not installable here: installing with pip"
    ensure_pip
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  # a CPU wheel of that version in a folder of PIP_FIND_LINKS first (where the PyTorch index is unreachable, asking
  # it cost 9.5 s of retries here), then the CPU index at most 10 s without retries (either installer), then PyPI
  wheel=$(for d in ${PIP_FIND_LINKS:-}; do ls "$d"/torch-"$torch_version"+cpu-*.whl 2>/dev/null; done | head -n 1 || true)
  { [ -n "$wheel" ] && install "$wheel"; } \
    || UV_HTTP_TIMEOUT=10 PIP_TIMEOUT=10 PIP_RETRIES=0 install --index-url "$cpu_index" "torch==$torch_version" 2>/dev/null \
    || install "torch==$torch_version"
  echo "torch==$torch_version" >> "$constraints"
fi
if [ "$use_uv" = 1 ]; then
  install -e ".[dev]" pip  # pip too: a venv a user can pip install into
else
  install -e ".[dev]"
fi
# litdata (the `stream` extra) requires torchvision, which has no CPU build for every CPU torch: installed without
# its requirements, which the dev extra lists but torchvision (litdata imports it only to decode images itself)
install --no-deps "litdata>=0.2.50"
# torch's modules, and those of the libraries Lightning's import pulls in beside it (sympy for torch._dynamo,
# matplotlib for torchmetrics), compile in two processes at once first: 15.8 s for this step against 17.4-19.3 s
PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -c 'import torch' &
PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -c '
import importlib
for name in ("sympy", "matplotlib.pyplot", "numpy"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass' &
wait
PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -c 'import torch, lightning.pytorch as pl; print("venv ready: torch", torch.__version__, "lightning", pl.__version__)'
