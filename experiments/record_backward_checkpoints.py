"""Record the backward's checkpoint buffer on a GPU for the CPU replay test
(tests/test_backward_checkpoints.py::test_a_recorded_gpu_buffer_replays_bit_for_bit).

    python experiments/record_backward_checkpoints.py [--out tests/data/h100] [--force]

For Nq = 70, Nk = 90, d = 64, causal and not: seeded inputs (fa_sim.reference.random_inputs seed 1,
dO standard normal from numpy's generator seed 101, as the test's _problem), O and LSE from
fa_hw.forward, then fa_hw.backward in the deterministic mode with every CTA of the main kernel's
grid checkpointed (FA_BWD_CHECKPOINTS). Each case is written to OUT/bwd_checkpoints_70x90_d64[_causal].npz
(q, k, v, o, lse, do, causal, deterministic, scale, ctas, checkpoints, dq, dk, dv, device), refused
if the file exists unless --force; then the PTX engine (mma model h200) replays it and the
per-checkpoint agreement is printed (exit 1 on a difference).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

NQ, NK, D, SEED = 70, 90, 64, 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "h100"),
                    help="directory of the recordings (default: tests/data/h100, where the committed ones, from an H100, are)")
    ap.add_argument("--force", action="store_true", help="overwrite existing recordings (default: refuse)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    paths = {c: out / f"bwd_checkpoints_{NQ}x{NK}_d{D}{'_causal' if c else ''}.npz" for c in (False, True)}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not args.force:
        print(f"refusing to overwrite {', '.join(existing)}; pass --force", file=sys.stderr)
        return 2

    import fa_hw
    from fa_hw import check, runtime
    from fa_sim.backward import simulate_backward
    from fa_sim.contract.backward import BackwardConfig
    from fa_sim.crosscheck import backward_checkpoint_stats, format_checkpoint_table
    from fa_sim.reference import random_inputs

    if not fa_hw.has_gpu():
        print("no NVIDIA GPU / driver here: the recording needs one", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for causal, path in paths.items():
        q, k, v = random_inputs(1, 1, NQ, NK, D, seed=SEED)
        do = np.random.default_rng(SEED + 100).standard_normal(q.shape).astype(np.float16)
        fwd = fa_hw.forward(q, k, v, causal=causal)
        o, lse = check.to_numpy(fwd.o), check.to_numpy(fwd.lse)
        ctas = list(range(BackwardConfig(D).n_kv_blocks(NK)))  # every CTA of the main kernel's grid (B = H = 1)
        res = fa_hw.backward(q, k, v, o, lse, do, causal=causal, deterministic=True, checkpoint_ctas=ctas)
        np.savez_compressed(path, q=q, k=k, v=v, o=o, lse=lse, do=do, causal=np.bool_(causal),
                            deterministic=np.bool_(True), scale=np.float64(res.scale), ctas=np.array(ctas, np.int64),
                            checkpoints=res.checkpoints, dq=res.dq, dk=res.dk, dv=res.dv,
                            device=np.str_(runtime.device().name))
        print(f"wrote {path}")
        sim = simulate_backward(q, k, v, o, lse, do, causal=causal, deterministic=True, mma_model="h200",
                                checkpoint_ctas=ctas)
        stats = backward_checkpoint_stats(sim.checkpoints, res.checkpoints, res.config, ctas, 1, NQ, NK, causal)
        print("\n".join(format_checkpoint_table(stats)))
        same = [getattr(sim, n).tobytes() == getattr(res, n).tobytes() for n in ("dq", "dk", "dv")]
        print(f"  dQ, dK, dV bit-identical: {same}")
        if not (all(s.ok for s in stats) and all(same)):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
