#!/usr/bin/env python3
"""det_ring_model.py - a model check of the deterministic backward through an L2 ring proposed in
docs/bwd-sm90-v3.md part VII: R persistent CTAs, CTA c taking tokens c, c + R, c + 2R, ... in
order; each stores its tile's per-slot fp32 rows into its own ring of S tile slots and publishes how
many tiles of its current token are stored; key k's rows are summed by its owner, CTA k mod R, in the
order of the sorted entry list (ascending token, then slot: the order of today's deterministic
reduction, bwd_det_reduce_row in cuda/attn_bwd/bwd_common.cuh), each entry as soon as its tile is
published; after adding a row the owner counts it consumed on the writer's ring slot, and a writer
reuses a slot only once every row of the tile it held is consumed. Owners work in the time their CTA
waits for ring space and, a bounded amount, after each tile.

    python3 dev/det_ring_model.py [--runs N] [--seed S] [--self-test]

Each run draws R (1-5), S (1-4), tokens, rows (keys over a small key range, ascending in 70% of the
runs and in random order in the rest, with duplicates, -1 slots and empty rows; 0-4 tiles of 4
slots) and a random interleaving of the CTAs' steps. Checked: every row an owner reads is the one its entry names (stored and published, not yet
overwritten); every key's rows are added exactly once, in sorted-list order, so acc's bits equal a
sequential sum over ascending (token, slot) whatever R, S and the timing; no deadlock.

--self-test requires each broken protocol to be caught: the tile count published before its rows
are stored (publish_before_store), a slot reused without waiting for its rows' consumption
(no_ring_wait), an owner that blocks on the first entry of its lowest unfinished key instead of
moving on (blocking_owner), and a writer that waits for ring space without doing owner work
(no_owner_in_wait).

Why no order of the rows can deadlock it: a CTA starts its next token only after storing every tile
of the current one, so every token below the lowest token in flight is stored whole; an entry of that
lowest token follows in its key's list only entries of lower tokens (stored, and by the same argument
consumable) and of itself (earlier slots: stored before it), so the CTA that holds it can always free
its oldest slot. Ascending rows matter for speed only: they keep the keys of the tiles in flight a
narrow window, so few rows wait in the ring for a predecessor.
"""
import sys

from protocol_model import ModelError, main, run

TILE = 4  # slots per tile in the model (64 in the kernel)
MUTANTS = ("publish_before_store", "no_ring_wait", "blocking_owner", "no_owner_in_wait")


class Model:
    def __init__(self, rng, mutant=None):
        self.rng, self.mutant = rng, mutant
        self.R = rng.randint(1, 5)
        self.S = rng.randint(1, 4)
        self.T = rng.randint(1, 3 * self.R + 2)
        self.nkeys = rng.randint(1, 12)
        self.sorted = rng.random() < 0.7
        self.rows = [self.draw_row() for _ in range(self.T)]
        # the sorted entry list per key: (token, slot), ascending token then slot (a stable sort by key)
        self.entries = {k: [] for k in range(self.nkeys)}
        for t, row in enumerate(self.rows):
            for j, k in enumerate(row):
                if k >= 0:
                    self.entries[k].append((t, j))
        self.cursor = {k: 0 for k in range(self.nkeys)}
        self.acc = {k: [] for k in range(self.nkeys)}
        self.ring = [[None] * self.S for _ in range(self.R)]  # ring[c][s]: {slot: (token, slot)} or None
        self.pending = [[None] * self.S for _ in range(self.R)]  # rows stored, not yet visible
        self.published = [(-1, 0)] * self.R  # (token, tiles stored) per CTA, as visible to others
        self.consumed = [[0] * self.S for _ in range(self.R)]  # rows consumed per ring slot (cumulative)
        self.need = [[0] * self.S for _ in range(self.R)]  # rows written per ring slot (cumulative)
        self.owned = [[k for k in range(self.nkeys) if k % self.R == o] for o in range(self.R)]
        self.budget = rng.randint(0, 3)  # owner entries a CTA adds after each tile

    def draw_row(self):
        n = self.rng.randint(0, 4 * TILE)
        keys = sorted(self.rng.randrange(self.nkeys) for _ in range(n))
        if not self.sorted:
            self.rng.shuffle(keys)
        # -1 slots (invalid) anywhere: they carry no row and no entry
        return [-1 if self.rng.random() < 0.15 else k for k in keys]

    def tiles(self, t):
        return (len(self.rows[t]) + TILE - 1) // TILE

    def stored(self, t, j):
        """the writer of token t has published the tile holding slot j"""
        tok, n = self.published[t % self.R]
        return tok > t or (tok == t and n > j // TILE)

    def step_entry(self, k):
        """adds key k's next entry if its tile is published; True if it did"""
        e = self.entries[k]
        i = self.cursor[k]
        if i == len(e) or not self.stored(*e[i]):
            return False
        t, j = e[i]
        c, s = t % self.R, (j // TILE) % self.S
        got = self.ring[c][s].get(j) if self.ring[c][s] is not None else None
        if got != (t, j):
            raise ModelError(f"owner of key {k} read ring[{c}][{s}] slot {j} = {got}, wanted {(t, j)}")
        self.acc[k].append((t, j))
        self.cursor[k] = i + 1
        self.consumed[c][s] += 1
        return True

    def owner_can(self, o):
        keys = [k for k in self.owned[o] if self.cursor[k] < len(self.entries[k])]
        if self.mutant == "blocking_owner":
            keys = keys[:1]
        return any(self.stored(*self.entries[k][self.cursor[k]]) for k in keys)

    def owner_step(self, o):
        """one entry of CTA o's owned keys (the lowest key that can move)"""
        keys = [k for k in self.owned[o] if self.cursor[k] < len(self.entries[k])]
        if self.mutant == "blocking_owner":
            keys = keys[:1]
        for k in keys:
            if self.step_entry(k):
                return True
        return False

    def cta(self, c):
        for t in range(c, self.T, self.R):
            for n in range(self.tiles(t)):
                s = n % self.S
                # the slot is free once every row of the tile it held was consumed
                while self.mutant != "no_ring_wait" and self.consumed[c][s] < self.need[c][s]:
                    if self.mutant != "no_owner_in_wait" and self.owner_can(c):
                        yield ("step", None)
                        self.owner_step(c)
                    else:
                        yield ("wait", lambda: self.consumed[c][s] >= self.need[c][s]
                               or (self.mutant != "no_owner_in_wait" and self.owner_can(c)))
                yield ("step", None)
                rows = {j: (t, j) for j in range(n * TILE, min((n + 1) * TILE, len(self.rows[t])))
                        if self.rows[t][j] >= 0}
                self.need[c][s] += len(rows)
                if self.mutant == "publish_before_store":
                    self.published[c] = (t, n + 1)
                    yield ("step", None)
                    self.ring[c][s] = rows
                else:
                    self.pending[c][s] = rows  # st.global by WG1, not yet ordered before the flag
                    yield ("step", None)
                    self.ring[c][s] = self.pending[c][s]  # bar.sync + fence.acq_rel.gpu
                    yield ("step", None)
                    self.published[c] = (t, n + 1)  # st.release.gpu of (token, tiles stored)
                for _ in range(self.budget):
                    if not self.owner_can(c):
                        break
                    yield ("step", None)
                    self.owner_step(c)
        # after its last token: the CTA's owned keys to the end
        while any(self.cursor[k] < len(self.entries[k]) for k in self.owned[c]):
            yield ("wait", lambda: self.owner_can(c))
            self.owner_step(c)

    def run(self):
        run([self.cta(c) for c in range(self.R)], [], self.rng)
        for k in range(self.nkeys):
            if self.acc[k] != self.entries[k]:
                raise ModelError(f"key {k}: rows added as {self.acc[k]}, sorted order {self.entries[k]}")

    def what(self):
        return (f"R {self.R} S {self.S} T {self.T} keys {self.nkeys} budget {self.budget} "
                f"rows {'ascending' if self.sorted else 'unsorted'}")


def correct(r, rng):
    m = Model(rng)
    return m.what(), m


def broken(r, rng, mutant):
    m = Model(rng, mutant)
    return m.what(), m


if __name__ == "__main__":
    sys.exit(main("det_ring_model (R 1..5, S 1..4, rows of 0..4 tiles)", 2000, correct, MUTANTS, broken))
