#!/usr/bin/env bash
# The one GPU runner: stage the model and corpora, then run topic scripts (benchmarks/gpu/TOPIC.sh) on the GPUs of
# one host and pack everything they wrote into one archive (the workplace's device tool brings back at most 8 files).
#
#   bash benchmarks/gpu/run.sh TAG SPEC [SPEC ...]        # from the repository root on the GPU host, $OUT set
#
# SPEC is TOPIC[@GPU][=SECONDS]: TOPIC.sh runs with CUDA_VISIBLE_DEVICES=GPU (default 0) and is stopped after SECONDS
# (default 480). Topics on different GPUs run at the same time; topics on one GPU run one after the other, in the
# order given. GPU may be a list ("0,1") for a topic that spreads itself over several GPUs: that list is a lane of its
# own, beside the others, so give such a topic a call of its own. GPU~NAME is another lane on the same GPU
# (`a@0 b@0~2`: a and b at the same time on GPU 0), for topics too small to fill a GPU alone.
# `bg:SPEC` starts the topic detached (it outlives this call, for a later call of the same lease), `collect:TOPIC`
# copies what a detached topic has written so far into this call's archive. A detached topic's GPU~NAME keeps a
# second detached run of the same topic apart (`bg:book_notebooks@0~b`, then `collect:book_notebooks~b`).
#
# Every topic gets KVLAB_RESULTS=$OUT/TAG/files and writes its results under $KVLAB_RESULTS/<repo-relative path>;
# its log and exit code go to $OUT/TAG/logs/TOPIC.log and $OUT/TAG/times.txt. The archive is $OUT/TAG.tgz:
# `tar -xzf TAG.tgz` here, then copy TAG/files/. over the repository root (benchmarks/gpu/README.md).
set -uo pipefail
tag=${1:?usage: bash benchmarks/gpu/run.sh TAG TOPIC[@GPU][=SECONDS] ...}; shift
: "${OUT:?OUT must name the folder whose files come back}"
R="$OUT/$tag"; mkdir -p "$R/files" "$R/logs"
if [ -f scripts/gpu_stage.sh ] && [ "${KVLAB_STAGED:-0}" != 1 ]; then  # KVLAB_STAGED=1: staged by the caller
  source scripts/gpu_stage.sh unpack > "$R/logs/stage.log" 2>&1 || echo "staging: exit $?" >> "$R/logs/stage.log"
  set +e  # the staging script sets -e; a failing topic must not stop the others
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$R/device.txt" 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
  >> "$R/device.txt" 2>&1
export PY=${PY:-python3}

run_topic() {  # TOPIC GPU SECONDS
  local t=$1 gpu=$2 limit=$3 t0 rc
  t0=$(date +%s)
  KVLAB_RESULTS="$R/files" CUDA_VISIBLE_DEVICES=$gpu PYTHONUNBUFFERED=1 \
    timeout -k 15 "$limit" bash "benchmarks/gpu/$t.sh" > "$R/logs/$t.log" 2>&1 < /dev/null
  rc=$?
  echo "$t: gpu $gpu, exit $rc$([ $rc = 124 ] && echo " (stopped at $limit s)"), $(( $(date +%s) - t0 )) s" \
    | tee -a "$R/times.txt"
}

declare -A queue=()
order=()
for spec in "$@"; do
  case "$spec" in
    bg:*)
      s=${spec#bg:}; limit=${s#*=}; [ "$limit" = "$s" ] && limit=480; s=${s%%=*}
      t=${s%%@*}; gpu=${s#*@}; [ "$gpu" = "$s" ] && gpu=0
      name=$t; [ "$gpu" = "${gpu#*~}" ] || name="$t~${gpu#*~}"
      mkdir -p "/tmp/kvlab-bg/$name/files"
      KVLAB_RESULTS="/tmp/kvlab-bg/$name/files" CUDA_VISIBLE_DEVICES=${gpu%%~*} PYTHONUNBUFFERED=1 \
        setsid nohup timeout -k 15 "$limit" bash "benchmarks/gpu/$t.sh" > "/tmp/kvlab-bg/$name/run.log" 2>&1 \
        < /dev/null &
      echo $! > "/tmp/kvlab-bg/$name/pid"
      echo "$name: started detached on gpu ${gpu%%~*} (limit $limit s)" | tee -a "$R/times.txt" ;;
    collect:*)
      name=${spec#collect:}
      cp -r "/tmp/kvlab-bg/$name/files/." "$R/files/" 2>/dev/null
      cp "/tmp/kvlab-bg/$name/run.log" "$R/logs/$name.log" 2>/dev/null
      echo "$name: collected ($(find "/tmp/kvlab-bg/$name/files" -type f 2>/dev/null | wc -l) files; running:" \
        "$(kill -0 "$(cat "/tmp/kvlab-bg/$name/pid" 2>/dev/null)" 2>/dev/null && echo yes || echo no))" \
        | tee -a "$R/times.txt" ;;
    *)
      limit=${spec#*=}; [ "$limit" = "$spec" ] && limit=480; s=${spec%%=*}
      t=${s%%@*}; lane=${s#*@}; [ "$lane" = "$s" ] && lane=0
      [ -f "benchmarks/gpu/$t.sh" ] || { echo "$t: no benchmarks/gpu/$t.sh" | tee -a "$R/times.txt"; continue; }
      [ -n "${queue[$lane]+x}" ] || order+=("$lane")
      queue[$lane]="${queue[$lane]:-} $t:$limit" ;;
  esac
done

# one lane per GPU (or GPU list): its topics one after the other; the lanes at the same time
lanes=()
for lane in "${order[@]}"; do
  ( for item in ${queue[$lane]}; do run_topic "${item%%:*}" "${lane%%~*}" "${item##*:}"; done ) &
  lanes+=($!)
done
[ ${#lanes[@]} = 0 ] || wait "${lanes[@]}"  # the lanes only: a detached topic (bg:) runs on past this call
tar -C "$OUT" -czf "$OUT/$tag.tgz" "$tag" && rm -rf "$R"
ls -la "$OUT"
