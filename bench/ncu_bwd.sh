#!/usr/bin/env bash
# ncu side-by-side (libdsa 64-head sm_90a backward vs cuDNN FE 1.32 SM90 backward).
# From the repo root on the GPU machine:
#   bash bench/ncu_bwd.sh            (writes everything under $OUT, ~2-3 min wall; SHAPE=... picks the shape)
# Needs: build/bench/dsa_bench built; bench/cudnn_peer.py; cuDNN FE installed in /tmp/site
# (docs/perf.md, "How to run"). docs/bwd-sm90-v3.md part I section 4 says what to read in it.
# Other pairs: OURS_RE / OURS_CMD pick libdsa's kernel and the program that runs it, CUDNN_MATCH the
# substring of cuDNN's kernel name (the longest matching launch is profiled), e.g. the slot target:
#   SHAPE=train-glm-cp8 OURS_RE=slot_target_sm90_kernel CUDNN_MATCH=Recompute \
#   OURS_CMD="python3 bench/cudnn_peer.py --shapes train-glm-cp8 --reps 1" bash bench/ncu_bwd.sh
# (cudnn_list.csv lists every cuDNN kernel of the call with its time, to choose CUDNN_MATCH).
set -u
OUT=${OUT:-/tmp/ncu19}; mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
SHAPE=${SHAPE:-bwd-glm-4k}

# 0. metric names that exist on this chip (a metric ncu does not know aborts the whole profile)
"$NCU" --query-metrics --chip gh100 > "$OUT/query_metrics.txt" 2>&1
WANT="gpu__time_duration.sum sm__cycles_elapsed.avg.per_second sm__cycles_elapsed.max dram__bytes_read.sum dram__bytes_write.sum \
lts__t_sectors_op_red.sum lts__t_requests_srcunit_tex_op_red.sum lts__t_sectors_op_red_lookup_hit.sum lts__t_sectors_op_red_lookup_miss.sum \
lts__t_sectors_op_read.sum lts__t_sectors_op_write.sum lts__t_sectors_srcunit_tex_op_read.sum lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum \
lts__throughput.avg.pct_of_peak_sustained_elapsed lts__d_sectors.sum lts__t_sectors.sum lts__t_tag_requests.sum \
l1tex__t_requests_pipe_lsu_mem_global_op_red.sum l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum smsp__inst_executed_op_global_red.sum \
smsp__inst_executed_op_ldgsts.sum l1tex__data_pipe_lsu_wavefronts_mem_shared.sum l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum \
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
sm__inst_executed_pipe_tensor_op_gmma.sum sm__inst_executed_pipe_tensor_op_hmma.sum smsp__inst_executed.sum smsp__cycles_active.avg \
smsp__warps_issue_stalled_lg_throttle_per_warp_active.pct smsp__warps_issue_stalled_long_scoreboard_per_warp_active.pct \
smsp__warps_issue_stalled_barrier_per_warp_active.pct smsp__warps_issue_stalled_membar_per_warp_active.pct \
smsp__warps_issue_stalled_wait_per_warp_active.pct smsp__warps_issue_stalled_math_pipe_throttle_per_warp_active.pct \
smsp__warps_issue_stalled_drain_per_warp_active.pct smsp__warps_issue_stalled_mio_throttle_per_warp_active.pct \
smsp__warps_issue_stalled_short_scoreboard_per_warp_active.pct smsp__warps_issue_stalled_sleeping_per_warp_active.pct \
smsp__warps_issue_stalled_dispatch_stall_per_warp_active.pct smsp__warps_issue_stalled_misc_per_warp_active.pct"
M=""; for m in $WANT; do b=${m%%.*}; grep -q "^ *$b\b" "$OUT/query_metrics.txt" && M="$M,$m" || echo "absent: $m" >> "$OUT/absent_metrics.txt"; done
M="${M#,},breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed"
SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats --section Occupancy"
COMMON="--clock-control none --target-processes all --launch-count 1 $SECT --metrics $M --import-source no"

# 1. libdsa: the det0 main kernel (the automatic choice: attn_bwd_sm90_ws_kernel; OURS_RE=attn_bwd_sm90_kernel
#    with DSA_BWD_VARIANT=2 profiles the lockstep one), first launch.
OURS_RE=${OURS_RE:-attn_bwd_sm90_ws_kernel}
OURS_CMD=${OURS_CMD:-build/bench/dsa_bench --shapes $SHAPE --reps 1}
PYTHONPATH=/tmp/site:${PYTHONPATH:-} "$NCU" $COMMON --kernel-name-base demangled -k "regex:$OURS_RE" \
  -o "$OUT/ours" -f $OURS_CMD > "$OUT/ours_run.log" 2>&1
# 1b. (optional, +~20 s) the deterministic main kernel and its reduction: uncomment
# "$NCU" --clock-control none --kernel-name-base demangled -k "regex:attn_bwd_sm90_kernel<.*bool.1>|bwd_det_reduce_kernel" \
#   --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics $M -o "$OUT/ours_det" -f \
#   build/bench/dsa_bench --shapes "$SHAPE" --reps 1 > "$OUT/ours_det_run.log" 2>&1

# 2. cuDNN: list every kernel of one call with one cheap metric, pick the longest (the main kernel;
#    its CuTe DSL name should contain FlashAttentionDSABackwardSm90), then profile it alone.
PYTHONPATH=/tmp/site:${PYTHONPATH:-} "$NCU" --clock-control none --target-processes all --metrics gpu__time_duration.sum --csv --print-units base \
  python3 bench/cudnn_peer.py --shapes "$SHAPE" --reps 1 > "$OUT/cudnn_list.csv" 2> "$OUT/cudnn_list.log"
KN=$(python3 - "$OUT/cudnn_list.csv" "${CUDNN_MATCH:-FlashAttentionDSABackward}" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
match = sys.argv[2]
hi = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
h = rows[hi]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
def val(r):
    try: return float(r[vi].replace(",", ""))
    except Exception: return -1.0
# the main kernel: the longest cuDNN DSA backward kernel (not the bench's spin kernel, not pre / post)
cand = [r for r in rows[hi + 1:] if len(r) == len(h) and match in r[ki]
        and "Preprocess" not in r[ki] and "Postprocess" not in r[ki]]
best = max(cand or [r for r in rows[hi + 1:] if len(r) == len(h)], key=val)
print(best[ki])
PY
)
echo "cudnn main kernel: $KN" > "$OUT/cudnn_kernel_name.txt"
PYTHONPATH=/tmp/site:${PYTHONPATH:-} "$NCU" $COMMON -k "regex:^${KN}\$" \
  -o "$OUT/cudnn" -f python3 bench/cudnn_peer.py --shapes "$SHAPE" --reps 1 > "$OUT/cudnn_run.log" 2>&1

# 3. text exports (raw = every metric; details = the sections; source = per-SASS-line stall samples)
for r in ours cudnn; do
  [ -f "$OUT/$r.ncu-rep" ] || continue
  "$NCU" -i "$OUT/$r.ncu-rep" --page raw --csv > "$OUT/${r}_raw.csv"
  "$NCU" -i "$OUT/$r.ncu-rep" --page details --csv > "$OUT/${r}_details.csv"
  "$NCU" -i "$OUT/$r.ncu-rep" --page source --csv --print-source sass > "$OUT/${r}_sass.csv" 2>/dev/null
done
ls -la "$OUT"
