#!/usr/bin/env python3
"""bwd_ws_model.py - a model check of the warp-specialised backward's barrier protocol
(attn_bwd_sm90_ws_kernel, cuda/attn_bwd/bwd_sm90_ws.cu): WG0 ("front": S, dP, P / dS to shared
memory, the gather of the next KV tile) and WG1 ("back": dQ's upper dims, the dKV chunks) over one
KV buffer, one P / dS pair and two idx buffers, handed over by the named barriers kBarPdSFull,
kBarPdSFree, kBarKVFree (both warpgroups) and kBarKV, kBarTgt (WG0), run under random
interleavings of every warp's next step and of the cp.async landings.

    python3 dev/bwd_ws_model.py [--runs N] [--seed S] [--self-test]

--self-test also runs eight broken protocols and requires each to be caught: P / dS stored before
kBarPdSFree, kBarKVFree arrived before WG1's dQ wait<0>, kBarPdSFree arrived before the last chunk's
wait<0>, the gather issued before kBarKVFree, no cp.async.wait_all before kBarKV, no
fence.proxy.async after the stmatrix, WG1's idx loads hoisted above kBarPdSFull, and kBarPdSFree
arrived on the last tile too.

Modelled: the 8 warps as thread groups (4 per warpgroup; the warps of a warpgroup are not in
lockstep), each with the kernel's steps from the prologue (Q / dO copies by all warps, gather(0) by
WG0, L' / Delta by warps 0, 1, cp.async.wait_all, fence, __syncthreads) through the tile loop, for
ntiles 0..4, D 512 / 576 (8 / 9 dKV chunks), with and without the slot target (kBarTgt, spart) and
in both modes (kDet: WG1 reads no idx). Named barriers count warps (256 threads = 8 arrivals); each
arrival names the phase it is meant for, the barrier's use count in the code. Shared memory per
writer warp: KV and idx[s] by WG0 warp w's rows (every 16-row group holds a row of each WG0 warp, so
every reader reads all four), P, dS and spart by WG0 warp w, Q / dO by all 8 warps, L' / Delta by
warps 0, 1. A write holds its tile tag; a cp.async write is in flight until its landing (an
event); a write reaches the other warps at the writer's next barrier operation (release) and the
async proxy at the writer's next fence.proxy.async, a copy only once it also follows the writer's
cp.async.wait_all. A wgmma reads its operands from its issue to the wgmma.wait_group<k> that
retires it (groups retire in order per warp); a plain load may be performed until the warp's next
barrier operation. The gathers' global loads, the reductions and the dq stores touch no shared
memory and are not modelled, nor are registers (the wgmma A / accumulator fences are per warp).

Checked on every run: every read sees its tile's data, landed, released and (for a wgmma) fenced; no
write or landing hits a region while another warp's read of it may be in flight; every arrival lands
in the phase it is meant for (no barrier is lapped, no two phases mix); no barrier is left
half-arrived, no copy in flight and no wgmma unretired at exit; no deadlock.
"""
import sys

from protocol_model import ModelError, main, run

NW = 4  # warps per warpgroup
MUTANTS = ("store_before_free", "kvfree_at_issue", "pdsfree_before_wait", "gather_before_kvfree",
           "no_cp_wait", "no_proxy_fence", "idx_before_full", "pdsfree_last")
KV = [("KV", q) for q in range(NW)]
IDX = [[("idx", s, q) for q in range(NW)] for s in (0, 1)]
P, DS, SPART = ([(n, q) for q in range(NW)] for n in ("P", "dS", "spart"))
QDO = [("QdO", i) for i in range(2 * NW)]


class NamedBar:
    """a named barrier over `count` warps: barrier.sync arrives and waits for the phase to complete,
    barrier.arrive arrives only; the count-th arrival completes the phase and resets the count. An
    arrival meant for another phase would join the current one on hardware: the phases mix."""

    def __init__(self, name, count):
        self.name, self.count, self.k, self.arrived = name, count, 0, set()

    def arrive(self, who, phase):
        if phase != self.k or who in self.arrived:
            raise ModelError(f"{self.name}: {who} arrives for phase {phase} in phase {self.k} "
                             f"({len(self.arrived)} of {self.count} arrived): the phases mix")
        self.arrived.add(who)
        if len(self.arrived) == self.count:
            self.k, self.arrived = self.k + 1, set()

    def passed(self, phase):
        return self.k > phase


class Region:
    """a piece of shared memory: the tile tag of its last write and that write's state"""
    __slots__ = ("tag", "by", "landed", "rel", "fen", "readers")

    def __init__(self):
        self.tag, self.by, self.landed, self.rel, self.fen, self.readers = None, None, True, True, True, set()


class Model:
    def __init__(self, ntiles, nbt, kdet, tgt, rng, mutant=None):
        self.nt, self.nbt, self.kdet, self.tgt, self.rng, self.mutant = ntiles, nbt, kdet, tgt, rng, mutant
        self.mem = {k: Region() for k in KV + IDX[0] + IDX[1] + P + DS + SPART + QDO + [("LD", 0), ("LD", 1)]}
        self.bar0 = NamedBar("__syncthreads", 2 * NW)
        self.full, self.free = NamedBar("kBarPdSFull", 2 * NW), NamedBar("kBarPdSFree", 2 * NW)
        self.kvfree = NamedBar("kBarKVFree", 2 * NW)
        self.kv, self.tg = NamedBar("kBarKV", NW), NamedBar("kBarTgt", NW)
        self.names = [f"wg{i // NW}.w{i % NW}" for i in range(2 * NW)]
        self.copies = [0] * (2 * NW)  # cp.async in flight per warp
        self.unwaited = [set() for _ in range(2 * NW)]  # this warp's copies before its cp.async.wait_all
        self.unrel = [set() for _ in range(2 * NW)]  # this warp's writes not yet released
        self.unfen = [set() for _ in range(2 * NW)]  # ... not yet fenced for the async proxy
        self.plain = [[] for _ in range(2 * NW)]  # this warp's plain loads not yet ordered
        self.groups = [[] for _ in range(2 * NW)]  # this warp's wgmma groups in flight: (label, keys)
        self.events = []
        self.procs = [self.wg0(w) for w in range(NW)] + [self.wg1(w) for w in range(NW)]

    # ---- memory ----
    def write(self, i, key, tag, copy=False):
        r, me = self.mem[key], self.names[i]
        busy = [x for x in r.readers if x != me]
        if busy or not r.landed:
            raise ModelError(f"{me}: writes {key} (tile {tag}) while {sorted(busy) or 'a copy'} may access it")
        r.tag, r.by, r.landed, r.rel, r.fen = tag, i, not copy, False, False
        self.unrel[i].add(key)
        self.unfen[i].add(key)
        if copy:
            self.copies[i] += 1
            self.unwaited[i].add(key)

            def land():
                if r.readers:
                    raise ModelError(f"{me}'s copy of {key} (tile {tag}) lands while {sorted(r.readers)} read it")
                r.landed = True
                self.copies[i] -= 1

            self.events.append((f"land {me} {key}", land))

    def read(self, i, key, tag, who, mma):
        """warp i's read; its own writes need no release (program order), a wgmma's need the fence"""
        r = self.mem[key]
        bad = (r.tag != tag and f"holds tile {r.tag}") or (not r.landed and "in flight") or \
              (not r.rel and r.by != i and "not released") or (mma and not r.fen and "not fenced for the async proxy")
        if bad:
            raise ModelError(f"{who}: reads {key} for tile {tag}: {bad}")
        r.readers.add(who)

    def load(self, i, keys, tag):
        """plain ld.shared: may be performed until this warp's next barrier operation"""
        for k in keys:
            self.read(i, k, tag, self.names[i], False)
        self.plain[i] += keys

    def mma(self, i, label, reads):
        """issue + commit of one wgmma group reading [(keys, tag)] until its wait"""
        who = f"{self.names[i]}.{label}"
        for keys, tag in reads:
            for k in keys:
                self.read(i, k, tag, who, True)
        self.groups[i].append((who, [k for keys, _ in reads for k in keys]))

    def wait_mma(self, i, k):
        """wgmma.wait_group<k>: all but the newest k groups retired"""
        yield ("step", None)
        while len(self.groups[i]) > k:
            who, keys = self.groups[i].pop(0)
            for key in keys:
                self.mem[key].readers.discard(who)

    def wait_all(self, i):
        """cp.async.wait_all: this warp's copies have landed and are ordered before its next steps"""
        yield ("wait", lambda: self.copies[i] == 0)
        self.unwaited[i].clear()

    def fence(self, i):
        """fence.proxy.async: this warp's waited writes become visible to the async proxy"""
        done = self.unfen[i] - self.unwaited[i]
        for k in done:
            self.mem[k].fen = True
        self.unfen[i] -= done

    def release(self, i):
        """a barrier operation: orders this warp's waited writes and its loads before it"""
        done = self.unrel[i] - self.unwaited[i]
        for k in done:
            self.mem[k].rel = True
        self.unrel[i] -= done
        for k in self.plain[i]:
            self.mem[k].readers.discard(self.names[i])
        self.plain[i] = []

    def arrive(self, i, bar, phase):
        self.release(i)
        bar.arrive(self.names[i], phase)

    def sync(self, i, bar, phase):
        self.arrive(i, bar, phase)
        yield ("wait", lambda: bar.passed(phase))

    def gather(self, w, n):
        """ws_gather(n) by WG0 warp w: cp.async of its KV rows, st.shared of its idx entries"""
        self.write(w, KV[w], n, copy=True)
        self.write(w, IDX[n & 1][w], n)

    def done(self, i):
        if self.copies[i] or self.groups[i]:
            raise ModelError(f"{self.names[i]} exits with {self.copies[i]} copies, "
                             f"{len(self.groups[i])} wgmma groups in flight")

    # ---- the prologue of every warp (the kernel body before the role split) ----
    def prologue(self, i):
        self.write(i, QDO[i], "pro", copy=True)  # bwd_sm90_load_q_do
        if i < NW:
            self.gather(i, 0)  # WG0's ws_gather of tile 0
        if i < 2:
            self.write(i, ("LD", i), "pro")  # bwd_sm90_load_lp_delta: threads 0..63
        yield from self.wait_all(i)
        self.fence(i)
        yield from self.sync(i, self.bar0, 0)  # the __syncthreads before the role split

    # ---- WG0 warp w: ws_front ----
    def wg0(self, w):
        nt, m = self.nt, self.mutant
        if nt > 0:
            yield from self.prologue(w)
            self.load(w, [("LD", w // 2)], "pro")  # L', Delta of rows 16 w .. 16 w + 15, before the tile loop
        for n in range(nt):
            s = n & 1
            if n > 0:  # KV(n) landed: cp.async.wait_all, fence, kBarKV
                if m != "no_cp_wait":
                    yield from self.wait_all(w)
                self.fence(w)
                yield from self.sync(w, self.kv, n - 1)
            self.mma(w, "SdP", [(KV, n), (QDO, "pro")])  # S, dP over all keys
            yield from self.wait_mma(w, 0)
            self.load(w, IDX[s], n)  # bwd_sm90_p_ds: every key's index
            if self.tgt:  # ws_target_tile
                self.write(w, SPART[w], n)
                yield from self.sync(w, self.tg, n)
                if w < 2:  # threads t < 64
                    self.load(w, SPART + IDX[s], n)
            yield ("step", None)
            self.mma(w, "dQ", [(KV, n)])  # RS dQ dims [0, 256)
            yield from self.wait_mma(w, 0)
            if m == "store_before_free":
                self.write(w, P[w], n)
                self.write(w, DS[w], n)
                yield ("step", None)
            if n > 0:
                yield from self.sync(w, self.free, n - 1)
            if m != "store_before_free":
                self.write(w, P[w], n)  # stmatrix
                self.write(w, DS[w], n)
            yield ("step", None)
            if m != "no_proxy_fence":
                self.fence(w)
            self.arrive(w, self.full, n)
            yield ("step", None)
            if n + 1 < nt:  # kBarKVFree, then ws_gather(n + 1)
                if m == "gather_before_kvfree":
                    self.gather(w, n + 1)
                    yield ("step", None)
                yield from self.sync(w, self.kvfree, n)
                if m != "gather_before_kvfree":
                    self.gather(w, n + 1)
                yield ("step", None)
        self.done(w)

    # ---- WG1 warp w: ws_back ----
    def wg1(self, w):
        nt, m, i = self.nt, self.mutant, NW + w
        if nt > 0:
            yield from self.prologue(i)
        for n in range(nt):
            s = n & 1
            if m == "idx_before_full" and not self.kdet:
                self.load(i, IDX[s], n)
                yield ("step", None)
            yield from self.sync(i, self.full, n)
            if m != "idx_before_full" and not self.kdet:
                self.load(i, IDX[s], n)  # sm90_lay1_key_rows: entries 16 w .. 16 w + 15
            yield ("step", None)
            self.mma(i, "dQ", [(DS, n), (KV, n)])  # SS dQ dims [256, D)
            yield ("step", None)
            if n + 1 < nt and m == "kvfree_at_issue":
                self.arrive(i, self.kvfree, n)
            yield from self.wait_mma(i, 0)
            if n + 1 < nt and m != "kvfree_at_issue":
                self.arrive(i, self.kvfree, n)
            for c in range(self.nbt):  # the dKV chunks, two accumulators
                self.mma(i, f"c{c}", [(DS, n), (QDO, "pro")] + ([(P, n)] if c < 8 else []))
                yield ("step", None)
                if c > 0:
                    yield from self.wait_mma(i, 1)  # then chunk c - 1's reductions (global)
            if n + 1 < nt and m == "pdsfree_before_wait":
                self.arrive(i, self.free, n)
            yield from self.wait_mma(i, 0)
            if (n + 1 < nt or m == "pdsfree_last") and m != "pdsfree_before_wait":
                self.arrive(i, self.free, n)
        self.done(i)

    def run(self):
        run(self.procs, self.events, self.rng)
        for bar in (self.bar0, self.full, self.free, self.kvfree, self.kv, self.tg):
            if bar.arrived:
                raise ModelError(f"{bar.name}: exit with phase {bar.k} half-arrived ({sorted(bar.arrived)})")


def correct(r, rng):
    nt, nbt, kdet, tgt = r % 5, 9 if r // 5 % 2 else 8, r // 10 % 2 == 1, r // 20 % 2 == 1
    return f"ntiles {nt}, D {64 * nbt}, kDet {kdet}, slot target {tgt}", Model(nt, nbt, kdet, tgt, rng)


if __name__ == "__main__":
    sys.exit(main("bwd_ws_model (ntiles 0..4, D 512 / 576, kDet, slot target)", 2000, correct, MUTANTS,
                  lambda r, rng, m: (m, Model(2 + r % 3, 9 if r % 2 else 8, False, r // 2 % 2 == 1, rng, m))))
