"""Target program for compute-sanitizer: the seed configuration in all three shared-memory
layouts (or the configs named by tag), causal and not, on small shapes with tails (Nq, Nk not
multiples of the tiles, Nq != Nk), normal and debug (checkpoint) builds. Exits 1 if any output is
off, so a sanitizer run also checks the numbers.

    compute-sanitizer --tool memcheck  --error-exitcode 3 python -m fa_hw.sanitize
    compute-sanitizer --tool racecheck --error-exitcode 3 python -m fa_hw.sanitize
    compute-sanitizer --tool racecheck --error-exitcode 3 python -m fa_hw.sanitize m128n64d64w4-swizzled-s2-qr-dp-hf
"""

from __future__ import annotations

import sys

from fa_sim.config import KernelConfig, SmemLayout

from . import check
from .forward import forward

SHAPES = ((1, 2, 130, 130), (1, 1, 77, 200), (1, 1, 200, 77))


def main(argv: list[str] | None = None) -> int:
    tags = sys.argv[1:] if argv is None else argv
    try:
        configs = [KernelConfig.from_tag(t) for t in tags] or [KernelConfig(smem=smem) for smem in SmemLayout]
    except ValueError as exc:
        print(f"fa_hw.sanitize: {exc}", file=sys.stderr)
        return 2
    worst = 0.0
    for cfg in configs:
        for causal in (False, True):
            for i, (b, h, nq, nk) in enumerate(SHAPES):
                q, k, v = check.random_inputs(b, h, nq, nk, cfg.head_dim, seed=i)
                ctas = [0, 1] if i == 0 else None  # the debug build on the first shape
                out = forward(q, k, v, causal=causal, config=cfg, checkpoint_ctas=ctas)
                err = check.rel_err(out.o, check.reference(q, k, v, causal)[0])
                worst = max(worst, err)
                print(f"{cfg.tag} causal={causal} {(b, h, nq, nk)} debug={ctas is not None} rel_err_o={err:.2e}")
    print(f"worst rel_err_o {worst:.2e}")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
