"""The host's time per fa_hw.attention call beside the GPU's: is a small launch bound by Python?

    python experiments/host_overhead.py [--shape 32,8,1000,32] [--causal] [--calls 50] [--profile]

For q, k, v (standard normal fp16 on the GPU) and dO: `--calls` forward calls and `--calls`
backward calls (torch.autograd.grad on one saved forward, retain_graph), check_finite=False, each
loop once with the host's clock around the enqueues (no synchronisation inside the loop) and once
with CUDA events around the whole loop after a synchronisation. Host ms per call close to GPU ms
per call means the GPU waits for Python: the launch path, not the kernels, sets the time.
`--profile` adds cProfile's 15 most expensive functions (cumulative) of the backward loop.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="32,8,1000,32", help="B,H,N,d (default 32,8,1000,32)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error(f"--calls must be >= 1, got {args.calls}")
    import torch

    import fa_hw

    b, h, n, d = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def fwd():
        return fa_hw.attention(q, k, v, args.causal, check_finite=False)

    o = fwd()

    def bwd():
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    print(f"fa_hw.attention {args.shape} causal={args.causal}, {args.calls} calls, {torch.cuda.get_device_name()}")
    for name, fn in (("forward", fwd), ("backward", bwd)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        host = (time.perf_counter() - t0) / args.calls * 1e3
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        gpu = start.elapsed_time(end) / args.calls
        print(f"  {name:8s} host {host:7.3f} ms/call   GPU (events) {gpu:7.3f} ms/call")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            bwd()
        torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(15)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
