"""TFLOP/s of fa_hw's kernel beside torch SDPA's flash and cuDNN backends, in one run on one GPU.

    python experiments/bench_hw.py [--out DIR] [--warmup 10] [--reps 30] [--extra m128n64d64w8-swizzled ...]
    python experiments/bench_hw.py --diagnose      # + what limits the seed kernel (see below)
    python experiments/bench_hw.py --cases 0 3 --extra m64n64d64w4-swizzled-ffma m64n64d128w4-swizzled-ffma
                                                   # the robust softmax form against the FFMA one

Cases (B, H, N, d) = (4,16,4096,64), (8,16,1024,64), (1,16,16384,64), (4,16,4096,128), causal and
not. Our kernel runs in the seed tiling (64x64, 4 warps) in each smem layout (plus --extra
configs, by tag; a '-ffma' suffix selects the FFMA softmax form, KernelConfig.softmax); FLOPs are
4*B*H*N^2*d, halved for causal. Inputs are random normal fp16 torch tensors
(shared by all backends; our kernel reads them in place through DLPack-style pointers). Each
launch is bracketed by CUDA events after warm-up; the table reports medians. It also checks our O
against SDPA-flash's (relative Frobenius error). Writes bench_hw.json and bench_hw.md to --out
(default $OUT, else experiments/out).

--diagnose adds, for the seed tiling at (4, 16, 4096, 64), builds that are NOT the library's
kernel (rows 'fa_hw-diag'): other __launch_bounds__ occupancy targets (CTAs per SM), and the
spec's literal softmax arithmetic (CUDA's accurate expf with separately rounded multiply and
subtract) instead of SCHEDULE.md's exp2 form (ex2.approx), to measure what each costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from fa_hw import check
from fa_hw.forward import prepare
from fa_hw.runtime import device
from fa_sim.config import KernelConfig, SmemLayout
from fa_sim.crosscheck import config_from_tag

CASES = [(4, 16, 4096, 64), (8, 16, 1024, 64), (1, 16, 16384, 64), (4, 16, 4096, 128)]
def parse_tag(tag: str) -> KernelConfig:
    try:
        return config_from_tag(tag)
    except ValueError as exc:
        raise SystemExit(f"bad --extra config: {exc}") from None


DIAGNOSTICS = {"min_blocks=3": dict(min_blocks_override=3), "min_blocks=5": dict(min_blocks_override=5),
               "min_blocks=6": dict(min_blocks_override=6), "accurate-expf": dict(diag_accurate_exp=True),
               "accurate-expf,min_blocks=5": dict(diag_accurate_exp=True, min_blocks_override=5)}


def time_ours(q, k, v, causal, cfg, warmup, reps, diagnostics=None):
    plan, problem, _ = prepare(q, k, v, causal, None, cfg, diagnostics=diagnostics)
    times = plan.time(problem.stream, warmup, reps)
    occupancy = plan.loaded.kernel.occupancy.max_active_blocks_per_multiprocessor(plan.block[0], plan.smem_bytes)
    return statistics.median(times), f"{plan.loaded.registers}/{occupancy}", problem.o


def time_torch(fn, warmup, reps):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    marks[0].record()
    for i in range(reps):
        fn()
        marks[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(marks, marks[1:]))


def sdpa_rows(q, k, v, causal, warmup, reps):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows, ref = [], None
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                ms = time_torch(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup, reps)
            rows.append((name, ms, None))
            ref = out if ref is None else ref
        except Exception as exc:  # a backend that does not take this shape on this build
            rows.append((name, None, " ".join(str(exc).split())[:120]))
    torch.cuda.synchronize()
    return rows, ref


def run_case(case, causal, configs, args):
    import torch

    b, h, n, d = case
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, n, d), generator=gen, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = check.attention_flops(b, h, n, d, causal)
    sdpa, ref = sdpa_rows(q, k, v, causal, args.warmup, args.reps)
    out = []
    for name, ms, note in sdpa:
        out.append(dict(case=list(case), causal=causal, backend=name, config="", ms=ms, registers=None,
                        tflops=flops / (ms * 1e-3) / 1e12 if ms else None, note=note, rel_err_vs_flash=None))
    for cfg in configs:
        if cfg.head_dim != d:
            continue
        ms, regs, o = time_ours(q, k, v, causal, cfg, args.warmup, args.reps)
        err = check.rel_err(check.to_numpy(o), check.to_numpy(ref)) if ref is not None else None
        out.append(dict(case=list(case), causal=causal, backend="fa_hw", config=cfg.tag, ms=ms, registers=regs,
                        tflops=flops / (ms * 1e-3) / 1e12, note=None, rel_err_vs_flash=err))
    for label, diag in (DIAGNOSTICS.items() if args.diagnose and case == CASES[0] else ()):
        cfg = KernelConfig(head_dim=d)
        ms, regs, o = time_ours(q, k, v, causal, cfg, args.warmup, args.reps, diag)
        err = check.rel_err(check.to_numpy(o), check.to_numpy(ref)) if ref is not None else None
        out.append(dict(case=list(case), causal=causal, backend="fa_hw-diag", config=f"{cfg.tag} {label}", ms=ms,
                        registers=regs, tflops=flops / (ms * 1e-3) / 1e12, note="not the library kernel",
                        rel_err_vs_flash=err))
    flash = next((r["tflops"] for r in out if r["backend"] == "sdpa-flash"), None)
    for r in out:
        r["vs_flash"] = r["tflops"] / flash if flash and r["tflops"] else None
    del q, k, v
    torch.cuda.empty_cache()
    return out


def markdown(rows, gpu_name: str) -> str:
    lines = [f"GPU: {gpu_name}. Medians of CUDA-event times per launch; TFLOP/s = 4*B*H*N^2*d (/2 causal) / time.", "",
             "| B, H, N, d | causal | backend | config | ms | TFLOP/s | x SDPA-flash | regs/CTAs per SM | rel err vs flash |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = lambda x, p: "n/a" if x is None else f"{x:.{p}f}"
        lines.append(f"| {tuple(r['case'])} | {r['causal']} | {r['backend']} | {r['config'] or '-'} | {f(r['ms'], 3)} | "
                     f"{f(r['tflops'], 1)} | {f(r['vs_flash'], 2)} | {r['registers'] or '-'} | "
                     f"{'-' if r['rel_err_vs_flash'] is None else format(r['rel_err_vs_flash'], '.1e')} |")
    return "\n".join(lines + form_costs(rows)) + "\n"


def form_costs(rows) -> list[str]:
    """The robust softmax form (default) against its '-ffma' twin, where both ran (--extra)."""
    ours = {(tuple(r["case"]), r["causal"], r["config"]): r for r in rows if r["backend"] == "fa_hw"}
    pairs = [(key, ours[key[:2] + (key[2] + "-ffma",)]) for key in ours if key[:2] + (key[2] + "-ffma",) in ours]
    if not pairs:
        return []
    out = ["", "Softmax form: fmul_fsub (robust, default) against ffma (diagnostic), same run:", "",
           "| B, H, N, d | causal | config | fmul_fsub ms | ffma ms | fmul_fsub / ffma time | TFLOP/s fmul_fsub / ffma |",
           "|---|---|---|---:|---:|---:|---:|"]
    for (case, causal, tag), twin in pairs:
        r = ours[(case, causal, tag)]
        out.append(f"| {case} | {causal} | {tag} | {r['ms']:.3f} | {twin['ms']:.3f} | {r['ms'] / twin['ms']:.3f} | "
                   f"{r['tflops']:.1f} / {twin['tflops']:.1f} |")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "experiments/out")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--extra", nargs="*", default=[], help="more configs by tag, e.g. m128n64d64w8-swizzled")
    p.add_argument("--cases", nargs="*", type=int, default=None, help="indices into the case list")
    p.add_argument("--diagnose", action="store_true", help="add the diagnostic builds (module docstring)")
    args = p.parse_args(argv)
    dev = device()
    extra = [parse_tag(t) for t in args.extra]
    rows = []
    for i, case in enumerate(CASES):
        if args.cases is not None and i not in args.cases:
            continue
        configs = [KernelConfig(head_dim=case[3], smem=s) for s in SmemLayout] + extra
        for causal in (False, True):
            for r in run_case(case, causal, configs, args):
                rows.append(r)
                print(f"{str(tuple(case)):22s} causal={causal!s:5s} {r['backend']:10s} {r['config']:24s} "
                      f"{'n/a' if r['ms'] is None else format(r['ms'], '8.3f')} ms "
                      f"{'n/a' if r['tflops'] is None else format(r['tflops'], '6.1f')} TFLOP/s"
                      f"{'' if r['vs_flash'] is None else format(r['vs_flash'], '6.2f') + 'x flash'}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_hw.json").write_text(json.dumps({"gpu": dev.name, "rows": rows}, indent=1))
    (out / "bench_hw.md").write_text(markdown(rows, dev.name))
    print(markdown(rows, dev.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
