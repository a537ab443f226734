#!/usr/bin/env bash
# Same-run A/B of two builds (or two settings) of dsa_bench on one GPU: the two commands run as
# separate processes, alternated A, B, A, B, ... (AB_ROUNDS rounds, default 2), each with its own
# loop of reps as dsa_bench times every row; then one line per row: the mean ms of A and of B, B / A,
# and the peer's (FlashMLA's) ratio in each when --flashmla is in the commands.
#   bash bench/ab.sh OUT SHAPES LABEL_A "CMD_A" LABEL_B "CMD_B"
# CMD is a dsa_bench command line without --shapes / --out, environment assignments allowed, e.g.
#   bash bench/ab.sh /tmp/ab fwd-glm-4k,bwd-glm-4k asc "DSA_X=1 /tmp/base/dsa_bench" new "build/bench/dsa_bench"
# Files: OUT/ab_<label>_<round>.json (dsa_bench's rows) and .log; set DSA_COMMIT in CMD for labels.
set -u
if [ $# -ne 6 ]; then sed -n 2,9p "$0"; exit 2; fi
OUT=$1 SHAPES=$2 LA=$3 CA=$4 LB=$5 CB=$6
ROUNDS=${AB_ROUNDS:-2}
mkdir -p "$OUT"
t0=$(date +%s)
for i in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    if [ $side = A ]; then l=$LA c=$CA; else l=$LB c=$CB; fi
    env bash -c "$c --shapes $SHAPES --out $OUT/ab_${l}_$i.json" > "$OUT/ab_${l}_$i.log" 2>&1
    echo "$l round $i rc $? at $(( $(date +%s) - t0 )) s"
  done
done
python3 - "$OUT" "$LA" "$LB" <<'PY'
import glob, json, statistics, sys
out, la, lb = sys.argv[1:4]
def rows(label):
    acc = {}
    for f in sorted(glob.glob(f"{out}/ab_{label}_*.json")):
        d = json.load(open(f))
        for r in (d["rows"] if isinstance(d, dict) else d):
            if r.get("ms"):
                acc.setdefault((r["shape"], r.get("variant") or ""), []).append(r)
    return acc
a, b = rows(la), rows(lb)
print(f"{'shape / variant':44s} {la + ' ms':>12s} {lb + ' ms':>12s} {lb + '/' + la:>8s}  peer ratio {la} / {lb}")
for k in sorted(set(a) & set(b)):
    ma = statistics.mean(r["ms"] for r in a[k]); mb = statistics.mean(r["ms"] for r in b[k])
    pa = [r["peer_ratio"] for r in a[k] if r.get("peer_ratio")]; pb = [r["peer_ratio"] for r in b[k] if r.get("peer_ratio")]
    peer = f"{statistics.mean(pa):.3f} / {statistics.mean(pb):.3f}" if pa and pb else "-"
    print(f"{k[0] + ' / ' + k[1]:44s} {ma:12.4f} {mb:12.4f} {mb / ma:8.4f}  {peer}")
PY
