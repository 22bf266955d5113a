"""Checks before long work: what a command can refuse without its inputs is refused before the
inputs are made (the random inputs of a large problem take tens of seconds, a float64 reference
of one can take hours), and a long run says how long it will take before it starts.

The order, in every command that runs the kernel (fa sim, trace, banks, hw, compare, sweep):
1. the arguments: argparse's types, the combinations (common.refuse), the config, the --kernel
   file (it exists, ends in .cu), the CTAs or lanes a command selects;
2. the output paths (outputs.check_outputs);
3. the engine and config together (`check_engine`): the hand-written program refuses schedule
   options; the PTX engine compiles and parses its kernel now, so a --kernel that does not
   compile, or lacks a macro its config needs, fails here (the program is cached on disk and in
   the process: the run reuses it);
4. the machine: the inputs' own memory (common.check_input_memory), for the GPU commands the
   GPU's presence and the kernel's cubin (fa_hw.runtime.check_launch, which fa hw and fa compare
   call: a cheap device probe, then the cached compile), a --cluster scheduler's answer (`check_cluster`, fa_sim.parallel.cluster's timeout);
5. the estimate (`announce`, fa_sim.estimate): refused past this machine's memory, printed on
   stderr when the run is estimated at PROGRESS_MIN_SECONDS or more;
then the inputs are made and the run starts.
"""

from __future__ import annotations

import sys

from ..estimate import Estimate, estimate
from ..kernels import check_program_config
from ..run import PtxFrontEnd


def check_engine(front, config, causal: bool, checkpoints: bool = False) -> None:
    """The front end can run `config`: the program refuses schedule options (fa_sim.run's chooser
    already said so); the PTX engine's program for its kernel (fa2_fwd.cu or a variant) is compiled
    and parsed now, so NVRTC's error or a missing macro comes before any input is made."""
    if isinstance(front, PtxFrontEnd):
        from ..ptx.fa2 import attention_program  # lazy on purpose: the PTX front end loads only when it runs

        attention_program(config, bool(causal), bool(checkpoints), front.kernel)
    else:
        check_program_config(config)


def check_cluster(address: str | None) -> None:
    """A --cluster scheduler answers as one (fa_sim.parallel.cluster.probe_scheduler); 'local' and
    no cluster need nothing."""
    from ..parallel.cluster import LOCAL, check_address, probe_scheduler

    address = None if address is None else check_address(address, "--cluster ")
    if address not in (None, LOCAL):
        probe_scheduler(address)


def qkv_shapes(shape, heads_k: int | None = None) -> list[tuple[int, int, int, int]]:
    """The shapes of q, k and v for (B, H, Nq, Nk, d), K/V with heads_k heads (default H)."""
    b, h, nq, nk, d = shape
    hk = h if heads_k is None else heads_k
    return [(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)]


def problem_of(shapes, causal: bool, scale, config, window=None, softcap=None):
    """The Problem that q, k, v of these shapes describe, checked as simulate checks it
    (fa_sim.validate), before the inputs exist."""
    from ..validate import make_problem

    return make_problem(*shapes, causal, scale, config, window, softcap)


def announce(command: str, problem, mma=None, *, simulation: bool = True, reference: bool = True,
             runs: int = 1) -> Estimate:
    """Refuse a run (of `runs` simulations, and the float64 reference if `reference`) that cannot
    fit in this machine's memory; print the estimate on stderr when it is long."""
    from ..simulate import PROGRESS_MIN_SECONDS  # read at each call (tests lower it)

    est = estimate(problem, mma)
    if simulation:
        est.check(reference=reference)
    seconds = runs * est.sim_seconds * simulation + est.reference_seconds * reference
    if seconds >= PROGRESS_MIN_SECONDS:
        print(f"fa {command}: {est.describe(simulation=simulation, reference=reference, runs=runs)}",
              file=sys.stderr, flush=True)
    return est
