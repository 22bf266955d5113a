"""Nsight Compute's warp instructions executed (smsp__inst_executed.sum) by split-KV decoding's split
launch, for the timing model's SASS walk to be held to on the CPU (tests/test_timing_launches.py).

    python experiments/ncu_splitkv_instructions.py --out OUT   # on a GPU with ncu: OUT/timing_ncu_splitkv.json

The launch is `fa compare --batch 2 --heads 4 --heads-k 1 --seqlen 1 --seqlen-k 2000 --cache-seqlens
2000,700 --head-dim 64 --splits 4 --timing`'s (tests/test_timing_gpu.py): fa2_fwd.cu with FA_SPLITKV,
the 4 Q heads of the one K/V head packed (4 query rows per CTA), cache lengths 2000 and 700, so 6 of
the 8 CTAs run keys (warp 0's lanes of rows past N_q diverge in store_partial) and 2 are empty
splits. It is profiled through fa_hw.profile.profile_launch (ncu on the split launch alone). The
count does not depend on the input values (the kernel's branches read shapes and lengths only).
The JSON holds {"meta": {...}, "kernels": [{"key", the launch's options, "smsp__inst_executed.sum"}]}:
fa_sim.calibrate.recordings compares the counts exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAME = "timing_ncu_splitkv.json"
METRIC = "smsp__inst_executed.sum"
LAUNCHES = [  # (B, H, H_k, Nq, Nk, d), cache lengths, splits
    ((2, 4, 1, 1, 2000, 64), (2000, 700), 4),
]


def key(shape, cache, splits) -> str:
    b, h, hk, nq, nk, d = shape
    return f"split-KV/{b}x{h}x{nq}x{nk}x{d}/heads_k={hk}/cache_seqlens={','.join(map(str, cache))}/splits={splits}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for " + NAME)
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        raise SystemExit(f"--out {out}: not a directory")
    import fa_hw
    from fa_hw.profile import profile_launch
    from fa_sim.config import KernelConfig

    if not fa_hw.has_gpu():
        raise SystemExit("no NVIDIA GPU here: this recording profiles the split launch with Nsight Compute")
    rng = np.random.default_rng(0)
    rows = []
    for shape, cache, splits in LAUNCHES:
        b, h, hk, nq, nk, d = shape
        q = rng.standard_normal((b, h, nq, d)).astype(np.float16)
        k, v = (rng.standard_normal((b, hk, nk, d)).astype(np.float16) for _ in range(2))
        config = KernelConfig(head_dim=d)
        ncu = profile_launch(q, k, v, False, None, config, None, [METRIC], splits=splits,
                             cache_seqlens=np.array(cache, np.int32))
        rows.append({"key": key(shape, cache, splits), "shape": list(shape), "cache_seqlens": list(cache),
                     "splits": splits, "config": config.tag, METRIC: int(ncu[METRIC])})
        print(f"{rows[-1]['key']}: {rows[-1][METRIC]:,} warp instructions", file=sys.stderr)
    from fa_hw.device import device

    meta = {"tool": f"ncu --metrics {METRIC} on the split launch (fa_hw.profile.profile_launch)",
            "gpu": device().name, "command": "python experiments/ncu_splitkv_instructions.py --out OUT"}
    (out / NAME).write_text(json.dumps({"meta": meta, "kernels": rows}, indent=1) + "\n")
    print(f"wrote {out / NAME}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
