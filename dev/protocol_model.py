"""protocol_model.py - what the kernels' protocol models share (dev/fwd_small_ring_model.py,
dev/bwd_ws_model.py): an mbarrier with its phases, the scheduler that runs thread groups
(generators) and asynchronous completions in a random interleaving, and the command line that runs
the correct protocol many times and each broken one until it is caught.

A thread group is a generator yielding ("step", None) before each step or ("wait", pred) before a
wait that may proceed once pred() is true. An event is (name, fn) or (name, fn, ready): fn runs at
a random moment (once ready() is true), as a copy's landing or an arrival fired by hardware.
"""
import argparse
import random


class ModelError(Exception):
    pass


class Bar:
    """an mbarrier: `count` arrivals (and tx bytes, when expected) complete a phase"""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.k = name, count, count, 0, 0

    def arrive(self, n, phase, tx=0):
        if phase != self.k:
            raise ModelError(f"{self.name}: arrival meant for phase {phase} in phase {self.k}")
        self.pending -= n
        self.tx += tx
        if self.pending < 0:
            raise ModelError(f"{self.name}: more arrivals than its count in phase {self.k}")
        self._complete()

    def complete_tx(self, b, phase):
        if phase != self.k:
            raise ModelError(f"{self.name}: bytes meant for phase {phase} in phase {self.k}")
        self.tx -= b
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.k += 1
            self.pending = self.count

    def done(self, phase):
        """wait(parity phase & 1) meaning phase `phase`: true once it completed"""
        if self.k > phase + 1:
            raise ModelError(f"{self.name}: waiter for phase {phase} lapped (phase {self.k})")
        return self.k == phase + 1

    def free(self, use):
        """a producer's empty wait before its use-th fill (parity (use & 1) ^ 1)"""
        return use == 0 or self.done(use - 1)


def run(procs, events, rng):
    """runs the thread groups and the events (a list the steps may append to) to the end in a random
    interleaving; ModelError on a deadlock"""
    live = []
    for p in procs:
        try:
            live.append([p, next(p)])
        except StopIteration:
            pass
    while live or events:
        enabled = [x for x in live if x[1][0] == "step" or x[1][1]()]
        ready = [e for e in events if len(e) == 2 or e[2]()]
        choices = len(enabled) + len(ready)
        if choices == 0:
            raise ModelError("deadlock: " + ", ".join(str(x[0].gi_frame.f_lineno) for x in live))
        pick = rng.randrange(choices)
        if pick < len(enabled):
            x = enabled[pick]
            try:
                x[1] = next(x[0])
            except StopIteration:
                live.remove(x)
        else:
            e = ready[pick - len(enabled)]
            events.remove(e)
            e[1]()


def main(name, runs, correct, mutants, broken):
    """correct(run, rng) and broken(run, rng, mutant) build a model and return (what, model);
    model.run() raises ModelError on a violation. Returns the exit status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    what = ""
    for r in range(a.runs):
        what, model = correct(r, rng)
        try:
            model.run()
        except ModelError as e:
            print(f"run {r} ({what}): {e}")
            return 1
    print(f"{name}: {a.runs} random interleavings: no violation, no deadlock")
    if a.self_test:
        for mutant in mutants:
            caught = None
            for r in range(a.runs):
                try:
                    broken(r, rng, mutant)[1].run()
                except ModelError as e:
                    caught = f"run {r}: {e}"
                    break
            if caught is None:
                print(f"self-test: the broken protocol {mutant} passed {a.runs} runs")
                return 1
            print(f"self-test: {mutant} caught ({caught})")
    return 0
