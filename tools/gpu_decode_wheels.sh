#!/usr/bin/env bash
# Packs what benchmarks/gpu_decode.py and the GPU decode's tests need on the GPU machine beyond its image: nvImageCodec
# (the JPEG engines) and nvJPEG for CUDA 13, lmdb, msgpack, isal and torchdata, into .gpuwheels-decode/ (ignored
# through .git/info/exclude): about 29 MB, which fits beside the working tree in one carry (64 MiB in all), where
# tools/gpu_wheels.sh's 36 MB and these together do not.
#
#   bash tools/gpu_decode_wheels.sh
#   GIT_COMMIT=<sha> WHEELS=.gpuwheels-decode bash benchmarks/gpu_decode_call.sh r1 engines,resnet18   (carry it)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpuwheels-decode/' "$exclude" 2>/dev/null || echo '/.gpuwheels-decode/' >> "$exclude"
rm -rf .gpuwheels-decode && mkdir -p .gpuwheels-decode
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpuwheels-decode "nvidia-nvimgcodec-cu13>=0.9,<0.10" "nvidia-nvjpeg>=13,<14" lmdb msgpack isal torchdata \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
du -sh .gpuwheels-decode
