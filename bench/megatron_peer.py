#!/usr/bin/env python3
"""megatron_peer.py - a Megatron-Core DSA layer on libdsa against the same layer on Megatron-Core
0.16.1's unfused reference, in one process on the same inputs and weights (examples/megatron_layer.py
builds both from Megatron's spec and checks them against each other first).

Per shape two rows: op "megatron-dsa-fwd" (the training forward: indexer, top-k, attention, indexer
loss) and "megatron-dsa-step" (that forward and the backward), variant "libdsa", the peer
"megatron-unfused" timed in the same run (median of --reps, CUDA events around each call, each
implementation its own loop after two warm-up steps), with both peak allocations and the largest
relative difference of the compared fields (out, loss, dq, dkv, indexer gradients).

  python3 bench/megatron_peer.py [--shapes meg-4k,meg-2k-b2] [--reps N] [--out FILE] [--commit C]

Shapes (GLM-5's attention: 64 heads, 32 index heads, qk_head_dim 192, q_lora 2048, hidden 6144):
  meg-4k      sq 4096, b 1, topk 2048
  meg-2k-b2   sq 2048, b 2, topk 1024
Megatron's reference holds [b, np, sq, sk] fp32 scores (4 GiB each at meg-4k); both fit an 80 GB card.
"""
import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {"meg-4k": dict(seq=4096, batch=1, topk=2048), "meg-2k-b2": dict(seq=2048, batch=2, topk=1024)}


def load_example():
    path = os.path.join(HERE, "..", "examples", "megatron_layer.py")
    spec = importlib.util.spec_from_file_location("megatron_layer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def versions():
    """megatron-core's version and the Hadamard transform its rotation used."""
    import megatron.core
    from megatron.core.transformer.experimental_attention_variant import dsa
    from libdsa import megatron as M
    had = ("libdsa.megatron.hadamard_transform (torch)" if dsa.hadamard_transform is M.hadamard_transform
           else "fast_hadamard_transform")
    return megatron.core.__version__, had


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None, help="the commit to record (default: git rev-parse of this checkout)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("megatron_peer: no CUDA device, nothing timed")
        return 0
    ex = load_example()
    card = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = a.commit or subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    out = a.out or os.path.join(HERE, "results", f"{date}-{card.replace(' ', '-')}-megatron.json")
    rows = []
    for name in a.shapes.split(","):
        s = SHAPES[name]
        args = ex.parse(["--seq", str(s["seq"]), "--batch", str(s["batch"]), "--topk", str(s["topk"]),
                         "--heads", "64", "--index-heads", "32", "--hidden", "6144", "--q-lora", "2048",
                         "--qk-head-dim", "192", "--time", "--reps", str(a.reps)])
        res = ex.run_case(args, torch.device("cuda"))
        diff = max(res["diffs"].values())
        version, hadamard = versions()
        for what in ("fwd", "step"):
            lib, ref = res[f"libdsa_{what}_ms"], res[f"megatron_{what}_ms"]
            rows.append(dict(
                shape=name, op=f"megatron-dsa-{what}", variant="libdsa", ms=round(lib, 4), peer="megatron-unfused",
                peer_ms=round(ref, 4), peer_same_run=True, peer_ratio=round(ref / lib, 3),
                peer_max_rel_diff=diff, peak_mib=round(res["libdsa_peak_mib"]),
                peer_peak_mib=round(res["megatron_peak_mib"]), process="megatron_peer",
                note=f"sq {s['seq']}, b {s['batch']}, np 64, index heads 32, topk {s['topk']}; megatron-core "
                     f"{version}; Hadamard: {hadamard}",
                reps=a.reps, card=card, commit=commit, date=date,
                status="ok" if all(d <= ex.TOLERANCE[f] for f, d in res["diffs"].items()) else "mismatch"))
            print(f"{name:10s} {what:5s} libdsa {lib:9.3f} ms  megatron {ref:9.3f} ms  ({ref / lib:6.1f}x)  "
                  f"max rel diff {diff:.3g}", flush=True)
        torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
