"""`fa hw --backward` and `fa compare --backward`: the backward pass (fa2_bwd.cu) on the GPU through
fa_hw.backward, beside the float64 reference and the PTX engine (docs/backward.md, section 7). Its
CPU-side inputs, checks and error table are fa_sim/commands/backward.py's; fa_hw is imported when a
command runs, as in the other GPU commands. `--dtype bf16` runs fa_hw.forward and fa_hw.backward in
bf16 (the FA_BF16 builds) on the bf16 values of the same draws; errors use the bf16 bound, and fa
compare counts ulps of bf16. `--config LABEL` runs those tiles and options (fa compare: on both sides),
`--config auto` the device's entry of fa_hw.tuned_backward's tables (fa_hw.backward(config="auto")'s
choice), printed with the entry it came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract.backward import kernels_of
from . import UsageError
from .backward import (GRADIENTS, KERNEL_COLUMNS, LABELS, Run, _num, backward_config, check_inputs, check_options,
                       config_json, dtype_of, gradient_errors, load_inputs)


def _gpu_config(args, q, k):
    """(BackwardConfig, its table entry or None) of --config on this device: a label's, or for auto
    fa_hw.tuned_backward.lookup for the device's name and arch (fa_hw.backward's config="auto"); a label
    with vector dQ reductions on a GPU before sm_90 is one line, before the forward runs."""
    from fa_hw import runtime
    from fa_hw.tuned_backward import lookup

    from ..contract.backward import DQ_RED_MIN_ARCH, vector_reductions_ok

    nk = int(np.shape(k)[2])

    def auto(head_dim: int, dtype: str):
        return lookup(head_dim, args.causal, nk, gpu=runtime.device().name, arch=runtime.device_arch(), dtype=dtype)
    cfg, source = backward_config(args, int(np.shape(q)[3]), auto)
    if cfg.dq_red != 1 and not vector_reductions_ok(arch := runtime.device_arch()):
        raise UsageError(f"--config {cfg.label}: dq_red={cfg.dq_red} (red.global.add.v{cfg.dq_red}.f32) needs "
                         f"sm_{DQ_RED_MIN_ARCH} or newer, this GPU is {arch}; a label without r2/r4 runs on any arch")
    return cfg, source


def _gpu_inputs(args):
    """Seeded q, k, v, dO, checked (simulate_backward's checks) before any GPU work."""
    q, k, v, do = load_inputs(args)
    check_inputs(q, k, v, do, args.causal, getattr(args, "scale", None), dtype_of(args))
    return q, k, v, do


def _gpu_forward(q, k, v, args):
    """O and LSE of fa_hw.forward (its default config for head_dim, in --dtype), as numpy."""
    import fa_hw
    from fa_hw import check

    fwd = fa_hw.forward(q, k, v, causal=args.causal, scale=getattr(args, "scale", None), dtype=dtype_of(args))
    return check.to_numpy(fwd.o), check.to_numpy(fwd.lse)


def hw(args) -> int:
    """`fa hw --backward`: fa_hw.forward, then fa_hw.backward on the GPU; the gradients' errors
    against float64 with their bound, each kernel's time and registers."""
    import json

    import fa_hw
    from fa_hw import runtime

    check_options(args, ("kernel",))
    runtime.device()  # no GPU: one line before the inputs are made
    q, k, v, do = _gpu_inputs(args)
    config, source = _gpu_config(args, q, k)
    o, lse = _gpu_forward(q, k, v, args)
    res = fa_hw.backward(q, k, v, o, lse, do, causal=args.causal, scale=args.scale,
                         deterministic=args.dq == "deterministic", dtype=dtype_of(args), config=config)
    run = Run(q, k, v, do, None, res, 0.0)
    errs = gradient_errors(run)
    above = [n for n, e in errs.items() if not e.ok]
    cfg = res.config
    launched = kernels_of(res.deterministic)  # the three kernels, in the order of res.kernel_ms
    if args.json:
        print(json.dumps({"gradients": {n: e.to_json() for n, e in errs.items()}, "above_bound": above,
                          "dq_mode": args.dq, "dtype": cfg.dtype, "shape": [*q.shape[:3], k.shape[2], q.shape[3]],
                          "causal": args.causal,
                          "config": config_json(cfg), "config_source": source,
                          "kernel_ms": dict(zip(launched, res.kernel_ms)), "registers": res.registers},
                         allow_nan=False))
        return 1 if above else 0
    print(f"fa hw --backward  {cfg.describe()}  causal={args.causal}  (B, H, Nq, Nk, d) = "
          f"{(*q.shape[:3], k.shape[2], q.shape[3])}  dQ {args.dq}"
          + (f"  --config {cfg.label}" if getattr(args, "config", None) is not None else ""))
    if source is not None:
        print(f"  config auto: {source}")
    print(f"    {'':<4}{'max |error|':>12}{'/ max |grad|':>14}{'error / bound':>15}")
    for name, e in errs.items():
        frac = "-" if e.of_bound is None else f"{e.of_bound:.2f}"
        print(f"    {LABELS[name]:<4}{_num(e.max_abs):>12}{_num(e.relative):>14}{frac:>15}"
              + (f"   {e.nonfinite} not finite" if e.nonfinite else "") + ("   ABOVE BOUND" if not e.ok else ""))
    print("  kernel time (ms, first launch)  " + ", ".join(f"{KERNEL_COLUMNS[n]} {t:.4f}"
                                                          for n, t in zip(launched, res.kernel_ms)))
    print("  registers per thread            " + ", ".join(f"{KERNEL_COLUMNS.get(n, n)} {r}"
                                                          for n, r in res.registers.items()))
    return 1 if above else 0


@dataclass(frozen=True)
class GradMatch:
    """One gradient of the GPU against the simulator: equal bits, the largest distance in ulps of the run's
    16-bit type, and
    (atomic dQ, whose order of additions varies) whether both stay within the float64 bound."""

    identical: float  # fraction of bit-identical elements
    max_ulps: int
    within_bound: bool
    required: str  # "bits" or "bound"

    @property
    def ok(self) -> bool:
        return self.identical == 1.0 if self.required == "bits" else self.within_bound


def _bits(x, dtype: str) -> np.ndarray:
    """The 16-bit patterns (uint16) of gradients of the run's type: fp16 arrays, or (bf16) float32
    arrays of bf16 values, whose upper halves they are (a float32 that is not a bf16 value: ValueError)."""
    if dtype == "fp16":
        return np.ascontiguousarray(x, dtype=np.float16).view(np.uint16)
    w = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if (w & 0xFFFF).any():
        raise ValueError("bf16 gradients must be float32 arrays of bf16 values (their low 16 bits zero)")
    return (w >> 16).astype(np.uint16)


def _ordered(bits: np.ndarray) -> np.ndarray:
    """16-bit float patterns (fp16 or bf16: sign in bit 15) as integers ordered like the values (so
    that differences count ulps)."""
    u = np.asarray(bits, np.uint16).astype(np.int64)
    return np.where(u & 0x8000, 0x8000 - u, u)


def match_gradients(sim: dict, gpu: dict, ref: dict, bounds: dict, deterministic: bool,
                    dtype: str = "fp16") -> dict[str, GradMatch]:
    """dq, dk, dv of the GPU against the simulator's (in `dtype`: fp16 arrays, or float32 arrays of
    bf16 values): deterministic mode requires every gradient bit for bit; atomic mode dK and dV bit
    for bit (they do not depend on the mode) and dQ, whose additions the GPU orders differently from
    run to run, within the float64 bound on both sides."""
    out = {}
    for name in GRADIENTS:
        a, b = np.asarray(sim[name]), np.asarray(gpu[name])
        if a.shape != b.shape:
            raise ValueError(f"{name}: simulator shape {a.shape}, GPU shape {b.shape}")
        ab, bb = _bits(a, dtype), _bits(b, dtype)
        same = ab == bb
        ulps = int(np.abs(_ordered(ab) - _ordered(bb)).max()) if a.size else 0
        inside = all(bool((np.abs(x.astype(np.float64) - ref[name]) <= bounds[name]).all()) for x in (a, b))
        required = "bits" if deterministic or name != "dq" else "bound"
        out[name] = GradMatch(float(same.mean()) if a.size else 1.0, ulps, inside, required)
    return out


def compare(args) -> int:
    """`fa compare --backward`: the backward on the GPU (fa_hw.backward) and on the PTX engine
    (simulate_backward with the H200's tensor-core model) from the same q, k, v, dO and the GPU
    forward's O and LSE, both running the main kernel's debug build for the CTAs of --ctas (linear
    ids n_block + n_kv_blocks * bh; default the first and the last): every checkpoint bit for bit
    (both modes: none depends on dQ's order), and the gradients as match_gradients decides."""
    import json

    import fa_hw
    import fa_hw.runtime

    from ..backward import simulate_backward
    from ..crosscheck import backward_checkpoint_stats, checkpoints_json, format_checkpoint_table
    from ..reference import attention_backward
    from .common import checkpoint_ctas_option

    check_options(args, ("kernel", "save", "gpu_npz", "banks", "timing"))
    fa_hw.runtime.device()  # no GPU: one line before the inputs are made
    q, k, v, do = _gpu_inputs(args)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    dtype = dtype_of(args)
    cfg, source = _gpu_config(args, q, k)
    ctas = checkpoint_ctas_option(args.ctas, cfg.n_kv_blocks(nk) * b * h)  # a bad --ctas: one line before the GPU runs
    o, lse = _gpu_forward(q, k, v, args)
    det = args.dq == "deterministic"
    gpu = fa_hw.backward(q, k, v, o, lse, do, causal=args.causal, scale=args.scale, deterministic=det,
                         checkpoint_ctas=ctas, dtype=dtype, config=cfg)
    sim = simulate_backward(q, k, v, o, lse, do, causal=args.causal, scale=args.scale, deterministic=det,
                            mma_model="h200", checkpoint_ctas=ctas, dtype=dtype, config=cfg)
    stats = backward_checkpoint_stats(sim.checkpoints, gpu.checkpoints, cfg, ctas, b * h, nq, nk, args.causal)
    *want, bq, bk, bv = attention_backward(q, k, v, do, causal=args.causal, scale=args.scale, bound=True, dtype=dtype)
    grads = lambda r: {"dq": r.dq, "dk": r.dk, "dv": r.dv}  # noqa: E731
    res = match_gradients(grads(sim), grads(gpu), dict(zip(GRADIENTS, want)), dict(zip(GRADIENTS, (bq, bk, bv))),
                          det, dtype)
    ok = all(m.ok for m in res.values()) and all(s.ok for s in stats)
    if args.json:
        print(json.dumps({"dq_mode": args.dq, "dtype": dtype, "ok": ok, "ctas": list(ctas),
                          "config": config_json(cfg), "config_source": source,
                          "checkpoints": checkpoints_json(stats),
                          "gradients": {
            n: {"identical": m.identical, "max_ulps": m.max_ulps, "within_bound": m.within_bound,
                "required": m.required, "ok": m.ok} for n, m in res.items()}}))
        return 0 if ok else 1
    print(f"fa compare --backward  {sim.config.describe()}  causal={args.causal}  (B, H, Nq, Nk, d) = "
          f"{(*q.shape[:3], k.shape[2], q.shape[3])}  dQ {args.dq}: GPU against the PTX engine (mma model h200)"
          + (f"  --config {cfg.label}" if getattr(args, "config", None) is not None else ""))
    if source is not None:
        print(f"  config auto: {source}")
    print(f"  checkpoints of the main kernel's CTAs {list(ctas)}, per round (Q block visited):")
    print("\n".join(format_checkpoint_table(stats)))
    for name, m in res.items():
        need = "bit-identical" if m.required == "bits" else "both within the float64 bound"
        print(f"  {LABELS[name]}  identical {m.identical:7.2%}  max {m.max_ulps} ulp  required: {need}  "
              + ("ok" if m.ok else "MISMATCH"))
    return 0 if ok else 1
