#!/usr/bin/env python3
"""merge_results.py - one run's JSON files (dsa_bench, cudnn_peer.py, ...) into one file.

    python3 bench/merge_results.py A.json B.json ... -o OUT.json [--sort]

Concatenates the rows in the order given (--sort: by the canonical shape order of
docs/perf.md's canonical shapes, files' order kept within a shape), warns when the files name different
cards, commits or dates (a ratio between two of them is not a same-run ratio), and prints a summary:
shape / variant / ms / peer / peer_ms / peer_ratio. A row whose peer was not measured in its own
process (older files' peers copied from another run: "peer_same_run" false or absent) shows its ratio
in parentheses. Each row gets "source" (the file it came from) unless it has one.
"""
import argparse
import json
import os
import sys

CANONICAL = [
    "fwd-v32-8k", "fwd-v32-32k", "fwd-v32-128k", "fwd-v32-8k-h64", "fwd-glm-4k", "fwd-glm-cp8",
    "fwd-tp-h8", "fwd-tp-h16", "fwd-tp-h32", "bwd-glm-4k", "bwd-glm-16k", "bwd-glm-32k",
    "bwd-tp-h16", "bwd-v32-8k", "idx-glm-4k", "idx-glm-cp8", "idx-32k", "idx-32k-h64",
    "topk-32k", "topk-128k", "train-glm-4k", "train-glm-cp8", "train-32k",
]


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def main():
    ap = argparse.ArgumentParser(description="concatenate the JSON rows of one run")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--sort", action="store_true", help="canonical shape order")
    a = ap.parse_args()

    rows = []
    for path in a.files:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict):  # tolerate {"rows": [...]}
            data = data.get("rows", [])
        if not isinstance(data, list):
            sys.exit(f"{path}: not a list of rows")
        for r in data:
            r.setdefault("source", os.path.basename(path))
        rows.extend(data)
        print(f"{path}: {len(data)} rows")

    for key in ("card", "commit", "date"):
        seen = sorted({str(r.get(key)) for r in rows})
        if len(seen) > 1:
            print(f"warning: the files differ in {key}: {', '.join(seen)}", file=sys.stderr)

    if a.sort:
        order = {s: i for i, s in enumerate(CANONICAL)}
        rows = [r for _, r in sorted(enumerate(rows), key=lambda ir: (
            order.get(ir[1].get("shape"), len(CANONICAL)), ir[0]))]

    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.out)

    print(f"\n{'shape':<14} {'variant':<18} {'ms':>8} {'peer_ms':>8} {'ratio':>8}  {'peer':<55} process")
    for r in rows:
        ratio = fmt(r.get("peer_ratio"), ".2f")
        if ratio != "-" and not r.get("peer_same_run", False):
            ratio = f"({ratio})"  # not a same-run ratio
        peer = r.get("peer") or "-"
        if r.get("peer_status") not in (None, "ok", "not run") and r.get("peer_ms") is None:
            peer = f"{peer} [{r['peer_status']}]"
        print(f"{str(r.get('shape')):<14} {str(r.get('variant')):<18} {fmt(r.get('ms'), '.3f'):>8} "
              f"{fmt(r.get('peer_ms'), '.3f'):>8} {ratio:>8}  {peer[:55]:<55} "
              f"{r.get('process', 'dsa_bench')}")
    print("ratio = peer_ms / ms (> 1: libdsa faster); (x) = not a same-run ratio")
    print(f"wrote {a.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
