#!/usr/bin/env python3
"""status_table.py - the README's status table from complete runs only.

    python3 bench/status_table.py bench/results/DATE-CARD-full.json [MORE-full.json ...]

Each file is one bench/full_run.sh run on one card. For every canonical shape and variant that a
peer measured in the same process, the table gives per card libdsa's time, the peer's and the ratio
peer ms / libdsa ms (> 1: libdsa faster); one column per card. Rows without a same-run peer (the
cuBLAS indexer engine, the mma engine, and so on) stay out: their times are in the full files.
"""
import json
import os
import sys

# (shape, variant) in the table's order, with the op and the peer as the table names them
ORDER = [
    ("fwd-v32-8k", "sink"), ("fwd-v32-32k", "sink"), ("fwd-v32-128k", "sink"), ("fwd-v32-8k-h64", "sink"),
    ("fwd-glm-4k", "topk_length"), ("fwd-glm-cp8", "topk_length"),
    ("fwd-tp-h8", "topk_length"), ("fwd-tp-h16", "topk_length"), ("fwd-tp-h32", "topk_length"),
    ("bwd-glm-4k", "det0"), ("bwd-glm-16k", "det0"), ("bwd-glm-32k", "det0"), ("bwd-tp-h16", "det0"),
    ("bwd-tp-h16", "det0,peer-pad64"), ("bwd-v32-8k", "det0"),
    ("bwd-glm-4k", "det0,indexer"), ("bwd-glm-16k", "det0,indexer"), ("bwd-glm-32k", "det0,indexer"),
    ("bwd-tp-h16", "det0,indexer"),
    ("bwd-glm-4k", "det1"), ("bwd-glm-16k", "det1"), ("bwd-glm-32k", "det1"), ("bwd-tp-h16", "det1"),
    ("bwd-v32-8k", "det1"),
    ("bwd-glm-4k", "det1,indexer"), ("bwd-glm-16k", "det1,indexer"), ("bwd-glm-32k", "det1,indexer"),
    ("bwd-tp-h16", "det1,indexer"),
    ("idx-glm-4k", "default"), ("idx-glm-cp8", "default"), ("idx-32k", "default"), ("idx-32k-h64", "default"),
    ("topk-32k", "causal"), ("topk-32k", "causal,peer-det"), ("topk-32k", "full"),
    ("topk-128k", "causal"), ("topk-128k", "causal,peer-det"), ("topk-128k", "full"),
]


def peer_name(r):
    p = r.get("peer") or ""
    if "FlashMLA" in p:
        return "FlashMLA" + (" (heads padded to 64)" if r["shape"].startswith("fwd-tp") else "")
    if "deterministic=True" in p:
        return "cuDNN IndexerTopK, deterministic"
    if "IndexerTopK" in p and "indexer_forward" in p:
        return "cuDNN indexer + IndexerTopK"
    if "IndexerTopK" in p:
        return "cuDNN IndexerTopK"
    if "torch.topk" in p:
        return "torch.topk"
    if "SparseAttentionBackward" in p:
        if r.get("variant", "").startswith("det1"):
            return "cuDNN (non-deterministic: it has no SM90 deterministic mode)"
        if "padded" in p:
            return "cuDNN, q padded to 64 heads"
        return "cuDNN"
    return p


def indices(shape, variant):
    if not shape.startswith("bwd-"):
        return ""
    if shape.startswith("bwd-v32"):
        return "random distinct"
    return "from the indexer" if "indexer" in variant else "uniform causal"


def load(path):
    d = json.load(open(path))
    rows = d["rows"] if isinstance(d, dict) else d
    best = {}
    for r in rows:
        if not r.get("peer_same_run") or not r.get("peer_ratio") or r.get("status") != "ok":
            continue
        key = (r["shape"], r.get("variant") or "")
        # cudnn_peer.py's row is the peer's same-process measurement for bwd / idx / topk; dsa_bench's
        # for fwd: keep the one that has the peer
        best[key] = r
    rows0 = rows[0] if rows else {}
    card = (rows0.get("card") or os.path.basename(path)).replace("NVIDIA ", "")
    commits = sorted({r.get("commit") for r in rows if r.get("commit")})
    return card, commits, best


def main(paths):
    cards = [load(p) for p in paths]
    print("| shape | variant | indices | peer | " + " | ".join(f"{c[0]}: libdsa ms / peer ms, ratio" for c in cards) + " |")
    print("|---|---|---|---|" + "---|" * len(cards))
    for key in ORDER:
        have = [c[2].get(key) for c in cards]
        if not any(have):
            continue
        r0 = next(r for r in have if r)
        cells = []
        for r in have:
            cells.append(f"{r['ms']:.3f} / {r['peer_ms']:.3f}, **{r['peer_ratio']:.2f}x**" if r else "-")
        print(f"| {key[0]} | {key[1]} | {indices(*key)} | {peer_name(r0)} | " + " | ".join(cells) + " |")
    print()
    for p, c in zip(paths, cards):
        print(f"- {c[0]}: `{p}` (commit {', '.join(c[1])})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip())
        sys.exit(2)
    main(sys.argv[1:])
