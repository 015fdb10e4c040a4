#!/usr/bin/env bash
# One call of this session's GPU rounds (2026-11-25, one H200 through the workplace's device tool):
#
#   bash benchmarks/gpu_2026_11_25/round.sh TAG NAME [NAME ...]
#
# stages what the call carried (scripts/gpu_stage.sh unpack: SmolLM2's GGUF halves, the corpora, gemma3-270m's pieces,
# wheels), then runs each helper script benchmarks/gpu_2026_11_25/NAME.sh one after the other, alone on the GPU,
# each writing into $OUT/TAG/NAME/ with its log and exit code, and tars $OUT/TAG into $OUT/TAG.tgz (the tool brings
# back at most 8 files). A NAME of the form `bg:NAME` starts that script detached (setsid) into /tmp/bg/NAME, to be
# collected by a later call of the same lease with `collect:NAME`. NAME=SECONDS stops that script after SECONDS (300);
# BG_ARGS are passed to a background script after its folder; ROUND_ARGS to every foreground script.
set -uo pipefail
tag=${1:?usage: round.sh TAG NAME...}; shift
R="$OUT/$tag"; mkdir -p "$R"
source scripts/gpu_stage.sh unpack > "$R/stage.log" 2>&1 || echo "staging: exit $?" >> "$R/stage.log"
set +e
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/device.txt" 2>&1
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> "$R/device.txt" 2>&1
for name in "$@"; do
  case "$name" in
    bg:*)
      n=${name#bg:}; mkdir -p /tmp/bg/$n
      setsid nohup bash benchmarks/gpu_2026_11_25/$n.sh /tmp/bg/$n ${BG_ARGS:-} > /tmp/bg/$n/run.log 2>&1 < /dev/null &
      echo "$n: started in the background" >> "$R/times.txt" ;;
    collect:*)
      n=${name#collect:}; mkdir -p "$R/$n"; cp -r /tmp/bg/$n/. "$R/$n/" 2>/dev/null
      echo "$n: collected ($(ls /tmp/bg/$n | wc -l) files)" >> "$R/times.txt" ;;
    *)
      limit=${name#*=}; [ "$limit" = "$name" ] && limit=300; name=${name%%=*}
      mkdir -p "$R/$name"; t0=$(date +%s)
      PYTHONUNBUFFERED=1 timeout -k 10 "$limit" bash benchmarks/gpu_2026_11_25/$name.sh "$R/$name" ${ROUND_ARGS:-} > "$R/$name/run.log" 2>&1
      rc=$?
      echo "$name: exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$R/times.txt" ;;
  esac
done
tar -C "$OUT" -czf "$OUT/$tag.tgz" "$tag" && rm -rf "$R"
