#!/bin/sh
# plot.sh - `make plots`: charts of the newest bench/results/*.json (or the file given) into docs/img/
# (newest: below).
#   bench-fwd.png bench-bwd.png bench-idx.png bench-topk.png: per op, the rate of each shape and
#     variant (bars), the peer of docs/perf.md's targets (points) and the same-run ceiling (line);
#   bench-peer-ratio.png: every row's speed relative to its peer (1.0 = as fast as the peer).
# Needs python3 (standard library only) and gnuplot.
#   bench/plot.sh [results.json] [outdir]
set -eu
cd "$(dirname "$0")/.."
# the newest file by time; where several are within two minutes of it (a clone writes every file at
# checkout), the newest full run among them by name (<date>-<card>-full.json), else the last by name
json=${1:-$(python3 - <<'PY'
import glob, os
fs = glob.glob("bench/results/*.json")
if fs:
    t = max(os.path.getmtime(f) for f in fs)
    top = sorted(f for f in fs if os.path.getmtime(f) > t - 120)
    print(([f for f in top if f.endswith("-full.json")] or top)[-1])
PY
)}
out=${2:-docs/img}
if [ -z "$json" ] || [ ! -f "$json" ]; then
  echo "plot.sh: no results: run 'make bench' first (it writes bench/results/<date>-<card>.json)" >&2
  exit 1
fi
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# python3 turns the JSON into one tab-separated data file per op plus a gnuplot script.
python3 - "$json" "$out" "$tmp" <<'EOF'
import json, math, os, sys
src, out, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
rows = json.load(open(src))
if not rows:
    sys.exit("plot.sh: %s holds no rows" % src)

def num(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None

def fmt(x):
    return "?" if x is None else "%.6g" % x

first = rows[0]
card, commit, date = first.get("card", "?"), first.get("commit", "?"), first.get("date", "?")
gemm, copy = num(first.get("gemm_ceiling_tflops")), num(first.get("copy_ceiling_gbps"))
ops = [("sparse fwd", "fwd"), ("sparse bwd", "bwd"), ("indexer+topk", "idx"), ("topk", "topk")]
gp = ['set terminal pngcairo size 1200,650 font "sans,10" noenhanced',
      'set datafile separator "\\t"', 'set datafile missing "?"', 'set style fill solid 0.8 border -1',
      'set boxwidth 0.6', 'set grid ytics', 'set key outside top center horizontal', 'set xtics rotate by 30 right',
      'set yrange [0:*]', 'set bmargin 8']
for op, tag in ops:
    sel = [r for r in rows if r.get("op") == op]
    if not sel:
        continue
    is_bytes = sel[0].get("unit") == "GB/s"
    unit = "GB/s" if is_bytes else "TFLOP/s"
    ceil = copy if is_bytes else gemm
    dat = os.path.join(tmp, tag + ".dat")
    ymax = 0
    with open(dat, "w") as f:
        for i, r in enumerate(sel):
            rate = num(r.get("gbps") if is_bytes else r.get("tflops"))
            peer = num(r.get("peer_rate"))
            label = "%s %s" % (r.get("shape"), r.get("variant"))
            if rate is None:
                label += " (n/a)"
            for v in (rate, peer, ceil):
                if v is not None:
                    ymax = max(ymax, v)
            f.write("%d\t%s\t%s\t%s\n" % (i, label, fmt(rate), fmt(peer)))
    ceil_name = "copy ceiling (read+write)" if is_bytes else "cuBLAS bf16 GEMM ceiling"
    gp += ['set output "%s/bench-%s.png"' % (out, tag),
           'set title "%s: %s per shape  (%s, commit %s, %s; ceilings and peers as in docs/perf.md)"' % (op, unit, card, commit, date),
           'set ylabel "%s"' % unit, 'set xrange [-0.7:%f]' % (len(sel) - 0.3),
           'set yrange [0:%f]' % (ymax * 1.15 if ymax > 0 else 1)]
    plot = ['"%s" using 1:(0):xtic(2) with dots lc rgb "#ffffff" notitle' % dat,
            '"%s" using 1:3 with boxes lc rgb "#4a7bb7" title "libdsa"' % dat,
            '"%s" using 1:3:(sprintf("%%.0f", $3)) with labels offset 0,0.8 notitle' % dat,
            '"%s" using 1:4 with points pt 7 ps 1.6 lc rgb "#d62728" title "peer (docs/perf.md)"' % dat]
    if ceil is not None:
        plot.append('%f with lines lw 2 dt 2 lc rgb "#2ca02c" title "%s %.0f %s (same run)"' % (ceil, ceil_name, ceil, unit))
    gp.append("plot " + ", \\\n     ".join(plot))

# Every row's speed relative to its peer.
dat = os.path.join(tmp, "ratio.dat")
n = 0
ymax, ymin = 1.0, 1.0
with open(dat, "w") as f:
    for r in rows:
        ratio = num(r.get("peer_ratio"))
        if ratio is not None and ratio <= 0:
            ratio = None
        if r.get("peer") is None:
            continue
        label = "%s %s" % (r.get("shape"), r.get("variant"))
        if ratio is None:
            label += " (n/a)"
        else:
            ymax, ymin = max(ymax, ratio), min(ymin, ratio)
        f.write("%d\t%s\t%s\n" % (n, label, fmt(ratio)))
        n += 1
if n:
    gp += ['set output "%s/bench-peer-ratio.png"' % out,
           'set title "speed relative to the peer of docs/perf.md, same work (>1: libdsa faster)  (%s, commit %s, %s)"' % (card, commit, date),
           'set ylabel "x peer (log scale)"', 'set logscale y', 'set xrange [-0.7:%f]' % (n - 0.3),
           'set yrange [%f:%f]' % (min(0.1, ymin / 2), ymax * 2),
           'plot "%s" using 1:(0):xtic(2) with dots lc rgb "#ffffff" notitle, \\\n'
           '     "%s" using 1:3 with boxes lc rgb "#4a7bb7" title "libdsa / peer", \\\n'
           '     "%s" using 1:3:(sprintf("%%.2f", $3)) with labels offset 0,0.8 notitle, \\\n'
           '     1 with lines lw 2 dt 2 lc rgb "#d62728" title "peer"' % (dat, dat, dat)]
open(os.path.join(tmp, "plot.gp"), "w").write("\n".join(gp) + "\n")
print("plot.sh: %s (%d rows, %s, commit %s)" % (src, len(rows), card, commit))
EOF
gnuplot "$tmp/plot.gp"
ls "$out"/bench-*.png
