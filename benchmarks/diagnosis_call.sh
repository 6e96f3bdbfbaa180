#!/usr/bin/env bash
# One call of a lent GPU machine's series of `benchmarks/diagnosis.py` runs. The first call starts the run detached
# (setsid: it goes on between calls, so no fit is cut by a call's limit) for the workloads it names; every call then
# waits up to SECONDS for it to end, prints each finished workload's line, and copies the newest result (written
# after each workload) and the log under $OUT/diag. Exit 0: the run has ended; 3: still running, send the same call
# again at once (a machine idle for 30 s is given back with its /tmp and the run). A call that finds the run ended
# starts a new one with the workloads it names. Each run keeps the last run's result on this machine
# (/tmp/diag-last.json: the workloads it leaves out are carried) or, in a machine's first run, $KEEP; every finished
# fit is kept in /tmp/diag-cache (`--cache`): a run started again on the same machine goes on from there. No cache
# crosses machines: a workload's fits are compared with each other, so they run on one host.
#
#   GIT_COMMIT=<sha> KEEP=benchmarks/results/diagnosis-<date>-h200.json bash benchmarks/diagnosis_call.sh 580 photos_hr segmentation
#   bash benchmarks/diagnosis_call.sh 580          # the next calls: wait on the same run
#   (2026-11-27 on the H200: segmentation about 15 minutes; audio, speech_ctc, tokens_lm_text and short_epochs 2-4
#   minutes each; photos_hr 8-18 minutes)
set -u
secs=$1; shift
export PYTHONUNBUFFERED=1
run=/tmp/diag-run out="${OUT:-/tmp/out}/diag"
mkdir -p "$out" /tmp/diag-out "$run"
if ! { [ -f "$run/pid" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null; }; then
  if [ $# -eq 0 ]; then echo "no diagnosis is running here and no workloads were named"; exit 2; fi
  keep=/tmp/diag-last.json; [ -f "$keep" ] || keep=${KEEP:-}
  rm -f "$run/rc"
  setsid nohup bash -c 'python benchmarks/diagnosis.py "$@"; echo $? >'"$run/rc" _ --only "$@" --data /tmp/wl \
    --out /tmp/diag-out ${keep:+--keep "$keep"} --cache /tmp/diag-cache >"$run/log.txt" 2>&1 </dev/null &
  echo $! >"$run/pid"
  echo "started: diagnosis of $*"
fi
end=$(($(date +%s) + secs))
while [ ! -f "$run/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
grep -E "^[a-z_]+: (\[|.* \.\.\. \(at [0-9]+ s\)$)|Traceback|read from" "$run/log.txt" | cut -c1-600
newest=$(ls -t /tmp/diag-out/diagnosis-*.json 2>/dev/null | head -1)
if [ -n "$newest" ]; then cp "$newest" /tmp/diag-last.json && cp /tmp/diag-out/* "$out/"; fi
cp "$run/log.txt" "$out/log.txt"
if [ -f "$run/rc" ]; then echo "diagnosis exit $(cat "$run/rc")"; exit 0; fi
echo "still running: send the same call again"
exit 3
