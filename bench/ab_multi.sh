#!/usr/bin/env bash
# Same-run A/B of several builds of dsa_bench on one GPU, round-robin: every round runs each command
# once as its own process (each with its own loop of reps as dsa_bench times every row), in order;
# AB_ROUNDS rounds (default 2). Then one line per row: the first label's mean ms, every other
# label's ratio to it, and each label's mean peer ratio (FlashMLA's, when --flashmla is in the
# commands). bench/ab.sh is its two-label form.
#   bash bench/ab_multi.sh OUT SHAPES LABEL="CMD" [LABEL2="CMD2" ...]
# CMD is a dsa_bench command line without --shapes / --out (environment assignments allowed), e.g.
#   bash bench/ab_multi.sh /tmp/ab bwd-glm-4k base="build/bench/dsa_bench" n=".ab/n/build/bench/dsa_bench"
# Files: OUT/ab_<label>_<round>.json and .log, OUT/table.txt.
set -u
if [ $# -lt 3 ]; then sed -n 2,9p "$0"; exit 2; fi
OUT=$1 SHAPES=$2; shift 2
ROUNDS=${AB_ROUNDS:-2}
mkdir -p "$OUT"
t0=$(date +%s)
labels=()
for i in $(seq 1 "$ROUNDS"); do
  for v in "$@"; do
    l=${v%%=*} c=${v#*=}
    [ "$i" -eq 1 ] && labels+=("$l")
    env bash -c "$c --shapes $SHAPES --out $OUT/ab_${l}_$i.json" > "$OUT/ab_${l}_$i.log" 2>&1
    echo "$l round $i rc $? at $(( $(date +%s) - t0 )) s"
  done
done
python3 - "$OUT" "${labels[@]}" <<'PY' | tee "$OUT/table.txt"
import glob, json, statistics, sys
out, labels = sys.argv[1], sys.argv[2:]
def rows(label):
    acc = {}
    for f in sorted(glob.glob(f"{out}/ab_{label}_*.json")):
        d = json.load(open(f))
        for r in (d["rows"] if isinstance(d, dict) else d):
            if r.get("ms"):
                acc.setdefault((r["shape"], r.get("variant") or ""), []).append(r)
    return acc
acc = {l: rows(l) for l in labels}
keys = sorted(set.intersection(*(set(a) for a in acc.values())))
base = labels[0]
mean = lambda rs, f: statistics.mean(r[f] for r in rs)
print(f"{'shape / variant':40s} {base + ' ms':>11s} " + " ".join(f"{l + '/' + base:>10s}" for l in labels[1:])
      + "  peer ratio " + " / ".join(labels))
for k in keys:
    mb = mean(acc[base][k], "ms")
    peer = [[r["peer_ratio"] for r in acc[l][k] if r.get("peer_ratio")] for l in labels]
    ptxt = " / ".join(f"{statistics.mean(p):.3f}" for p in peer) if all(peer) else "-"
    print(f"{k[0] + ' / ' + k[1]:40s} {mb:11.4f} " + " ".join(f"{mean(acc[l][k], 'ms') / mb:10.4f}" for l in labels[1:])
          + "  " + ptxt)
PY
