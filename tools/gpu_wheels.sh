#!/usr/bin/env bash
# Packs the wheels the GPU machine lacks for the streaming, LMDB and loader tests and benchmarks (litdata, boto3, moto's
# S3 server, obstore, lmdb, isal, torchdata, webdataset) into .gpuwheels/ (ignored through .git/info/exclude), for
# Python 3.12 on manylinux: one `carry` of about 40 MB. DALI travels in chunks of its own
# (../shared/gpu/make-wheel-chunks.sh). Each wheel is fetched without its requirements: the list names what the
# device's image does not hold (device README, KINDS.md's package list).
#
#   bash tools/gpu_wheels.sh
#   run(carry=[".gpuwheels"], command="python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#       .gpuwheels/*.whl && export PYTHONPATH=$PWD:/tmp/site && ...")
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpuwheels/' "$exclude" 2>/dev/null || echo '/.gpuwheels/' >> "$exclude"
rm -rf .gpuwheels && mkdir -p .gpuwheels
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .gpuwheels litdata==0.2.76 boto3 botocore s3transfer jmespath obstore "moto==5.*" responses xmltodict flask \
  flask-cors blinker itsdangerous cryptography cffi pycparser lmdb msgpack isal torchdata webdataset braceexpand \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
du -sh .gpuwheels
