"""Compile every kernel build the issue-11 device run needs, in parallel, into the cubin cache.

    FLASHSIM_CACHE=.fa_cache python experiments/kernel_builds.py --arch sm_90 [--workers 16]

The builds: the candidates tune_hw.py times (fa_hw.tuned.candidates, causal and not), the seed and
heuristic configs bench_hw.py runs, the launches of ncu_options.py, and the GPU tests of the options
(tests/test_hw_gpu_options.py: every config and its spec-schedule twin, causal and not, their debug
builds, the sanitizer's builds), and the debug builds of the script's `fa compare` runs (COMPARE). On the development machine (no GPU: NVRTC makes sm_90 cubins) this
fills the cache folder the device run carries; on the device it turns cache misses (a kernel
source changed by a merge) into one parallel compile before the timed steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent / "tests")]
COMPARE = ["m128n64d64w4-swizzled-s2-qr-hf-dp", "m64n64d128w4-swizzled-s3"]  # device_kernel.sh's fa compare runs


def builds(arch: str) -> list:
    from ncu_options import LAUNCHES
    from test_hw_gpu_options import CONFIGS, SANITIZED, SPAN, twin

    from fa_sim.contract import KernelBuild
    from fa_hw.tuned import HEURISTIC, candidates
    from fa_sim.config import KernelConfig

    tags = set(CONFIGS) | {t for _, _, t in LAUNCHES}
    cfgs = {KernelConfig.from_tag(t) for t in tags} | set(HEURISTIC.values())
    cfgs |= {c for d in (64, 128) for causal in (False, True) for c in candidates(d, causal)}
    cfgs |= {KernelConfig(head_dim=d) for d in (64, 128)}
    cfgs |= {twin(c) for c in cfgs}
    out = {KernelBuild(c, causal, arch) for c in cfgs for causal in (False, True)}
    debug = {KernelConfig.from_tag(t) for t in SPAN + SANITIZED + COMPARE}
    out |= {KernelBuild(c, causal, arch, True) for c in debug | {twin(c) for c in debug} for causal in (False, True)}
    return sorted(out, key=lambda b: (b.config.tag, b.causal, b.checkpoints))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None, help="e.g. sm_90 (default: the GPU's)")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    args = p.parse_args(argv)
    from fa_sim.contract.cubins import cache_dir, compile_many

    arch = args.arch
    if arch is None:
        from fa_hw import device_arch

        arch = device_arch()
    todo = builds(arch)
    t0 = time.time()
    done = compile_many(todo, args.workers)
    spills = sorted({c.build.config.tag for c in done if c.usage.stack_bytes})
    print(f"{len(done)} builds for {arch} in {cache_dir()} ({time.time() - t0:.0f} s); with local memory: "
          f"{', '.join(spills) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
