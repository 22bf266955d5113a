"""The step budget of a wave: how many instruction issues the PTX engine runs before it calls the
kernel hung (a GPU would spin until the watchdog or the user kills it; the simulator says where).

A step is one instruction executed for one group of threads at one pc (every thread of the wave
at that pc, in lockstep). A kernel that ends issues each static instruction at most once per trip
of the loops around it (once per diverged group), so the default budget of a wave is

    SLACK x static instructions x (trips + 1)

with `trips` the most iterations a loop may legitimately run: for the attention kernel the
problem's K/V rounds; for `fa_sim.ptx.launch` the largest of MIN_TRIPS, the element count of the
largest array argument and the largest integer argument (a loop over the data, or up to a size
argument). `launch(max_steps=N)` or the environment variable FLASHSIM_MAX_STEPS (every run, also
`fa sim` and `fa_sim.simulate`) sets the budget of each wave instead.

A launch whose waves cannot take less than LONG_LAUNCH_SECONDS says so up front on stderr, and
while a wave runs longer than PROGRESS_SECONDS a line on stderr says how far it is into its
budget and where its threads are, so a long or hung run is never silent; Ctrl-C stops it
(KeyboardInterrupt, raised between two instructions).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from ..errors import KernelFault

ENV = "FLASHSIM_MAX_STEPS"
SLACK = 4  # fa2_fwd.cu issues at most 0.42 x instructions x (rounds + 1) per wave (every config, tails, causal)
MIN_TRIPS = 1024  # loops a launch's arguments do not explain (fixed-count loops of small kernels)
PROGRESS_SECONDS = 10.0  # first notice; then every PROGRESS_EVERY seconds
PROGRESS_EVERY = 30.0
LOOK_EVERY = 1 << 14  # steps between two looks at the clock (cheap next to a step's numpy work)
MIN_WAVE_SECONDS = 0.5e-3  # the least a wave costs (a trivial kernel's wave: about 1.3 ms, measured)
LONG_LAUNCH_SECONDS = 10.0  # a launch whose waves alone take this long is announced up front


@dataclass(frozen=True)
class StepBudget:
    """The steps one wave may issue, and how that number was chosen (for the error message)."""

    limit: int
    why: str

    def exceeded(self, where: str, ctas: str) -> KernelFault:
        return KernelFault(
            f"the kernel ran past its step budget of {self.limit:,} instruction issues ({self.why}) in {ctas}; "
            f"its threads were at {where} - a loop that never ends? If the kernel really runs this long, "
            f"allow more steps with launch(max_steps=N) or the environment variable {ENV}=N")


def parse_max_steps(value, what: str) -> int:
    """A positive step count from a keyword or the environment (ValueError naming `what` otherwise)."""
    try:
        n = int(value)
        ok = n >= 1 and (not isinstance(value, float) or value == n) and not isinstance(value, bool)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a positive whole number of instruction issues per wave, got {value!r}")
    return n


def step_budget(n_static: int, trips: int, max_steps=None) -> StepBudget:
    """The budget of a wave: max_steps if given, else FLASHSIM_MAX_STEPS if set, else the default."""
    if max_steps is not None:
        return StepBudget(parse_max_steps(max_steps, "max_steps"), "max_steps")
    env = os.environ.get(ENV)
    if env:
        return StepBudget(parse_max_steps(env, f"the environment variable {ENV}"), ENV)
    limit = SLACK * max(n_static, 1) * (max(int(trips), 0) + 1)
    return StepBudget(limit, f"{SLACK} x {n_static} instructions x {int(trips) + 1} trips; see fa_sim.ptx.budget")


class Heartbeat:
    """Progress lines on stderr for work that runs longer than PROGRESS_SECONDS: the first then,
    the next every PROGRESS_EVERY seconds."""

    def __init__(self, who: str):
        self.who = who
        self.start = time.monotonic()
        self.next = self.start + PROGRESS_SECONDS

    def look(self, what) -> None:
        """Print `what()` (how far the work is) if a line is due; cheap when none is."""
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + PROGRESS_EVERY
        print(f"fa_sim.ptx: simulating {self.who} on the PTX engine, still running after {now - self.start:.0f} s "
              f"(working, not hung): {what()}", file=sys.stderr, flush=True)
