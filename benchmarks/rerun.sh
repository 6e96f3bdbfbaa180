#!/usr/bin/env bash
# Run benchmark scripts one after another, detached (setsid), so that a series longer than one command's time limit
# on a lent GPU machine goes on between commands; each one's log and exit status land in $RERUN_DIR (/tmp/rerun).
#
#   benchmarks/rerun.sh start "auto_num_workers.py --data /tmp/demo" "bench --data /tmp/demo" ...
#       (a script or folder under benchmarks/ runs as benchmarks/<it>; bench, demo and doctor run the package's CLI)
#   benchmarks/rerun.sh wait SECONDS    # until every one has finished or SECONDS have passed; prints where each stands
#   benchmarks/rerun.sh pack FILE.tgz   # the result files written since start, and every log, in one file
#
# Results go where each script writes them (benchmarks/results by default); set GIT_COMMIT where the checkout has no
# .git, so that the results name the commit they measured.
set -u
dir=${RERUN_DIR:-/tmp/rerun}
case "${1:-}" in
start)
  shift
  rm -rf "$dir" && mkdir -p "$dir" && touch "$dir/started"
  i=0
  for cmd in "$@"; do
    i=$((i + 1))
    printf '%s\n' "$cmd" >"$dir/$(printf %02d $i).cmd"
  done
  PYTHONUNBUFFERED=1 setsid nohup bash -c '
    for f in "$0"/*.cmd; do
      n=${f%.cmd}; read -r first rest <"$f"
      date +%s >"$n.start"
      if [ -e "benchmarks/$first" ]; then python benchmarks/$first $rest
      else python -m lightning_gpu_boost $first $rest; fi >"$n.log" 2>&1
      echo $? >"$n.rc"; date +%s >"$n.end"
    done
    touch "$0/done"' "$dir" >/dev/null 2>&1 </dev/null &
  echo "started $i command(s); logs in $dir"
  ;;
wait)
  end=$(($(date +%s) + ${2:-60}))
  while [ ! -e "$dir/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  for f in "$dir"/*.cmd; do
    n=${f%.cmd}
    if [ -e "$n.rc" ]; then
      echo "$(cat "$f"): exit $(cat "$n.rc") after $(($(cat "$n.end") - $(cat "$n.start"))) s"
    elif [ -e "$n.start" ]; then
      echo "$(cat "$f"): running for $(($(date +%s) - $(cat "$n.start"))) s"
    else
      echo "$(cat "$f"): waiting"
    fi
  done
  [ -e "$dir/done" ] && echo "all done"
  ;;
pack)
  find benchmarks/results -type f -newer "$dir/started" >"$dir/new.txt"
  ls "$dir"/*.log >>"$dir/new.txt" 2>/dev/null
  tar czf "$2" -T "$dir/new.txt" && echo "packed $(wc -l <"$dir/new.txt") file(s) into $2"
  ;;
*)
  sed -n '2,12p' "$0"
  exit 2
  ;;
esac
