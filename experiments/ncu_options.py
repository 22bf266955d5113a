"""Nsight Compute evidence of what each kernel option changes (issue 11), in one profiled process.

    ncu --csv --page raw -k regex:'fa2_fwd_kernel|flash_fwd' $(python experiments/ncu_options.py ncu-args) \
        python experiments/ncu_options.py launch --order order.json [--tuned-dir DIR] > raw.csv
    python experiments/ncu_options.py summarize raw.csv --order order.json > ncu_options.md

`launch` runs, once each, SDPA-flash and fa_hw's kernel in the configs of LAUNCHES (plus the
config="auto" choice of each shape when --tuned-dir is given) on the same random fp16 inputs, and
writes the launch order; `summarize` reads ncu's raw CSV (one row per profiled launch, in launch
order) and prints, per launch: time, registers, achieved occupancy, instructions, IPC, warp cycles
per issued instruction and its largest stall reasons, tensor-pipe and L1 utilisation, shared-memory
wavefronts and bank conflicts of ldmatrix. The options are orthogonal, so the rows are arranged as
steps: the seed, its tile with 32 rows per warp, then one option more per row (--set issue11), or
issue 19's lazy_sum and poly_exp on the best tiles (--set issue19), with the MUFU (xu) and FMA pipes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

SHAPES = {64: (4, 16, 4096, 64), 128: (4, 16, 4096, 128)}
LAUNCHES = [  # (head_dim, causal, tag): each row one step from the one before it
    (64, False, "m64n64d64w4-swizzled"), (64, False, "m128n64d64w4-swizzled"), (64, False, "m128n64d64w4-swizzled-s2"),
    (64, False, "m128n64d64w4-swizzled-s2-dp"), (64, False, "m128n64d64w4-swizzled-s2-qr-dp"),
    (64, False, "m128n128d64w4-swizzled"), (64, False, "m128n128d64w4-swizzled-s2"),
    (64, True, "m128n128d64w4-swizzled"), (64, True, "m128n128d64w4-swizzled-hf"),
    (128, False, "m128n32d128w4-swizzled"), (128, False, "m128n32d128w4-swizzled-s2"),
    (128, False, "m128n32d128w4-swizzled-s2-dp"), (128, False, "m128n64d128w4-swizzled-s2"),
    (128, False, "m64n64d128w4-swizzled-s2-qr"),
]
LAUNCHES_19 = [  # issue 19's options, each from the best tile of issue 11: lazy_sum (-ls), poly_exp (-e1, -e2), pingpong
    (64, False, "m128n128d64w4-swizzled-s2"), (64, False, "m128n128d64w4-swizzled-s2-ls"),
    (64, False, "m128n128d64w4-swizzled-s2-e1"), (64, False, "m128n128d64w4-swizzled-s2-e2"),
    (64, False, "m128n128d64w4-swizzled-s2-ls-e1"), (64, True, "m128n128d64w4-swizzled-s2-hf"),
    (64, True, "m128n128d64w4-swizzled-s2-hf-ls"),
    (128, False, "m128n64d128w4-swizzled-s2"), (128, False, "m128n64d128w4-swizzled-s2-ls"),
    (128, False, "m128n64d128w4-swizzled-s2-e1"), (128, False, "m128n64d128w4-swizzled-s2-ls-e1"),
    (128, True, "m128n64d128w4-swizzled-s2-hf"), (128, True, "m128n64d128w4-swizzled-s2-hf-ls"),
    # pingpong (-pp): the 256-row tile of 8 warps without and with the two groups half a round apart
    (64, False, "m256n128d64w8-swizzled-s2"), (64, False, "m256n128d64w8-swizzled-s2-pp"),
    (64, False, "m256n128d64w8-swizzled-s2-pp-ls"), (128, False, "m256n64d128w8-swizzled-s2"),
    (128, False, "m256n64d128w8-swizzled-s2-pp"), (128, False, "m256n64d128w8-swizzled-s2-pp-ls"),
    (128, True, "m256n64d128w8-swizzled-s2-hf-pp-ls"),
]
LAUNCH_SETS = {"issue11": LAUNCHES, "issue19": LAUNCHES_19}
SECTIONS = ["SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "ComputeWorkloadAnalysis",
            "InstructionStats"]
METRICS = ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
           "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "smsp__inst_executed_op_ldsm.sum",
           "l1tex__throughput.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"]
COLUMNS = [  # (heading, metric or alternatives (the first ncu reported), format, scale)
    ("us", "gpu__time_duration.sum", "{:.0f}", 1.0), ("regs", "launch__registers_per_thread", "{:.0f}", 1.0),
    ("occ %", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.1f}", 1.0),
    ("M instr", "smsp__inst_executed.sum", "{:.0f}", 1e-6), ("IPC", "sm__inst_executed.avg.per_cycle_active", "{:.2f}", 1.0),
    ("cyc/issue", "smsp__average_warps_active_per_issue_active.ratio", "{:.2f}", 1.0),
    ("tensor %", (METRICS[0], "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                  "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"), "{:.1f}", 1.0), ("L1 %", METRICS[5], "{:.1f}", 1.0), ("M LDSM", METRICS[4], "{:.1f}", 1e-6),
    ("LDSM confl", METRICS[2], "{:.0f}", 1.0), ("STS confl", METRICS[3], "{:.0f}", 1.0),
    ("xu (MUFU) %", METRICS[6], "{:.1f}", 1.0), ("fma %", METRICS[7], "{:.1f}", 1.0),
]
STALL = "smsp__average_warps_issue_stalled_"


def ncu_args() -> str:
    return " ".join([f"--section {s}" for s in SECTIONS] + [f"--metrics {','.join(METRICS)}"])


def launch(order_path: str, tuned_dir: str | None, launches=LAUNCHES) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fa_hw
    from fa_hw.runtime import device, device_arch
    from fa_hw.tuned import auto_config
    from fa_sim.config import KernelConfig

    plan = [(d, causal, KernelConfig.from_tag(tag), "") for d, causal, tag in launches]
    if tuned_dir:
        for d in SHAPES:
            for causal in (False, True):
                choice = auto_config(d, causal, SHAPES[d][2], device().name, device_arch(), Path(tuned_dir))
                plan.append((d, causal, choice.config, "auto"))
    order, inputs = [], {}
    for d, shape in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs[d] = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.float16) for _ in range(3)]
        for causal in (False, True):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(*inputs[d], is_causal=causal)
            torch.cuda.synchronize()
            order.append(dict(shape=list(shape), causal=causal, backend="sdpa-flash", config=""))
    for d, causal, cfg, why in plan:
        try:
            fa_hw.forward(*inputs[d], causal=causal, config=cfg)
            order.append(dict(shape=list(SHAPES[d]), causal=causal, backend="fa_hw" + (f" ({why})" if why else ""),
                              config=cfg.tag))
        except Exception as exc:  # recorded; ncu simply has no row for it
            print(f"{cfg.tag}: {' '.join(str(exc).split())[:200]}", file=sys.stderr)
    Path(order_path).write_text(json.dumps(order, indent=1))


def parse_raw(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """ncu --csv --page raw: a header row, a units row, then one row per profiled kernel ->
    (rows as {metric: value}, {metric: unit})."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return [], {}
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[2:]], dict(zip(header, rows[1]))


US_PER = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def _num(x: str | None) -> float | None:
    try:
        return float(str(x).replace(",", ""))
    except (TypeError, ValueError):
        return None


def summarize(raw: str, order: list[dict]) -> str:
    kernels, units = parse_raw(raw)
    lines = ["Nsight Compute, one launch each (ncu locks clocks: times are not the benchmark's).", "",
             "| shape | causal | backend | config | " + " | ".join(c[0] for c in COLUMNS) + " | top stalls (cycles/issue) |",
             "|---|---|---|---|" + "---:|" * len(COLUMNS) + "---|"]
    if len(kernels) != len(order):
        lines.insert(1, f"WARNING: {len(kernels)} profiled kernels for {len(order)} recorded launches; paired in order")
    for i, k in enumerate(kernels):
        o = order[i] if i < len(order) else dict(shape=[], causal="?", backend="?", config="")
        cells = []
        for _, names, fmt, scale in COLUMNS:
            metric = next((m for m in ((names,) if isinstance(names, str) else names) if m in k), None)
            v = _num(k.get(metric))
            if v is not None and metric == "gpu__time_duration.sum":
                v *= US_PER.get(units.get(metric, "usecond"), 1.0)
            cells.append("-" if v is None else fmt.format(v * scale))
        stalls = sorted(((m[len(STALL):].replace("_per_issue_active.ratio", ""), _num(v)) for m, v in k.items()
                         if m.startswith(STALL) and m.endswith("_per_issue_active.ratio") and _num(v) is not None),
                        key=lambda kv: -kv[1])[:4]
        top = ", ".join(f"{name} {val:.2f}" for name, val in stalls)
        lines.append(f"| {tuple(o['shape'])} | {o['causal']} | {o['backend']} | {o['config'] or k.get('Kernel Name', '')[:30]} | "
                     + " | ".join(cells) + f" | {top} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ncu-args", help="print the ncu options (sections and metrics)")
    a = sub.add_parser("launch", help="the profiled process")
    a.add_argument("--order", required=True)
    a.add_argument("--tuned-dir", default=None)
    a.add_argument("--set", default="issue11", choices=list(LAUNCH_SETS), help="which option steps to launch")
    s = sub.add_parser("summarize", help="raw CSV -> markdown table")
    s.add_argument("raw")
    s.add_argument("--order", required=True)
    args = p.parse_args(argv)
    if args.cmd == "ncu-args":
        print(ncu_args())
    elif args.cmd == "launch":
        launch(args.order, args.tuned_dir, LAUNCH_SETS[args.set])
    else:
        order = Path(args.order)
        print(summarize(Path(args.raw).read_text(), json.loads(order.read_text()) if order.is_file() else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
