#!/usr/bin/env python3
"""topk_bisect_model.py - an emulation of the bisection top-k (tkb_kernel in cuda/topk/topk_filter.cu,
the launches whose rows all have at most 4096 columns) against the contract's selection (the K
largest keys, ties to the smaller column, ascending output; NaN below -inf, -0 == +0).

    python3 dev/topk_bisect_model.py [ROWS]

Per row: the kernel's thread layout (column t + 256 u), the min / max skip of the common high bits,
the bit-by-bit count of keys matching the prefix with the early stop when they are exactly the keys
still needed, and the emit's positions (taken outright: >= a lower bound; T*'s ties by column).
Rows: random, three-valued, constant, specials (NaN, +-inf, +-0, denormals, +-FLT_MAX), random bit
patterns, tiny negatives; lengths 2..4096, K from 1 to L - 1. Prints the bisection steps of random
rows of 2049..4096 columns.
"""
import random, struct, sys
NT, KPT = 256, 16
def tk_key(f):
    u = struct.unpack('<I', struct.pack('<f', f))[0]
    if f != f: return 0
    if u == 0x80000000: u = 0
    return (~u & 0xffffffff) if (u & 0x80000000) else (u | 0x80000000)
def reference(keys, k):
    order = sorted(range(len(keys)), key=lambda c: (-keys[c], c))
    return sorted(order[:k])
def bisect(keys, k):
    L = len(keys)
    # thread layout: column c = tid + NT*u
    valid = [c < L for c in range(NT*KPT)]
    key = [keys[c] if c < L else 0 for c in range(NT*KPT)]
    vk = [key[c] for c in range(L)]
    kmn, kmx = min(vk), max(vk)
    x = kmn ^ kmx
    b = (x.bit_length() - 1) if x else -1
    prefix = 0 if b == 31 else (((kmx >> (b + 1)) << (b + 1)) if b >= 0 else kmx)
    rem, nmatch = k, L
    steps = 0
    while b >= 0:
        if nmatch == rem: break
        cand = prefix | (1 << b)
        hm = (0xffffffff << b) & 0xffffffff
        # as the kernel: no validity test here (past the row key is 0, which no candidate matches)
        c1 = sum(1 for c in range(NT*KPT) if (key[c] & hm) == cand)
        steps += 1
        if c1 >= rem: prefix, nmatch = cand, c1
        else: rem -= c1; nmatch -= c1
        b -= 1
    if nmatch == rem: gt_lo, teq, need_eq = prefix, prefix, 0
    else: gt_lo, teq, need_eq = prefix + 1, prefix, rem
    count_gt = k - need_eq
    # emit: order (u, warp, lane) == column order; positions by exclusive counts
    out = [None] * k
    gb = eb = 0
    for c in range(NT*KPT):   # u-major, then tid: c = tid + NT*u ascending == plain ascending
        if not valid[c]: continue
        g = key[c] >= gt_lo
        e = (not g) and key[c] == teq
        if g or (e and eb < need_eq):
            pos = gb + min(eb, need_eq)
            assert out[pos] is None
            out[pos] = c
        gb += g; eb += e
    assert gb == count_gt, (gb, count_gt)
    assert None not in out
    return out, steps
def f32(x): return struct.unpack('<f', struct.pack('<f', x))[0]
rng = random.Random(7)
special = [float('nan'), float('inf'), -float('inf'), 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]
tot_steps = []; n = 0
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 600
for it in range(ROWS):
    L = rng.choice([2, 3, 65, 100, 2049, 3000, 4095, 4096, rng.randint(2, 4096)])
    k = rng.choice([1, L - 1, max(1, L // 2), min(2048, L - 1), rng.randint(1, L - 1)])
    kind = it % 6
    if kind == 0: row = [f32(rng.random()) for _ in range(L)]
    elif kind == 1: row = [f32(rng.choice([0.5, 0.25, 1.0])) for _ in range(L)]
    elif kind == 2: row = [f32(7.0)] * L
    elif kind == 3: row = [rng.choice(special) if rng.random() < 0.3 else f32(rng.gauss(0, 10)) for _ in range(L)]
    elif kind == 4: row = [f32(struct.unpack('<f', struct.pack('<I', rng.getrandbits(32)))[0]) for _ in range(L)]
    else: row = [f32(-rng.random() * 1e-3) for _ in range(L)]
    keys = [tk_key(v) for v in row]
    got, steps = bisect(keys, k)
    want = reference(keys, k)
    if got != want:
        print("MISMATCH", it, L, k, kind); sys.exit(1)
    if kind == 0 and L >= 2049: tot_steps.append(steps)
    n += 1
print(f"bisect model: {n} rows match the reference (ties by column, NaN, +-0, +-inf, constant rows); "
      f"random rows of 2049..4096 columns: {min(tot_steps)}..{max(tot_steps)} steps, mean {sum(tot_steps)/len(tot_steps):.1f}")
