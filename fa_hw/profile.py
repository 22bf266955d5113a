"""Nsight Compute runs of the kernel and their shared-memory counters beside the simulator's.

`bank_comparison(q, k, v, causal, scale, config)` profiles one launch of fa2_fwd with `ncu`
(metrics below, per SASS instruction class, as docs/hardware_facts.md lists them), runs the simulator's
BankCounter on the same inputs, and returns both sets of counts. `fa compare --banks` prints it.

The profiled process is this module itself (`python -m fa_hw.profile --target FILE`), which
loads the inputs from an .npz and launches the kernel once; ncu's `--csv --page raw` output is
parsed into {metric: value}. Issue 38's features pass through: k and v with fewer heads than q
(GQA), `window`, `softcap`, and a bf16 config (float32 arrays of bf16 values, as fa_hw.forward takes
them); the profiled launch is that feature's build, as the simulator's is (docs/features.md).

Instructions are what the build's SASS issues: Nsight Compute's `inst_executed` counts a warp
instruction whose guard is false for every lane too, and ptxas if-converts some arms the PTX
branches around (the GQA build's Q copy: fa_sim.timing.issued). So the simulator's count per class
is its PTX run's plus the SASS walk's difference (`sass_extra`: issued minus run, per class), which
adds instructions and no wavefronts.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

from fa_sim.config import KernelConfig
from fa_sim.observers.banks import BankCounter, Counts, SmemClass

from .errors import FaHwError
from .forward import forward

#: ncu's counters per class and quantity, as `ncu --query-metrics` lists them on the H200
#: (experiments/device_crosscheck.sh keeps that list). A quantity is a metric, or (a, b) for a - b.
#: There is no per-SASS-class conflict counter for LDS and STS: ncu's bank-conflict counters for
#: them are the L1 hardware counters, and the `op_ld` one includes ldmatrix, so LDS conflicts are
#: l1tex op_ld minus the LDSM conflicts. cp.async.cg is LDGSTS with the cache-bypass path.
METRICS: dict[SmemClass, dict[str, str | tuple[str, str]]] = {
    SmemClass.LDSM: {
        "instructions": "smsp__inst_executed_op_ldsm.sum",
        "wavefronts": "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
        "conflicts": "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum",
    },
    SmemClass.LDS: {
        "instructions": "smsp__sass_inst_executed_op_shared_ld.sum",
        "wavefronts": "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
        "conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                      "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum"),
    },
    SmemClass.STS: {
        "instructions": "smsp__sass_inst_executed_op_shared_st.sum",
        "wavefronts": "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    },
    SmemClass.LDGSTS: {
        "instructions": "smsp__inst_executed_op_ldgsts.sum",
        "wavefronts": "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum",
        "conflicts": "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts_cache_bypass.sum",
    },
}


def _metric_names() -> list[str]:
    names = []
    for quantities in METRICS.values():
        for spec in quantities.values():
            names += list(spec) if isinstance(spec, tuple) else [spec]
    return list(dict.fromkeys(names))


def ncu_value(ncu: dict[str, float], spec) -> float | None:
    """A quantity from parsed ncu output: a metric, or the difference of two; None if missing."""
    if isinstance(spec, tuple):
        a, b = (ncu.get(m) for m in spec)
        return None if a is None or b is None else a - b
    return ncu.get(spec)


class ProfileError(FaHwError):
    """ncu is missing, failed, or printed nothing we could read."""


def ncu_path() -> str:
    path = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)
    if path is None:
        raise ProfileError("Nsight Compute (ncu) is not installed or not on PATH")
    return path


def parse_raw_csv(text: str) -> dict[str, float]:
    """ncu --csv --page raw: header row of metric names, a units row, one row per kernel."""
    rows = [r for r in csv.reader(io.StringIO(text[text.find('"ID"'):] if '"ID"' in text else text)) if r]
    if len(rows) < 3:
        raise ProfileError(f"ncu printed no kernel rows:\n{text[-2000:]}")
    header, values = rows[0], rows[2]
    out = {}
    for name, value in zip(header, values):
        try:
            out[name] = float(value.replace(",", ""))
        except ValueError:
            continue
    return out


def profile_launch(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None,
                   metrics: list[str] | None = None, window=None, softcap=None) -> dict[str, float]:
    """Run ncu on one launch of the kernel (`kernel`: a variant .cu, else fa_hw's own) with these
    features; {metric: value} for every metric ncu reported (`metrics`: the bank counters by default)."""
    metrics = _metric_names() if metrics is None else metrics
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "inputs.npz")
        np.savez(npz, q=q, k=k, v=v, causal=causal, scale=np.nan if scale is None else scale,
                 config=json.dumps(config.to_json()), kernel="" if kernel is None else str(kernel),
                 window=np.array((-1, -1) if window is None else window, np.int64),
                 softcap=0.0 if softcap is None else float(softcap))
        cmd = [ncu_path(), "--csv", "--page", "raw", "--metrics", ",".join(metrics), "--kernel-name",
               "regex:fa2", "--launch-count", "1", sys.executable, "-m", "fa_hw.profile", "--target", npz]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise ProfileError(f"ncu failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return parse_raw_csv(proc.stdout)


@dataclass(frozen=True)
class BankComparison:
    config: KernelConfig
    sim: dict[SmemClass, Counts]  # the simulator's run (PTX instructions)
    ncu: dict[str, float]
    #: per class, warp instructions the build's SASS issues beyond those the run executed (issued
    #: with a false guard: if-converted arms, fa_sim.timing.issued); no wavefronts
    sass_extra: dict[SmemClass, int] = field(default_factory=dict)

    def ncu_counts(self, cls: SmemClass) -> dict[str, float | None]:
        return {q: ncu_value(self.ncu, spec) for q, spec in METRICS[cls].items()}

    def instructions(self, cls: SmemClass) -> int:
        """The simulator's warp instructions of `cls` as the SASS issues them (run + sass_extra)."""
        return self.sim[cls].instructions + self.sass_extra.get(cls, 0)

    def matches(self, cls: SmemClass) -> bool:
        """Instructions (as issued), wavefronts and conflicts equal; for LDGSTS instructions and
        wavefronts only, since ncu calls none of its extra wavefronts bank conflicts
        (docs/hardware_facts.md)."""
        got, mine = self.ncu_counts(cls), self.sim[cls]
        want = {"instructions": self.instructions(cls), "wavefronts": mine.wavefronts, "conflicts": mine.conflicts}
        compared = ("instructions", "wavefronts") if cls is SmemClass.LDGSTS else tuple(got)
        return all(got[q] is not None and int(got[q]) == want[q] for q in compared)

    def to_json(self) -> dict:
        return {"config": self.config.tag,
                "classes": {c.value: {"sim": {**self.sim[c].to_json(c), "instructions": self.instructions(c),
                                              "ptx_instructions": self.sim[c].instructions,
                                              "sass_guard_off": self.sass_extra.get(c, 0)},
                                      "ncu": self.ncu_counts(c), "match": self.matches(c)} for c in SmemClass},
                "ncu_metrics": {m: self.ncu.get(m) for m in _metric_names()}}


def sass_extra_instructions(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, *,
                            window=None, softcap=None, arch: str | None = None,
                            observers=()) -> dict[SmemClass, int]:
    """Per shared-memory class, the warp instructions the build's SASS for `arch` (None: this GPU's)
    issues in this launch beyond those the PTX engine runs (fa_sim.timing.issued); `observers` see
    that PTX-engine run."""
    from fa_sim.timing.issued import issued_counts

    from .device import device_arch

    issued, ran = issued_counts(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap,
                                arch=device_arch() if arch is None else arch, observers=observers)
    return {c: issued.get(c.value, 0) - ran.get(c.value, 0) for c in SmemClass}


def bank_comparison(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, *,
                    window=None, softcap=None) -> BankComparison:
    """The simulator's shared-memory counts beside Nsight Compute's for one launch (GQA from k's
    heads, `window`, `softcap`, bf16 from the config: that feature's build on both sides). The
    simulator's counts come from one PTX-engine run (the counts both front ends give alike), whose
    warps' paths are also walked through this GPU's SASS for the instructions it issues with a
    false guard (`sass_extra_instructions`)."""
    counter = BankCounter()
    extra = sass_extra_instructions(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap,
                                    observers=[counter])
    return BankComparison(config, counter.report().by_class(),
                          profile_launch(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap), extra)


def format_bank_comparison(cmp: BankComparison) -> str:
    def cell(x):
        return "-" if x is None else f"{int(x):,}"

    lines = [f"shared memory, simulator vs Nsight Compute ({cmp.config.tag})",
             f"  {'class':<8}{'sim instr':>11}{'ncu instr':>11}{'sim wavefr':>12}{'ncu wavefr':>12}"
             f"{'sim confl':>11}{'ncu confl':>11}  match"]
    for c in SmemClass:
        s, n = cmp.sim[c], cmp.ncu_counts(c)
        conf = cell(n["conflicts"])
        lines.append(f"  {c.value:<8}{cmp.instructions(c):>11,}{cell(n['instructions']):>11}{s.wavefronts:>12,}"
                     f"{cell(n['wavefronts']):>12}{s.conflicts:>11,}{conf:>11}  {'yes' if cmp.matches(c) else 'NO'}")
    lines.append("  (LDS conflicts: l1tex op_ld conflicts minus LDSM's; LDGSTS: cp.async.cg, cache-bypass path)")
    off = {c.value: n for c, n in cmp.sass_extra.items() if n}
    if off:
        lines.append("  (sim instr: the PTX run's plus what the SASS issues with a false guard: "
                     + ", ".join(f"{c} {n:+,}" for c, n in off.items()) + ")")
    return "\n".join(lines)


#: Nsight Compute's warp-state reasons (WarpStateStats section), per issued instruction.
STALL_REASONS = ("selected", "not_selected", "wait", "short_scoreboard", "long_scoreboard", "barrier",
                 "math_pipe_throttle", "mio_throttle", "no_instruction", "dispatch_stall", "branch_resolving",
                 "lg_throttle", "membar", "drain", "misc", "sleeping", "tex_throttle", "imc_miss")
TIMING_METRICS = ("smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                  "sm__warps_active.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum",
                  *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS))


@dataclass(frozen=True)
class TimingComparison:
    """The measured kernel time and Nsight Compute's warp states beside the timing model's."""

    config: KernelConfig
    measured_ms: float  # median over batches of the per-batch medians (CUDA events)
    batch_ms: tuple
    prediction: object  # fa_sim.timing.Prediction
    ncu: dict

    def stall(self, reason: str) -> float | None:
        return self.ncu.get(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio")

    def to_json(self) -> dict:
        return {"config": self.config.tag, "measured_ms": self.measured_ms, "batch_ms": list(self.batch_ms),
                "predicted": self.prediction.to_json(),
                "error": self.prediction.kernel_ms / self.measured_ms - 1,
                "ncu": {"inst_executed": self.ncu.get("smsp__inst_executed.sum"),
                        "issue_active_pct": self.ncu.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                        "stalls": {r: self.stall(r) for r in STALL_REASONS}}}


def measure_time(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, warmup: int = 5,
                 reps: int = 20, batches: int = 3, *, window=None, softcap=None) -> tuple[float, tuple]:
    """(median, per-batch medians) of the kernel time in ms: CUDA events around each launch after warm-up."""
    import statistics

    from .forward import prepare

    plan, dev, _ = prepare(q, k, v, causal, scale, config, kernel=kernel, window=window, softcap=softcap)
    medians = tuple(statistics.median(plan.time(dev.stream, warmup, reps)) for _ in range(batches))
    return statistics.median(medians), medians


def timing_comparison(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None,
                      gpu: str = "h200", *, window=None, softcap=None) -> TimingComparison:
    """fa compare --timing: measure the launch, profile one with Nsight Compute, predict it (GQA
    from k's heads, `window`, `softcap`, bf16 from the config: that build on all three)."""
    from fa_sim.problem import Problem
    from fa_sim.timing import predict

    ms, batches = measure_time(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap)
    b, h, nq, _ = q.shape
    pred = predict(Problem(b, h, nq, k.shape[2], causal, 1.0, config, heads_k=k.shape[1], window=window,
                           softcap=softcap), gpu, kernel)
    ncu = profile_launch(q, k, v, causal, scale, config, kernel, list(TIMING_METRICS), window=window, softcap=softcap)
    return TimingComparison(config, ms, batches, pred, ncu)


def format_timing_comparison(cmp: TimingComparison) -> str:
    p = cmp.prediction
    inst = cmp.ncu.get("smsp__inst_executed.sum")
    lines = [f"kernel time, measured vs the timing model ({cmp.config.tag})",
             f"  measured   {cmp.measured_ms:.4f} ms (CUDA events, median of {len(cmp.batch_ms)} batches: "
             + ", ".join(f"{x:.4f}" for x in cmp.batch_ms) + ")",
             f"  predicted  {p.kernel_ms:.4f} ms ({p.kernel_ms / cmp.measured_ms - 1:+.1%}); {p.limiter}",
             f"  warp instructions executed: ncu {'-' if inst is None else f'{int(inst):,}'}, model {p.instructions:,}",
             f"  {'stall reason':<22}{'ncu':>8}{'model':>8}   (warp-cycles per issued instruction)"]
    for r in STALL_REASONS:
        got, mine = cmp.stall(r), p.stalls.get(r)
        if (got or 0) >= 0.005 or mine:
            lines.append(f"  {r:<22}{'-' if got is None else f'{got:.2f}':>8}{'-' if mine is None else f'{mine:.2f}':>8}")
    return "\n".join(lines)


def _target(npz: str) -> None:
    """The profiled process: one launch of the kernel on the saved inputs."""
    d = np.load(npz)
    cfg = KernelConfig.from_json(str(d["config"]))
    scale = None if np.isnan(d["scale"]) else float(d["scale"])
    kernel = str(d["kernel"]) if "kernel" in d.files and str(d["kernel"]) else None
    window = tuple(int(x) for x in d["window"]) if "window" in d.files else (-1, -1)
    softcap = float(d["softcap"]) if "softcap" in d.files else 0.0
    forward(d["q"], d["k"], d["v"], causal=bool(d["causal"]), scale=scale, config=cfg, kernel=kernel,
            window=None if window == (-1, -1) else window, softcap=softcap or None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    _target(ap.parse_args().target)
