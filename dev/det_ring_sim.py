#!/usr/bin/env python3
"""det_ring_sim.py - a timing model of part VII's deterministic backward through an L2 ring
(docs/bwd-sm90-v3.md; its protocol is model-checked by dev/det_ring_model.py): how long writers wait
for ring space, and how many rows are live in the ring, for a ring of S tile slots per CTA.

    python3 dev/det_ring_sim.py [--shape glm-4k|glm-32k] [--waves N] [--slots 2,3,4,6]
                                [--jitter F] [--owner-rows N] [--unsorted] [--seed S]

R = 132 CTAs, CTA c taking tokens first + c, first + c + R, ... (--waves waves from each of three
starting tokens: the dense causal rows, the middle and the end of the sequence). A token at global
position g has the keys 0..g if g + 1 <= K, else K keys drawn uniformly from 0..g (ascending, or in
random order with --unsorted). A tile (64 slots) takes 1 time unit x (1 + jitter * N(0, 1)); its rows
are stored at its end. Each CTA is also the owner of the keys k = c mod R: it adds an entry's row
once the row is stored and the previous entry of its key's list (ascending token, then slot) is
added, --owner-rows rows per time unit (a tile's time), one at a time, in the order they became
ready. Earlier tokens (before the simulated waves) count as added. A writer starts tile n only once
every row of tile n - S of its ring is added.

Printed per S: the makespan over the ideal (every CTA's tiles back to back, no ring), the writers'
wait as a share of their time, the peak and mean rows live in the ring (stored, not yet added) in
tile-steps of the grid (R x 64 rows = 19.5 MB at D = 576), and the owners' busy share.
"""
import argparse
import collections
import heapq
import random

R, TILE = 132, 64
SHAPES = {"glm-4k": (4096, 4096, 2048), "glm-32k": (4096, 32768, 2048)}  # T, T_kv, K


def rows_for(first, waves, T, T_kv, K, rng, unsorted):
    q_s = T_kv - T
    toks = [t for t in range(first, min(T, first + waves * R))]
    rows = {}
    for t in toks:
        g = q_s + t
        if g + 1 <= K:
            row = list(range(g + 1))
        else:
            row = sorted(rng.sample(range(g + 1), K))
        if unsorted:
            rng.shuffle(row)
        rows[t] = row
    return toks, rows


def simulate(toks, rows, S, jitter, owner_rate, rng):
    first = toks[0]
    # entry lists per key, (token, slot) ascending
    lists = {}
    for t in toks:
        for j, k in enumerate(rows[t]):
            lists.setdefault(k, []).append((t, j))
    nxt, prev = {}, {}  # (t, j) -> the next / previous entry of its key's list
    for k, e in lists.items():
        for a, b in zip(e, e[1:]):
            nxt[a], prev[b] = b, a
    stored, added = set(), set()
    ntiles = {t: (len(rows[t]) + TILE - 1) // TILE for t in toks}
    # per CTA: its token list, position, ring slot counts
    ctoks = {c: [t for t in toks if (t - first) % R == c] for c in range(R)}
    pos = {c: [0, 0] for c in range(R)}  # token index, tile
    need = {c: [0] * S for c in range(R)}
    done_cnt = {c: [0] * S for c in range(R)}
    slot_of = {}
    owner_q = {c: collections.deque() for c in range(R)}  # ready entries (FIFO)
    serving = {c: False for c in range(R)}
    owner_busy = {c: 0.0 for c in range(R)}
    blocked = {}  # c -> time it started waiting
    wait = {c: 0.0 for c in range(R)}
    busy_time = {c: 0.0 for c in range(R)}
    ev = []
    seq = [0]
    live, live_peak, live_area, last_t = [0], [0], [0.0], [0.0]

    def push(t, kind, data):
        seq[0] += 1
        heapq.heappush(ev, (t, seq[0], kind, data))

    def tick(now):
        live_area[0] += live[0] * (now - last_t[0])
        last_t[0] = now

    def start_tile(c, now):
        ti, n = pos[c]
        if ti == len(ctoks[c]):
            return
        s = n % S
        if done_cnt[c][s] < need[c][s]:
            blocked[c] = now
            return
        d = max(0.05, 1 + jitter * rng.gauss(0, 1))
        busy_time[c] += d
        push(now + d, "tile", c)

    def ready(e, now):
        k = rows[e[0]][e[1]]
        o = k % R
        owner_q[o].append(e)
        if not serving[o]:
            serve(o, now)

    def serve(o, now):
        serving[o] = bool(owner_q[o])
        if not owner_q[o]:
            return
        e = owner_q[o].popleft()
        owner_busy[o] += 1.0 / owner_rate
        push(now + 1.0 / owner_rate, "add", (o, e))

    for c in range(R):
        start_tile(c, 0.0)
    now = 0.0
    while ev:
        now, _, kind, data = heapq.heappop(ev)
        tick(now)
        if kind == "tile":
            c = data
            ti, n = pos[c]
            t = ctoks[c][ti]
            s = n % S
            js = range(n * TILE, min((n + 1) * TILE, len(rows[t])))
            need[c][s] += len(js)
            for j in js:
                e = (t, j)
                stored.add(e)
                slot_of[e] = (c, s)
                live[0] += 1
                p = prev.get(e)
                if p is None or p in added:
                    ready(e, now)
            live_peak[0] = max(live_peak[0], live[0])
            n += 1
            if n == ntiles[t]:
                ti, n = ti + 1, 0
            pos[c] = [ti, n]
            start_tile(c, now)
        else:
            o, e = data
            added.add(e)
            live[0] -= 1
            c, s = slot_of[e]
            done_cnt[c][s] += 1
            if c in blocked and done_cnt[c][pos[c][1] % S] >= need[c][pos[c][1] % S]:
                wait[c] += now - blocked.pop(c)
                start_tile(c, now)
            f = nxt.get(e)
            if f is not None and f in stored:
                ready(f, now)
            serve(o, now)
    return now, wait, busy_time, live_peak[0], live_area[0] / max(now, 1e-9), owner_busy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="glm-4k", choices=sorted(SHAPES))
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--slots", default="2,3,4,6")
    ap.add_argument("--jitter", type=float, default=0.05)
    ap.add_argument("--owner-rows", type=float, default=128.0)
    ap.add_argument("--unsorted", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    T, T_kv, K = SHAPES[a.shape]
    print(f"{a.shape}: R {R}, {a.waves} waves from tokens 0, T/2, T - waves R; jitter {a.jitter}, owner "
          f"{a.owner_rows:g} rows per tile time, rows {'unsorted' if a.unsorted else 'ascending'}")
    print(f"{'start':>6} {'S':>3} {'x ideal':>8} {'wait':>6} {'live peak':>10} {'live mean':>10} {'owner busy':>11}")
    for first in (0, T // 2, T - a.waves * R):
        rng = random.Random(a.seed)
        toks, rows = rows_for(first, a.waves, T, T_kv, K, rng, a.unsorted)
        for S in (int(x) for x in a.slots.split(",")):
            rng = random.Random(a.seed + S)
            span, wait, busy, peak, mean, ob = simulate(toks, rows, S, a.jitter, a.owner_rows, rng)
            ideal = max(busy.values())
            print(f"{first:>6} {S:>3} {span / ideal:>8.3f} {sum(wait.values()) / (R * span):>6.3f} "
                  f"{peak / (R * TILE):>10.2f} {mean / (R * TILE):>10.2f} {sum(ob.values()) / (R * span):>11.3f}")


if __name__ == "__main__":
    main()
