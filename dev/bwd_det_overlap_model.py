#!/usr/bin/env python3
"""bwd_det_overlap_model.py - a check of the stream schedule of the deterministic backward's overlapped
chunk loop (-DDSA_BWD_DET_OVERLAP=R, cuda/attn_bwd/bwd_sm90_ws.cu ws_launch): the launches, event
records and waits that the loop issues on the call's stream S and the context's side stream X, for
1..12 chunks, turned into a happens-before graph and checked for every ordering the data needs.

    python3 dev/bwd_det_overlap_model.py [--chunks N] [--self-test]

The graph keeps only what CUDA documents, as a captured graph has it: each operation of a stream
depends on the one issued just before it on that stream, by that one's completion, except a kernel
launched with programmatic stream serialization (the main kernels of chunks 1..n-1, each right
after a reduction), which depends on the reduction's start (its CTAs allow the dependent launch at
entry) and not on its completion; the completion of such a kernel implies the reduction's only
because its last CTA executes griddepcontrol.wait (an edge from the reduction's completion to the
kernel's); a wait binds to the event's latest record issued before it (host order) and also
depends on that record. Nothing else is assumed transitive. A required order "A before B" holds when
A's completion reaches B's start in that graph.

Required, for every chunk c (regions c % 3: sort keys, offsets and ranks; buffers c % 2: contrib):
  - sort(c) before main(c) (ranks) and before red(c) (offsets); main(c) before red(c) (rows);
  - red(c - 1) before red(c) (acc: each kv row's sum in chunk order, the determinism);
  - every reader of region r or buffer b of an earlier chunk before the next writer of it (a sort
    into region r, a main kernel into buffer b), and a writer before the later chunk's readers;
  - every side-stream operation before the call's last operation (the join), and each wait bound to
    a record issued before it on a stream forked from S (what graph capture needs).

--self-test also builds seven broken schedules and requires each to be caught: two sort regions, one
contrib buffer, the reduction launched programmatically too, sorts three chunks ahead, no wait for
the sort before the reduction and main kernel, the side stream's sort without the ready handoff,
and main kernels whose last CTA does not wait for the reduction beside them.
"""
import argparse
import sys

MUTANTS = ("two_regions", "one_buffer", "red_pdl", "ahead3", "no_done_wait", "no_ready", "no_grid_wait")


class Sched:
    def __init__(self):
        self.ops = []  # (id, stream, kind, name, attrs)
        self.last_rec = {}  # event -> op id of its latest record
        self.edges = {}  # node -> set(nodes); nodes: ("s", id) start, ("d", id) done

    def _add(self, stream, kind, name, **a):
        i = len(self.ops)
        self.ops.append((i, stream, kind, name, a))
        return i

    def kernel(self, stream, name, pdl=False, grid_wait=False, **a):
        return self._add(stream, "kernel", name, pdl=pdl, grid_wait=grid_wait, **a)

    def record(self, stream, ev):
        i = self._add(stream, "record", "rec " + ev, ev=ev)
        self.last_rec[ev] = i
        return i

    def wait(self, stream, ev):
        return self._add(stream, "wait", "wait " + ev, ev=ev, bound=self.last_rec.get(ev))

    def graph(self):
        e = {}

        def edge(a, b):
            e.setdefault(a, set()).add(b)

        by_stream = {}
        for i, s, kind, name, a in self.ops:
            by_stream.setdefault(s, []).append(i)
        for s, ids in by_stream.items():
            for k, i in enumerate(ids):
                _, _, kind, _, a = self.ops[i]
                edge(("s", i), ("d", i))
                if k == 0:
                    continue
                prev = ids[k - 1]
                if kind == "kernel" and a["pdl"] and self.ops[prev][2] == "kernel":
                    edge(("s", prev), ("s", i))  # programmatic: the primary's start
                    if a["grid_wait"]:
                        edge(("d", prev), ("d", i))  # griddepcontrol.wait before the grid completes
                else:
                    edge(("d", prev), ("s", i))
                if kind == "wait" and a["bound"] is not None:
                    edge(("d", a["bound"]), ("s", i))
        self.edges = e
        self._reach = {}

    def reaches(self, a, b):
        if a not in self._reach:
            seen, st = {a}, [a]
            while st:
                n = st.pop()
                for m in self.edges.get(n, ()):
                    if m not in seen:
                        seen.add(m)
                        st.append(m)
            self._reach[a] = seen
        return b in self._reach[a]

    def before(self, a, b):
        return self.reaches(("d", a), ("s", b))


def build(n, mutant=None):
    """The host loop of ws_launch's overlap branch, op by op, for n chunks."""
    S, X = "S", "X"
    sc = Sched()
    nreg = 2 if mutant == "two_regions" else 3
    nbuf = 1 if mutant == "one_buffer" else 2
    ahead = 3 if mutant == "ahead3" else 2
    sorts, mains, reds = {}, {}, {}
    forked = [False]

    def sort_ahead(c, ready, done):
        if mutant != "no_ready":
            sc.record(S, ready)
            sc.wait(X, ready)
        forked[0] = True
        sorts[c] = sc.kernel(X, f"sort({c})", region=c % nreg)
        sc.record(X, done)

    def reduce(c):
        reds[c] = sc.kernel(S, f"red({c})", pdl=(mutant == "red_pdl" and c > 0), region=c % nreg, buf=c % nbuf)

    sorts[0] = sc.kernel(S, "sort(0)", region=0)
    if n > 1:
        sort_ahead(1, "ready1", "done1")
    for c in range(n):
        if c > 0:
            if mutant != "no_done_wait":
                sc.wait(S, f"done{c & 1}")
            reduce(c - 1)
        mains[c] = sc.kernel(S, f"main({c})", pdl=c > 0, grid_wait=mutant != "no_grid_wait", region=c % nreg,
                             buf=c % nbuf)
        if c + ahead < n:
            sort_ahead(c + ahead, f"ready{c & 1}", f"done{(c + ahead) & 1}")
    reds[n - 1] = sc.kernel(S, f"red({n - 1}) on every SM", pdl=mutant == "red_pdl", region=(n - 1) % nreg,
                            buf=(n - 1) % nbuf)
    if forked[0]:
        sc.record(X, "join")
        sc.wait(S, "join")
    fin = sc.kernel(S, "convert")
    sc.graph()
    return sc, sorts, mains, reds, fin


def check(n, mutant=None):
    sc, sorts, mains, reds, fin = build(n, mutant)
    errs = []

    def need(a, b, why):
        if a is None or b is None:
            errs.append(f"an operation is never issued: {why}")
        elif not sc.before(a, b):
            errs.append(f"{sc.ops[a][3]} not before {sc.ops[b][3]}: {why}")

    sorts = {c: sorts.get(c) for c in range(n)}

    nreg = 2 if mutant == "two_regions" else 3
    nbuf = 1 if mutant == "one_buffer" else 2
    for c in range(n):
        need(sorts[c], mains[c], "ranks")
        need(sorts[c], reds[c], "offsets")
        need(mains[c], reds[c], "rows")
        if c > 0:
            need(reds[c - 1], reds[c], "acc order")
    for c in range(n):
        for d in range(c + 1, n):
            if d % nreg == c % nreg:  # region reuse: chunk c's readers before chunk d's sort
                need(mains[c], sorts[d], "region reuse (ranks)")
                need(reds[c], sorts[d], "region reuse (offsets)")
                need(sorts[c], sorts[d], "region reuse (two sorts)")
            if d % nbuf == c % nbuf:  # buffer reuse: chunk c's reduction before chunk d's main kernel
                need(reds[c], mains[d], "buffer reuse")
    for i, s, kind, name, a in sc.ops:
        if s == "X":
            need(i, fin, "side stream joined")
        if kind == "wait" and a["bound"] is None:
            errs.append(f"{name}: no record issued before it")
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    bad = 0
    for n in range(1, args.chunks + 1):
        errs = check(n)
        if errs:
            bad += 1
            print(f"{n} chunks: {len(errs)} violations, first: {errs[0]}")
    if bad:
        print("FAIL: the schedule violates an ordering")
        return 1
    print(f"ok: 1..{args.chunks} chunks, every ordering holds")
    if args.self_test:
        for m in MUTANTS:
            caught = [n for n in range(1, args.chunks + 1) if check(n, m)]
            if not caught:
                print(f"FAIL: mutant {m} not caught")
                return 1
            print(f"mutant {m}: caught ({check(caught[0], m)[0]}, {caught[0]} chunks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
