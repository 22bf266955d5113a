"""What a prediction (fa_sim.timing.predict) costs this machine, estimated before it starts, and its
progress while it runs.

The kernel's compile, SASS paths and SM runs cost seconds once per config (cached); what grows with
the problem is
- the dispatch (predict.dispatch): a Python heap loop over every CTA of the grid,
  B * H * ceil(Nq / block_m) of them, each a few tuples and floats;
- the grid's instruction count (predict.grid_instructions): the walk of each distinct CTA path
  class (its rounds, masked rounds, tails), whose cost and memory grow with the class's K/V rounds;
  a causal grid has a class per Q block (rounds 1 .. ceil(Nk / block_n)), a non-causal one two.
The coefficients were measured on the development machine (2 shared cores, busy), with a margin
of about 3x for a busier one: dispatch 1.1-1.8 us per CTA non-causal, 3-5 us causal (CTAs of
unequal length end one at a time), about 160-500 bytes per CTA; a class walk 3-4 us per round
once its probes are on disk (12 us over the 8,384 rounds of (8, 32, 8192) causal, first probes
included) and about 7 KiB per round (the stream's records of a long walk). What does not grow
with the problem, and is not in the estimate: the kernel's compile, the functional probes and the
SM runs, 5-10 s per config the first time and read from the disk cache after (docs/timing.md,
"How long it takes"). `check` refuses a prediction estimated past MAX_SECONDS or this machine's
memory (fa_sim.estimate.machine_bytes) with one line naming the sizes; `Progress` prints lines on
stderr for one estimated at fa_sim.simulate.PROGRESS_MIN_SECONDS or more.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ..problem import Problem

DISPATCH_S = 5e-6  # s per CTA dispatched, non-causal
DISPATCH_CAUSAL_S = 1.5e-5  # s per CTA dispatched, causal
DISPATCH_BYTES = 600  # per CTA dispatched
WALK_S = 1.2e-5  # s per K/V round of a CTA path class walked
WALK_BYTES = 8 << 10  # per K/V round of the longest class walked
MAX_SECONDS = 600.0  # a prediction estimated past this is refused: the model is not for such grids
PROGRESS_FIRST_S = 5.0  # the first progress line; then every PROGRESS_EVERY_S
PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True)
class TimingCost:
    problem: Problem
    ctas: int  # dispatched
    walk_rounds: int  # K/V rounds over the distinct CTA path classes (an upper bound)
    seconds: float
    bytes: int
    machine: int  # fa_sim.estimate.machine_bytes()

    def describe(self) -> str:
        from ..estimate import _duration, _size

        return (f"estimate: about {_duration(self.seconds)} and {_size(self.bytes)} for the timing model "
                f"({self.ctas:,} CTAs dispatched, {self.walk_rounds:,} rounds of CTA paths walked), after the "
                f"kernel's compile and SM runs")

    def check(self, sizes: str, fix: str) -> None:
        """ValueError past MAX_SECONDS or this machine's memory. `sizes`: how the caller names the
        problem's sizes ('--batch 1 --heads 16 --seqlen 2147483647'); `fix`: what to lower."""
        from ..estimate import _duration, _size

        over = []
        if self.seconds > MAX_SECONDS:
            over.append(f"about {_duration(self.seconds)}, past the {_duration(MAX_SECONDS)} limit")
        if self.bytes > self.machine:
            over.append(f"about {_size(self.bytes)} of memory, more than this machine's {_size(self.machine)}")
        if over:
            p = self.problem
            ctas = f"{self.ctas:,} CTA{'s' if self.ctas != 1 else ''}"
            raise ValueError(f"{sizes}: the timing model dispatches B*H*ceil(Nq/block_m) = {ctas} "
                             f"one by one and walks {self.walk_rounds:,} K/V rounds of their paths ({p.config.tag}"
                             f"{', causal' if p.causal else ''}): {' and '.join(over)}; {fix}")


def timing_cost(prob: Problem) -> TimingCost:
    """The up-front estimate of predict(prob), from closed forms (free for any size)."""
    from ..estimate import machine_bytes

    bh = prob.batch * prob.heads
    longest = prob.n_rounds  # the longest class: every key block
    # causal: a class per distinct round count, at most the Q blocks' rounds of one head
    walk = prob.cta_rounds // bh + longest if prob.causal else 2 * longest
    per_cta = DISPATCH_CAUSAL_S if prob.causal else DISPATCH_S
    seconds = prob.n_ctas * per_cta + walk * WALK_S
    return TimingCost(prob, prob.n_ctas, walk, seconds, prob.n_ctas * DISPATCH_BYTES + longest * WALK_BYTES,
                      machine_bytes())


class Progress:
    """Lines on stderr while a long prediction runs: what it is doing, how far, the time left at
    the pace so far; the first after PROGRESS_FIRST_S, then every PROGRESS_EVERY_S. `show` False:
    silent (`step` costs a clock read)."""

    def __init__(self, show: bool, stream=None) -> None:
        self.show, self.stream = show, stream
        self.start = time.monotonic()
        self.next = self.start + PROGRESS_FIRST_S
        self.began: dict[str, float] = {}

    def step(self, what: str, done: int, total: int) -> None:
        """`done` of `total` units of the step `what` ('dispatching CTAs over 132 SMs') are done."""
        if not self.show:
            return
        now = time.monotonic()
        began = self.began.setdefault(what, now)
        if now < self.next:
            return
        self.next = now + PROGRESS_EVERY_S
        frac = done / max(total, 1)
        left = f", about {(now - began) * (1 - frac) / frac:.0f} s left in this step" if frac > 0 else ""
        print(f"fa_sim.timing: {what}: {done:,} of {total:,} ({frac:.0%}); {now - self.start:.0f} s since the "
              f"prediction started{left}", file=self.stream or sys.stderr, flush=True)
