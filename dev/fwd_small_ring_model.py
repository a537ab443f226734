#!/usr/bin/env python3
"""fwd_small_ring_model.py - a model check of the small-H forward's block ring
(cuda/attn_fwd/fwd_sm90_small.cu, N <= 32; at N = 24 / 32 and D = 576 P lives in the RoPE block and
that block comes last): the synchronisation of its producer WG and its consumer WG over one KV
stage whose 64-column blocks are refilled one by one, run under random interleavings of every
thread group's next step, of the cp.async landings and of the wgmma retirements.

    python3 dev/fwd_small_ring_model.py [--runs N] [--seed S] [--self-test]

--self-test also runs six broken protocols and requires each to be caught: value blocks released
when their P V is issued instead of retired, the RoPE block released before S^T retired, one mask
buffer instead of two, empties completed by one warp's arrival, a landing group's .noinc arrival
after its first block instead of its last, and P in the RoPE block with the order and release of
the ring without P there (RoPE block first, freed after S^T).

Modelled: the mbarriers full[3] (landing groups {ord 0}, {1 .. NB - 5}, {NB - 4 .. NB - 1} of the
order RoPE block first, then value blocks 0..7, or blocks 0..8 with P in the RoPE block; full[0]
also counts the plain arrivals that release the mask) and empty[NB] (one arrival per consumer warp); the producer as two thread groups (each
owning half of every block's rows and of the mask bytes), whose cp.async copies land as independent
events and whose .noinc arrivals fire once every earlier copy of the group landed; the consumer as
four warps: per tile S^T by landing group (a warp's read of a block from its wgmma issue to its
wait), the RoPE block released after S^T's wait, the softmax reading the tile's mask, the OR and P
barriers (named barriers of the 4 warps), P written per warp (into the RoPE block when it lives
there), P V in 8 commit groups retiring in order per warp, each value block released after its
group's wait, and the RoPE block holding P after the last.

Checked on every run: every read of a block sees the tile's data in both halves and every mask
read the tile's mask; no landing, copy issue or mask write hits a block or a mask while a warp
reads it; no P write while any warp's P V may read P; every arrival lands in the phase it is meant
for (no barrier is lapped); the run ends with every group done (no deadlock).
"""
import sys

from protocol_model import Bar, ModelError, main, run

NW = 4  # consumer warps
NPG = 2  # producer thread groups
MUTANTS = ("release_at_issue", "rope_early", "one_mask", "one_warp_empty", "noinc_first")
MUTANTS_RL = ("p_rope_early",)  # P in the RoPE block, with the order and release of the ring without P there


def ring_block(nb, o, rl=False):
    return (8 if o == 0 else o - 1) if nb > 8 and not rl else o


def ring_group(nb, o):
    return 0 if o == 0 else 1 if o <= nb - 5 else 2


def group_first(nb, o):
    return o in (0, 1, nb - 4)


def group_last(nb, o):
    return o in (0, nb - 5, nb - 1)


class Model:
    def __init__(self, ntiles, nb, rng, mutant=None, rl=False):
        self.ntiles, self.nb, self.rng, self.mutant = ntiles, nb, rng, mutant
        self.rl = rl and nb > 8  # P in the RoPE block (N = 24 / 32): the RoPE block comes last
        self.order_rl = self.rl and mutant != "p_rope_early"
        self.full = [Bar(f"full{g}", 128 + (128 if g == 0 else 0)) for g in range(3)]
        self.empty = [Bar(f"empty{b}", 1 if mutant == "one_warp_empty" else NW) for b in range(nb)]
        self.mem = {(b, q): None for b in range(nb) for q in range(NPG)}  # block half -> tile tag
        self.mask = {(k, q): None for k in range(2) for q in range(NPG)}
        self.readers = {}  # block -> set of reader names
        self.p_readers = set()  # warps whose P V may still read P
        self.bars = {}  # (name, tile) -> warps arrived
        self.events = []
        self.inflight = {q: [] for q in range(NPG)}  # copies issued, not landed: ids
        self.next_copy = 0
        self.procs = [self.producer(q) for q in range(NPG)] + [self.warp(w) for w in range(NW)]

    # ---- memory ----
    def write_block(self, b, q, tag, who):
        if self.readers.get(b):
            raise ModelError(f"{who}: writes block {b} while {sorted(self.readers[b])} read it")
        self.mem[(b, q)] = tag

    def read_begin(self, blocks, tag, who):
        for b in blocks:
            for q in range(NPG):
                if self.mem[(b, q)] != tag:
                    raise ModelError(f"{who}: reads block {b} for tile {tag}, half {q} holds {self.mem[(b, q)]}")
            self.readers.setdefault(b, set()).add(who)

    def read_end(self, blocks, who):
        for b in blocks:
            self.readers[b].discard(who)

    def bar_post(self, name, n, w):
        self.bars.setdefault((name, n), set()).add(w)

    def bar_done(self, name, n):
        return len(self.bars.get((name, n), ())) == NW

    # ---- producer thread group q ----
    def producer(self, q):
        nb = self.nb
        name = f"prod{q}"
        for n in range(self.ntiles):
            for o in range(nb):
                b = ring_block(nb, o, self.order_rl)
                yield ("wait", lambda b=b, n=n: self.empty[b].free(n))
                # the copies write the block half from their issue on
                self.write_block(b, q, ("partial", n), f"{name} issue")
                cid = self.next_copy
                self.next_copy += 1
                self.inflight[q].append(cid)

                def land(b=b, n=n, cid=cid):
                    self.write_block(b, q, n, f"{name} landing")
                    self.inflight[q].remove(cid)

                self.events.append((f"land {name} n{n} b{b}", land))
                last = group_last(nb, o) if self.mutant != "noinc_first" else group_first(nb, o)
                if last:
                    g = ring_group(nb, o)
                    before = list(self.inflight[q])

                    def noinc(g=g, n=n, before=before):
                        self.full[g].arrive(64, n)

                    # fires once every copy this group issued so far landed
                    self.events.append((f"noinc {name} n{n} g{g}", noinc, lambda before=before, q=q: not any(
                        c in self.inflight[q] for c in before)))
                if o == 0:
                    k = 0 if self.mutant == "one_mask" else n & 1
                    self.mask[(k, q)] = n
                    self.full[0].arrive(64, n)  # plain arrivals: release the mask bytes
                yield ("step", None)

    # ---- consumer warp w ----
    def warp(self, w):
        nb = self.nb
        name = f"warp{w}"
        for n in range(self.ntiles):
            # S^T by landing group
            for o in range(nb):
                if group_first(nb, o):
                    g = ring_group(nb, o)
                    yield ("wait", lambda g=g, n=n: self.full[g].done(n))
                self.read_begin([ring_block(nb, o, self.order_rl)], n, name + "S")
                yield ("step", None)
            yield ("step", None)  # S^T retires: wait_group 0
            rope = [8] if nb > 8 else []
            if self.mutant == "rope_early" and rope:
                self.empty[8].arrive(1, n)
                yield ("step", None)
            self.read_end(range(nb), name + "S")
            rope_now = not self.rl or self.mutant == "p_rope_early"  # the RoPE block freed after S^T
            if rope and rope_now and self.mutant != "rope_early" and (self.mutant != "one_warp_empty" or w == 0):
                self.empty[8].arrive(1, n)
            yield ("step", None)
            # softmax: the tile's mask, the OR barrier (every warp's previous P V retired before it)
            k = 0 if self.mutant == "one_mask" else n & 1
            for q in range(NPG):
                if self.mask[(k, q)] != n:
                    raise ModelError(f"{name}: reads the mask of tile {n}, buffer {k} half {q} holds {self.mask[(k, q)]}")
            self.bar_post("max", n, w)
            yield ("wait", lambda n=n: self.bar_done("max", n))
            if self.p_readers:
                raise ModelError(f"{name}: writes P({n}) while the P V of {sorted(self.p_readers)} may read P")
            if self.rl:  # this warp's keys of P(n), every head, into the RoPE block
                for q in range(NPG):
                    self.write_block(8, q, ("P", n), f"{name} P")
                yield ("step", None)
            self.bar_post("p", n, w)
            yield ("wait", lambda n=n: self.bar_done("p", n))
            # P V: 8 commit groups issued back to back, retiring in order; block m freed after group m
            for m in range(8):
                self.read_begin([m], n, f"{name}PV{m}")
                if self.mutant == "release_at_issue":
                    self.empty[m].arrive(1, n)
            self.p_readers.add(name)
            if self.rl:
                self.read_begin([8], ("P", n), f"{name}PVP")
            for m in range(8):
                yield ("step", None)  # wait_group<7 - m>: group m retired
                self.read_end([m], f"{name}PV{m}")
                if self.mutant != "release_at_issue" and (self.mutant != "one_warp_empty" or w == 0):
                    self.empty[m].arrive(1, n)
            self.p_readers.discard(name)
            if self.rl:
                self.read_end([8], f"{name}PVP")
                if self.mutant != "p_rope_early" and (self.mutant != "one_warp_empty" or w == 0):
                    self.empty[8].arrive(1, n)

    def run(self):
        run(self.procs, self.events, self.rng)


if __name__ == "__main__":
    sys.exit(main("fwd_small_ring_model (ntiles 0..5, D 512 / 576, P in the RoPE block or not)", 3000,
                  lambda r, rng: (f"ntiles {r % 6}, D {64 * (9 if r % 2 else 8)}, P in RoPE {r % 4 == 3}",
                                  Model(r % 6, 9 if r % 2 else 8, rng, rl=r % 4 == 3)),
                  MUTANTS + MUTANTS_RL,
                  lambda r, rng, m: (m, Model(2 + r % 4, 9, rng, m, rl=m in MUTANTS_RL or r % 2 == 1))))
