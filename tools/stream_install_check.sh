#!/usr/bin/env bash
# CI's dry run of the `stream` extra's documented install (README's Install, docs/streaming.md): with the installed
# torch pinned by a constraint, the resolver picks the torchvision that matches it and never replaces torch.
# Usage: tools/stream_install_check.sh [VENV]   (default .venv; nothing is installed)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
if [ -n "${TORCH_PIN:-}" ]; then echo "$TORCH_PIN" > "$pin"; else
  "$venv/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$pin"
fi
# the documented command adds PyTorch's CPU index for CPU machines; CI's machine reaches PyPI only (EXTRA_INDEX adds one)
extra=(${EXTRA_INDEX:+--extra-index-url "$EXTRA_INDEX"})
if [ -x "$venv/bin/pip" ]; then
  out=$("$venv/bin/python" -m pip install --dry-run --retries 0 -c "$pin" "${extra[@]}" ".[stream]" 2>&1) || true
else  # a venv made with uv (tools/make_venv.sh)
  out=$("$venv/bin/uv" pip install --dry-run --python "$venv/bin/python" -c "$pin" "${extra[@]}" ".[stream]" 2>&1) || true
fi
if grep -qiE "(^| |\+|-)torch[=-][0-9]" <<<"$out" || ! grep -qiE "Would (install|download)|Would not|already satisfied|Resolved" <<<"$out" \
   || grep -qiE "ResolutionImpossible|No solution found|^ERROR" <<<"$out"; then
  echo "the stream extra's install would replace torch or cannot resolve with $(cat "$pin"):" >&2
  echo "$out" >&2
  exit 1
fi
echo "stream extra: resolves beside $(cat "$pin") without replacing it"
