"""`--backward` on `fa sim`, `fa banks` and `fa trace`: the backward pass (fa_hw/kernels/fa2_bwd.cu,
docs/backward.md) on the PTX engine, through fa_sim.simulate_backward.

Inputs: random q, k, v as the forward commands draw them for the same options, and dO the same
generator's next standard-normal draw (fa_sim.reference.random_inputs_backward; `--dtype bf16`:
the same draws rounded to bf16); or `--npz FILE` holding q, k, v and do (with --dtype bf16: bf16
values, as float32 or float16 arrays, as the forward's --npz takes them; a value bf16 does not hold
is one line). `--dtype bf16` runs the FA_BF16 build of the forward and of the three backward kernels,
and the accuracy lines use the bf16 bound (attention_backward(..., dtype="bf16"), docs/backward.md
section 4). The forward (fa_sim.simulate, its default config for head_dim) gives
O and LSE, then the three backward kernels run. The backward's tiles and options are a
fa_sim.contract.backward.BackwardConfig (d = 32, 64, 96, 128, 160, 192; 256 is refused with
UNSUPPORTED's reason): DEFAULT_TILES, or `--config LABEL` (LABEL_FORMS, e.g. 64x8s1fr4p: the labels
of experiments/tune_bwd.py's candidates, checked against the problem's head_dim before any work),
or `--config auto` in fa time (the modelled GPU's entry of fa_hw.tuned_backward's tables), fa hw and
fa compare (the device's), which print the table entry it came from. The forward's config options but
--head-dim and --dtype, a forward config tag and --engine are refused with --backward; `--kernel FILE` names a variant of
fa2_bwd.cu (an existing .cu file with the same kernels, parameters and FA_* macros). dO is
checked with simulate_backward's own checks (shape, NaN/Inf) before the forward runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import UsageError
from .common import (
    AUTO_CONFIG,
    PROBLEM_DESTS,
    check_input_memory,
    config_options,
    is_backward_label,
    problem_head_dim,
    problem_shape,
    refuse,
    refuse_features,
    warp_and_lane,
)
from .inputs import _refuse, check_host_memory, inputs_option, load_npz

BACKWARD_FILE = ("arrays q [B, H, Nq, d], k and v [B, H, Nk, d], and with --backward do [B, H, Nq, d] "
                 "(numpy.savez(FILE, q=q, k=k, v=v, do=do))")
DQ_MODES = ("deterministic", "atomic")
GRADIENTS = ("dq", "dk", "dv")
LABELS = {"dq": "dQ", "dk": "dK", "dv": "dV"}
KERNEL_COLUMNS = {"fa2_bwd_preprocess_kernel": "preprocess", "fa2_bwd_kernel": "main",
                  "fa2_bwd_convert_dq_kernel": "convert dQ", "fa2_bwd_dq_kernel": "dQ"}


def add_backward_arguments(p, dq_mode: bool = True) -> None:
    """--backward, and --dq MODE where the dQ accumulation matters."""
    p.add_argument("--backward", action="store_true",
                   help="run the backward pass (fa2_bwd.cu on the PTX engine, after the forward) with dO seeded "
                        "after q, k, v, or the --npz file's array do (default off)")
    if dq_mode:
        p.add_argument("--dq", choices=DQ_MODES, default="deterministic",
                       help="with --backward: how dQ is summed across K/V blocks: deterministic (a dQ kernel of "
                            "its own loops over the K/V blocks in order, no atomics, O(N) memory) or atomic "
                            "(red.global.add.f32 from the main kernel, FlashAttention-2's way) "
                            "(default deterministic; one of deterministic, atomic)")


def check_options(args, refused: tuple[str, ...] = ()) -> None:
    """Refuse what does not apply with --backward (or --dq without it), before any work."""
    if not args.backward:
        refuse(args, ("dq",), "without --backward")
        return
    forward = [o.dest for o in config_options() if o.dest not in ("head_dim", "dtype")]
    refuse(args, (*forward, "engine"),
           "with --backward: the backward's tiles and options are a BackwardConfig, chosen by --config LABEL|auto "
           "(docs/backward.md)")
    check_config_option(args)
    refuse_features(args, "with --backward: fa2_bwd.cu has no grouped-query attention, sliding window or softcap "
                          "(docs/features.md)")
    refuse(args, ("seqlens", "splits", "cache_seqlens", "pack_gqa"), "with --backward: fa2_bwd.cu has no packed batches "
                                                         "(cu_seqlens) or split-KV decoding (docs/features.md)")
    refuse(args, refused, f"with --backward in fa {args.command} (the backward pass's options: docs/backward.md, "
                          f"section 7)")
    if getattr(args, "npz", None) is None and getattr(args, "head_dim", None) is not None:
        from ..contract.backward import BackwardConfig
        d = problem_head_dim(args)
        BackwardConfig(d)  # 256: one line with its reason, before any GPU or engine work
        backward_config(args, d, auto=_not_yet)  # a label that does not tile at d: one line, before any work


#: the commands where --config auto applies with --backward: a GPU's tuned table (fa time: the modelled GPU's)
AUTO_COMMANDS = ("time", "hw", "compare")


def check_config_option(args) -> None:
    """--config with --backward: a backward label (its syntax; its tiles at the head_dim come with
    backward_config) or auto where a GPU chooses (AUTO_COMMANDS); a forward tag is one line."""
    from ..contract.backward import LABEL_FORMS

    tag = getattr(args, "config", None)
    if tag is None or is_backward_label(tag):
        return
    if tag == AUTO_CONFIG:
        if args.command not in AUTO_COMMANDS:
            raise UsageError(f"--config auto with --backward picks a GPU's tuned backward tiles (fa_hw.tuned_backward), "
                             f"so it applies to fa time (the modelled GPU's), fa hw and fa compare; in fa {args.command} "
                             f"give a label ({LABEL_FORMS})")
        return
    raise UsageError(f"--config {tag} is a forward config tag; with --backward --config takes a backward label "
                     f"({LABEL_FORMS}) or auto")


def _not_yet(head_dim: int, dtype: str):
    return None  # check_options: --config auto is resolved by the command, which knows the GPU


def backward_config(args, head_dim: int, auto=None):
    """(the BackwardConfig of the options for this head_dim in --dtype, the tuned table entry it came from
    or None): DEFAULT_TILES without --config, a label's config (one UsageError line when it does not tile
    or fit at head_dim), or for --config auto auto(head_dim, dtype) - a fa_hw.tuned_backward.Choice, given
    by the command that knows the GPU (None: not chosen yet, DEFAULT_TILES)."""
    from ..contract.backward import BackwardConfig

    dtype = dtype_of(args)
    tag = getattr(args, "config", None)
    if tag == AUTO_CONFIG and auto is not None:
        choice = auto(head_dim, dtype)
        if choice is not None:
            return choice.config, choice.source
    if tag is None or tag == AUTO_CONFIG:
        return BackwardConfig(head_dim, dtype=dtype), None
    try:
        return BackwardConfig.from_label(tag, head_dim, dtype), None
    except ValueError as exc:
        raise UsageError(f"--config {tag} at head_dim {head_dim}: {exc}") from None


def config_json(cfg) -> dict:
    """The config of a --backward run as the JSON outputs give it."""
    return {"head_dim": cfg.head_dim, "block_m": cfg.block_m, "block_n": cfg.block_n, "warps": cfg.n_warps,
            "label": cfg.label}


def kernel_variant(args) -> Path | None:
    """--kernel with --backward: a variant of fa2_bwd.cu, an existing .cu file, or a .patch/.diff
    against fa2_bwd.cu (applied strictly, fa_sim/contract/patch.py, and the result written once to
    the disk cache as a .cu, which the backward build reads)."""
    import hashlib

    from ..cache import cache_root, store_atomic
    from ..contract.backward import BWD_PATH
    from ..contract.errors import KernelSourceError
    from ..contract.patch import apply_patch

    if getattr(args, "kernel", None) is None:
        return None
    path = Path(args.kernel)
    if path.suffix not in (".cu", ".patch", ".diff") or not path.is_file():
        raise UsageError(f"--kernel {args.kernel}: with --backward, --kernel takes an existing .cu file, a variant of "
                         f"fa_hw/kernels/fa2_bwd.cu with the same kernels, parameters and FA_* macros, or a "
                         f".patch/.diff against fa2_bwd.cu")
    if path.suffix == ".cu":
        return path
    try:
        text = apply_patch(BWD_PATH.read_text(), path.read_text(), name=f"--kernel {args.kernel}", target=BWD_PATH.name)
    except (KernelSourceError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(str(exc) if isinstance(exc, KernelSourceError) else f"--kernel {args.kernel}: cannot read it: "
                         f"{exc}") from None
    out = cache_root() / "kernel-variants" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}-{path.stem}.cu"
    if not out.is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # store_atomic then fails: the message below
        if not store_atomic(out, text.encode()):
            raise UsageError(f"--kernel {args.kernel}: cannot write the patched fa2_bwd.cu to {out.parent} "
                             "(set FLASHSIM_CACHE to a writable directory, or give the patched .cu)")
    return out


def dtype_of(args) -> str:
    """The run's 16-bit type: --dtype (fp16 or bf16; fa explain has none: fp16)."""
    return getattr(args, "dtype", "fp16")


def load_inputs(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v, dO of --npz FILE (its do array is required), or seeded random ones, in --dtype (bf16:
    float32 arrays of bf16 values; a bf16 run reads float16 file arrays through their values, as the
    forward's commands/common.run_inputs does, so that the input policy names a value bf16 does not
    hold)."""
    from ..reference import random_inputs_backward

    dtype = dtype_of(args)
    if getattr(args, "npz", None) is None:
        check_input_memory(args)
        b, h, nq, nk, d = problem_shape(args)
        need = 2 * b * h * nq * d * 4  # dO, dQ and their fp32 workspace besides q, k, v, O
        check_host_memory(need, f"(B, H, Nq, d) = ({b}, {h}, {nq}, {d})", "dO, dQ and the dQ workspace",
                          "lower --batch, --heads or --seqlen")
        return random_inputs_backward(b, h, nq, nk, d, args.seed, dtype=dtype)
    option = inputs_option(args)
    refuse(args, PROBLEM_DESTS, f"with {option}: the file's q, k, v fix the shape")
    data = load_npz(args.npz, ("q", "k", "v", "do"), option, BACKWARD_FILE)
    for name, x in data.items():
        if x.ndim != 4:
            raise _refuse(option, args.npz, f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape "
                                            f"{x.shape}", BACKWARD_FILE)
        if x.dtype.kind not in "fiu":
            raise _refuse(option, args.npz, f"{name} has dtype {x.dtype}, not a number type", BACKWARD_FILE)
    arrays = data["q"], data["k"], data["v"], data["do"]
    if dtype == "bf16":
        return tuple(np.asarray(x, np.float32) if x.dtype == np.float16 else x for x in arrays)
    return arrays


def check_inputs(q, k, v, do, causal: bool, scale, dtype: str = "fp16", config=None):
    """simulate_backward's checks of q, k, v and dO (shapes, head_dim, NaN/Inf, in `dtype` the input
    policy and bf16's range), before the forward runs; O and LSE stand in as zeros (the forward makes
    them). Returns the BackwardConfig (`config`, else DEFAULT_TILES')."""
    from ..backward import check_backward_inputs
    from ..contract.backward import BackwardConfig

    q = np.asarray(q)
    if q.ndim == 4:
        BackwardConfig(int(q.shape[3]))  # an unsupported head_dim: one line naming the choices
    zeros = np.zeros(q.shape, np.float16 if dtype == "fp16" else np.float32)
    x = check_backward_inputs(q, k, v, zeros, np.zeros(q.shape[:3], np.float32), do, causal, scale, config,
                              dtype=dtype)
    return x.config


@dataclass(frozen=True)
class Run:
    """A forward and a backward run on the same inputs."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    fwd: object  # fa_sim.SimResult
    res: object  # fa_sim.BackwardResult
    forward_seconds: float


def run_backward(args, observers=(), kernel=None, mma=None, dq_observers=(), dq: str | None = None) -> Run:
    """Inputs, their checks, the forward, then simulate_backward with `observers` on its main kernel
    (`dq_observers` on the deterministic mode's dQ kernel) under the --config label's tiles
    (backward_config); `dq` the dQ mode, default args.dq."""
    from ..backward import simulate_backward
    from ..simulate import simulate

    q, k, v, do = load_inputs(args)
    scale, dtype = getattr(args, "scale", None), dtype_of(args)
    check_inputs(q, k, v, do, args.causal, scale, dtype)
    config = backward_config(args, int(np.shape(q)[3]))[0]  # a label at the inputs' head_dim, before the forward
    start = time.perf_counter()
    fwd = simulate(q, k, v, causal=args.causal, scale=scale, mma_model=mma, dtype=dtype)
    seconds = time.perf_counter() - start
    res = simulate_backward(q, k, v, fwd.o, fwd.lse, do, causal=args.causal, scale=scale,
                            deterministic=(dq or args.dq) == "deterministic", observers=observers,
                            dq_observers=dq_observers, kernel=kernel, mma_model=mma, dtype=dtype, config=config)
    return Run(q, k, v, do, fwd, res, seconds)


# -- fa sim --backward --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GradError:
    """One gradient against float64: max |error|, that over max |gradient|, the largest error / bound
    (None where a value is not finite), and the non-finite count."""

    max_abs: float | None
    relative: float | None
    of_bound: float | None
    nonfinite: int

    @property
    def ok(self) -> bool:
        return self.nonfinite == 0 and self.of_bound is not None and self.of_bound <= 1.0

    def to_json(self) -> dict:
        return {"max_abs_err": self.max_abs, "rel_err": self.relative, "err_over_bound": self.of_bound,
                "nonfinite": self.nonfinite}


def gradient_errors(run: Run) -> dict[str, GradError]:
    """dQ, dK, dV against fa_sim.reference.attention_backward with its derived elementwise bound for
    the run's type (res.config.dtype: fp16's, or bf16's with unit roundoff 2^-8), on the values the
    kernels saw (fp16 arrays, or float32 ones holding the bf16 values)."""
    from ..reference import attention_backward

    dtype = run.res.config.dtype
    half = np.float16 if dtype == "fp16" else np.float32
    *want, bq, bk, bv = attention_backward(*(np.asarray(x).astype(half) for x in (run.q, run.k, run.v, run.do)),
                                           causal=run.res.causal, scale=run.res.scale, bound=True, dtype=dtype)
    out = {}
    for name, got, ref, bound in zip(GRADIENTS, (run.res.dq, run.res.dk, run.res.dv), want, (bq, bk, bv)):
        g = got.astype(np.float64)
        bad = int((~np.isfinite(g)).sum())
        if bad:
            out[name] = GradError(None, None, None, bad)
            continue
        err = np.abs(g - ref)
        top = float(np.abs(ref).max()) if ref.size else 0.0
        mx = float(err.max()) if err.size else 0.0
        out[name] = GradError(mx, mx / top if top > 0 else 0.0, float((err / bound).max()) if err.size else 0.0, 0)
    return out


def _num(x: float | None) -> str:
    return "not finite" if x is None else f"{x:.3e}"


def sim(args) -> int:
    """`fa sim --backward`: see fa_sim/commands/sim.py."""
    import json

    from ..events import COUNTED_OPS

    check_options(args, ("workers", "cluster"))
    kernel = kernel_variant(args)
    checkers = {}  # kernel name -> HazardChecker: the main kernel, and the deterministic mode's dQ kernel
    if args.check_hazards:
        from ..observers.hazards import HazardChecker
        checkers = {"fa2_bwd_kernel": HazardChecker()}
        if args.dq == "deterministic":
            checkers["fa2_bwd_dq_kernel"] = HazardChecker()
    run = run_backward(args, tuple(checkers.values())[:1], kernel, args.mma, tuple(checkers.values())[1:])
    res, errs = run.res, gradient_errors(run)
    reports = {name: c.report() for name, c in checkers.items()}
    above = [n for n, e in errs.items() if not e.ok]
    status = 1 if above or any(not r.ok for r in reports.values()) else 0
    counts = {kern: {op.value: int(c.get(op, 0)) for op in COUNTED_OPS} for kern, c in res.instructions.items()}
    mode = "deterministic" if res.deterministic else "atomic"
    if args.json:
        out = {"gradients": {n: e.to_json() for n, e in errs.items()}, "above_bound": above,
               "dq_mode": mode, "dtype": res.config.dtype,
               "config": config_json(res.config),
               "seconds": {"forward": run.forward_seconds, "backward": res.seconds}, "instructions": counts,
               "kernel": None if kernel is None else str(kernel)}
        if reports:
            out["hazards"] = reports["fa2_bwd_kernel"].to_json()
            out["hazards_by_kernel"] = {name: r.to_json() for name, r in reports.items()}
        print(json.dumps(out, allow_nan=False))
        return status
    b, h, nq, d = run.q.shape
    print(f"fa sim --backward: B={b} H={h} Nq={nq} Nk={run.k.shape[2]} d={d} "
          f"{'causal' if res.causal else 'non-causal'} scale={res.scale:.6g} {res.config.describe()} "
          + (f"(--config {res.config.label}) " if getattr(args, "config", None) is not None else "")
          + f"dQ {mode}" + (f" kernel {kernel.name}" if kernel is not None else ""))
    print("  gradients against float64 (fa_sim.reference.attention_backward, with its error bound)")
    print(f"    {'':<4}{'max |error|':>12}{'/ max |grad|':>14}{'error / bound':>15}")
    for name, e in errs.items():
        frac = "-" if e.of_bound is None else f"{e.of_bound:.2f}"
        print(f"    {LABELS[name]:<4}{_num(e.max_abs):>12}{_num(e.relative):>14}{frac:>15}"
              + (f"   {e.nonfinite} not finite" if e.nonfinite else "")
              + ("   ABOVE BOUND" if not e.ok else ""))
    names = {k: KERNEL_COLUMNS.get(k, k) for k in counts}
    print("  warp instructions " + "".join(f"{names[k]:>12}" for k in counts))
    for op in COUNTED_OPS:
        print(f"    {op.value:<15}" + "".join(f"{counts[k][op.value]:>12,}" for k in counts))
    print(f"  forward wall time              {run.forward_seconds:.3f} s")
    print(f"  backward wall time             {res.seconds:.3f} s")
    if reports:
        from ..observers.hazards import format_hazards
        for name, r in reports.items():
            print(("main kernel" if name == "fa2_bwd_kernel" else "dQ kernel") + f" ({name}) " + format_hazards(r))
    return status


# -- fa banks --backward ----------------------------------------------------------------------------------
def banks(args) -> int:
    """`fa banks --backward`: BankCounter on the main kernel's launch; per class, phase and round."""
    import json

    from ..observers import bank_tables
    from ..observers.banks import BankCounter

    check_options(args, ("compare", "plot", "kernel"))
    counter = BankCounter()
    run = run_backward(args, (counter,), dq="atomic")  # the main kernel with its dQ GEMM (FlashAttention-2's)
    rep = counter.report()
    import dataclasses
    cfg = run.res.config
    smem = ("swizzled (fa2_bwd.cu FA_SMEM_SWIZZLE: rows of d halves, Swizzle<{},{},{}> in 8 x {} atoms)"
            .format(*cfg.swizzle_bms, cfg.swizzle_atom_cols) if cfg.smem_swizzle
            else "padded (fa2_bwd.cu: rows of d + 8 halves)")
    rep = dataclasses.replace(rep, smem=smem)
    b, h, nq, d = run.q.shape
    nk = run.k.shape[2]
    if args.json:
        meta = {"kernel": "fa2_bwd_kernel",
                "problem": {"batch": b, "heads": h, "seqlen": nq, "seqlen_k": nk, "head_dim": d, "seed": args.seed},
                "config": config_json(cfg),
                "dtype": cfg.dtype, "causal": args.causal}
        print(json.dumps({**meta, **rep.to_json()}, indent=1))
        return 0
    keys = "" if nk == nq else f", Nk={nk}"
    title = (f"fa banks --backward: fa2_bwd_kernel, (B,H,N,d) = ({b},{h},{nq},{d}){keys}"
             f"{' causal' if args.causal else ''}, {cfg.describe()}; rounds are Q blocks")
    print(bank_tables.format_report(rep, title, instructions=bool(getattr(args, "instructions", False))))
    return 0


# -- fa trace --backward ----------------------------------------------------------------------------------
def trace(args) -> int:
    """`fa trace --backward`: one lane's S, P, dP, dS, dV, dK and dQ partial in one round (one Q block)
    of the main kernel, at their fragment coordinates (fa_sim.observers.backward_lane)."""
    import json

    from ..contract.backward import BackwardConfig
    from ..events import Op
    from ..isa.sm80 import WARP_SIZE
    from ..observers import backward_lane
    from ..observers.trace import TraceFilter, TraceRecorder

    check_options(args, ("ops", "save", "perfetto", "kernel"))
    if getattr(args, "npz", None) is not None:
        q, k, v, do = load_inputs(args)  # the file fixes the shape: checked before the simulation
        (b, h, nq, d), nk = np.shape(q), np.shape(k)[2]
        shape = (b, h, nq, nk, d)
    else:
        shape = problem_shape(args)
    b, h, nq, nk, d = shape
    BackwardConfig(d)  # an unsupported head_dim: its own line
    cfg = backward_config(args, d)[0]
    if cfg.dq_warp_rows != 16:
        raise UsageError(f"--config {cfg.label}: fa trace --backward reads the dQ GEMM's 16-row warp tiles; a label "
                         f"with m (dq_warp_rows 32) is not traced (fa sim --backward and fa banks --backward run it)")
    n_kv = cfg.n_kv_blocks(nk)
    n_ctas = n_kv * b * h
    if args.cta >= n_ctas:
        raise UsageError(f"--cta {args.cta} is outside the backward grid: {n_ctas} CTAs (K/V blocks of "
                         f"{cfg.block_n} keys x batch-heads), 0..{n_ctas - 1}")
    warp, lane = warp_and_lane(args, cfg.n_warps)
    n_block = args.cta % n_kv
    rounds = backward_lane.rounds_of(cfg, n_block, nq, args.causal)
    if args.round >= rounds:
        key0 = n_block * cfg.block_n
        runs = ("no round" if rounds == 0 else "round 0 only" if rounds == 1 else f"rounds 0..{rounds - 1}")
        why = (f"under --causal it starts at Q block {key0 // cfg.block_m} (its first key {key0} // block_m "
               f"{cfg.block_m}) of {cfg.n_q_blocks(nq)}" if args.causal else
               f"Nq = {nq} queries in Q blocks of block_m = {cfg.block_m}")
        raise UsageError(f"--round {args.round} is not a round of CTA {args.cta} (K/V block {n_block}): it runs "
                         f"{runs}; {why}")
    recorder = TraceRecorder(TraceFilter(ctas=(args.cta,), threads=(WARP_SIZE * warp + lane,), rounds=(args.round,),
                                         ops=frozenset({Op.HMMA})))
    run_backward(args, (recorder,), dq="atomic")  # the main kernel with its dQ GEMM (FlashAttention-2's)
    lane_view = backward_lane.lane_values(recorder.trace.records, cfg, args.cta, warp, lane, args.round, n_kv, nq,
                                          args.causal)
    if args.json:
        print(json.dumps(backward_lane.lane_json(lane_view, nq, nk, args.causal), indent=1))
    else:
        print(backward_lane.format_lane(lane_view, nq, nk, args.causal))
    return 0


# -- fa time --backward -------------------------------------------------------------------------------------
def time_(args, auto=None) -> int:
    """The backward's three launches timed by the model (fa_sim.timing.predict_backward_seeded): no
    forward run (the kernels' paths read no value, so seeded O, LSE and dO of the right shapes
    stand in); one CTA per path class runs on the PTX engine, then the busiest SM cycle by cycle.
    `auto(head_dim, dtype)`: --config auto's choice for the modelled GPU (fa_sim/commands/time.py
    gives fa_hw.tuned_backward.lookup: only the GPU commands import fa_hw)."""
    import json

    from ..contract.backward import DQ_RED_MIN_ARCH, BackwardConfig, vector_reductions_ok
    from ..timing import GPUS, predict_backward_seeded
    from ..validate import check_scale

    check_options(args, ("perfetto",))
    kernel = kernel_variant(args)
    b, h, nq, nk, d = problem_shape(args)
    dtype = dtype_of(args)
    try:
        BackwardConfig(d)  # an unsupported head_dim: one line naming the choices
        scale = check_scale(getattr(args, "scale", None), d)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    gpu = GPUS[args.gpu]
    config, source = backward_config(args, d, auto)
    if config.dq_red != 1 and not vector_reductions_ok(gpu.arch):
        raise UsageError(f"--config {config.label}: dq_red={config.dq_red} (red.global.add.v{config.dq_red}.f32) needs "
                         f"sm_{DQ_RED_MIN_ARCH} or newer, the {args.gpu} model is {gpu.arch}; a label without r2/r4 "
                         "runs on any arch")
    # q, k, v, o, dO as the host arrays (bf16: float32 values and their uint16 patterns), dQ, dK, dV
    # in 16 bits, the fp32 dQ accumulator
    size = 2 if dtype == "fp16" else 6
    need = size * b * h * d * (3 * nq + 2 * nk) + 2 * b * h * d * (nq + 2 * nk) + 4 * b * h * nq * d
    check_host_memory(need, f"(B, H, Nq, Nk, d) = ({b}, {h}, {nq}, {nk}, {d})", "the backward's arrays",
                      "lower --batch, --heads or --seqlen")
    pred = predict_backward_seeded(b, h, nq, nk, d, args.causal, scale, args.dq == "deterministic", args.gpu,
                                   kernel=kernel, seed=args.seed, dtype=dtype, config=config)
    if args.json:
        print(json.dumps({"backward": True, "causal": args.causal, "gpu": args.gpu, "dq": args.dq, "dtype": dtype,
                          "shape": [b, h, nq, nk, d], "config": config_json(config), "config_source": source,
                          **pred.to_json()}))
        return 0
    print(f"fa time --backward  (B, H, Nq, Nk, d) = ({b}, {h}, {nq}, {nk}, {d})  {dtype}  "
          f"{'causal' if args.causal else 'non-causal'}  dQ {args.dq}  on the {args.gpu} model")
    if getattr(args, "config", None) is not None:
        print(f"  config {config.label:<16} {config.describe()}")
    if source is not None:
        print(f"  config auto: {source}")
    print(f"  predicted time          {pred.kernel_ms:.4f} ms   (the three launches one after the other)")
    for name, p in pred.kernels.items():
        print(f"  {name:27s} {p.kernel_ms:.4f} ms   {p.notes['registers']} registers, {p.occupancy} CTAs per SM, "
              f"{p.notes['ctas']:,} CTAs")
        print(f"    limiter                 {p.limiter}")
    return 0
