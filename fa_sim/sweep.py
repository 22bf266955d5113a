"""Sweeps: configs x shapes x causal, each case simulated with the bank counter and the hazard
checker attached and measured against float64, the cases spread over local processes or a Dask
cluster (fa_sim.parallel.pmap; one case per task, each case serial inside its worker).

    cases = make_cases([KernelConfig(smem=s) for s in SmemLayout], [(1, 2, 256, 256)], (False, True))
    results = run_sweep(cases, workers="auto")
    print(format_table(results)); fig = figure(results)

A case's numbers: warp instructions per counted class (events.COUNTED_OPS), shared-memory bank
conflicts per class as Nsight Compute counts them (LDGSTS: excess wavefronts, which ncu does not
call conflicts; observers/banks.py), the hazard count, the relative Frobenius error of O and the
largest |LSE error| against fa_sim.reference (None where not finite; fa_sim.accuracy). A case fails
(`CaseResult.ok` False) on a hazard, a non-finite result or an error above its documented bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .config import KernelConfig
from .events import COUNTED_OPS
from .observers.banks import SmemClass

Shape = tuple[int, int, int, int]  # B, H, Nq, Nk


@dataclass(frozen=True)
class Case:
    config: KernelConfig
    shape: Shape
    causal: bool
    seed: int = 0
    mma: str = "exact"
    engine: str | None = None  # None: the one the config needs (fa_sim.kernels.engine_for)
    kernel: str | None = None  # a variant .cu for the PTX engine; None: fa_hw's own
    timing: str | None = None  # a GPU model (fa_sim.timing.GPUS) to predict the kernel time on

    @property
    def name(self) -> str:
        b, h, nq, nk = self.shape
        return f"{self.config.tag} {b}x{h}x{nq}x{nk}{' causal' if self.causal else ''}"

    def problem(self):
        from .problem import Problem

        b, h, nq, nk = self.shape
        return Problem(b, h, nq, nk, self.causal, self.config.head_dim ** -0.5, self.config)


@dataclass(frozen=True)
class CaseResult:
    case: Case
    instructions: dict  # counted class name -> warp instructions
    banks: dict  # SmemClass value -> {"instructions", "wavefronts", "ideal", "conflicts" | "excess_wavefronts"}
    hazards: int
    rel_err_o: float | None
    max_abs_err_lse: float | None
    nonfinite: tuple = field(default_factory=tuple)  # str of each fa_sim.accuracy.NonFinite
    seconds: float = 0.0
    above_bound: tuple = field(default_factory=tuple)  # str of each fa_sim.accuracy.AboveBound
    predicted_ms: float | None = None  # the timing model's kernel time (Case.timing)

    @property
    def conflicts(self) -> int:
        """Bank conflicts over the classes ncu counts them for (LDSM, LDS, STS)."""
        return sum(v["conflicts"] for k, v in self.banks.items() if "conflicts" in v)

    @property
    def ok(self) -> bool:
        """No hazards, every result finite and every error within its documented bound."""
        return self.hazards == 0 and not self.nonfinite and not self.above_bound

    def to_json(self) -> dict:
        b, h, nq, nk = self.case.shape
        return {"case": self.case.name, "config": self.case.config.to_json(), "shape": [b, h, nq, nk],
                "causal": self.case.causal, "seed": self.case.seed, "mma": self.case.mma,
                "engine": self.case.engine, "kernel": self.case.kernel,
                "instructions": self.instructions, "banks": self.banks, "conflicts": self.conflicts,
                "hazards": self.hazards, "rel_err_o": self.rel_err_o, "max_abs_err_lse": self.max_abs_err_lse,
                "nonfinite": list(self.nonfinite), "above_bound": list(self.above_bound), "seconds": self.seconds,
                "ok": self.ok, **({} if self.case.timing is None else
                                  {"timing_gpu": self.case.timing, "predicted_ms": self.predicted_ms})}


def make_cases(configs, shapes, causals, seed: int = 0, mma: str = "exact", engine: str | None = None,
               kernel: str | None = None, timing: str | None = None) -> list[Case]:
    """The product configs x shapes x causal flags, in that nesting order."""
    return [Case(c, tuple(int(x) for x in s), bool(cz), seed, mma, engine, kernel, timing)
            for c in configs for s in shapes for cz in causals]


@dataclass(frozen=True)
class SweepEstimate:
    """Time of a whole sweep (fa_sim.estimate per case, summed) and its largest case's memory."""

    cases: int
    seconds: float  # one core, simulations and references
    largest_bytes: int

    def describe(self, workers: int = 1) -> str:
        from .estimate import _duration, _size

        spread = "" if workers <= 1 else f", about {_duration(self.seconds / workers)} on {workers} workers"
        return (f"{self.cases} case{'s' if self.cases != 1 else ''}; estimate: about {_duration(self.seconds)} on "
                f"one core{spread}; the largest case needs about {_size(self.largest_bytes)}")


# What a case attaches beyond the plain simulation that fa_sim.estimate times: the bank counter and
# the hazard checker see every shared-memory access (measured on the development machine: a
# (1, 4, 1024) m64n64 run 0.33 s plain, 9.9 s observed; (1, 2, 256) causal 0.03 s and 0.37 s), and
# with Case.timing the timing model: its kernel model once per config, causal flag, GPU and kernel
# (compile, SASS paths, a one-CTA bank run, the stream's probe runs on the PTX engine and the SM runs:
# 8-60 s on that machine, less from the disk cache), then its per-shape cost (fa_sim.timing.cost).
OBSERVED_S = 2.4e-6  # s per (block_m * block_n) and CTA-round, bank counter and hazard checker
OBSERVED_FIXED_S = 0.4  # s per case
TIMING_MODEL_S = 10.0  # s per distinct (config, causal, GPU, kernel) of the timing model: its compile, probes and SM
# runs the first time (5-10 s measured; fa_sim.timing.cost)


def estimate_cases(cases) -> SweepEstimate:
    """Refuse, before anything runs, a case whose simulation cannot fit in this machine's memory or
    whose timing prediction is past the timing model's limit (fa_sim.timing.cost); the estimate of
    the whole sweep, the observers each case attaches and its timing prediction included."""
    from .estimate import estimate
    from .timing.cost import timing_cost

    seconds, largest, models = 0.0, 0, set()
    for case in cases:
        prob = case.problem()
        est = estimate(prob, case.mma)
        try:
            est.check(reference=True)
            if case.timing is not None:
                cost = timing_cost(prob)
                cost.check(f"--shape {','.join(map(str, case.shape))}", "lower the shape or drop --timing")
                seconds += cost.seconds
                largest = max(largest, cost.bytes)
                models.add((case.config, case.causal, case.timing, case.kernel))
        except ValueError as exc:
            raise ValueError(f"case {case.name}: {exc}") from None
        tile = case.config.block_m * case.config.block_n
        seconds += est.sim_seconds + est.reference_seconds + OBSERVED_FIXED_S + OBSERVED_S * tile * prob.cta_rounds
        largest = max(largest, est.needed(reference=True))
    return SweepEstimate(len(cases), seconds + TIMING_MODEL_S * len(models), largest)


def check_cases(cases) -> float:
    """estimate_cases(cases).seconds: the estimated seconds of the whole sweep on one core."""
    return estimate_cases(cases).seconds


def run_case(case: Case) -> CaseResult:
    """One case, in this process (pmap's task)."""
    from .accuracy import measure
    from .observers.banks import BankCounter
    from .observers.hazards import HazardChecker
    from .reference import random_inputs
    from .simulate import simulate

    b, h, nq, nk = case.shape
    q, k, v = random_inputs(b, h, nq, nk, case.config.head_dim, case.seed, dtype=case.config.dtype)
    banks, hazards = BankCounter(), HazardChecker()
    start = time.perf_counter()
    res = simulate(q, k, v, causal=case.causal, config=case.config, observers=[banks, hazards], mma_model=case.mma,
                   progress=False, workers=1, engine=case.engine, kernel=case.kernel)
    seconds = time.perf_counter() - start
    acc = measure(res.o, res.lse, q, k, v, res.causal, res.scale, res.config)
    by_class = banks.report().by_class()
    predicted = None
    if case.timing is not None:
        from .timing import predict

        predicted = predict(case.problem(), case.timing, case.kernel).kernel_ms
    return CaseResult(case, {op.value: int(res.instructions[op]) for op in COUNTED_OPS},
                      {c.value: by_class[c].to_json(c) for c in SmemClass}, hazards.report().total,
                      acc.rel_err_o, acc.max_abs_err_lse, tuple(str(f) for f in acc.nonfinite), seconds,
                      tuple(str(f) for f in acc.above_bound), predicted)


class CaseProgress:
    """One line on stderr per finished case: which, how long it took, how many are left and the
    time left at the pace so far (a sweep's unit of work is a case, so lines stay few)."""

    def __init__(self, cases, stream=None) -> None:
        self.cases, self.done, self.start = list(cases), 0, time.monotonic()
        self.stream = stream

    def __call__(self, index: int, result: CaseResult) -> None:
        import sys

        self.done += 1
        spent = time.monotonic() - self.start
        left = spent * (len(self.cases) - self.done) / self.done
        print(f"fa sweep: case {self.done}/{len(self.cases)} done ({self.cases[index].name}, {result.seconds:.1f} s); "
              f"{spent:.0f} s elapsed, about {left:.0f} s left", file=self.stream or sys.stderr, flush=True)


def run_sweep(cases, *, workers="auto", cluster: str | None = None, progress: bool | None = None) -> list[CaseResult]:
    """Every case (checked up front), spread over workers; results in case order. progress: a line
    per finished case on stderr (CaseProgress); None shows it for sweeps estimated at
    fa_sim.simulate.PROGRESS_MIN_SECONDS or more, on one core."""
    from .parallel import pmap
    from .simulate import PROGRESS_MIN_SECONDS

    cases = list(cases)
    seconds = check_cases(cases)
    show = seconds >= PROGRESS_MIN_SECONDS if progress is None else bool(progress)
    return pmap(run_case, cases, workers=workers, cluster=cluster, names=[f"case {c.name}" for c in cases],
                on_done=CaseProgress(cases) if show else None)


# -- reporting ---------------------------------------------------------------------------------------------
def _num(x) -> str:
    return "not finite" if x is None else f"{x:.2e}"


def format_table(results: list[CaseResult], title: str = "fa sweep") -> str:
    timed = any(r.case.timing is not None for r in results)
    head = (f"{'case':<42}{'warp instr':>12}{'LDSM cf':>9}{'LDS cf':>8}{'STS cf':>8}{'LDGSTS ex':>11}"
            f"{'hazards':>9}{'rel err O':>11}{'max|dLSE|':>11}{'s':>7}" + (f"{'pred ms':>10}" if timed else ""))
    lines = [title, head, "-" * len(head)]
    for r in results:
        b = r.banks
        pred = "" if not timed else f"{r.predicted_ms:>10.4f}" if r.predicted_ms is not None else f"{'-':>10}"
        lines.append(f"{r.case.name:<42}{sum(r.instructions.values()):>12,}{b['LDSM']['conflicts']:>9,}"
                     f"{b['LDS']['conflicts']:>8,}{b['STS']['conflicts']:>8,}{b['LDGSTS']['excess_wavefronts']:>11,}"
                     f"{r.hazards:>9,}{_num(r.rel_err_o):>11}{_num(r.max_abs_err_lse):>11}{r.seconds:>7.2f}{pred}")
    bad = [r for r in results if not r.ok]
    lines.append(f"{len(results)} cases, {len(bad)} with hazards, non-finite results or errors above their bound"
                 if bad else f"{len(results)} cases, no hazards, all results finite and within their error bounds")
    for r in bad:
        for finding in r.nonfinite:
            lines.append(f"  {r.case.name}: NOT FINITE: {finding}")
        for finding in r.above_bound:
            lines.append(f"  {r.case.name}: ABOVE BOUND: {finding}")
    return "\n".join(lines)


def figure(results: list[CaseResult]):
    """Four panels over the cases: warp instructions per class, bank conflicts per class, hazards,
    and the errors against float64."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r.case.name for r in results]
    x = np.arange(len(results))
    fig, axes = plt.subplots(4, 1, figsize=(max(8.0, 0.55 * len(results) + 3), 13), sharex=True)
    _bars(axes[0], x, {op.value: [r.instructions[op.value] for r in results] for op in COUNTED_OPS},
          "warp instructions", log=True)
    _bars(axes[1], x, {**{c: [r.banks[c]["conflicts"] for r in results] for c in ("LDSM", "LDS", "STS")},
                       "LDGSTS excess": [r.banks["LDGSTS"]["excess_wavefronts"] for r in results]},
          "bank conflicts (wavefronts - ideal)")
    hazards = [r.hazards for r in results]
    axes[2].bar(x, hazards, color="tab:red")
    axes[2].set_ylim(0, max(1, max(hazards, default=0)) * 1.1)
    axes[2].set_ylabel("hazards")
    for label, vals in (("rel. Frobenius error of O", [r.rel_err_o for r in results]),
                        ("max |LSE error|", [r.max_abs_err_lse for r in results])):
        axes[3].plot(x, [np.nan if v is None else v for v in vals], "o-", label=label)
    axes[3].set_yscale("log")
    axes[3].set_ylabel("error vs float64")
    axes[3].legend(fontsize=8)
    axes[3].set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    axes[0].set_title("fa sweep: configs x shapes x causal")
    fig.tight_layout()
    return fig


def _bars(ax, x, series: dict, ylabel: str, log: bool = False) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (label, vals) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=label)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=len(series))
