"""One launch of a kernel for Nsight Compute to profile: fa_hw's kernel for a config, or PyTorch's
SDPA flash backend (FlashAttention-2) on the same inputs, nothing else on the GPU.

    ncu --set full -k regex:fa2_fwd_kernel -c 1 -o seed python experiments/ncu_profile.py fa_hw
    ncu --set full -k regex:flash -c 1 -o flash python experiments/ncu_profile.py sdpa
    python experiments/ncu_profile.py fa_hw --config '{"block_m": 128, "block_n": 32, "head_dim": 128}'
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", choices=("fa_hw", "sdpa"))
    p.add_argument("--shape", default="4,16,4096,64", help="B,H,N,d (default 4,16,4096,64)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--config", default=None, help="KernelConfig as JSON (fa_hw only; default: seed with this d)")
    args = p.parse_args(argv)
    b, h, n, d = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float16) for _ in range(3))
    if args.which == "fa_hw":
        import fa_hw
        from fa_sim import KernelConfig

        cfg = KernelConfig.from_json(json.loads(args.config)) if args.config else KernelConfig(head_dim=d)
        out = fa_hw.forward(q, k, v, causal=args.causal, config=cfg)
        print(f"fa_hw {cfg.tag}: {out.kernel_ms:.3f} ms")
    else:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=args.causal)
        torch.cuda.synchronize()
        print("sdpa flash: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
