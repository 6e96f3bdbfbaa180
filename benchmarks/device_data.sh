#!/usr/bin/env bash
# The bench's JPEG tree on a lent GPU machine, made in the background while the wheels' chunks are carried over:
#
#   bash benchmarks/device_data.sh start 64000     (first call: returns at once)
#   bash benchmarks/device_data.sh wait 64000      (the call that benchmarks: returns once the tree is complete)
#
# `wait` watches the tree's marker (`.complete.json`, written last by make_jpeg_folder) while the maker runs, at
# most 300 s. Do not wait with `pgrep -f make_jpeg_folder`: it also finds the shell running a command line that
# names it, so it never ends, and the call runs out its limit with nothing under $OUT.
set -u
mode=$1; images=${2:-64000}
root=/tmp/lgb-data/jpeg-$images-100
case $mode in
  start)
    mkdir -p /tmp/lgb-data
    PYTHONPATH=$PWD setsid nohup "${PYTHON:-python3}" -c "from lightning_gpu_boost.core.images import make_jpeg_folder; \
make_jpeg_folder('$root', n=$images, num_classes=100, progress=False)" > /tmp/lgb-data/make-$images.log 2>&1 &
    echo $! > /tmp/lgb-data/make-$images.pid
    echo "making $root in the background (log: /tmp/lgb-data/make-$images.log)" ;;
  wait)
    for _ in $(seq 300); do
      [ -e "$root/.complete.json" ] && { echo "$root is complete"; exit 0; }
      kill -0 "$(cat /tmp/lgb-data/make-$images.pid 2>/dev/null)" 2>/dev/null || break  # the maker has ended
      sleep 1
    done
    [ -e "$root/.complete.json" ] && { echo "$root is complete"; exit 0; }
    echo "$root is not complete: $(tail -c 300 /tmp/lgb-data/make-$images.log 2>/dev/null)"; exit 1 ;;
  *) echo "usage: device_data.sh start|wait [images]"; exit 2 ;;
esac
