"""cp_layer.py - one DSA layer split over R ranks by context parallelism, checked against one rank.

    torchrun --nproc-per-node 2 examples/cp_layer.py            # R GPUs, NCCL
    python3 examples/cp_layer.py --ranks 2 --device cpu         # R processes on the CPU, gloo

Each rank holds two chunks of the packed sequence (the zig-zag split causal masking wants: rank r
owns chunks r and 2R - 1 - r of 2R, so every rank gets the same number of visible keys), its
queries' and its keys' rows alike. Per step it all-gathers index_k and kv into global storage order,
plans each of its chunks as a context-parallel query range, runs indexer top-k, the sparse forward
and backward, and reduce-scatters dkv to the ranks that own those keys (dsink is summed over all
ranks). docs/context-parallel.md explains the wiring. With --check, rank 0 also runs the whole
sequence alone and compares: indices, lengths, out, lse and dq must be bitwise equal (each query
row is computed from the same keys by the same code), dkv and dsink within bf16 tolerance (R
partial sums instead of one).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import libdsa


def zigzag_chunks(T: int, R: int, rank: int):
    """The (start, count) of rank's two chunks: chunk r and chunk 2R - 1 - r of 2R equal chunks."""
    assert T % (2 * R) == 0, f"T = {T} must be a multiple of 2R = {2 * R}"
    c = T // (2 * R)
    return [(rank * c, c), ((2 * R - 1 - rank) * c, c)]


def make_inputs(seed: int, docs, H: int, H_idx: int = 4, D: int = 576):
    """The whole sequence's tensors, the same on every rank (each rank then keeps its rows)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.rand(*s, generator=g, dtype=torch.float64) * 2 - 1).to(torch.bfloat16)
    cu = torch.tensor([0] + torch.tensor(docs).cumsum(0).tolist(), dtype=torch.int32)
    T = int(cu[-1])
    return dict(cu=cu, T=T, H=H, D=D, index_q=r(T, H_idx, 128), index_k=r(T, 128),
                weights=(torch.rand(T, H_idx, generator=g) - 0.5) * (H_idx * 128) ** -0.5,
                q=r(T, H, D), kv=r(T, D), dout=r(T, H, 512), sink=torch.rand(H, generator=g) * 2 - 1)


def layer(x, rows, key_rows_of_rank, rank, R, K, device, deterministic, group=None):
    """One rank's step. rows: its (start, count) query chunks; key_rows_of_rank[r]: the global key
    rows rank r holds (here the same positions as its queries). Returns its outputs and gradients."""
    dev = lambda t: t.to(device)
    mine = torch.cat([torch.arange(s, s + n) for s, n in rows])
    # all-gather the keys each rank holds, then put them in global storage order
    def gather_keys(local):
        if R == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(R)]
        dist.all_gather(parts, local.contiguous(), group=group)
        full = torch.empty((x["T"],) + tuple(local.shape[1:]), dtype=local.dtype, device=local.device)
        for r, part in enumerate(parts):
            full[key_rows_of_rank[r].to(local.device)] = part
        return full
    index_k = gather_keys(dev(x["index_k"][key_rows_of_rank[rank]]))
    kv = gather_keys(dev(x["kv"][key_rows_of_rank[rank]])).requires_grad_()
    # plan and score each chunk: a context-parallel query range of the packed sequence
    idx, lengths = [], []
    for s, n in rows:
        plan = libdsa.plan(x["cu"], x["T"], query_start=s, num_queries=n, device=device)
        i, l = libdsa.indexer_topk(dev(x["index_q"][s:s + n]), index_k, dev(x["weights"][s:s + n]), plan, K)
        idx.append(i)
        lengths.append(l)
    idx, lengths = torch.cat(idx), torch.cat(lengths)
    q = dev(x["q"][mine]).requires_grad_()
    sink = dev(x["sink"]).clone().requires_grad_()  # a leaf of its own (.to may return x's tensor)
    out, lse = libdsa.sparse_attention(q, kv, idx, x["D"] ** -0.5, topk_length=lengths, attn_sink=sink,
                                       deterministic=deterministic, return_lse=True)
    out.backward(dev(x["dout"][mine]))
    # dkv: every rank holds a partial sum over its queries for every key; sum them (in fp32) and give
    # each rank the rows it owns. dsink: a partial sum over this rank's queries.
    dkv, dsink = kv.grad.float(), sink.grad.clone()
    if R > 1:
        dist.all_reduce(dkv, group=group)  # a reduce-scatter of the owner-ordered rows does the same
        dist.all_reduce(dsink, group=group)
    dkv_mine = dkv[key_rows_of_rank[rank].to(dkv.device)].to(torch.bfloat16)
    return dict(idx=idx, lengths=lengths, out=out.detach(), lse=lse, dq=q.grad, dkv=dkv_mine, dsink=dsink)


def run(rank, R, args):
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank % torch.cuda.device_count()}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    x = make_inputs(args.seed, args.docs, args.heads)
    chunks = [zigzag_chunks(x["T"], R, r) for r in range(R)]
    key_rows = [torch.cat([torch.arange(s, s + n) for s, n in chunks[r]]) for r in range(R)]
    res = layer(x, chunks[rank], key_rows, rank, R, args.topk, device, args.deterministic)
    report = {}
    if args.check:
        # the same layer on one rank over the whole sequence (every rank checks its own rows)
        one = layer(x, [(0, x["T"])], [torch.arange(x["T"])], 0, 1, args.topk, device, args.deterministic)
        mine = key_rows[rank]
        for name in ("idx", "lengths", "out", "lse", "dq"):
            report[name] = bool(torch.equal(res[name].cpu(), one[name][mine.to(one[name].device)].cpu()))
        for name, ref in (("dkv", one["dkv"][mine.to(one["dkv"].device)]), ("dsink", one["dsink"])):
            a, b = res[name].double().cpu(), ref.double().cpu()
            report[name] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    return report


def _worker(rank, R, args, port, results):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo" if args.device == "cpu" else "nccl", rank=rank, world_size=R)
    try:
        results[rank] = run(rank, R, args)
    finally:
        dist.destroy_process_group()


def spawn(R, args, port=29517):
    """R processes on this host (gloo on the CPU, NCCL on GPUs); returns every rank's check report."""
    import torch.multiprocessing as mp
    with mp.Manager() as m:
        results = m.dict()
        mp.spawn(_worker, args=(R, args, port, results), nprocs=R, join=True)
        return dict(results)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=0, help="spawn this many processes (0: torchrun's world)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--docs", type=int, nargs="+", default=[20, 28, 16], help="real document lengths")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--check", action="store_true", help="compare with the whole sequence on one rank")
    return ap.parse_args(argv)


def main():
    args = parse()
    if args.ranks:
        reports = spawn(args.ranks, args)
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
        reports = {dist.get_rank(): run(dist.get_rank(), dist.get_world_size(), args)}
        dist.destroy_process_group()
    for rank in sorted(reports):
        print(f"rank {rank}: {reports[rank]}")
    ok, line = verdict(reports, args.check)
    print(line)
    sys.exit(0 if ok else 1)


def verdict(reports, checked, tol=1e-2):
    """One line on what was checked: every exact field equal and dkv / dsink within tol (relative to
    their largest element) on every rank; without --check, that nothing was compared."""
    if not checked:
        return True, (f"ran the layer on {len(reports)} rank(s); nothing compared "
                      "(--check compares every rank with the whole sequence on one rank)")
    bad = []
    for rank in sorted(reports):
        for name, v in reports[rank].items():
            if (v is not True) if isinstance(v, bool) else not (v <= tol):
                bad.append(f"rank {rank} {name}={v}")
    if bad:
        return False, "FAIL: " + ", ".join(bad)
    return True, (f"PASS: {len(reports)} rank(s) match one rank over the whole sequence "
                  f"(idx, lengths, out, lse, dq bitwise; dkv, dsink within {tol:g} relative)")


if __name__ == "__main__":
    main()
