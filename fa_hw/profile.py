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

A packed batch (`cu_seqlens_q`, `cu_seqlens_k`) and split-KV decoding (`splits`, `cache_seqlens`,
`pack_gqa`) are profiled too: the packed batch is one launch of the FA_VARLEN build over the packed
grid, split-KV's split launch is the FA_SPLITKV build's (the one ncu selects by name, `KERNEL_NAME`:
fa2_combine.cu's kernel, launched after it, uses no shared memory and is not profiled). Their
simulator side is `fa banks`' count of the same launch (fa_sim.observers.runs.simulate on the PTX
engine), and their SASS walk is that of the FA_VARLEN / FA_SPLITKV build for this GPU
(`launch_sass_extra`).
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


def launch_options(cu_seqlens_q=None, cu_seqlens_k=None, splits=None, cache_seqlens=None,
                   pack_gqa=None) -> dict:
    """The packed-batch / split-KV keyword arguments of one launch as fa_hw.forward and fa_sim.simulate
    take them (the given ones only: {} for a dense launch); ValueError (one line) for both kinds at
    once, or for splits="auto" (resolve it first, with this GPU's SM count: both sides run one split count)."""
    packed = {n: x for n, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)) if x is not None}
    split = {n: x for n, x in (("splits", splits), ("cache_seqlens", cache_seqlens), ("pack_gqa", pack_gqa))
             if x is not None}
    if packed and split:
        raise ValueError("a packed batch (cu_seqlens_q / cu_seqlens_k) takes no split-KV options (splits, "
                         "cache_seqlens, pack_gqa)")
    if packed and len(packed) != 2:
        raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k (int32, batch + 1 offsets)")
    if isinstance(splits, str):
        raise ValueError(f"splits must be an integer here (the count that runs), got {splits!r}: resolve \"auto\" "
                         f"first (fa_sim.splitkv.check_splitkv with this GPU's SM count)")
    if split and "splits" not in split:
        split["splits"] = 1  # fa_hw.forward's and fa_sim.simulate's default with cache_seqlens alone
    return {**{n: np.asarray(x, np.int32) for n, x in packed.items()},
            **{n: (np.asarray(x, np.int32) if n == "cache_seqlens" else x) for n, x in split.items()}}


def ncu_command(target: str, metrics: list[str]) -> list[str]:
    """ncu's command line profiling the first launch of fa2_fwd_kernel (fa_sim.contract.KERNEL_NAME, by
    name: `regex:fa2_fwd_kernel`, the filter experiments/device_timing.sh uses on the device) that
    `python -m fa_hw.profile --target FILE` makes: the only launch of a dense run or a packed batch
    (FA_VARLEN), and split-KV's split launch (FA_SPLITKV), not fa2_combine_kernel after it."""
    from fa_sim.contract import KERNEL_NAME

    return [ncu_path(), "--csv", "--page", "raw", "--metrics", ",".join(metrics),
            "--kernel-name", f"regex:{KERNEL_NAME}",
            "--launch-count", "1", sys.executable, "-m", "fa_hw.profile", "--target", target]


def save_target(path, q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, window=None,
                softcap=None, **launch) -> None:
    """The profiled process's inputs (`_target`): the arrays, the config and every launch option
    (`launch`: launch_options' packed-batch or split-KV arguments)."""
    launch = launch_options(**launch)
    np.savez(path, q=q, k=k, v=v, causal=causal, scale=np.nan if scale is None else scale,
             config=json.dumps(config.to_json()), kernel="" if kernel is None else str(kernel),
             window=np.array((-1, -1) if window is None else window, np.int64),
             softcap=0.0 if softcap is None else float(softcap),
             **{n: launch[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens") if n in launch},
             **({} if "splits" not in launch else {"splits": int(launch["splits"])}),
             **({} if "pack_gqa" not in launch else {"pack_gqa": bool(launch["pack_gqa"])}))


def profile_launch(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None,
                   metrics: list[str] | None = None, window=None, softcap=None, **launch) -> dict[str, float]:
    """Run ncu on one launch of the kernel (`kernel`: a variant .cu, else fa_hw's own) with these
    features; {metric: value} for every metric ncu reported (`metrics`: the bank counters by default).
    `launch`: a packed batch's cu_seqlens_q, cu_seqlens_k, or split-KV's splits, cache_seqlens,
    pack_gqa (launch_options): the FA_VARLEN launch, or split-KV's split launch, is profiled."""
    metrics = _metric_names() if metrics is None else metrics
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "inputs.npz")
        save_target(npz, q, k, v, causal, scale, config, kernel, window, softcap, **launch)
        cmd = ncu_command(npz, metrics)
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
    #: a packed batch's or split-KV's launch: which launch was compared ("" for a dense one)
    launch: str = ""

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
        return {"config": self.config.tag, **({"launch": self.launch} if self.launch else {}),
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


def _feature_build(q, k, v, causal: bool, scale: float | None, config: KernelConfig, window, softcap, launch: dict,
                   kernel=None):
    """fa2_fwd.cu's build (for the PTX: sm_80) of a packed batch's launch (FA_VARLEN; `kernel`: a
    variant's) or of split-KV's split launch (FA_SPLITKV), as fa_sim.simulate makes it from these
    inputs (`launch`: launch_options)."""
    from dataclasses import replace

    from fa_sim.contract import KernelBuild, kernel_source
    from fa_sim.validate import make_problem

    if "cu_seqlens_q" in launch:
        from fa_sim.varlen import head_major, make_varlen_problem

        shapes = [np.shape(head_major(x, n, t)) for x, n, t in ((q, "q", "total_q"), (k, "k", "total_k"),
                                                                (v, "v", "total_k"))]
        prob = make_varlen_problem(*shapes, launch["cu_seqlens_q"], launch["cu_seqlens_k"], causal, scale, config,
                                   window, softcap)
        return replace(KernelBuild.of(prob, "sm_80"), kernel=None if kernel is None else kernel_source(kernel))
    from fa_sim.splitkv import check_splitkv, split_build

    prob = make_problem(np.shape(q), np.shape(k), np.shape(v), causal, scale, config, window, softcap)
    plan = check_splitkv(prob, launch["splits"], launch.get("cache_seqlens"), None, launch.get("pack_gqa"))
    return split_build(plan.problem, "sm_80")


def launch_sass_extra(build, paths: dict, ran: dict, arch: str) -> dict[SmemClass, int]:
    """Per shared-memory class, the warp instructions `build`'s SASS for `arch` issues beyond those
    the PTX engine ran (fa_sim.timing.issued.walked_counts: `paths`, a BranchRecorder's; `ran`, the
    run's counts). `build`: the launch's KernelBuild (fa2_fwd.cu's FA_VARLEN or FA_SPLITKV build, its
    PTX as the engine ran it)."""
    from fa_sim.timing.issued import walked_counts

    issued, engine = walked_counts(build, paths, ran, arch)
    return {c: issued.get(c.value, 0) - engine.get(c.value, 0) for c in SmemClass}


def simulated_counts(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, *, window=None,
                     softcap=None, arch: str | None = None, **launch) -> tuple[dict[SmemClass, Counts], dict]:
    """A packed batch's or split-KV's side of bank_comparison: (per class, `fa banks`' counts of the
    launch: its one PTX-engine run with a BankCounter, fa_sim.observers.runs.simulate as fa banks runs
    it; the SASS walk's extra warp instructions of that run's paths, launch_sass_extra, for `arch`,
    None: this GPU's). Split-KV: its split launch (the observers see only that one). `kernel`: a
    variant of fa2_fwd.cu (a packed batch only; split-KV runs fa_hw's own)."""
    import warnings

    from fa_sim.observers import runs
    from fa_sim.observers.branches import BranchRecorder

    from .device import device_arch

    launch = launch_options(**launch)
    if not launch:
        raise ValueError("simulated_counts takes a packed batch (cu_seqlens_q, cu_seqlens_k) or split-KV decoding "
                         "(splits, cache_seqlens, pack_gqa); a dense launch is sass_extra_instructions'")
    counter, rec = BankCounter(), BranchRecorder()
    packed = "cu_seqlens_q" in launch
    split = {} if packed else {n: launch.get(n) for n in ("splits", "cache_seqlens", "pack_gqa")}
    with warnings.catch_warnings():  # fully masked score rows: -inf - -inf in fp32
        warnings.simplefilter("ignore", RuntimeWarning)
        res = runs.simulate(q, k, v, causal=causal, config=config, observers=[counter, rec], scale=scale,
                            engine="ptx", kernel=kernel, window=window, softcap=softcap,
                            cu_seqlens=(launch["cu_seqlens_q"], launch["cu_seqlens_k"]) if packed else None, **split)
    build = _feature_build(q, k, v, causal, scale, config, window, softcap, launch, kernel)
    extra = launch_sass_extra(build, rec.paths(), res.counts, device_arch() if arch is None else arch)
    return counter.report().by_class(), extra


def bank_comparison(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, *,
                    window=None, softcap=None, **launch) -> BankComparison:
    """The simulator's shared-memory counts beside Nsight Compute's for one launch (GQA from k's
    heads, `window`, `softcap`, bf16 from the config: that feature's build on both sides). The
    simulator's counts come from one PTX-engine run (the counts both front ends give alike), whose
    warps' paths are also walked through this GPU's SASS for the instructions it issues with a
    false guard (`sass_extra_instructions`). `launch`: a packed batch's cu_seqlens_q, cu_seqlens_k
    or split-KV's splits (an integer), cache_seqlens, pack_gqa (launch_options): that launch
    (split-KV: its split launch) on both sides (`simulated_counts`)."""
    launch = launch_options(**launch)
    if launch:
        if kernel is not None and "cu_seqlens_q" not in launch:
            raise ValueError("split-KV decoding runs fa_hw's own kernel: bank_comparison takes kernel=None with it")
        sim, extra = simulated_counts(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap, **launch)
        return BankComparison(config, sim, profile_launch(q, k, v, causal, scale, config, kernel, window=window,
                                                          softcap=softcap, **launch), extra, _launch_note(launch))
    counter = BankCounter()
    extra = sass_extra_instructions(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap,
                                    observers=[counter])
    return BankComparison(config, counter.report().by_class(),
                          profile_launch(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap), extra)


def _launch_note(launch: dict) -> str:
    """What the comparison of a packed batch's or split-KV's launch covers, for its table and JSON."""
    if "cu_seqlens_q" in launch:
        return ("packed batch: the FA_VARLEN launch over the packed grid (sequences "
                + ",".join(map(str, np.diff(launch["cu_seqlens_q"]))) + ")")
    return (f"split-KV decoding, {launch['splits']} split{'s' if launch['splits'] != 1 else ''}: the split launch "
            "(FA_SPLITKV) profiled" + ("; fa2_combine_kernel, launched after it, uses no shared memory (not "
                                       "profiled)" if launch["splits"] > 1 else " (one split: no combine launch)"))


def format_bank_comparison(cmp: BankComparison) -> str:
    def cell(x):
        return "-" if x is None else f"{int(x):,}"

    lines = [f"shared memory, simulator vs Nsight Compute ({cmp.config.tag})",
             *([f"  {cmp.launch}"] if cmp.launch else []),
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
    prediction: object  # fa_sim.timing.Prediction, or a LaunchesPrediction (a packed batch, split-KV)
    ncu: dict
    #: a packed batch's or split-KV's launches: what was timed and profiled ("" for a dense launch)
    launch: str = ""

    @property
    def profiled(self):
        """The model's Prediction of the launch Nsight Compute profiled: the prediction itself, or
        fa2_fwd_kernel's among a LaunchesPrediction's kernels (split-KV: the split launch)."""
        from fa_sim.contract import KERNEL_NAME

        kernels = getattr(self.prediction, "kernels", None)
        return self.prediction if kernels is None else kernels[KERNEL_NAME]

    def stall(self, reason: str) -> float | None:
        return self.ncu.get(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio")

    def to_json(self) -> dict:
        return {"config": self.config.tag, **({"launch": self.launch} if self.launch else {}),
                "measured_ms": self.measured_ms, "batch_ms": list(self.batch_ms),
                "predicted": self.prediction.to_json(),
                "error": self.prediction.kernel_ms / self.measured_ms - 1,
                "ncu": {"inst_executed": self.ncu.get("smsp__inst_executed.sum"),
                        "issue_active_pct": self.ncu.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                        "stalls": {r: self.stall(r) for r in STALL_REASONS}}}


def measure_time(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None, warmup: int = 5,
                 reps: int = 20, batches: int = 3, *, window=None, softcap=None, **launch) -> tuple[float, tuple]:
    """(median, per-batch medians) of the kernel time in ms: CUDA events around each launch after
    warm-up, the launches enqueued behind a blocking kernel (fa_hw.blocking.time_launches). `launch` (launch_options): a packed batch's one FA_VARLEN launch, or split-KV's split
    and combine launches together (fa_hw.splitkv.SplitLaunchPlan.time)."""
    import statistics

    from .forward import prepare

    launch = launch_options(**launch)
    if "splits" in launch:
        from .splitkv import prepare_splitkv

        sp = prepare_splitkv(q, k, v, causal, scale, config, window=window, softcap=softcap, **launch)
        timed, stream = sp, sp.dev.stream
    else:
        timed, dev, _ = prepare(q, k, v, causal, scale, config, kernel=kernel, window=window, softcap=softcap,
                                **launch)
        stream = dev.stream
    medians = tuple(statistics.median(timed.time(stream, warmup, reps)) for _ in range(batches))
    return statistics.median(medians), medians


def predict_launches(q, k, v, causal: bool, config: KernelConfig, gpu: str = "h200", *, window=None, softcap=None,
                     **launch):
    """The timing model's LaunchesPrediction of a packed batch or of split-KV decoding (`fa time
    --seqlens` / `--splits`: fa_sim.timing.predict_time with the same arguments), from the inputs'
    shapes (packed: q [total_q, H, d], k [total_k, H_k, d]; split-KV: q [B, H, Nq, d], k [B, H_k, Nk, d])."""
    from fa_sim.timing import predict_time

    launch = launch_options(**launch)
    if "cu_seqlens_q" in launch:
        return predict_time(None, q.shape[1], None, None, q.shape[2], causal, config, gpu, heads_k=k.shape[1],
                            window=window, softcap=softcap, **launch)
    b, h, nq, d = q.shape
    return predict_time(b, h, nq, k.shape[2], d, causal, config, gpu, heads_k=k.shape[1], window=window,
                        softcap=softcap, **launch)


def timing_comparison(q, k, v, causal: bool, scale: float | None, config: KernelConfig, kernel=None,
                      gpu: str = "h200", *, window=None, softcap=None, **launch) -> TimingComparison:
    """fa compare --timing: measure the launch, profile one with Nsight Compute, predict it (GQA
    from k's heads, `window`, `softcap`, bf16 from the config: that build on all three). `launch`
    (launch_options): a packed batch (its FA_VARLEN launch measured, profiled and predicted) or
    split-KV decoding (both launches measured and predicted, the split launch profiled: the stall
    reasons and instructions are the split launch's on both sides); fa2_fwd.cu's own build."""
    from fa_sim.problem import Problem
    from fa_sim.timing import predict

    launch = launch_options(**launch)
    if launch and kernel is not None:
        raise ValueError("the timing model times a packed batch or split-KV decoding on fa2_fwd.cu's own build: "
                         "timing_comparison takes kernel=None with it")
    ms, batches = measure_time(q, k, v, causal, scale, config, kernel, window=window, softcap=softcap, **launch)
    if launch:
        pred = predict_launches(q, k, v, causal, config, gpu, window=window, softcap=softcap, **launch)
    else:
        b, h, nq, _ = q.shape
        pred = predict(Problem(b, h, nq, k.shape[2], causal, 1.0, config, heads_k=k.shape[1], window=window,
                               softcap=softcap), gpu, kernel)
    ncu = profile_launch(q, k, v, causal, scale, config, kernel, list(TIMING_METRICS), window=window, softcap=softcap,
                         **launch)
    note = ""
    if "cu_seqlens_q" in launch:
        note = _launch_note(launch)
    elif launch:
        note = (f"split-KV decoding, {launch['splits']} split{'s' if launch['splits'] != 1 else ''}: "
                + ("time of the split and combine launches together; stalls and instructions of the split launch "
                   "(the one profiled)" if launch["splits"] > 1 else "the split launch (one split: no combine)"))
    return TimingComparison(config, ms, batches, pred, ncu, note)


def format_timing_comparison(cmp: TimingComparison) -> str:
    p, one = cmp.prediction, cmp.profiled
    inst = cmp.ncu.get("smsp__inst_executed.sum")
    lines = [f"kernel time, measured vs the timing model ({cmp.config.tag})",
             *([f"  {cmp.launch}"] if cmp.launch else []),
             f"  measured   {cmp.measured_ms:.4f} ms (CUDA events, median of {len(cmp.batch_ms)} batches: "
             + ", ".join(f"{x:.4f}" for x in cmp.batch_ms) + ")",
             f"  predicted  {p.kernel_ms:.4f} ms ({p.kernel_ms / cmp.measured_ms - 1:+.1%}); {one.limiter}",
             f"  warp instructions executed: ncu {'-' if inst is None else f'{int(inst):,}'}, "
             f"model {one.instructions:,}",
             f"  {'stall reason':<22}{'ncu':>8}{'model':>8}   (warp-cycles per issued instruction)"]
    for r in STALL_REASONS:
        got, mine = cmp.stall(r), one.stalls.get(r)
        if (got or 0) >= 0.005 or mine:
            lines.append(f"  {r:<22}{'-' if got is None else f'{got:.2f}':>8}{'-' if mine is None else f'{mine:.2f}':>8}")
    return "\n".join(lines)


def _target(npz: str) -> None:
    """The profiled process: one launch of the kernel on the saved inputs (save_target): dense, a
    packed batch (FA_VARLEN), or split-KV decoding (its split launch, then the combine)."""
    d = np.load(npz)
    cfg = KernelConfig.from_json(str(d["config"]))
    scale = None if np.isnan(d["scale"]) else float(d["scale"])
    kernel = str(d["kernel"]) if "kernel" in d.files and str(d["kernel"]) else None
    window = tuple(int(x) for x in d["window"]) if "window" in d.files else (-1, -1)
    softcap = float(d["softcap"]) if "softcap" in d.files else 0.0
    launch = {n: d[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens") if n in d.files}
    if "splits" in d.files:
        launch["splits"] = int(d["splits"])
    if "pack_gqa" in d.files:
        launch["pack_gqa"] = bool(d["pack_gqa"])
    forward(d["q"], d["k"], d["v"], causal=bool(d["causal"]), scale=scale, config=cfg, kernel=kernel,
            window=None if window == (-1, -1) else window, softcap=softcap or None, **launch)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    _target(ap.parse_args().target)
