"""One lane through one round of the seed kernel, from a trace of the simulator.

    python experiments/lane_trace.py [--cta 0 --warp 0 --lane 0 --round 0] [--causal] [--out DIR]
    python experiments/lane_trace.py --bench     # observer overheads (issue 3, "Speed")

Writes under --out (experiments/out/lane_trace): the story as text and JSON (what `fa trace`
prints), the trace archive (manifest.json + arrays.npz, traces/README.md), the Chrome/Perfetto
trace-event JSON (open it in ui.perfetto.dev), and the lane's footprint: which Q, K, V elements
its ldmatrix instructions delivered and which S and O elements it holds, read from the trace.
A small PNG of the footprint goes to experiments/figures/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.checkpoints import Checkpoint  # noqa: E402
from fa_sim.observers import figures, story, trace_io  # noqa: E402
from fa_sim.observers.runs import Problem, run_trace  # noqa: E402
from fa_sim.observers.trace import TraceFilter  # noqa: E402

FIGURES = Path(__file__).parent / "figures"


def footprint(st: story.LaneStory, cfg: KernelConfig) -> dict[str, np.ndarray]:
    """name -> [rows, cols] bool grid of the elements the lane received (Q, K, V) or holds (S, O),
    in tile coordinates of its CTA and round."""
    q0, k0 = st.m_block * cfg.block_m, st.round * cfg.block_n
    grids = {"Q": np.zeros((cfg.block_m, cfg.head_dim), bool), "K": np.zeros((cfg.block_n, cfg.head_dim), bool),
             "V": np.zeros((cfg.block_n, cfg.head_dim), bool)}
    for s in st.steps:
        if s.matrix in ("Q", "K", "V") and s.op.name == "LDSM":
            r0 = q0 if s.matrix == "Q" else k0
            for r, c in s.coords:
                grids[s.matrix][r - r0, c] = True
    for name, ck, cols, c0 in (("S", Checkpoint.S_ACC, cfg.block_n, k0), ("O", Checkpoint.O_ACC, cfg.head_dim, 0)):
        grids[name] = np.zeros((cfg.block_m, cols), bool)
        for sl in st.slots(ck):
            grids[name][sl.row - q0, sl.col - c0] = True
    return grids


def plot_footprint(grids: dict[str, np.ndarray], title: str):
    fig, axes = plt.subplots(1, len(grids), figsize=(2.3 * len(grids), 2.7))
    for ax, (name, g) in zip(axes, grids.items()):
        ax.imshow(g, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        ax.set_title(f"{name}: {int(g.sum())} elements", fontsize=8)
        ax.set_xlabel("key" if name == "S" else "d", fontsize=7)
        ax.set_ylabel("query" if name in ("Q", "S", "O") else "key", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _seconds(inputs, observers, causal=False) -> float:
    from fa_sim import simulate

    start = time.perf_counter()
    simulate(*inputs, causal=causal, observers=observers(), progress=False)
    return time.perf_counter() - start


def bench(repeats: int = 3) -> str:
    """Best-of-`repeats` wall times: one lane traced at N = 4096 against the untraced run, and all
    observers together on (1, 1, 1024, 64)."""
    from fa_sim.observers import BankCounter, HazardChecker, TraceRecorder

    lane0 = dict(ctas=(0,), warps=(0,), lanes=(0,))
    cases = [
        ("N=4096 untraced", 4096, lambda: []),
        ("N=4096 trace lane 0, round 0", 4096, lambda: [TraceRecorder(TraceFilter(**lane0, rounds=(0,)))]),
        ("N=4096 trace lane 0, all rounds", 4096, lambda: [TraceRecorder(TraceFilter(**lane0))]),
        ("N=1024 untraced", 1024, lambda: []),
        ("N=1024 all observers", 1024,
         lambda: [TraceRecorder(TraceFilter(**lane0)), BankCounter(), HazardChecker()]),
    ]
    lines = []
    for name, n, obs in cases:
        inputs = Problem(seqlen=n).inputs()
        best = min(_seconds(inputs, obs) for _ in range(repeats))
        lines.append(f"{name:<34} {best:7.2f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("cta", "warp", "lane", "round"):
        ap.add_argument(f"--{name}", type=int, default=0)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "lane_trace"))
    ap.add_argument("--bench", action="store_true", help="measure the observers' cost instead")
    args = ap.parse_args(argv)
    if args.bench:
        print(bench())
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = KernelConfig()
    filt = TraceFilter(ctas=(args.cta,), warps=(args.warp,), lanes=(args.lane,), rounds=(args.round,))
    tr = run_trace(cfg, filt, Problem(seqlen=args.seqlen), args.causal)
    st = story.lane_story(tr, args.cta, args.warp, args.lane, args.round)
    text = story.format_story(st)
    print(text)
    tag = f"cta{args.cta}_w{args.warp}_l{args.lane}_r{args.round}{'_causal' if args.causal else ''}"
    (out / f"{tag}.txt").write_text(text + "\n")
    (out / f"{tag}.json").write_text(json.dumps(story.story_json(st), indent=1) + "\n")
    trace_io.save_trace(tr, out / f"{tag}.trace")
    trace_io.save_perfetto(tr, out / f"{tag}.perfetto.json")
    title = f"CTA {args.cta} warp {args.warp} lane {args.lane}, round {args.round}: what the trace shows it touched"
    fig = plot_footprint(footprint(st, cfg), title)
    figures.save(fig, out / f"{tag}_footprint", ("png", "svg"))
    fig = plot_footprint(footprint(st, cfg), title)
    figures.save(fig, FIGURES / "lane0_footprint", ("png",), dpi=80)
    print(f"\nwrote {out}/{tag}.* and {FIGURES / 'lane0_footprint.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
