"""The timing model against the H200: fit on one half of the measured cases, report on the other.

    python experiments/timing_validate.py                 # report with the shipped H200 parameters
    python experiments/timing_validate.py --fit           # refit on the fitting half, then report
    python experiments/timing_validate.py --limit 20      # a quick look at every 20th case
    python experiments/timing_validate.py --fit-clock     # refit only the clock and overhead, then report
    python experiments/timing_validate.py --fit-launch    # refit only the launch latency on the small launches
    python experiments/timing_validate.py --jobs 16       # each kernel's SM rates in 16 processes

The measured cases are tests/data/h200/timing_cases.json (experiments/timing_measure.py on the
H200: medians of CUDA-event times, three batches each) and the small launches of
tests/data/h200/timing_small.json (`--small`: one CTA to two waves), which fit the launch latency
and are reported apart (those paced by the host or streaming K/V from DRAM in groups of their own). Each case belongs to the 'fit' or the
'validate' half by a hash of its key. --fit searches the SM parameters named in FITTED (coordinate
search over 0.6x and 1.5x of each value, or the pairs of --fit-factors in turn) on every
--fit-step-th fitting case, then the effective clock
and launch overhead by least squares of relative error on all fitting cases; parameters are
printed for fa_sim/timing/gpus.py (--fit-clock: only this last least-squares step, on the whole
fitting half). The report: MAPE and Spearman rank correlation on each half,
the sign of each option's speedup (the option against its base config on the same shape), the
worst cases, and the scatter plot experiments/figures/timing_h200.png. The signs are judged
against tests/data/h200/timing_pairs.json (`timing_measure.py --pairs`: each option timed beside
its base on the same inputs, interleaved, in three passes), beside the speedup of the two cases
timed apart; `--apart` judges them against the latter, as before the pairs were measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import pickle
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's fa_sim
    sys.path.insert(0, str(ROOT))

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.problem import Problem  # noqa: E402
from fa_sim.timing.gpus import H200, GpuModel, fill_fraction  # noqa: E402
from fa_sim.timing.predict import dispatch, kernel_model, masked_extra, occupancy, sm_rates  # noqa: E402
from timing_measure import base_tag  # noqa: E402 (experiments/, beside this script, as timing_auto imports it)

DATA = ROOT / "tests" / "data" / "h200" / "timing_cases.json"
SMALL = ROOT / "tests" / "data" / "h200" / "timing_small.json"  # launches of one partial wave or a few
PAIRS = ROOT / "tests" / "data" / "h200" / "timing_pairs.json"  # each option beside its base, interleaved
FITTED = ("mio_queue", "bar_latency", "smem_latency", "global_latency", "global_bytes_per_cycle", "hmma_cycles")


@dataclass(frozen=True)
class Measured:
    key: str
    half: str
    tag: str
    shape: tuple
    causal: bool
    kernel: str
    ms: float
    batch_ms: tuple = ()  # the medians of the three timed batches (the run's spread)
    small: bool = False  # from timing_small.json
    apart: str = ""  # why a small case is neither fitted nor in the halves' scores ("": it is)

    def problem(self) -> Problem:
        b, h, nq, nk, _ = self.shape
        return Problem(b, h, nq, nk, self.causal, 1.0, KernelConfig.from_tag(self.tag))


def load(path: Path = DATA) -> list[Measured]:
    """The measured cases of `path`; with the default, the small launches of SMALL after them."""
    rows = json.loads(path.read_text())["cases"]
    out = [Measured(r["key"], r["half"], r["tag"], tuple(r["shape"]), r["causal"], r["kernel"], *_time(r),
                    small=path == SMALL) for r in rows]
    if path == SMALL:
        floor = min(c.ms for c in out)
        out = [replace(c, apart=_apart(c, floor)) for c in out]
    return out + (load(SMALL) if path == DATA and SMALL.exists() else [])


HOST_PACED = 1.3  # a paced time within this factor of the fastest launch's: the host's launch rate, not the GPU
L2_BYTES = 50 * 2**20  # the H200's L2


def _apart(case: Measured, floor: float) -> str:
    """Why a small launch says nothing about the model's time: timed one launch after another, a
    launch of a few microseconds is paced by the host's launch rate (its time is within HOST_PACED
    of the fastest launch of the set, a 1-round CTA); a grid of one Q block per head whose K and V
    exceed the L2 streams every K/V tile from DRAM (no tile is shared by two CTAs), and the model
    has no DRAM bandwidth."""
    if case.ms < HOST_PACED * floor:
        return "paced by the host"
    prob = case.problem()
    if prob.n_m_blocks == 1 and 2 * prob.batch * prob.heads * prob.seqlen_k * prob.config.head_dim * 2 > L2_BYTES:
        return "K/V streamed from DRAM"
    return ""


def _time(row: dict) -> tuple[float, tuple]:
    """A case's measured time and its batches."""
    return row["kernel_ms"], tuple(row.get("batch_ms", ()))


def cycles(case: Measured, gpu: GpuModel) -> float:
    """Predicted makespan in SM cycles (the clock and launch overhead come after)."""
    prob = case.problem()
    rates = _rates(prob.config, prob.causal, case.kernel, _sm_part(gpu))
    return dispatch(prob, rates, gpu.sms, masked_extra(rates, prob))[0]


def fill(case: Measured, gpu: GpuModel) -> float:
    """The share of the GPU's CTA slots the case's first wave fills (GpuModel.overhead_us)."""
    prob = case.problem()
    return fill_fraction(prob.n_ctas, gpu.sms, len(_rates(prob.config, prob.causal, case.kernel, _sm_part(gpu)).per_round))


def _sm_part(gpu: GpuModel) -> GpuModel:
    """The parameters one SM's rates depend on (the clock and the launch overhead do not)."""
    return gpu.with_(clock_ghz=1.0, launch_us=0.0, fill_us=0.0)


RATES_CACHE: dict = {}  # (config tag, causal, kernel, SM parameters) -> Rates: --rates-cache's contents


def _key(tag: str, causal: bool, kernel: str, gpu: GpuModel) -> tuple:
    """A kernel's entry in RATES_CACHE."""
    return tag, causal, kernel, repr(gpu)


@functools.lru_cache(maxsize=None)
def _rates(config: KernelConfig, causal: bool, kernel: str, gpu: GpuModel):
    """One SM's rates for a kernel (shared by the cases of one config; the clock does not enter)."""
    key = _key(config.tag, causal, kernel, gpu)
    if key not in RATES_CACHE:
        model = kernel_model(config, causal, gpu.arch, str(ROOT / kernel) if kernel else None)
        RATES_CACHE[key] = replace(sm_rates(model, gpu, occupancy(model, gpu), account=False), run=None)
    return RATES_CACHE[key]


JOBS = 1  # processes that compute SM rates (--jobs)


def _rates_entry(tag: str, causal: bool, kernel: str, gpu: GpuModel):
    """(RATES_CACHE key, rates) of one kernel, computed in a worker process."""
    _rates(KernelConfig.from_tag(tag), causal, kernel, gpu)
    key = _key(tag, causal, kernel, gpu)
    return key, RATES_CACHE[key]


def prime(cases, gpus) -> None:
    """Compute the SM rates the cases need under each of `gpus` in JOBS processes at once (each
    kernel's SM run is independent); with JOBS = 1 they are computed when first asked for."""
    sm = [_sm_part(g) for g in gpus]
    todo = {(c.tag, c.causal, c.kernel, g) for c in cases for g in sm} if JOBS > 1 else set()
    todo = sorted((t for t in todo if _key(*t) not in RATES_CACHE), key=repr)
    if not todo:
        return
    with concurrent.futures.ProcessPoolExecutor(JOBS) as pool:
        RATES_CACHE.update(pool.map(_rates_entry, *zip(*todo)))


def clock_fit(cyc: np.ndarray, filled: np.ndarray, ms: np.ndarray, fill_us: float = 0.0,
              small: np.ndarray | None = None) -> tuple[float, float, float]:
    """(clock GHz, launch us, fill us) of cyc / clock + launch + fill x filled, by least squares of
    the relative error in two steps: the clock and the overhead of a full first wave (launch +
    fill) on the cases whose first wave fills every CTA slot (of the main set, not the `small`
    launches, where there are such), then the launch latency on those of a partial first wave with
    the clock and that sum held (so they cannot move the full-wave cases' predictions). Without
    partial waves the fill keeps `fill_us` and the launch takes the rest."""
    full = (filled >= 1) & (True if small is None or small.all() else ~small)
    a = np.stack([cyc[full] / ms[full], 1 / ms[full]], axis=1)
    (inv_clock, total), *_ = np.linalg.lstsq(a, np.ones(int(full.sum())), rcond=None)
    if (filled >= 1).all():
        return 1 / inv_clock / 1e6, total * 1e3 - fill_us, fill_us
    part, left = filled < 1, 1 - (cyc * inv_clock + total * filled) / ms  # what launch x (1 - filled) must explain
    x = (1 - filled[part]) / ms[part]
    launch = float(x @ left[part] / (x @ x))
    return 1 / inv_clock / 1e6, launch * 1e3, (total - launch) * 1e3


def predictions(cases, gpu: GpuModel) -> np.ndarray:
    prime(cases, [gpu])
    return np.array([cycles(c, gpu) / (gpu.clock_ghz * 1e6) + (gpu.launch_us + gpu.fill_us * fill(c, gpu)) / 1e3
                     for c in cases])


def fit(cases: list[Measured], gpu: GpuModel, step: int = 4, log=print,
        factors: tuple = ((0.6, 1.5),)) -> GpuModel:
    """Coordinate search of the FITTED parameters: each in turn times each pair of `factors` (the
    pairs in order, a finer pair after a coarser one), a trial kept where it lowers the MAPE of
    every `step`-th fitting case; then fit_clock on the whole fitting half."""
    fit_cases = [c for c in cases if c.half == "fit" and not c.apart]
    sample = fit_cases[::step]
    ms = np.array([c.ms for c in sample])

    def score(g: GpuModel) -> tuple[float, GpuModel]:
        cyc, filled = np.array([cycles(c, g) for c in sample]), np.array([fill(c, g) for c in sample])
        clock, launch, fill_us = clock_fit(cyc, filled, ms, g.fill_us, np.array([c.small for c in sample]))
        g = g.with_(clock_ghz=clock, launch_us=launch, fill_us=fill_us)
        pred = cyc / (clock * 1e6) + (launch + fill_us * filled) / 1e3
        return float(np.mean(np.abs(pred / ms - 1))), g

    def trial(g: GpuModel, name: str, factor: float) -> GpuModel:
        value = getattr(g, name)
        return g.with_(**{name: type(value)(value * factor) if isinstance(value, int) else value * factor})

    prime(sample, [gpu])
    best, gpu = score(gpu)
    log(f"start: MAPE {best:.2%} on {len(sample)} fitting cases")
    for pair in factors:
        for name in FITTED:
            trials = [trial(gpu, name, f) for f in pair]
            prime(sample, trials)
            for t in trials:
                err, g = score(t)
                if err < best:
                    best, gpu = err, g
                    log(f"  {name} = {getattr(t, name)}: MAPE {best:.2%}")
    return fit_clock(cases, gpu)


def fit_clock(cases: list[Measured], gpu: GpuModel) -> GpuModel:
    """The effective clock, the launch latency and the first wave's fill cost by least squares on
    the whole fitting half (small launches set apart excluded)."""
    fit_cases = [c for c in cases if c.half == "fit" and not c.apart]
    prime(fit_cases, [gpu])
    cyc, filled = np.array([cycles(c, gpu) for c in fit_cases]), np.array([fill(c, gpu) for c in fit_cases])
    clock, launch, fill_us = clock_fit(cyc, filled, np.array([c.ms for c in fit_cases]), gpu.fill_us,
                                       np.array([c.small for c in fit_cases]))
    return gpu.with_(clock_ghz=round(clock, 4), launch_us=round(launch, 3), fill_us=round(fill_us, 3))


def fit_launch(cases: list[Measured], gpu: GpuModel) -> GpuModel:
    """The launch latency alone, on the small launches of the fitting half, with the clock and the
    overhead of a full first wave (launch + fill) held: the 252 main cases' predictions stay."""
    sel = [c for c in cases if c.half == "fit" and c.small and not c.apart]
    cyc, filled = np.array([cycles(c, gpu) for c in sel]), np.array([fill(c, gpu) for c in sel])
    total = gpu.launch_us + gpu.fill_us
    left = 1 - (cyc / (gpu.clock_ghz * 1e6) + total / 1e3 * filled) / np.array([c.ms for c in sel])
    x = (1 - filled) / np.array([c.ms for c in sel])
    launch = round(float(x @ left / (x @ x)) * 1e3, 3)
    return gpu.with_(launch_us=launch, fill_us=round(total - launch, 3))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class Sign:
    """One option against its base config on the same shape: speedups (base time / option time - 1)."""

    key: str
    measured: float
    predicted: float
    low: float  # the measured speedup's range: of a pair's passes (timing_pairs.json), else over the
    high: float  # batches: slowest base batch / fastest option batch - 1 and the reverse
    timed_apart: float = 0.0  # the speedup from the two cases' own times (timing_cases.json), minutes apart

    @property
    def in_noise(self) -> bool:
        """The measured speedup's range holds 0: the measurement cannot tell its sign."""
        return self.low <= 0 <= self.high

    @property
    def right(self) -> bool:
        """Same sign; a prediction of exactly 0 (the option compiles to the base's cubin) is right
        where the measured range holds 0."""
        if self.predicted == 0:
            return self.in_noise
        return (self.measured > 0) == (self.predicted > 0)


def load_pairs(path: Path = PAIRS) -> dict[str, dict]:
    """The paired measurements (experiments/timing_measure.py --pairs) by option key: speedup, and
    low / high, the range of its passes' medians."""
    return {row["key"]: row for row in json.loads(path.read_text())["pairs"]}


def option_signs(cases: list[Measured], pred: dict, pairs: dict | None = None) -> list[Sign]:
    """Each option case against its base on the same shape; measured by the two cases' times, or,
    for an option in `pairs` (load_pairs), by its paired measurement."""
    by_shape = {(c.tag, c.shape, c.causal, c.kernel): c for c in cases}
    pairs = pairs or {}
    out = []
    for c in cases:
        base = by_shape.get((base_tag(c.tag), c.shape, c.causal, ""))
        if base is None or base.key == c.key:
            continue
        b, o = base.batch_ms or (base.ms,), c.batch_ms or (c.ms,)
        timed_apart = base.ms / c.ms - 1
        paired = pairs.get(c.key)
        if paired is not None and paired["base"] != base.key:
            raise ValueError(f"{c.key}: paired with {paired['base']}, timed apart with {base.key}")
        measured, low, high = (timed_apart, min(b) / max(o) - 1, max(b) / min(o) - 1) if paired is None else \
            (paired["speedup"], paired["low"], paired["high"])
        out.append(Sign(c.key, measured, pred[base.key] / pred[c.key] - 1, low, high, timed_apart))
    return out


def report(cases: list[Measured], pred: dict, out: Path, pairs: dict | None = None) -> str:
    """MAPE and Spearman per half, the worst cases, and the option signs: against `pairs`
    (load_pairs) where given, else against the speedups of the cases timed apart."""
    lines = ["| half | cases | MAPE | Spearman | worst |", "|---|---|---|---|---|"]
    groups = [(half, [c for c in cases if c.half == half and not c.small]) for half in ("fit", "validate")]
    groups += [(f"small, {half}", [c for c in cases if c.half == half and c.small and not c.apart])
               for half in ("fit", "validate")]
    groups += [(f"small, {why} (not modelled)", [c for c in cases if c.apart == why])
               for why in dict.fromkeys(c.apart for c in cases if c.apart)]
    for half, sel in groups:
        sel = [c for c in sel if c.key in pred]
        if not sel:
            continue
        m, p = np.array([c.ms for c in sel]), np.array([pred[c.key] for c in sel])
        err = np.abs(p / m - 1)
        i = int(np.argmax(err))
        lines.append(f"| {half} | {len(sel)} | {err.mean():.1%} | {spearman(m, p):.3f} | {sel[i].key} {p[i] / m[i] - 1:+.0%} |")
    signs = option_signs(cases, pred, pairs)
    rng = "the range of its passes" if pairs else "the range over the batches"
    how = ("measured in pairs, interleaved: tests/data/h200/timing_pairs.json" if pairs else
           "measured apart: the two cases of tests/data/h200/timing_cases.json")
    lines += ["", f"option speedup signs predicted right: {sum(g.right for g in signs)} of {len(signs)} ({how})"]
    for least in (0.02, 0.05):
        big = [g.right for g in signs if abs(g.measured) >= least]
        lines.append(f"  of the {len(big)} whose measured effect is at least {least:.0%}: {sum(big)} right")
    told = [g.right for g in signs if not g.in_noise]
    lines.append(f"  of the {len(told)} whose sign the measurement tells ({rng} does not hold 0): {sum(told)} right")
    noise = [g for g in signs if g.in_noise]
    lines.append(f"  {len(noise)} measured effects whose range holds 0, {sum(g.right for g in noise)} of them signed right")
    beside = (lambda g: f", timed apart {g.timed_apart:+.1%}") if pairs else (lambda g: "")
    lines += ["", f"the wrong ones (measured, [{rng}], predicted):"]
    lines += [f"  {g.key}: measured {g.measured:+.1%} [{g.low:+.1%}, {g.high:+.1%}]"
              f"{' inside noise' if g.in_noise else ''}{beside(g)}, predicted {g.predicted:+.1%}"
              for g in signs if not g.right]
    extra, bar = (" timed apart |", "---|") if pairs else ("", "")
    lines += ["", f"| option case | measured | {rng} |{extra} predicted | sign |", f"|---|---|---|{bar}---|---|"]
    lines += [f"| {g.key} | {g.measured:+.1%} | [{g.low:+.1%}, {g.high:+.1%}]{' (noise)' if g.in_noise else ''} |"
              f"{f' {g.timed_apart:+.1%} |' if pairs else ''} {g.predicted:+.1%} | {'right' if g.right else 'WRONG'} |"
              for g in signs]
    _scatter(cases, pred, out)
    return "\n".join(lines)


def _scatter(cases, pred, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for half, color in (("fit", "tab:blue"), ("validate", "tab:orange")):
        sel = [c for c in cases if c.half == half and c.key in pred]
        ax.scatter([c.ms for c in sel], [pred[c.key] for c in sel], s=10, color=color, label=half)
    lim = [min(c.ms for c in cases) * 0.8, max(c.ms for c in cases) * 1.25]
    ax.plot(lim, lim, color="gray", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured on the H200 (ms)",
           ylabel="predicted by fa_sim.timing (ms)", title="Kernel time, predicted vs measured")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--fit-clock", action="store_true", help="refit only the clock and launch overhead on the fitting half")
    ap.add_argument("--fit-launch", action="store_true",
                    help="refit only the launch latency on the small launches of the fitting half (clock and full-wave overhead held)")
    ap.add_argument("--fit-factors", type=float, nargs="+", default=[0.6, 1.5], metavar="F",
                    help="--fit's trial factors, in pairs (coarse first): 0.6 1.5 0.8 1.25 searches twice")
    ap.add_argument("--apart", action="store_true",
                    help="the option signs against the two cases timed apart, not the paired measurements")
    ap.add_argument("--jobs", type=int, default=1, help="processes that compute the SM rates")
    ap.add_argument("--limit", type=int, default=1, help="every Nth case only (quick looks)")
    ap.add_argument("--fit-step", type=int, default=4, help="fit the SM parameters on every Nth fitting case")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "figures" / "timing_h200.png")
    ap.add_argument("--json", type=Path, default=None, help="write the predictions here")
    ap.add_argument("--rates-cache", type=Path, default=None, metavar="FILE",
                    help="keep each kernel's SM rates in FILE (pickle) across runs: a rerun that changes only "
                         "the clock or the launch overhead then skips the SM simulations (delete it after a model change)")
    args = ap.parse_args(argv)
    if len(args.fit_factors) % 2 or args.jobs < 1:
        ap.error("--fit-factors takes pairs of factors and --jobs at least 1")
    global JOBS
    JOBS = args.jobs
    if args.rates_cache is not None and args.rates_cache.exists():
        RATES_CACHE.update(pickle.loads(args.rates_cache.read_bytes()))
    cases = load()[:: args.limit]
    gpu = H200
    t0 = time.time()
    if args.fit:
        pairs = tuple(zip(args.fit_factors[::2], args.fit_factors[1::2]))
        gpu = fit(cases, gpu, args.fit_step, log=lambda m: print(m, flush=True), factors=pairs)
        print(f"fitted: {gpu}")
    elif args.fit_clock:
        gpu = fit_clock(cases, gpu)
        print(f"fitted: clock_ghz={gpu.clock_ghz}, launch_us={gpu.launch_us}, fill_us={gpu.fill_us}")
    elif args.fit_launch:
        gpu = fit_launch(cases, gpu)
        print(f"fitted: launch_us={gpu.launch_us}, fill_us={gpu.fill_us} (clock_ghz={gpu.clock_ghz} held)")
    pred = dict(zip((c.key for c in cases), predictions(cases, gpu)))
    if args.rates_cache is not None:
        args.rates_cache.write_bytes(pickle.dumps(RATES_CACHE))
    pairs = None if args.apart else load_pairs()
    print(report(cases, pred, args.out, pairs))
    print(f"{len(cases)} cases in {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"gpu": repr(gpu), "predicted_ms": pred}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
