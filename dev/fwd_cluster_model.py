#!/usr/bin/env python3
"""fwd_cluster_model.py - a model check of the 64-head forward's cluster share (-DDSA_FWD_CLUSTER_SHARE=1,
cuda/attn_fwd/fwd_sm90_h64.cu): the synchronisation protocol of its two CTAs, run under random
interleavings of every thread group's next step and of the asynchronous copies' completions.

    python3 dev/fwd_cluster_model.py [--runs N] [--seed S] [--self-test]

--self-test also runs four broken protocols and requires each to be caught: sP0 written without
the ack, empties that count only the local consumers, a push issued before its rows landed, and
no final push drain.

Modelled per CTA (rank 0 and 1): the mbarriers full[w][h], empty[w][h], landed[q], ack, and the
four consumer hand-offs (M0, M1, S0, S1 named barriers: a count of posts per pair); the producer as
warp 0 (gathers its rows, pushes landed refills, thread 0's arrival carries expect_tx) and warps
1..3; the cp.async landings per group and the pushes as events that complete later; WG0 and WG1
with the kernel's order of waits, reads and releases; at D = 576 sP0 in block 8 of buffer 0.
Memory is tracked per region (CTA, buffer, half, piece of 32 rows, block 8 or the rest) with the
tile whose data it holds, and per reader interval.

Checked on every run: every read sees its tile's data in both pieces; no write (a landing, a push,
sP0) hits a region while a consumer reads it or while a push reads it as its source; every
arrival and completion lands in the phase it is meant for (no barrier is lapped); every wait is
for the phase it means; the run ends with every group done (no deadlock).
"""
import sys

from protocol_model import Bar, ModelError, main, run

ORDER = [(0, 0), (1, 1), (0, 1), (1, 0)]  # refill order: 0 L, 1 R, 0 R, 1 L (q = n % 4)


class _Sink:
    """absorbs the remote arrivals of a protocol that has none"""

    class _Any:
        def arrive(self, *a, **k):
            pass

    def __init__(self):
        self.empty = {wh: self._Any() for wh in ORDER}


class Cta:
    def __init__(self, rank, nb, mutant=None):
        self.rank = rank
        self.full = {wh: Bar(f"cta{rank}.full{wh}", 256) for wh in ORDER}
        self.empty = {wh: Bar(f"cta{rank}.empty{wh}", 128 if mutant == "local_empty" else 132) for wh in ORDER}
        self.landed = [Bar(f"cta{rank}.landed{q}", 128) for q in range(4)]
        self.ack = Bar(f"cta{rank}.ack", 1)
        self.hand = {n: 0 for n in ("M0", "M1", "S0", "S1")}  # posts so far
        # region -> tile tag; regions (w, h, piece, part) with part 'main' or 'b8' (block 8, 0 R, D = 576)
        self.mem = {}
        self.readers = {}  # region -> set of reader names
        self.src_busy = {}  # region -> number of pushes reading it
        for w, h in ORDER:
            for p in (0, 1):
                self.mem[(w, h, p, "main")] = None
                if nb == 9 and (w, h) == (0, 1):
                    self.mem[(w, h, p, "b8")] = None


class Model:
    def __init__(self, npairs, nb, rng, mutant=None):
        self.npairs, self.nb, self.rng, self.mutant = npairs, nb, rng, mutant
        self.ctas = [Cta(0, nb, mutant), Cta(1, nb, mutant)]
        self.events = []  # pending async completions: (name, fn)
        self.procs = []
        for c in (0, 1):
            self.procs += [self.producer(c, warp0=True), self.producer(c, warp0=False), self.wg0(c), self.wg1(c)]

    # ---- memory ----
    def regions(self, c, w, h, piece=None):
        pieces = (0, 1) if piece is None else (piece,)
        return [r for r in self.ctas[c].mem if r[0] == w and r[1] == h and r[2] in pieces]

    def write(self, c, region, tag, who):
        cta = self.ctas[c]
        if cta.readers.get(region):
            raise ModelError(f"{who}: writes cta{c}{region} while {sorted(cta.readers[region])} read it")
        if cta.src_busy.get(region):
            raise ModelError(f"{who}: writes cta{c}{region} while a push reads it")
        cta.mem[region] = tag

    def read_begin(self, c, regs, tag, who):
        cta = self.ctas[c]
        for r in regs:
            if cta.mem[r] != tag:
                raise ModelError(f"{who}: reads cta{c}{r} for {tag}, holds {cta.mem[r]}")
            cta.readers.setdefault(r, set()).add(who)

    def read_end(self, c, regs, who):
        for r in regs:
            self.ctas[c].readers[r].discard(who)

    # ---- processes: generators yielding a predicate (a wait) before each step; a step runs when the
    # scheduler picks an enabled process ----
    def producer(self, c, warp0):
        cta, peer = self.ctas[c], self.ctas[c ^ 1]
        name = f"cta{c}.prod{'W0' if warp0 else 'W123'}"
        group_n = 32 if warp0 else 96
        npush = [0]

        def push_one():
            n = npush[0]
            w, h = ORDER[n % 4]
            tile = 2 * (n // 4) + w
            src = self.regions(c, w, h, piece=c)
            for r in src:
                if cta.mem[r] != tile:
                    raise ModelError(f"{name}: pushes cta{c}{r} for tile {tile}, holds {cta.mem[r]}")
                cta.src_busy[r] = cta.src_busy.get(r, 0) + 1
                self.write(c ^ 1, r, ("partial", tile), f"push cta{c}->cta{c ^ 1} (issue)")
            phase = n // 4

            def land():
                for r in src:
                    if cta.mem[r] != tile:
                        raise ModelError(f"push of tile {tile}: source cta{c}{r} changed to {cta.mem[r]}")
                    cta.src_busy[r] -= 1
                    self.write(c ^ 1, r, tile, f"push cta{c}->cta{c ^ 1}")
                peer.full[(w, h)].complete_tx(len(src), phase)

            self.events.append((f"push cta{c} n{n}", land))
            npush[0] += 1

        def can_push(issued):
            n = npush[0]
            early = self.mutant == "push_early"
            return warp0 and n < issued and (early or cta.landed[n % 4].done(n // 4))

        for i in range(self.npairs):
            for k, (w, h) in enumerate(ORDER):
                n = 4 * i + k
                # wait for a free half; warp 0 pushes landed refills meanwhile (any number, in order)
                while True:
                    yield ("wait", lambda: cta.empty[(w, h)].free(i) or can_push(n))
                    if can_push(n) and (not cta.empty[(w, h)].free(i) or self.rng.random() < 0.5):
                        push_one()
                        continue
                    if cta.empty[(w, h)].free(i):
                        break
                tile = 2 * i + w
                own = self.regions(c, w, h, piece=c)
                for r in own:  # the copies write from their issue on
                    self.write(c, r, ("partial", tile), f"{name} issue")

                def landing(own=own, tile=tile, w=w, h=h, n=n, i=i):
                    for r in own:
                        self.write(c, r, tile, f"{name} landing")
                    cta.full[(w, h)].arrive(group_n, i)       # cp.async .noinc
                    cta.landed[n % 4].arrive(group_n, i)

                self.events.append((f"{name} land n{n}", landing))
                # plain arrivals (mask bytes); thread 0 (warp 0) with expect_tx of the peer's piece
                cta.full[(w, h)].arrive(group_n, i, tx=len(own) if warp0 else 0)
                yield ("step", None)
        if warp0 and self.mutant != "no_drain":
            while npush[0] < 4 * self.npairs:
                yield ("wait", lambda: can_push(4 * self.npairs))
                push_one()

    def remote_empty(self, c):
        """the CTA whose empties this CTA's consumers arrive on remotely (a sink when they do not)"""
        if self.mutant == "local_empty":
            return _Sink()
        return self.ctas[c ^ 1]

    def hand_post(self, c, n):
        self.ctas[c].hand[n] += 1

    def hand_done(self, c, n, i):
        return self.ctas[c].hand[n] >= i + 1

    def wg0(self, c):
        cta = self.ctas[c]
        name = f"cta{c}.WG0"
        if self.npairs == 0:
            return
        L00, R01 = self.regions(c, 0, 0), self.regions(c, 0, 1)
        L10 = self.regions(c, 1, 0)
        b8 = [r for r in R01 if r[3] == "b8"]
        # S(0)
        yield ("wait", lambda: cta.full[(0, 0)].done(0))
        self.read_begin(c, L00, 0, name)
        yield ("wait", lambda: cta.full[(0, 1)].done(0))
        self.ctas[c ^ 1].ack.arrive(1, 0) if self.nb == 9 else None
        self.read_begin(c, R01, 0, name)
        yield ("step", None)
        for i in range(self.npairs):
            self.read_end(c, R01, name)  # S(2i) complete: 0 R (blocks 4.., block 8) no longer read by WG0
            self.hand_post(c, "M0")
            yield ("step", None)  # RS PV over 0 L
            self.read_end(c, L00, name)
            cta.empty[(0, 0)].arrive(128, i)
            self.remote_empty(c).empty[(0, 0)].arrive(4, i)
            yield ("wait", lambda: self.hand_done(c, "M1", i))
            if self.nb == 9:
                if self.mutant != "no_ack_wait":
                    yield ("wait", lambda: cta.ack.done(i))
                for r in b8:
                    self.write(c, r, ("sP0", i), name)
            self.hand_post(c, "S0")
            yield ("wait", lambda: self.hand_done(c, "S1", i))
            self.read_begin(c, L10, 2 * i + 1, name)  # SS PV: sP1 and V1 0..255 (1 L)
            if i + 1 < self.npairs:
                yield ("wait", lambda: cta.full[(0, 0)].done(i + 1))
                self.read_begin(c, L00, 2 * i + 2, name)  # S(2i + 2) half L
                yield ("step", None)
                self.read_end(c, L10, name)  # the SS PV retired
                cta.empty[(1, 0)].arrive(128, i)
                self.remote_empty(c).empty[(1, 0)].arrive(4, i)
                yield ("wait", lambda: cta.full[(0, 1)].done(i + 1))
                if self.nb == 9:
                    self.ctas[c ^ 1].ack.arrive(1, i + 1)
                self.read_begin(c, R01, 2 * i + 2, name)
                yield ("step", None)
            else:
                yield ("step", None)
                self.read_end(c, L10, name)
                cta.empty[(1, 0)].arrive(128, i)
                self.remote_empty(c).empty[(1, 0)].arrive(4, i)

    def wg1(self, c):
        cta = self.ctas[c]
        name = f"cta{c}.WG1"
        R11, L10 = self.regions(c, 1, 1), self.regions(c, 1, 0)
        R01 = self.regions(c, 0, 1)
        R01_v = [r for r in R01 if r[3] == "main"]
        b8 = [r for r in R01 if r[3] == "b8"]
        for i in range(self.npairs):
            yield ("wait", lambda: cta.full[(1, 1)].done(i))
            self.read_begin(c, R11, 2 * i + 1, name)
            yield ("wait", lambda: cta.full[(1, 0)].done(i))
            self.read_begin(c, L10, 2 * i + 1, name + "S")
            yield ("step", None)
            self.read_end(c, L10, name + "S")  # S(2i + 1) complete (WG0's SS PV reads 1 L on)
            yield ("wait", lambda: self.hand_done(c, "M0", i))
            self.hand_post(c, "M1")
            self.hand_post(c, "S1")  # sP1 written (its own tile: not modelled)
            yield ("wait", lambda: self.hand_done(c, "S0", i))
            # SS PV: sP0 (block 8 at D = 576) and V0 256..511 (0 R without block 8)
            self.read_begin(c, R01_v, 2 * i, name)
            self.read_begin(c, b8, ("sP0", i), name)
            yield ("step", None)
            self.read_end(c, R11, name)  # the RS PV retired
            cta.empty[(1, 1)].arrive(128, i)
            self.remote_empty(c).empty[(1, 1)].arrive(4, i)
            yield ("step", None)
            self.read_end(c, R01_v + b8, name)
            cta.empty[(0, 1)].arrive(128, i)
            self.remote_empty(c).empty[(0, 1)].arrive(4, i)

    def run(self):
        run(self.procs, self.events, self.rng)


if __name__ == "__main__":
    sys.exit(main("fwd_cluster_model (npairs 0..4, D 512 / 576)", 4000,
                  lambda r, rng: (f"npairs {r % 5}, D {64 * (9 if r % 2 else 8)}", Model(r % 5, 9 if r % 2 else 8, rng)),
                  ("no_ack_wait", "local_empty", "push_early", "no_drain"),
                  lambda r, rng, m: (m, Model(1 + r % 4, 9, rng, m))))
