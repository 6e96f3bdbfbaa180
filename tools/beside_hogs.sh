#!/usr/bin/env bash
# Run a command beside two CPU hogs (busy loops), as a user's busy laptop would: `.ci/run` runs the timing tests
# (`pytest -m timing`) so after the suite, each change, on the 2-CPU CI machine. Exits with the command's status.
#
#   bash tools/beside_hogs.sh .venv/bin/python -m pytest -m timing -q
set -u
hogs=()
for _ in 1 2; do
  ( while :; do :; done ) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
"$@"
