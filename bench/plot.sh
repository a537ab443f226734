#!/bin/sh
# plot.sh - `make plots`: the README's charts from the complete runs, bench/results/*-full.json (or
# the full runs given), into docs/img/ (or -o DIR). The rows are the README's status table's, chosen
# by bench/status_table.py's select() (the newest full run per card, every row with a same-run peer),
# so the charts and the table show the same numbers; one colour per card.
#   bench-peer-ratio.png: every row's speed relative to its peer, peer ms / libdsa ms (> 1: libdsa
#     faster); hatched: the deterministic backward against cuDNN's non-deterministic time;
#   bench-fwd.png bench-bwd.png bench-idx.png bench-topk.png: per op, libdsa's rate (bars, the value
#     at the foot), the peer's (points) and the card's cuBLAS bf16 GEMM or device-copy rate of the
#     same run (line).
# Needs python3 (standard library only) and gnuplot.
#   bench/plot.sh [-o OUTDIR] [DATE-CARD-full.json ...]
set -eu
cd "$(dirname "$0")/.."
out=docs/img
if [ "${1:-}" = "-o" ]; then out=${2:?plot.sh: -o needs a folder}; shift 2; fi
if [ $# -eq 0 ]; then
  set -- $(ls bench/results/*-full.json 2>/dev/null || true)
fi
if [ $# -eq 0 ]; then
  echo "plot.sh: no complete run in bench/results (bench/full_run.sh writes <date>-<card>-full.json)" >&2
  exit 1
fi
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# python3 writes one tab-separated data file per chart and card plus one gnuplot script.
python3 - "$out" "$tmp" "$@" <<'EOF'
import math, os, sys
sys.path.insert(0, "bench")
from status_table import deterministic_vs_nondeterministic, select

out, tmp, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
runs, keys = select(paths)
if not keys:
    sys.exit("plot.sh: no row with a same-run peer in %s" % " ".join(paths))
COLOURS = ["#4a7bb7", "#e08a2c", "#5aa05a", "#9467bd", "#8c564b"]
PEER_PT = [7, 5, 9, 11, 13]


def num(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def who(run):
    return "%s (%s, %s)" % (run["card"], run["commit"], run["date"])


n = len(runs)
width = 0.8 / n
gp = ['set terminal pngcairo size 1200,560 font "sans,10" noenhanced',
      'set datafile separator "\\t"', 'set style fill solid 0.85 border -1',
      'set boxwidth %f' % (width * 0.95), 'set grid ytics', 'set key outside top center horizontal',
      'set xtics rotate by 30 right nomirror', 'set bmargin 7.5', 'set lmargin 14']


def xtics(sel):
    return 'set xtics (%s)' % ", ".join('"%s %s" %d' % (k[0], k[1], i) for i, k in enumerate(sel))


def xpos(i, c):
    return i - 0.4 + width * (c + 0.5)


# Every row's speed relative to its peer.
lo, hi = 1.0, 1.0
plot = []
for c, run in enumerate(runs):
    for det in (False, True):
        dat = os.path.join(tmp, "ratio-%d-%d.dat" % (c, det))
        with open(dat, "w") as f:
            for i, k in enumerate(keys):
                r = run["rows"].get(k)
                ratio = num(r and r["peer_ratio"])
                if ratio is None or ratio <= 0 or deterministic_vs_nondeterministic(r) != det:
                    continue
                lo, hi = min(lo, ratio), max(hi, ratio)
                f.write("%f\t%.6g\n" % (xpos(i, c), ratio))
        if os.path.getsize(dat) == 0:
            continue
        style = 'fs pattern 4 border -1' if det else 'fs solid 0.85 border -1'
        title = ('title "%s, deterministic vs cuDNN non-deterministic"' % run["card"]) if det else \
            ('title "libdsa / peer: %s"' % who(run))
        plot.append('"%s" using 1:2 with boxes %s lc rgb "%s" %s' % (dat, style, COLOURS[c % 5], title))
        plot.append('"%s" using 1:2:(sprintf("%%.2f", $2)) with labels offset 0,0.7 font "sans,%d" notitle'
                    % (dat, 8 if n == 1 else 6))
plot.append('1 with lines lw 2 dt 2 lc rgb "#d62728" title "as fast as the peer"')
gp += ['set output "%s/bench-peer-ratio.png"' % out,
       'set title "speed relative to the peer, peer ms / libdsa ms, same process and inputs (> 1: libdsa faster)"',
       'set ylabel "x peer (log scale)"', 'set logscale y', 'set ytics (0.25, 0.5, 1, 2, 4, 8)', 'set xrange [-0.6:%f]' % (len(keys) - 0.4),
       'set yrange [%f:%f]' % (min(0.25, lo / 1.5), max(4.0, hi * 1.6)), xtics(keys),
       "plot " + ", \\\n     ".join(plot), 'unset logscale y', 'set ytics autofreq']

# Per op: libdsa's rate, the peer's and the same-run ceiling.
for tag, prefix, op, unit, ceil_key, ceil_name in [
        ("fwd", "fwd-", "sparse attention forward", "TFLOP/s", "gemm", "cuBLAS bf16 GEMM"),
        ("bwd", "bwd-", "sparse attention backward", "TFLOP/s", "gemm", "cuBLAS bf16 GEMM"),
        ("idx", "idx-", "indexer + top-k", "TFLOP/s", "gemm", "cuBLAS bf16 GEMM"),
        ("topk", "topk-", "top-k", "GB/s", "copy", "device copy")]:
    sel = [k for k in keys if k[0].startswith(prefix)]
    if not sel:
        continue
    ymax = 0.0
    plot = []
    for c, run in enumerate(runs):
        dat = os.path.join(tmp, "%s-%d.dat" % (tag, c))
        with open(dat, "w") as f:
            for i, k in enumerate(sel):
                r = run["rows"].get(k)
                if not r:
                    continue
                rate = num(r.get("gbps") if unit == "GB/s" else r.get("tflops"))
                peer = num(r.get("peer_rate"))
                if rate is None or peer is None:
                    continue
                ymax = max(ymax, rate, peer)
                f.write("%f\t%.6g\t%.6g\n" % (xpos(i, c), rate, peer))
        col = COLOURS[c % 5]
        plot += ['"%s" using 1:2 with boxes lc rgb "%s" title "libdsa: %s"' % (dat, col, who(run)),
                 '"%s" using 1:(0):(sprintf("%%.0f", $2)) with labels offset 0,0.8 font "sans,8" tc rgb "#ffffff" notitle' % dat,
                 '"%s" using 1:3 with points pt %d ps 1.5 lc rgb "#d62728" title "peer, %s"'
                 % (dat, PEER_PT[c % 5], run["card"])]
        ceil = num(run[ceil_key])
        if ceil is not None:
            ymax = max(ymax, ceil)
            plot.append('%f with lines lw 2 dt 2 lc rgb "%s" title "%s %s: %.0f %s"'
                        % (ceil, col, run["card"], ceil_name, ceil, unit))
    gp += ['set output "%s/bench-%s.png"' % (out, tag),
           'set title "%s: %s per shape and variant (bars: libdsa; points: its peer in the status table)"'
           % (op, unit),
           'set ylabel "%s"' % unit, 'set xrange [-0.6:%f]' % (len(sel) - 0.4),
           'set yrange [0:%f]' % (ymax * 1.12 if ymax > 0 else 1), xtics(sel),
           "plot " + ", \\\n     ".join(plot)]
open(os.path.join(tmp, "plot.gp"), "w").write("\n".join(gp) + "\n")
print("plot.sh: %d rows from %s" % (len(keys), ", ".join("%s %s" % (r["path"], who(r)) for r in runs)))
EOF
gnuplot "$tmp/plot.gp"
ls "$out"/bench-*.png
