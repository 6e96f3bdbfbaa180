#!/usr/bin/env bash
# One call of a lent GPU machine for benchmarks/gpu_decode.py: installs the carried wheels (.gpuwheels), makes the
# 64,000-JPEG tree in /tmp/lgb-data once per machine (a machine idle for 30 s is given back with its /tmp: send the
# calls back to back), runs the parts named, and copies the part file and the log under $OUT/<name>.
#
#   GIT_COMMIT=<sha> bash benchmarks/gpu_decode_call.sh r1 decoders,resnet50 [extra arguments]
#   GIT_COMMIT=<sha> bash benchmarks/gpu_decode_call.sh r2 resnet50_4cpus,resnet18
#   python benchmarks/gpu_decode.py --merge <r1>/part.json <r2>/part.json
# WHEELS=.gpuwheels-decode (tools/gpu_decode_wheels.sh: nvImageCodec for the JPEG engines) instead of .gpuwheels.
# Copy what comes back as one archive: a call returns at most eight files.
set -u
name=$1; parts=$2; shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${WHEELS:-.gpuwheels}"/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "${OUT:-/tmp/out}/$name"
python benchmarks/gpu_decode.py --data /tmp/lgb-data --parts "$parts" --out "${OUT:-/tmp/out}/$name" "$@" \
  >"${OUT:-/tmp/out}/$name/log.txt" 2>&1
echo "gpu_decode exit $?"
grep -E "img/s|decoders:|engines|wrote|Error|error" "${OUT:-/tmp/out}/$name/log.txt" | cut -c1-400 | tail -40
