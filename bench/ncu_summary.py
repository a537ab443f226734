#!/usr/bin/env python3
"""Side-by-side summary of ncu_fwd.sh's exports: python3 ncu_summary.py OUT [SHAPE ...]
Prints, per shape: the key metrics of libdsa's kernel next to FlashMLA's (from <shape>_raw.csv), the
per-tile numbers derived from them, and the warp-stall samples grouped by SASS opcode and by the top
lines (from <shape>_{ours,fm}_sass.csv). Only the standard library; tolerant of absent metrics."""
import csv, glob, os, re, sys
from collections import Counter

KEYS = [  # (label, metric)
    ("duration ns", "gpu__time_duration.sum"),
    ("SM clock Hz", "sm__cycles_elapsed.avg.per_second"),
    ("SM cycles", "sm__cycles_elapsed.max"),
    ("tensor (gmma) active % of active", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("tensor (gmma) active % of elapsed", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed"),
    ("HGMMA instructions", "sm__inst_executed_pipe_tensor_op_gmma.sum"),
    ("warp instructions", "smsp__inst_executed.sum"),
    ("issue active %", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("warps eligible / cycle", "smsp__warps_eligible.avg.per_cycle_active"),
    ("LDGSTS (cp.async) instr", "smsp__inst_executed_op_ldgsts.sum"),
    ("LDGSTS requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"),
    ("LDGSTS sectors", "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"),
    ("L2->L1 bytes", "l1tex__m_xbar2l1tex_read_bytes.sum"),
    ("L2->L1 B/s", "l1tex__m_xbar2l1tex_read_bytes.sum.per_second"),
    ("L1->L2 write bytes", "l1tex__m_l1tex2xbar_write_bytes.sum"),
    ("smem/L1 bank reads", "l1tex__data_bank_reads.sum"),
    ("smem/L1 bank writes", "l1tex__data_bank_writes.sum"),
    ("bank reads % peak", "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed"),
    ("bank writes % peak", "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed"),
    ("LSU smem wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
    ("LDS instr", "smsp__inst_executed_op_shared_ld.sum"),
    ("STS instr", "smsp__inst_executed_op_shared_st.sum"),
    ("L2 tex read sectors", "lts__t_sectors_srcunit_tex_op_read.sum"),
    ("L2 tex read hit sectors", "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum"),
    ("L2 tex read miss sectors", "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum"),
    ("L2 tex write sectors", "lts__t_sectors_srcunit_tex_op_write.sum"),
    ("L2 hit rate %", "lts__t_sector_hit_rate.pct"),
    ("L2 throughput %", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM read bytes", "dram__bytes_read.sum"),
    ("DRAM write bytes", "dram__bytes_write.sum"),
    ("DRAM throughput %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("grid", "launch__grid_size"),
    ("registers/thread", "launch__registers_per_thread"),
    ("dyn smem/block", "launch__shared_mem_per_block_dynamic"),
    ("waves/SM", "launch__waves_per_multiprocessor"),
]
STALLS = ["long_scoreboard", "barrier", "membar", "wait", "math_pipe_throttle", "lg_throttle", "mio_throttle",
          "short_scoreboard", "sleeping", "dispatch_stall", "misc", "drain", "branch_resolving", "no_instruction",
          "not_selected", "selected", "gmma"]


def read_raw(path):
    rows = list(csv.reader(open(path, newline="")))
    hi = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hi is None:
        return []
    h = rows[hi]
    out = []
    for r in rows[hi + 1:]:
        if len(r) != len(h) or not r[h.index("Kernel Name")] or r[h.index("Kernel Name")].startswith("("):
            continue  # units row or junk
        out.append(dict(zip(h, r)))
    return out


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except Exception:
        return None


def who(name):
    return "ours" if "attn_fwd_sm90" in name else "fm" if "sparse_attn_fwd_kernel" in name else name[:30]


def sass_profile(path, top=25):
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    rows = list(csv.reader(open(path, newline="")))
    hi = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
    if hi is None:
        return None
    h = [c.strip() for c in rows[hi]]
    si = h.index("Source")
    ci = next((i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All")), None)
    ei = next((i for i, c in enumerate(h) if c.startswith("Instructions Executed")), None)
    if ci is None:
        return None
    by_op, lines, total = Counter(), [], 0.0
    for r in rows[hi + 1:]:
        if len(r) <= max(si, ci):
            continue
        s = num(r[ci]) or 0.0
        src = r[si].strip()
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+(\.[A-Z0-9_]+)?)", src)
        op = m.group(2) if m else src[:16]
        by_op[op] += s
        total += s
        lines.append((s, src, r[ei] if ei is not None and ei < len(r) else ""))
    lines.sort(key=lambda x: -x[0])
    return total, by_op, lines[:top]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ncu22"
    shapes = sys.argv[2:] or sorted(os.path.basename(p)[:-8] for p in glob.glob(os.path.join(out, "*_raw.csv")))
    for sh in shapes:
        res = read_raw(os.path.join(out, f"{sh}_raw.csv"))
        print(f"\n===== {sh}: {len(res)} profiled launches")
        if not res:
            continue
        cols = []  # the last launch of each kernel (the timed rep when all four were profiled)
        for who_ in ("ours", "fm"):
            c = [r for r in res if who(r["Kernel Name"]) == who_]
            if c:
                cols.append((who_, c[-1]))
        print(f"{'metric':38s}" + "".join(f"{w:>22s}" for w, _ in cols) + "   fm/ours")
        for lab, m in KEYS:
            vals = [num(r.get(m)) for _, r in cols]
            if all(v is None for v in vals):
                continue
            ratio = vals[1] / vals[0] if len(vals) == 2 and vals[0] and vals[1] is not None else None
            print(f"{lab:38s}" + "".join(f"{(v if v is not None else float('nan')):22.4g}" for v in vals) +
                  (f"   {ratio:.3f}" if ratio else ""))
        print("stall reasons (% of active warp-cycles):")
        for s in STALLS:
            m = f"smsp__warps_issue_stalled_{s}_per_warp_active.pct"
            vals = [num(r.get(m)) for _, r in cols]
            if any(v is not None for v in vals):
                print(f"  {s:36s}" + "".join(f"{(v if v is not None else float('nan')):22.2f}" for v in vals))
        # derived per-tile numbers (64-head kernels: tiles = grid * K / 64 with K = 2048 unless told)
        K = int(os.environ.get("K", "2048"))
        for w, r in cols:
            g, t, hz = num(r.get("launch__grid_size")), num(r.get("gpu__time_duration.sum")), num(r.get("sm__cycles_elapsed.avg.per_second"))
            if g and t and hz:
                tiles_per_sm = g * (K / 64) / 132
                print(f"  {w}: {t / tiles_per_sm:.0f} ns = {t * 1e-9 * hz / tiles_per_sm:.0f} clk per 64-key tile per SM "
                      f"(tensor floor 2176, smem floor 2368 at 128 B/clk), clock {hz / 1e9:.3f} GHz")
            l2b = num(r.get("l1tex__m_xbar2l1tex_read_bytes.sum"))
            if g and l2b:
                print(f"  {w}: L2->SM bytes per tile {l2b / (g * K / 64):.0f} (73728 gathered KV + Q + indices)")
        for w in ("ours", "fm"):
            p = sass_profile(os.path.join(out, f"{sh}_{w}_sass.csv"))
            if not p:
                print(f"  ({w}: no per-line source counters)")
                continue
            total, by_op, top = p
            print(f"\n  {w}: {total:.0f} stall samples; by opcode:")
            for op, s in by_op.most_common(14):
                print(f"    {op:28s} {100 * s / total:6.2f}%")
            print(f"  {w}: top lines (samples, SASS, executed):")
            for s, src, e in top:
                print(f"    {100 * s / total:6.2f}%  {src[:90]:90s} {e}")


if __name__ == "__main__":
    main()
