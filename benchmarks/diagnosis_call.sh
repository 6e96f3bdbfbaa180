#!/usr/bin/env bash
# One call of a lent GPU machine's series of `benchmarks/diagnosis.py` runs: each call runs some workloads for at
# most SECONDS, keeps every finished fit in /tmp/diag-cache (`--cache`: a workload cut short by the limit goes on
# from its last finished fit in the next call) and the newest result in /tmp/diag-last.json (`--keep`: the next call
# carries the workloads it leaves out). The first call of a machine keeps $KEEP (an earlier result) instead.
# Results and the log are copied under $OUT/diag. Send the calls back to back: a machine idle for 30 s is given back
# with its /tmp. The limit kills (SIGKILL): Lightning takes a SIGTERM as "stop this fit gracefully", and the script
# went on to its next stage past the call's own limit (2026-11-27: the call's output was lost), where a fit stopped
# short could also have been kept as finished.
#
#   GIT_COMMIT=<sha> KEEP=benchmarks/results/diagnosis-<date>-h200.json bash benchmarks/diagnosis_call.sh 580 photos_hr
#   (2026-11-27 on the H200: segmentation took two calls, about 15 minutes; audio, speech_ctc, tokens_lm_text and
#   short_epochs 2-4 minutes each; photos_hr about 16 minutes on an H100)
set -u
secs=$1; shift
export PYTHONUNBUFFERED=1
keep=/tmp/diag-last.json; [ -f "$keep" ] || keep=${KEEP:-}
mkdir -p "${OUT:-/tmp/out}/diag" /tmp/diag-out
timeout -s KILL "$secs" python benchmarks/diagnosis.py --only "$@" --data /tmp/wl --out /tmp/diag-out \
  ${keep:+--keep "$keep"} --cache /tmp/diag-cache >"${OUT:-/tmp/out}/diag/log.txt" 2>&1
echo "diagnosis exit $? (137: the time limit; run the same call again to go on)"
grep -E "^[a-z_]+: \[|Traceback|read from" "${OUT:-/tmp/out}/diag/log.txt" | cut -c1-600
newest=$(ls -t /tmp/diag-out/diagnosis-*.json 2>/dev/null | head -1)
if [ -n "$newest" ]; then cp "$newest" /tmp/diag-last.json && cp /tmp/diag-out/* "${OUT:-/tmp/out}/diag/"; fi
