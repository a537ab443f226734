#!/usr/bin/env bash
# ncu side-by-side of the sparse MLA forward: libdsa's 64-head sm_90a kernel
# (cuda/attn_fwd/fwd_sm90_h64.cu, attn_fwd_sm90_h64_kernel<9, false>) and FlashMLA 9241ae3's SM90 sparse
# prefill kernel (csrc/sm90/prefill/sparse/phase1.cuh, sm90::fwd::sparse_attn_fwd_kernel<KernelTemplate<576,
# false>, TmaParams<...>>), profiled in ONE dsa_bench process: dsa_bench times libdsa (warm-up + --reps), then
# FlashMLA on the same inputs (warm-up + --reps), so with --reps 1 each kernel launches exactly twice.
#
# From the repo root on the GPU machine (build/bench/dsa_bench built, .device/libflashmla_sparse.so present):
#   bash bench/ncu_fwd.sh                                   # fwd-v32-8k, ~2-3 min wall, everything under $OUT
#   SHAPES="fwd-v32-8k fwd-v32-32k" bash bench/ncu_fwd.sh   # + the 32k shape (the gap grows with s_kv): ~2x the time
#   SHAPES=fwd-tp-h16 KRE='attn_fwd_sm90_small_kernel|sparse_attn_fwd_kernel' bash bench/ncu_fwd.sh   # small-H
# Then: python3 bench/ncu_summary.py $OUT   (side-by-side table + stall samples by SASS opcode; needs only python3)
set -u
OUT=${OUT:-/tmp/ncu22}; mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort | tail -1)}
BENCH=${BENCH:-build/bench/dsa_bench}
FM=${FM:-.device/libflashmla_sparse.so}
SHAPES=${SHAPES:-fwd-v32-8k}
KRE=${KRE:-attn_fwd_sm90_h64_kernel|sparse_attn_fwd_kernel}  # ours | FlashMLA's (substrings of the demangled names)
OURS_RE=${KRE%%|*}; FM_RE=${KRE##*|}
[ -x "$NCU" ] || { echo "no ncu found" >&2; exit 2; }
"$NCU" --version > "$OUT/ncu_version.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/gpu.txt" 2>&1

# 0. keep only metric names this ncu knows on GH100 (one unknown name aborts the whole profile)
"$NCU" --query-metrics --chip gh100 > "$OUT/query_metrics.txt" 2>&1
WANT="gpu__time_duration.sum sm__cycles_elapsed.avg.per_second sm__cycles_elapsed.max sm__cycles_active.avg \
smsp__cycles_active.avg sm__throughput.avg.pct_of_peak_sustained_elapsed \
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
sm__inst_executed_pipe_tensor_op_gmma.sum smsp__inst_executed.sum smsp__issue_active.avg.pct_of_peak_sustained_active \
smsp__warps_active.avg.per_cycle_active smsp__warps_eligible.avg.per_cycle_active \
smsp__inst_executed_op_ldgsts.sum l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum \
l1tex__m_xbar2l1tex_read_bytes.sum l1tex__m_xbar2l1tex_read_bytes.sum.per_second l1tex__m_l1tex2xbar_write_bytes.sum \
l1tex__data_bank_reads.sum l1tex__data_bank_writes.sum l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed \
l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum \
smsp__inst_executed_op_shared_ld.sum smsp__inst_executed_op_shared_st.sum l1tex__throughput.avg.pct_of_peak_sustained_active \
lts__t_sectors_srcunit_tex_op_read.sum lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum \
lts__t_sectors_srcunit_tex_op_write.sum lts__t_sector_hit_rate.pct lts__t_sectors_op_read.sum lts__t_sectors_op_write.sum \
lts__throughput.avg.pct_of_peak_sustained_elapsed lts__t_bytes.sum.per_second \
dram__bytes_read.sum dram__bytes_write.sum dram__throughput.avg.pct_of_peak_sustained_elapsed \
smsp__warps_issue_stalled_long_scoreboard_per_warp_active.pct smsp__warps_issue_stalled_barrier_per_warp_active.pct \
smsp__warps_issue_stalled_membar_per_warp_active.pct smsp__warps_issue_stalled_wait_per_warp_active.pct \
smsp__warps_issue_stalled_math_pipe_throttle_per_warp_active.pct smsp__warps_issue_stalled_lg_throttle_per_warp_active.pct \
smsp__warps_issue_stalled_mio_throttle_per_warp_active.pct smsp__warps_issue_stalled_short_scoreboard_per_warp_active.pct \
smsp__warps_issue_stalled_sleeping_per_warp_active.pct smsp__warps_issue_stalled_dispatch_stall_per_warp_active.pct \
smsp__warps_issue_stalled_misc_per_warp_active.pct smsp__warps_issue_stalled_drain_per_warp_active.pct \
smsp__warps_issue_stalled_branch_resolving_per_warp_active.pct smsp__warps_issue_stalled_no_instruction_per_warp_active.pct \
smsp__warps_issue_stalled_not_selected_per_warp_active.pct smsp__warps_issue_stalled_selected_per_warp_active.pct \
smsp__warps_issue_stalled_gmma_per_warp_active.pct \
launch__grid_size launch__registers_per_thread launch__shared_mem_per_block_dynamic launch__waves_per_multiprocessor"
M=""; : > "$OUT/absent_metrics.txt"
for m in $WANT; do b=${m%%.*}; if grep -q "^ *$b\b" "$OUT/query_metrics.txt"; then M="$M,$m"; else echo "$m" >> "$OUT/absent_metrics.txt"; fi; done
M="${M#,},breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active"
SECT=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
      --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section InstructionStats
      --section SourceCounters --section LaunchStats --section Occupancy)
# Launch selection: the second launch of each kernel (the timed rep, right after dsa_bench's L2 flush) when this
# ncu counts launches per kernel configuration; otherwise all four launches (both warm-ups too, ~+40 s).
if "$NCU" --help 2>&1 | grep -q -- '--filter-mode'; then
  SEL=(--filter-mode per-launch-config --launch-skip 1 --launch-count 1)
else
  SEL=(--launch-count 4)
fi
echo "selection: ${SEL[*]}" > "$OUT/selection.txt"
# --clock-control none: the card's own clocks (as the bench runs); cache control stays at its default (all
# caches flushed before each replay pass = the cold-L2 start of a timed rep after the flush memset).
for SH in $SHAPES; do
  T0=$(date +%s)
  "$NCU" --clock-control none --target-processes all --kernel-name-base demangled -k "regex:$KRE" "${SEL[@]}" \
    "${SECT[@]}" --metrics "$M" --import-source no -o "$OUT/fwd_$SH" -f \
    "$BENCH" --shapes "$SH" --reps 1 --flashmla "$FM" > "$OUT/run_$SH.log" 2>&1
  echo "$SH: ncu rc=$? in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/times.txt"
  R="$OUT/fwd_$SH.ncu-rep"; [ -f "$R" ] || continue
  # both kernels must be in the report; if this ncu applied the selection globally, redo with all four launches
  NK=$("$NCU" -i "$R" --page raw --csv 2>/dev/null | grep -c -E "$OURS_RE|$FM_RE")
  if [ "${NK:-0}" -lt 2 ] && [ "${SEL[0]}" != "--launch-count" ]; then
    echo "$SH: only $NK kernel(s) profiled with ${SEL[*]}; retrying with --launch-count 4" | tee -a "$OUT/times.txt"
    "$NCU" --clock-control none --target-processes all --kernel-name-base demangled -k "regex:$KRE" --launch-count 4 \
      "${SECT[@]}" --metrics "$M" --import-source no -o "$OUT/fwd_$SH" -f \
      "$BENCH" --shapes "$SH" --reps 1 --flashmla "$FM" > "$OUT/run_$SH.log" 2>&1
  fi
  # raw = every metric of every profiled launch (one row each); details = the sections; source = per-SASS
  # line stall samples and executed instructions, one file per kernel (import-side -k filter)
  "$NCU" -i "$R" --page raw --csv --print-units base > "$OUT/${SH}_raw.csv" 2> "$OUT/${SH}_raw.err"
  "$NCU" -i "$R" --page details --csv > "$OUT/${SH}_details.csv" 2>/dev/null
  for who in ours fm; do
    re=$OURS_RE; [ $who = fm ] && re=$FM_RE
    "$NCU" -i "$R" --kernel-name-base demangled -k "regex:$re" --launch-count 1 --page source --csv --print-source sass \
      > "$OUT/${SH}_${who}_sass.csv" 2> "$OUT/${SH}_${who}_sass.err"
    # fallback: an ncu whose import ignores -k writes every result's source into one file
    [ -s "$OUT/${SH}_${who}_sass.csv" ] || "$NCU" -i "$R" --page source --csv --print-source sass > "$OUT/${SH}_all_sass.csv" 2>/dev/null
  done
done
ls -la "$OUT"
