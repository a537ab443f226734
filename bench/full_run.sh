#!/usr/bin/env bash
# bench/full_run.sh - one complete run of every canonical shape with its peers, in one script run,
# into bench/results/<date>-<card>-full.json (the -full suffix marks a complete run).
#
#   bash bench/full_run.sh OUTDIR [STEPS]      STEPS: comma list of build,bench,peer,train,merge (default all)
#
# FLASHMLA_SO (default .device/libflashmla_sparse.so) names FlashMLA's library. Set DSA_COMMIT: a copy
# of the tree on another machine may carry a .git whose HEAD is not the tree's commit. Where one
# command may run only so long, split the steps over two commands (STEPS).
#
# Runs, in this order and on one GPU:
#   1. build/bench/dsa_bench over every shape, with FlashMLA timed beside each fwd row in the same
#      process;
#   2. bench/cudnn_peer.py over the bwd, idx and topk shapes (its default set): libdsa (through
#      build/libdsa.so) and cuDNN FE / torch.topk in one process on the same tensors;
#   3. bench/cudnn_peer.py over the indexer-training train-* shapes, a process of its own (their cuDNN
#      kernels compile on first use, minutes: a step that fits one command's time limit by itself);
#   4. bench/merge_results.py: the files of the steps that ran into OUTDIR/<date>-<card>-full.json.
# Steps 2 and 3 need cuDNN FE on PYTHONPATH (docs/perf.md, "How to run"). Each step's log goes to
# OUTDIR; a failed step does not stop the next.
set -uo pipefail
out=${1:?usage: bench/full_run.sh OUTDIR [STEPS]}
steps=",${2:-build,bench,peer,train,merge},"
fm=${FLASHMLA_SO:-.device/libflashmla_sparse.so}
mkdir -p "$out"
date_=$(date +%Y-%m-%d)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
card=${card:-unknown}
export DSA_COMMIT=${DSA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
t0=$(date +%s)
if [[ $steps == *,build,* ]]; then
  make -j"$(nproc)" all build/bench/dsa_bench >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
if [[ $steps == *,bench,* ]]; then
  ./build/bench/dsa_bench --flashmla "$fm" --out "$out/dsa_bench.json" >"$out/dsa_bench.log" 2>&1
  echo "dsa_bench: rc $? at $(( $(date +%s) - t0 )) s"
fi
if [[ $steps == *,peer,* ]]; then
  python3 bench/cudnn_peer.py --lib build/libdsa.so --out "$out/cudnn_peer.json" >"$out/cudnn_peer.log" 2>&1
  echo "cudnn_peer: rc $? at $(( $(date +%s) - t0 )) s"
fi
if [[ $steps == *,train,* ]]; then
  python3 bench/cudnn_peer.py --lib build/libdsa.so --shapes train-glm-4k,train-glm-cp8,train-32k \
    --out "$out/cudnn_peer_train.json" >"$out/cudnn_peer_train.log" 2>&1
  echo "cudnn_peer train: rc $? at $(( $(date +%s) - t0 )) s"
fi
if [[ $steps == *,merge,* ]]; then
  files=()
  for f in dsa_bench cudnn_peer cudnn_peer_train; do [ -f "$out/$f.json" ] && files+=("$out/$f.json"); done
  python3 bench/merge_results.py --sort "${files[@]}" -o "$out/$date_-$card-full.json"
fi
