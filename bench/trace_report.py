#!/usr/bin/env python3
"""trace_report.py - summary of a probe-3 forward timeline (make probe-bench PROBE=3; the bench with
DSA_FWD_TRACE=prefix writes prefix-<shape>-<row>-v2.bin / -small.bin).

Each file holds [16 CTAs (the grid's last)][4 warpgroups][2048] uint64 records written by thread 0 of every WG:
event id << 48 | clock64 (48 bits), 0 = no record. Event ids (cuda/attn_fwd_sm90_v2.cu and
cuda/attn_fwd_sm90_small.cu mark them with Sm90Trace::mark): 0..15 the first consumer WG, 16..31 the
second, 32..47 the producer; a WG's lowest id starts its iteration (a pair of tiles in the 64-head
kernel, a tile in the small-H split).

Prints, per warpgroup, the mean clocks from each mark to the next over the iterations in the middle
of every CTA (the first two and the last one left out), their share of the iteration, and the mean
iteration length. Usage: trace_report.py FILE [FILE ...]
"""
import struct
import sys
from collections import OrderedDict

CTAS, WGS, EVENTS = 16, 4, 2048
NAMES = {
    "v2": {0: "pair entry (S(2i) done)", 1: "m0 posted", 2: "RS PV issued", 3: "RS PV done",
           4: "m1 received", 5: "sP0 posted", 6: "sP1 received", 7: "SS PV issued",
           8: "next 0L landed", 9: "SS PV done", 10: "next 0R landed",
           16: "pair entry", 17: "1R landed", 18: "1L landed", 19: "S(2i+1) done", 20: "m0 received",
           21: "m1 posted", 22: "sP1 posted", 23: "RS PV issued", 24: "sP0 received", 25: "RS PV done",
           26: "SS PV done",
           32: "0L free", 33: "0L issued", 34: "1R free", 35: "1R issued", 36: "0R free",
           37: "0R issued", 38: "1L free", 39: "1L issued"},
    "small": {0: "tile landed", 1: "S issued", 2: "PV(n-1) retired", 3: "S done", 4: "softmax done",
              5: "P posted", 6: "PV issued", 16: "tile landed", 17: "P received", 18: "PV issued",
              19: "PV done", 32: "stage free", 33: "copies issued"},
}


def report(path):
    kind = "small" if path.endswith("-small.bin") else "v2"
    names = NAMES[kind]
    data = open(path, "rb").read()
    n = len(data) // 8
    if n != CTAS * WGS * EVENTS:
        print(f"{path}: {n} records, expected {CTAS * WGS * EVENTS}")
        return
    recs = struct.unpack(f"<{n}Q", data)
    print(f"== {path} ({kind})")
    for wg in range(WGS):
        trans = OrderedDict()
        iters = []
        for cta in range(CTAS):
            base = (cta * WGS + wg) * EVENTS
            seq = [(r >> 48, r & 0xFFFFFFFFFFFF) for r in recs[base:base + EVENTS] if r]
            if not seq:
                continue
            start = min(e for e, _ in seq)
            cuts = [i for i, (e, _) in enumerate(seq) if e == start]
            for k in range(2, len(cuts) - 1):  # middle iterations only
                it = seq[cuts[k]:cuts[k + 1] + 1]
                iters.append(it[-1][1] - it[0][1])
                for (e0, c0), (e1, c1) in zip(it, it[1:]):
                    trans.setdefault((e0, e1), []).append(c1 - c0)
        if not iters:
            continue
        mean_it = sum(iters) / len(iters)
        print(f"  WG{wg}: {len(iters)} iterations, mean {mean_it:.0f} clk")
        for (e0, e1), v in trans.items():
            m = sum(v) / len(v)
            print(f"    {names.get(e0, e0)!s:>26} -> {names.get(e1, e1)!s:<26} {m:8.0f} clk  {100 * m / mean_it:5.1f}%"
                  f"  (n {len(v)})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for f in sys.argv[1:]:
        report(f)
