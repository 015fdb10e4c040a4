#!/usr/bin/env bash
# Sourced by the GPU launchers: `step NAME SECONDS CMD...` runs CMD with a time limit, its output in $OUT/NAME.log,
# its exit code in $OUT/rc_NAME.txt and its time in $OUT/times.txt, and goes on whatever happens.
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/rc_$name.txt"
  echo "$name: exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$OUT/times.txt"
}
