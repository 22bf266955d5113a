"""Simulator against GPU over a sweep of configs x causal x shapes: per-checkpoint agreement.

On the GPU:  python experiments/sim_vs_hw.py run --out DIR [--gpu-only]
             runs both backends on every case, writes DIR/sim_vs_hw.md, .json, .png and
             DIR/gpu_runs.npz (the GPU side of every case: O, LSE, checkpoint buffers);
             --gpu-only stops after the GPU side.
Anywhere:    python experiments/sim_vs_hw.py report --gpu DIR/gpu_runs.npz --out DIR [--engine ptx]
             redoes the comparison on the CPU against a saved GPU sweep (same table and figure).
The sweep: 17 configs (CONFIGS) x causal x 3 shapes (SHAPES) = 102 cases.

Each case uses seeded standard-normal inputs; the first, middle and last CTA are checkpointed,
O and LSE are compared over the whole grid. The GPU side runs the cases one after another in this
process (one process per GPU); the simulator side spreads them over `--workers` local processes
(default: one per core) or a Dask cluster (`--cluster local` or a scheduler address), one case per
task (fa_sim.parallel.pmap).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fa_sim import KernelConfig, Problem
from fa_sim.checkpoints import CHECKPOINTS
from fa_sim.crosscheck import CompareReport, build_report, simulate_with_checkpoints
from fa_sim.reference import random_inputs


@dataclass(frozen=True)
class Case:
    config: KernelConfig
    causal: bool
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    seed: int = 7

    @property
    def name(self) -> str:
        return f"{self.config.tag}{'-causal' if self.causal else ''}-{self.seqlen_q}x{self.seqlen_k}"

    def inputs(self):
        return random_inputs(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.config.head_dim, self.seed)

    @property
    def ctas(self) -> list[int]:
        """First, middle and last CTA of the grid (the last holds the tails and, causal, the most rounds)."""
        n = Problem(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.causal, 1.0, self.config).n_ctas
        return sorted({0, n // 2, n - 1})


#: The family's corners (layouts, head dims, tiles, warps), the schedule options config="auto"
#: picks on the H200, and the FFMA softmax diagnostic.
CONFIGS = tuple(KernelConfig.from_tag(t) for t in (
    "m64n64d64w4-swizzled", "m64n64d64w4-plain", "m64n64d64w4-padded", "m64n32d32w4-swizzled",
    "m128n64d128w8-swizzled", "m128n128d64w4-swizzled", "m64n32d128w4-padded", "m128n128d32w8-plain",
    "m128n64d64w4-swizzled", "m128n128d64w4-swizzled-s2", "m128n128d64w4-swizzled-s2-hf",
    "m128n64d128w4-swizzled-s2", "m128n64d128w4-swizzled-hf", "m128n32d128w4-swizzled-s2-dp",
    "m128n64d64w4-swizzled-s2-qr-dp", "m64n64d128w4-swizzled-s3", "m64n64d64w4-swizzled-ffma"))

#: (batch, heads, Nq, Nk): whole tiles; tails with Nk > Nq; tails with Nk < Nq over two batches.
SHAPES = ((1, 2, 128, 128), (1, 1, 200, 333), (2, 1, 333, 200))


def cases() -> list[Case]:
    return [Case(cfg, causal, *shape) for cfg in CONFIGS for causal in (False, True) for shape in SHAPES]


def simulate_case(item: tuple[Case, float, str | None]):
    """The simulator side of one case (a pmap task): (SimResult, checkpoint buffer)."""
    case, scale, engine = item
    q, k, v = case.inputs()
    return simulate_with_checkpoints(q, k, v, case.causal, scale, case.config, case.ctas, engine=engine)


def compare_cases(all_cases: list[Case], saved: dict, workers="auto", cluster=None,
                  engine: str | None = None) -> dict[str, CompareReport]:
    """Simulate every case in parallel (`engine` None: the one each config needs, see
    fa_sim.kernels.engine_for), then compare each with its saved GPU run."""
    from fa_sim.kernels import engine_for
    from fa_sim.parallel import pmap

    if engine == "program":  # the hand-written program runs the spec's schedule only
        all_cases = [c for c in all_cases if engine_for(c.config) == "program"]
    items = [(c, float(saved[f"{c.name}/scale"]), engine) for c in all_cases]
    sims = pmap(simulate_case, items, workers=workers, cluster=cluster, names=[f"case {c.name}" for c in all_cases])
    reports = {}
    for case, (res, buf) in zip(all_cases, sims):
        q, k, v = case.inputs()
        reports[case.name] = build_report(q, k, v, case.causal, case.config, case.ctas, res, buf,
                                          saved[f"{case.name}/o"], saved[f"{case.name}/lse"],
                                          saved[f"{case.name}/checkpoints"])
    return reports


def run_gpu(all_cases: list[Case]) -> dict[str, np.ndarray]:
    import fa_hw

    saved = {}
    for case in all_cases:
        q, k, v = case.inputs()
        out = fa_hw.forward(q, k, v, causal=case.causal, config=case.config, checkpoint_ctas=case.ctas)
        saved.update({f"{case.name}/o": np.asarray(out.o), f"{case.name}/lse": np.asarray(out.lse),
                      f"{case.name}/checkpoints": out.checkpoints, f"{case.name}/scale": np.float64(out.scale)})
    return saved


def write_outputs(reports: dict[str, CompareReport], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_vs_hw.json").write_text(json.dumps({n: r.to_json() for n, r in reports.items()}, indent=1))
    cks = [c.value for c in CHECKPOINTS]
    lines = ["| case | " + " | ".join(cks) + " | O max ulps | LSE max abs |", "|---" * (len(cks) + 3) + "|"]
    for name, rep in reports.items():
        cells = [f"{s.fraction_identical:.2%} ({s.max_ulps})" for s in rep.checkpoints]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {rep.outputs.o_max_ulps} | {rep.outputs.lse_max_abs:.1e} |")
    lines.append("")
    lines.append("cell: fraction of bit-identical values (max difference in ulps)")
    (out / "sim_vs_hw.md").write_text("\n".join(lines) + "\n")
    _figure(reports, out / "sim_vs_hw.png")
    print("\n".join(lines))


def _figure(reports: dict[str, CompareReport], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(reports)
    frac = np.array([[s.fraction_identical for s in reports[n].checkpoints] for n in names])
    ulps = np.array([[s.max_ulps for s in reports[n].checkpoints] for n in names])
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(names) + 1.6))
    im = ax.imshow(frac, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(CHECKPOINTS)), [c.value for c in CHECKPOINTS], rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for i in range(len(names)):
        for j in range(len(CHECKPOINTS)):
            ax.text(j, i, str(ulps[i, j]), ha="center", va="center", fontsize=6,
                    color="white" if frac[i, j] < 0.6 else "black")
    fig.colorbar(im, ax=ax, label="fraction bit-identical (text: max ulps)")
    ax.set_title("fa_sim vs H200, per checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--gpu-only", action="store_true",
                   help="run and save the GPU side only (DIR/gpu_runs.npz); compare later with `report`")
    rep = sub.add_parser("report")
    rep.add_argument("--gpu", type=Path, required=True)
    rep.add_argument("--out", type=Path, required=True)
    for parser in (r, rep):
        parser.add_argument("--engine", choices=("program", "ptx"), default=None,
                            help="simulator front end (default: program for the spec's schedule, ptx for "
                                 "configs with schedule options; program skips those cases)")
        parser.add_argument("--workers", default="auto",
                            help="local processes for the simulator side (default auto: one per core)")
        parser.add_argument("--cluster", default=None,
                            help="run the simulator side on a Dask cluster: local or a scheduler address")
    args = p.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    all_cases = cases()
    if args.cmd == "run":
        saved = run_gpu(all_cases)
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.out / "gpu_runs.npz", **saved)
        if args.gpu_only:
            print(f"wrote {args.out / 'gpu_runs.npz'}: {len(all_cases)} cases")
            return 0
    else:
        saved = dict(np.load(args.gpu))
    reports = compare_cases(all_cases, saved, workers, args.cluster, args.engine)
    write_outputs(reports, args.out)
    return 0 if all(r.ok for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
