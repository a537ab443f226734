#!/usr/bin/env python3
"""status_table.py - the README's status table from complete runs only.

    python3 bench/status_table.py bench/results/*-full.json            # prints the table
    python3 bench/status_table.py --readme README.md bench/results/*-full.json   # rewrites it in place
    python3 bench/status_table.py --check README.md bench/results/*-full.json    # exit 1 if stale

Each file is one bench/full_run.sh run on one card (<date>-<card>-full.json). Per card the newest
run counts (by its rows' date, then by name); the table has one column per card, headed by the
card, the commit and the date it ran. For every canonical shape and variant that a peer measured in
the same process, a cell gives libdsa's time, the peer's and the ratio peer ms / libdsa ms (> 1:
libdsa faster). Rows without a same-run peer (the cuBLAS indexer engine, the mma engine, and so on)
stay out: their times are in the full files, like those of the shapes beyond the canonical ones
(bench/merge_results.py's CANONICAL). A canonical shape's row with a same-run peer whose variant is
not in ORDER is named on stderr, so that a new one is added to ORDER rather than lost.

--readme writes the table between the lines BEGIN and END of the file (below), keeping the rest;
bench/plot.sh draws the README's charts from the same selection (select()).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from merge_results import CANONICAL  # noqa: E402

BEGIN = "<!-- status-table begin: written by `make status` (bench/status_table.py); do not edit -->"
END = "<!-- status-table end -->"

# (shape, variant) in the table's order
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
    ("train-glm-4k", "target"), ("train-glm-cp8", "target"), ("train-32k", "target"),
    ("train-glm-4k", "det0"), ("train-glm-cp8", "det0"), ("train-32k", "det0"),
    ("train-glm-4k", "det1"), ("train-glm-cp8", "det1"), ("train-32k", "det1"),
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
    if "sparse_attn_score_recompute" in p:
        return "cuDNN score recompute (slot target)"
    if "indexer_backward_wrapper" in p:
        if r.get("variant", "").startswith("det1"):
            return "cuDNN indexer backward (non-deterministic: it has no deterministic mode)"
        return "cuDNN indexer backward, heads padded to 64"
    if "SparseAttentionBackward" in p:
        if r.get("variant", "").startswith("det1"):
            return "cuDNN (non-deterministic: it has no SM90 deterministic mode)"
        if "padded" in p:
            return "cuDNN, q padded to 64 heads"
        return "cuDNN"
    return p


def deterministic_vs_nondeterministic(r):
    """A deterministic libdsa row timed against a peer that has no deterministic mode."""
    return r["shape"].startswith(("bwd-", "train-")) and r.get("variant", "").startswith("det1")


def indices(shape, variant):
    if shape.startswith("train-"):
        return "from the indexer"
    if not shape.startswith("bwd-"):
        return ""
    if shape.startswith("bwd-v32"):
        return "random distinct"
    return "from the indexer" if "indexer" in variant else "uniform causal"


def load(path):
    """One full run: {card, commit, date, path, rows: {(shape, variant): row with a same-run peer}}."""
    with open(path) as f:
        d = json.load(f)
    rows = d["rows"] if isinstance(d, dict) else d
    best = {}
    for r in rows:
        if not r.get("peer_same_run") or not r.get("peer_ratio") or r.get("status") != "ok":
            continue
        # dsa_bench writes the fwd rows with FlashMLA beside them, cudnn_peer.py the bwd / idx /
        # topk rows with their peers (dsa_bench's rows of those shapes carry no peer)
        best[(r["shape"], r.get("variant") or "")] = r
    name = os.path.basename(path)
    card = next((r["card"] for r in rows if r.get("card")), name)
    dates = sorted({r["date"] for r in rows if r.get("date")}) or [name[:10]]
    commits = sorted({r["commit"] for r in rows if r.get("commit")}) or ["?"]
    ceil = lambda k: next((r[k] for r in rows if r.get("process") == "dsa_bench" and r.get(k)),
                          next((r[k] for r in rows if r.get(k)), None))
    return dict(card=card.replace("NVIDIA ", ""), commit=", ".join(commits), date=dates[-1], path=path,
                rows=best, gemm=ceil("gemm_ceiling_tflops"), copy=ceil("copy_ceiling_gbps"))


def select(paths):
    """(runs, keys): the newest run per card, cards in name order; the ORDER keys any run has."""
    newest = {}
    for p in paths:
        run = load(p)
        have = newest.get(run["card"])
        if have is None or (run["date"], os.path.basename(p)) > (have["date"], os.path.basename(have["path"])):
            newest[run["card"]] = run
    runs = [newest[c] for c in sorted(newest)]
    for run in runs:
        extra = sorted(k for k in run["rows"] if k not in ORDER and k[0] in CANONICAL)
        if extra:
            print("status_table.py: %s: canonical rows with a same-run peer not in ORDER (left out): %s"
                  % (run["path"], ", ".join("%s %s" % k for k in extra)), file=sys.stderr)
    keys = [k for k in ORDER if any(k in run["rows"] for run in runs)]
    return runs, keys


def table(paths):
    runs, keys = select(paths)
    out = ["| shape | variant | indices | peer | "
           + " | ".join("%s (%s, %s): libdsa ms / peer ms, ratio" % (r["card"], r["commit"], r["date"]) for r in runs)
           + " |",
           "|---|---|---|---|" + "---|" * len(runs)]
    for key in keys:
        have = [run["rows"].get(key) for run in runs]
        r0 = next(r for r in have if r)
        cells = [("%.3f / %.3f, **%.2fx**" % (r["ms"], r["peer_ms"], r["peer_ratio"])) if r else "-" for r in have]
        out.append("| %s | %s | %s | %s | " % (key[0], key[1], indices(*key), peer_name(r0)) + " | ".join(cells) + " |")
    out.append("")
    out.append("ratio = peer ms / libdsa ms (> 1: libdsa is faster). Runs:")
    out.append("")
    for r in runs:
        out.append("- %s: `%s`, commit %s, last run on a GPU %s" % (r["card"], r["path"], r["commit"], r["date"]))
    return "\n".join(out) + "\n"


def splice(readme, text):
    """README text with the block between BEGIN and END replaced by text."""
    with open(readme) as f:
        doc = f.read()
    b, e = doc.find(BEGIN), doc.find(END)
    if b < 0 or e < b:
        sys.exit("status_table.py: %s has no '%s' ... '%s' block" % (readme, BEGIN, END))
    return doc[:b] + BEGIN + "\n" + text + doc[e:]


def main(argv):
    mode = None
    if argv and argv[0] in ("--readme", "--check"):
        if len(argv) < 3:
            sys.exit(__doc__.strip())
        mode, readme, argv = argv[0], argv[1], argv[2:]
    paths = [p for p in argv if p.endswith("-full.json")]
    if not argv or len(paths) != len(argv):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit("status_table.py: give only complete runs (<date>-<card>-full.json)" if argv else 2)
    text = table(paths)
    if mode is None:
        sys.stdout.write(text)
        return
    new = splice(readme, text)
    with open(readme) as f:
        old = f.read()
    if mode == "--check":
        if new != old:
            sys.exit("status_table.py: %s's status table is not the one the full runs give: run `make status`" % readme)
        print("status_table.py: %s's status table is up to date" % readme)
    elif new != old:
        with open(readme, "w") as f:
            f.write(new)
        print("status_table.py: rewrote the status table of %s" % readme)
    else:
        print("status_table.py: %s's status table is up to date" % readme)


if __name__ == "__main__":
    main(sys.argv[1:])
