#!/bin/bash
# usage: spy.sh LOG OUTDIR
LOG=$1; OUT=$2; mkdir -p $OUT
at() { while true; do n=$(grep -o "bench.stream batch [0-9]*" $LOG | tail -1 | awk '{print $3}'); [ -n "$n" ] && [ "$n" -ge "$1" ] && break; sleep 2; done; }
for b in 150 1050; do
  at $b
  for pid in $(pgrep -f python_streaming_sink_runner); do
    /work/main/.venv/bin/py-spy record --idle -r 50 -d 25 -f raw -p $pid -o $OUT/commit-$b-$pid.txt >/dev/null 2>&1 &
  done
  wait
done
