"""Where and when the GPU runs each CTA, beside the timing model's CTA dispatch.

    python experiments/timing_dispatch.py --measure --out DIR        # on the GPU: DIR/timing_dispatch.npz
    python experiments/timing_dispatch.py                            # the recording against the model
    python experiments/timing_dispatch.py --measure --only . --launches 2 --out DIR   # every case of timing_measure
    python experiments/timing_dispatch.py --data DIR/timing_dispatch.npz --jobs 2     # its report

The timing model (fa_sim.timing.predict.dispatch) sends the grid's CTAs in launch order to the
SMs' free slots, the first wave round-robin over the SMs, and runs each SM's residents at its
simulated rate per occupancy (processor sharing). Whether the GPU does the same decides the tail
of a grid, and with it what heavy_first (a causal grid's longest CTAs launched first) gains.

Measured: the kernel variant experiments/variants/fa2_fwd_cta_trace.patch - the seed kernel, the
same registers, each CTA's SM, %globaltimer at its start and end and its SM clock cycles written
over the first LSE words of its rows - on the causal heavy_first cases of
experiments/timing_measure.py, each beside the same config without heavy_first (`--only REGEX`:
any cases of timing_measure.py instead), inputs random normal (timing_measure's), `--launches`
launches after `--warmup`, each launch synchronised and read back.

The report, per case: the grid's span on the GPU (first CTA start to last CTA end; median and
range over the launches) and in the model (cycles at the model's clock); the tail, the span over
the mean of the SMs' last ends, on each; the SM clock the CTAs ran at (clock64 cycles over
%globaltimer nanoseconds). Then what the launches show about the GPU's dispatch: how many CTAs
each SM took in the first wave, whether later CTAs start in launch order, the time from a slot's
CTA ending to the next CTA starting on that SM, and heavy_first's speedup of the span beside the
model's. The variant also records when each K/V round starts (its first block_m - 8 rounds); kept
for the first launch of the grids of one CTA per SM, where a CTA's time is its own: the report
sets the phases of such a CTA (the prologue, round 0 with the first copies' wait, a later round,
the last round and the epilogue) beside the model's SM running one CTA alone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing_measure import ROOT, Case, _inputs, cases  # noqa: E402

PATCH = ROOT / "experiments" / "variants" / "fa2_fwd_cta_trace.patch"
ROUNDS_PATCH = ROOT / "experiments" / "variants" / "fa2_fwd_round_trace.patch"  # also each round's start
DATA = ROOT / "tests" / "data" / "h200" / "timing_dispatch.npz"
ROUNDS_DATA = ROOT / "tests" / "data" / "h200" / "timing_rounds.npz"
RECORD_WORDS = 8  # per CTA, over the first LSE words of its rows (the patch's layout)
FIELDS = ("sm", "start_ns", "end_ns", "cycles")


def dispatch_cases(only: str | None = None) -> list[Case]:
    """The causal heavy_first cases of timing_measure.cases(), each after the same config without
    heavy_first on its shape; with `only` (a regular expression), the cases of timing_measure.cases()
    whose key it matches instead (kernel variants and Q tails of fewer than RECORD_WORDS rows left out)."""
    if only is not None:
        return [c for c in cases() if re.search(only, c.key) and not c.kernel and _recordable(c)]
    out = []
    for c in cases():
        cfg = c.config()
        if c.causal and cfg.heavy_first and not c.kernel:
            out += [Case(replace(cfg, heavy_first=False).tag, c.shape, True), c]
    return out


def _recordable(case: Case) -> bool:
    """Whether every Q block of the case has RECORD_WORDS rows for its CTA's record."""
    nq, bm = case.shape[2], case.config().block_m
    return nq - (-(-nq // bm) - 1) * bm >= RECORD_WORDS


def decode(lse: np.ndarray, case: Case) -> dict:
    """The patch's per-CTA records from one launch's LSE [B, H, Nq] (float32), in launch order
    (blockIdx.x fastest): SM, start and end (ns from the launch's first start), SM cycles."""
    cfg = case.config()
    b, h, nq, _, _ = case.shape
    n_m = -(-nq // cfg.block_m)
    if not _recordable(case):
        raise ValueError(f"{case.key}: the last Q block has fewer than {RECORD_WORDS} rows for its record")
    words = np.ascontiguousarray(lse, np.float32).view(np.uint32).reshape(b * h, nq)
    cols = (np.arange(n_m) * cfg.block_m)[:, None] + np.arange(RECORD_WORDS)
    rec = words[:, cols].astype(np.uint64)  # [bh, Q block, word]
    bx = (n_m - 1 - np.arange(n_m)) if cfg.heavy_first and case.causal else np.arange(n_m)  # the kernel's m_block
    if not np.array_equal(rec[:, :, 1], np.broadcast_to(bx, rec.shape[:2])):
        raise ValueError(f"{case.key}: the LSE records are not the trace's (blockIdx.x does not match)")
    order = np.argsort(bx)
    rec = rec[:, order].reshape(-1, RECORD_WORDS)  # launch order: blockIdx.x fastest
    t0 = rec[:, 2] | rec[:, 3] << np.uint64(32)
    t1 = rec[:, 4] | rec[:, 5] << np.uint64(32)
    first = t0.min()
    # then each recorded round's start (SM cycles from the CTA's start), as many as the Q block has rows for
    width = cfg.block_m - RECORD_WORDS
    m = np.broadcast_to(order, (b * h, n_m))  # launch order -> the Q block whose rows hold the record
    rows = np.minimum(nq - m * cfg.block_m, cfg.block_m).reshape(-1)
    n = np.minimum(rec[:, 7].astype(np.int64), rows - RECORD_WORDS)
    at = (m * cfg.block_m + RECORD_WORDS)[..., None] + np.arange(width)
    starts = np.take_along_axis(words, np.minimum(at, nq - 1).reshape(b * h, -1), axis=1).reshape(-1, width)
    starts = np.where(np.arange(width) < n[:, None], starts, 0)
    return {"sm": rec[:, 0].astype(np.int16), "start_ns": (t0 - first).astype(np.int64),
            "end_ns": (t1 - first).astype(np.int64), "cycles": rec[:, 6].astype(np.uint32),
            "round_n": n.astype(np.int32), "round_cycles": starts.astype(np.uint32)}


def measure(out: Path, launches: int, warmup: int, only: str | None = None, rounds: bool = False) -> Path:
    """Trace the cases (dispatch_cases) on the GPU: `launches` launches each after `warmup`; with
    `rounds`, the round-trace variant, keeping the rounds' starts of the first launch of the grids
    of one CTA per SM (and only those grids) in timing_rounds.npz."""
    import torch

    from fa_hw.forward import prepare
    from fa_hw.runtime import device_arch
    from fa_sim.contract import KernelBuild, kernel_source
    from fa_sim.contract.cubins import compile_many

    todo = dispatch_cases(only)
    patch = ROUNDS_PATCH if rounds else PATCH
    arch, source = device_arch(), kernel_source(patch)
    compile_many(sorted({KernelBuild(c.config(), c.causal, arch, False, source) for c in todo}, key=repr))
    columns: dict = {f: [] for f in ("case", "launch", *FIELDS, "round_n", "round_cycles")}
    keys: list[str] = []
    for case in todo:
        q, k, v = _inputs(case)
        plan, dev, _ = prepare(q, k, v, case.causal, None, case.config(), kernel=str(patch))
        plan.time(dev.stream, warmup, 1)
        spans = []
        for launch in range(launches):
            plan.run(dev.stream)
            rec = decode(dev.results()[1].cpu().numpy(), case)  # torch inputs: torch outputs
            lone = first_wave(rec["sm"], rec["start_ns"], rec["end_ns"]).max() == 1
            if rounds and launch == 0 and not lone:  # the round trace: grids of one CTA per SM only
                break
            if launch > 0 or not lone:  # rounds kept: one CTA per SM, the first launch
                rec["round_n"] = np.zeros_like(rec["round_n"])
            for f in (*FIELDS, "round_n"):
                columns[f].append(rec[f])
            columns["round_cycles"].append(rec["round_cycles"][np.arange(rec["round_cycles"].shape[1]) < rec["round_n"][:, None]])
            columns["case"].append(np.full(len(rec["sm"]), len(keys), np.int16))
            columns["launch"].append(np.full(len(rec["sm"]), launch, np.int8))
            spans.append(int(rec["end_ns"].max()))
        if spans:
            keys.append(case.key)
            print(f"{case.key}: span {statistics.median(spans) / 1e3:.1f} us", flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "patch": patch.name, "launches": launches, "warmup": warmup,
            "keys": keys}
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("timing_rounds.npz" if rounds else "timing_dispatch.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **{f: np.concatenate(c) for f, c in columns.items()})
    return path


def first_wave(sm: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """CTAs per SM of one launch that started before any CTA ended."""
    return np.bincount(sm[start_ns < end_ns.min()])


@dataclass(frozen=True)
class Traced:
    """One case's launches: per launch and CTA (launch order), its SM, start, end and SM cycles."""

    case: Case
    sm: np.ndarray  # [launches, CTAs]
    start_ns: np.ndarray
    end_ns: np.ndarray
    cycles: np.ndarray
    round_n: np.ndarray | None = None  # [launches, CTAs]: rounds whose start was recorded
    round_cycles: tuple = ()  # per launch: the recorded rounds' starts of every CTA in turn (SM cycles from its start)

    def round_starts(self, launch: int = 0) -> list[np.ndarray]:
        """Per CTA (launch order): the SM cycle at which each of its recorded rounds started."""
        cuts = np.cumsum(self.round_n[launch])[:-1]
        return np.split(self.round_cycles[launch], cuts)

    @property
    def spans_us(self) -> np.ndarray:
        return self.end_ns.max(axis=1) / 1e3

    def tail(self, launch: int = 0) -> float:
        """The span over the mean of the SMs' last ends."""
        ends = np.zeros(int(self.sm[launch].max()) + 1)
        np.maximum.at(ends, self.sm[launch], self.end_ns[launch])
        return float(self.end_ns[launch].max() / ends[ends > 0].mean())

    def clock_ghz(self) -> float:
        """The median SM clock of the CTAs that ran at least 2 us (clock64 over %globaltimer)."""
        dur = self.end_ns - self.start_ns
        long = dur > 2000
        return float(np.median(self.cycles[long] / dur[long]))

    def first_wave(self, launch: int = 0) -> np.ndarray:
        """CTAs per SM that started before any CTA ended."""
        return first_wave(self.sm[launch], self.start_ns[launch], self.end_ns[launch])

    def refill_gaps_ns(self) -> np.ndarray:
        """For every CTA after the first wave: its start less the last end on its SM before it."""
        out = []
        for sm, t0, t1 in zip(self.sm, self.start_ns, self.end_ns):
            later = t0 >= t1.min()
            for s in np.unique(sm[later]):
                mine = sm == s
                ends = np.sort(t1[mine])
                starts = t0[mine & later]
                before = np.searchsorted(ends, starts + 32, side="right") - 1  # 32 ns: the timer's step
                out.append(starts[before >= 0] - ends[before[before >= 0]])
        return np.concatenate(out) if out else np.zeros(0)

    def in_order(self) -> float:
        """The share of CTAs after the first wave that start no earlier (within 64 ns) than the CTA
        launched before them."""
        shares = []
        for t0, t1 in zip(self.start_ns, self.end_ns):
            later = t0[t0 >= t1.min()]
            if len(later) > 1:
                shares.append(float(np.mean(np.diff(later) >= -64)))
        return float(np.mean(shares)) if shares else 1.0


def load(path: Path = DATA) -> list[Traced]:
    """The traced cases of a --measure file."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        cols = {f: z[f] for f in z.files if f != "meta"}
    by_key = {c.key: c for c in cases()}
    out, taken = [], 0
    for n, key in enumerate(meta["keys"]):
        rows = cols["case"] == n
        launches = int(cols["launch"][rows].max()) + 1
        arrays = {f: cols[f][rows].reshape(launches, -1) for f in FIELDS}
        case = by_key.get(key) or Case.from_key(key)
        if "round_n" in cols:  # the rounds' starts, in the order of the CTA records
            arrays["round_n"] = cols["round_n"][rows].reshape(launches, -1)
            flat = []
            for per_launch in arrays["round_n"]:
                flat.append(cols["round_cycles"][taken:taken + int(per_launch.sum())])
                taken += int(per_launch.sum())
            arrays["round_cycles"] = tuple(flat)
        out.append(Traced(case, **arrays))
    return out


def model_trace(case: Case, gpu=None) -> tuple[float, np.ndarray]:
    """The model's makespan (cycles) and dispatch trace [CTA, (index, SM, start, end)] of a case."""
    from fa_sim.timing.gpus import H200
    from fa_sim.timing.predict import (
        _rates,
        dispatch,
        kernel_model,
        masked_extra,
        occupancy,
    )

    gpu = gpu or H200
    prob = _problem(case)
    k = occupancy(kernel_model(prob.config, prob.causal, gpu.arch), gpu)
    rates = _rates(prob.config, prob.causal, gpu, None, k)
    trace: list = []
    cycles, _ = dispatch(prob, rates, gpu.sms, masked_extra(rates, prob), trace=trace)
    return cycles, np.array(trace, float)


def model_trace_occupancy(case: Case) -> int:
    """The model's CTAs per SM for the case's kernel on the H200."""
    from fa_sim.timing.gpus import H200
    from fa_sim.timing.predict import kernel_model, occupancy

    prob = _problem(case)
    return occupancy(kernel_model(prob.config, prob.causal, H200.arch), H200)


def _problem(case: Case):
    from fa_sim.problem import Problem

    b, h, nq, nk, _ = case.shape
    return Problem(b, h, nq, nk, case.causal, 1.0, case.config())


PHASES = ("to round 0", "round 0", "a later round", "the last round and the epilogue")


def gpu_phases(t: Traced, launch: int = 0) -> tuple | None:
    """Median SM cycles of each of PHASES over the CTAs whose every round's start was recorded (and
    that ran at least 4 rounds); None when there are none."""
    prob = _problem(t.case)
    from fa_sim.timing.predict import launch_order

    rounds = prob.n_block_max(launch_order(prob))
    if t.round_n is None:
        return None
    full = [(r.astype(np.int64), int(c)) for r, c, n, want in
            zip(t.round_starts(launch), t.cycles[launch], t.round_n[launch], rounds) if n == want >= 4]
    if not full:
        return None
    return tuple(float(np.median(x)) for x in zip(*[(r[0], r[1] - r[0], np.median(np.diff(r[1:])), c - r[-1])
                                                     for r, c in full]))


def model_phases(case: Case, rounds: int = 8) -> tuple:
    """PHASES in the model: one CTA of `rounds` K/V rounds (its causal diagonal's masked) alone on an
    SM, at the copy latency of a full SM (a grid of one CTA per SM)."""
    from fa_sim.timing.gpus import H200
    from fa_sim.timing.predict import _masked_rounds, kernel_model, occupancy
    from fa_sim.timing.sm import run_sm

    prob = _problem(case)
    model = kernel_model(prob.config, prob.causal, H200.arch)
    k = occupancy(model, H200)
    masked = int(_masked_rounds(prob)[-1])
    run = run_sm([model.cta_stream(rounds, H200, masked)], prob.config.n_warps, H200.loaded(k, k), account=False,
                 marks=tuple(model.round_starts(rounds, masked)))
    m = np.array(run.marked[0])
    return float(m[0]), float(m[1] - m[0]), float(np.median(np.diff(m[1:]))), float(run.cycles - m[-1])


def _model_row(case: Case) -> tuple[str, float, float]:
    """(key, model span us, model tail) at the H200 model's clock (a worker's job)."""
    from fa_sim.timing.gpus import H200

    cycles, tr = model_trace(case)
    ends = np.zeros(H200.sms)
    np.maximum.at(ends, tr[:, 1].astype(int), tr[:, 3])
    return case.key, cycles / H200.clock_ghz / 1e3, float(cycles / ends[ends > 0].mean())


def report(traced: list[Traced], jobs: int = 1, with_rounds: list[Traced] = ()) -> str:
    """The report (the module docstring); `with_rounds`: traces with the rounds' starts (--rounds)."""
    from fa_sim.timing.gpus import H200

    with concurrent.futures.ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        rows = (pool.map if pool else map)(_model_row, [t.case for t in traced])
        model = {key: (span, tail) for key, span, tail in rows}
    lines = ["| case | CTAs | GPU span us (launches' range) | model span us | GPU tail | model tail | SM clock GHz |",
             "|---|---|---|---|---|---|---|"]
    tails = []
    for t in traced:
        span, tail = model[t.case.key]
        g = t.spans_us
        tails.append((statistics.median(t.tail(i) for i in range(len(g))), tail))
        lines.append(f"| {t.case.key} | {t.sm.shape[1]} | {np.median(g):.1f} ({g.min():.1f}-{g.max():.1f}) | {span:.1f} | "
                     f"{tails[-1][0]:.3f} | {tail:.3f} | {t.clock_ghz():.3f} |")
    tg, tm = np.array(tails).T
    gaps = np.concatenate([t.refill_gaps_ns() for t in traced])
    waves = [t.first_wave() for t in traced]
    even = sum(len(set(w[w > 0].tolist())) == 1 for w in waves)
    occupancy = sum(int(w.max()) == model_trace_occupancy(t.case) for w, t in zip(waves, traced))
    clocks = np.array([t.clock_ghz() for t in traced])
    lines += ["", f"{len(traced)} cases, {sum(t.sm.shape[0] for t in traced)} launches, "
              f"{sum(t.sm.size for t in traced):,} CTA records",
              f"tails (span / mean SM end): GPU median {np.median(tg):.3f}, model {np.median(tm):.3f}; "
              f"mean |model - GPU| {np.mean(abs(tm - tg)):.3f}, correlation {np.corrcoef(tg, tm)[0, 1]:.2f}",
              f"first wave: every SM took the same number of CTAs in {even} of {len(traced)} cases, "
              f"the model's occupancy in {occupancy}",
              f"later CTAs starting in launch order (within 64 ns): {np.mean([t.in_order() for t in traced]):.1%}",
              f"a freed slot to the next CTA's start on that SM: p10 / p50 / p90 "
              f"{np.percentile(gaps, 10):.0f} / {np.percentile(gaps, 50):.0f} / {np.percentile(gaps, 90):.0f} ns "
              f"({len(gaps):,} refills; the model starts the next CTA at once)",
              f"SM clock in the kernels: median {np.median(clocks):.3f} GHz (cases {clocks.min():.3f}-{clocks.max():.3f}); "
              f"the model's fitted clock {H200.clock_ghz} GHz"]
    alone = [(t, gpu_phases(t)) for t in with_rounds if model_trace_occupancy(t.case) == 1]
    alone = [(t, g) for t, g in alone if g is not None]
    if alone:
        lines += ["", "One CTA per SM, SM cycles (the GPU: medians over the CTAs whose every round's start was "
                  "recorded; the model: one CTA of 8 rounds), GPU / model:", "",
                  "| case | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
        for t, g in alone:
            m = model_phases(t.case)
            lines.append(f"| {t.case.key} | " + " | ".join(f"{a:.0f} / {b:.0f}" for a, b in zip(g, m)) + " |")
    by_key = {t.case.key: t for t in traced}
    hf = [(by_key[k.replace("-hf/", "/")], t) for k, t in by_key.items()
          if "-hf/" in k and k.replace("-hf/", "/") in by_key]
    if hf:
        lines += ["", "| heavy_first case | GPU span speedup | model span speedup |", "|---|---|---|"]
        for base, opt in hf:
            g = np.median(base.spans_us) / np.median(opt.spans_us) - 1
            m = model[base.case.key][0] / model[opt.case.key][0] - 1
            lines.append(f"| {opt.case.key} | {g:+.1%} | {m:+.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true", help="run the traced kernel on the GPU")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default=None, metavar="REGEX", help="trace the cases of timing_measure.py whose key matches")
    ap.add_argument("--rounds", action="store_true",
                    help="with --measure: the round-trace variant (each round's start), to timing_rounds.npz")
    ap.add_argument("--data", type=Path, default=DATA, help="the recording the report reads")
    ap.add_argument("--rounds-data", type=Path, default=ROUNDS_DATA, help="the --rounds recording it reads")
    ap.add_argument("--jobs", type=int, default=1, help="processes that run the model's SM (one per case)")
    ap.add_argument("--list", action="store_true", help="print the cases and stop")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(c.key for c in dispatch_cases(args.only)))
        return 0
    if args.measure:
        print(f"wrote {measure(args.out, args.launches, args.warmup, args.only, args.rounds)}")
        return 0
    if not args.data.exists():
        raise SystemExit(f"no recording at {args.data}: run with --measure on a GPU first")
    print(report(load(args.data), args.jobs, load(args.rounds_data) if args.rounds_data.exists() else ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
