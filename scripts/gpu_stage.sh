#!/usr/bin/env bash
# Stage kvlab's default model and corpora on a GPU machine that reaches no registry, through a tool that carries at
# most 64 MiB per call (the workplace's device tool). Two halves:
#
#   here:   bash scripts/gpu_stage.sh pack      # .cache/gpu/{gguf.part1,gguf.part2,corpora.tar.xz,corpora-long.tar.xz}
#                                                 # and .whl/ (add the wheels the GPU image lacks: benchmarks/gpu/README.md)
#   gemma:  bash scripts/gpu_stage.sh pack-gemma   # .cache/gpu/g3.p0..p6 (7 x 37 MB): gemma3-270m's GGUF in pieces;
#           each call carries one piece and runs `unpack`, which joins them once all seven are there (sha256 checked)
#   qwen:   bash scripts/gpu_stage.sh pack-qwen05   # .cache/gpu/q05.p00..p13 (14 pieces of <= 34 MiB) and
#           bash scripts/gpu_stage.sh pack-qwen15   # .cache/gpu/q15.p00..p31 (32 pieces): Qwen2.5-Coder-0.5B / 1.5B's GGUF;
#           the last piece travels with .cache/gpu/corpora-headline.tar.xz (GSM8K, its CoT exemplars, MMLU: 1.7 MB) and
#           .whl/ (gguf, for the GGUF conversion); `unpack` joins the pieces once all are there (sha256 checked)
#   there:  calls 1-3 carry .cache/gpu/gguf.part1..3 (a third each, ~31 MiB, beside the ~18 MiB tree; the third
#           with corpora.tar.xz), call 4 corpora-long.tar.xz and .whl; each runs `bash benchmarks/gpu/run.sh ...`,
#           which sources `scripts/gpu_stage.sh unpack` first (the machine must stay warm between the calls:
#           ignored files survive only then).
#
# `unpack` assembles the GGUF under KVLAB_CACHE=$PWD/.cache/kvlab (checked against the registry's sha256 when kvlab
# first loads it), unpacks the corpora, installs the carried wheels (gguf for the GGUF conversion, rank-bm25 for
# REFORM's BM25 baseline) without dependencies, and exports KVLAB_CACHE and PYTHONPATH.
set -eo pipefail
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA_PIECES=7  # 37 MB each: one fits a call beside the ~28 MB tree (64 MiB a call)
PIECE=34M       # a Qwen piece: 34 MiB beside the ~28 MB tree
# model id, GGUF file, sha256 (kvlab/assets/registry.json), pieces (ceil(size / 34 MiB)), piece prefix
QWEN05=(qwen2.5-coder-0.5b qwen2.5-coder-0.5b-instruct-awq.gguf
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 14 q05)
QWEN15=(qwen2.5-coder-1.5b qwen2.5-coder-1.5b-instruct.gguf
        cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 32 q15)

pack_qwen() {  # ID FILE SHA PIECES PREFIX: the GGUF in 34 MiB pieces, the headline corpora and the gguf wheel
  local src="${KVLAB_CACHE:-$HOME/.cache/kvlab}"
  [ -f "$src/assets/$1/$2" ] || .venv/bin/python -m kvlab fetch "$1"
  for c in gsm8k gsm8k-cot-prompt mmlu; do [ -d "$src/assets/$c" ] || .venv/bin/python -m kvlab fetch "$c"; done
  mkdir -p .cache/gpu .whl
  rm -f .cache/gpu/"$5".p*
  split -b "$PIECE" -d -a 2 "$src/assets/$1/$2" ".cache/gpu/$5.p"
  local n; n=$(ls .cache/gpu/"$5".p* | wc -l)
  [ "$n" = "$4" ] || { echo "gpu_stage: $1 split into $n pieces, expected $4" >&2; exit 1; }
  tar -C "$src" -cJf .cache/gpu/corpora-headline.tar.xz assets/gsm8k assets/gsm8k-cot-prompt assets/mmlu
  .venv/bin/pip download -q --no-deps -d .whl gguf==0.19.0
  ls -la .cache/gpu/"$5".p* .cache/gpu/corpora-headline.tar.xz .whl
}

unpack_qwen() {  # ID FILE SHA PIECES PREFIX: move carried pieces into the cache; join them once all are there
  local d="$KVLAB_CACHE/assets/$1"
  if ls .cache/gpu/"$5".p* >/dev/null 2>&1; then mkdir -p "$d" && mv .cache/gpu/"$5".p* "$d/"; fi
  if [ ! -f "$d/$2" ] && [ "$(ls "$d/$5".p* 2>/dev/null | wc -l)" = "$4" ]; then
    cat "$d/$5".p* > "$d/.gguf.tmp" && echo "$3  $d/.gguf.tmp" | sha256sum -c --quiet &&
      mv "$d/.gguf.tmp" "$d/$2" && rm -f "$d/$5".p*
  fi
  echo "$1: $(ls "$d/$5".p* 2>/dev/null | wc -l) of $4 pieces waiting; $(ls "$d/$2" 2>/dev/null || echo "not joined yet")"
}
join_bundle() {  # the pieces of `pack-bundle` carried so far: once all are here, restore .cache/gpu and .whl from them
  local b="$PWD/.cache/kvlab/bundle"
  mkdir -p "$b"
  if ls .cache/gpu/bundle.p* >/dev/null 2>&1; then mv .cache/gpu/bundle.p* "$b/"; fi
  [ -f .cache/gpu/bundle.count ] && cp .cache/gpu/bundle.count "$b/count"
  local want; want=$(cat "$b/count" 2>/dev/null || echo 0)
  local have; have=$(ls "$b"/bundle.p* 2>/dev/null | wc -l)
  echo "bundle: $have of $want pieces here"
  if [ "$want" -gt 0 ] && [ "$have" = "$want" ]; then
    cat "$b"/bundle.p* | tar -xf - && rm -f "$b"/bundle.p* && echo "bundle: joined"
  fi
}

case "${1:-}" in
  pack-bundle)
    # after `pack`: everything `pack` made (the GGUF thirds, the corpora, the wheels) as one tar in pieces of
    # BYTES (default 15 MB), for when the tracked tree leaves less than a third of the GGUF's room in a call
    bytes=${2:-15000000}
    rm -f .cache/gpu/bundle.p*
    tar -cf - .cache/gpu/gguf.part? .cache/gpu/corpora*.tar.xz .whl | split -b "$bytes" -d -a 2 - .cache/gpu/bundle.p
    ls .cache/gpu/bundle.p* | wc -l > .cache/gpu/bundle.count
    echo "pack-bundle: $(cat .cache/gpu/bundle.count) pieces of <= $bytes bytes (carry one a call with .cache/gpu/bundle.count)" ;;
  pack)
    src="${KVLAB_CACHE:-$HOME/.cache/kvlab}"
    mkdir -p .cache/gpu .whl
    # three thirds: each call carries the tracked tree (~19 MB) + one third (~33 MB) + what else fits
    rm -f .cache/gpu/gguf.part*
    split -n 3 -d -a 1 --numeric-suffixes=1 "$src/assets/smollm2-135m/$GGUF" .cache/gpu/gguf.part
    # the corpora fetched here (a missing one is left out and named)
    have=(); for c in austen c4-sample paul-graham shakespeare gsm8k gsm8k-cot-prompt wikitext mmlu piqa arc-easy squad \
        winogrande hellaswag arc-challenge; do
      if [ -d "$src/assets/$c" ]; then have+=("assets/$c"); else echo "gpu_stage: $c not fetched here, not packed"; fi
    done
    tar -C "$src" -cJf .cache/gpu/corpora.tar.xz "${have[@]}"
    # the long-context QA and RULER corpora (hotpotqa is 46 MB as JSON, 11 MB packed): a tar of their own
    long=(); for c in hotpotqa pg-essays-ruler; do [ -d "$src/assets/$c" ] && long+=("assets/$c"); done
    [ ${#long[@]} = 0 ] || tar -C "$src" -cJf .cache/gpu/corpora-long.tar.xz "${long[@]}"
    .venv/bin/pip download -q --no-deps -d .whl gguf==0.19.0 rank-bm25==0.2.2
    ls -la .cache/gpu .whl ;;
  pack-gemma)
    # gemma3-270m (253 MB, the DHSA paper's model family) in pieces that fit one call each beside the tree
    src="${KVLAB_CACHE:-$HOME/.cache/kvlab}/assets/gemma3-270m/gemma-3-270m-q4_k_m.gguf"
    if [ ! -f "$src" ]; then .venv/bin/python -m kvlab fetch gemma3-270m; fi
    mkdir -p .cache/gpu
    rm -f .cache/gpu/g3.p?
    split -n "$GEMMA_PIECES" -d -a 1 "$src" .cache/gpu/g3.p
    ls -la .cache/gpu/g3.p* ;;
  pack-qwen05) pack_qwen "${QWEN05[@]}" ;;
  pack-qwen15) pack_qwen "${QWEN15[@]}" ;;
  unpack)
    export KVLAB_CACHE="$PWD/.cache/kvlab"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    join_bundle
    a="$KVLAB_CACHE/assets/smollm2-135m"
    mkdir -p "$a"
    for p in .cache/gpu/gguf.part?; do [ -f "$p" ] && mv "$p" "$a/.${p##*.}"; done
    if [ -f "$a/.part1" ] && [ -f "$a/.part2" ] && [ -f "$a/.part3" ]; then
      cat "$a/.part1" "$a/.part2" "$a/.part3" > "$a/.$GGUF.tmp" && mv "$a/.$GGUF.tmp" "$a/$GGUF" && rm -f "$a"/.part?
    fi
    g="$KVLAB_CACHE/assets/gemma3-270m"
    if ls .cache/gpu/g3.p? >/dev/null 2>&1; then mkdir -p "$g" && mv .cache/gpu/g3.p? "$g/"; fi
    if [ "$(ls "$g"/g3.p? 2>/dev/null | wc -l)" = "$GEMMA_PIECES" ] && [ ! -f "$g/gemma-3-270m-q4_k_m.gguf" ]; then
      cat "$g"/g3.p? > "$g/.gguf.tmp" &&
        echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $g/.gguf.tmp" | sha256sum -c --quiet &&
        mv "$g/.gguf.tmp" "$g/gemma-3-270m-q4_k_m.gguf" && rm -f "$g"/g3.p?
    fi
    ls "$g" 2>/dev/null | tr '\n' ' ' || true; echo
    unpack_qwen "${QWEN05[@]}"; unpack_qwen "${QWEN15[@]}"
    for t in .cache/gpu/corpora*.tar.xz; do [ -f "$t" ] && tar -C "$KVLAB_CACHE" -xJf "$t"; done
    if ls .whl/*.whl >/dev/null 2>&1; then python -m pip install -q --no-deps --no-index .whl/*.whl 2>&1 | tail -1; fi
    ls -la "$a" ;;
  *) echo "usage: bash scripts/gpu_stage.sh pack|pack-bundle [BYTES]|pack-gemma|pack-qwen05|pack-qwen15|unpack" >&2; exit 2 ;;
esac
