"""The host's time per fa_hw.attention call beside the GPU's: is a small launch bound by Python?

    python experiments/host_overhead.py [--shape 32,8,1000,32] [--causal] [--calls 50] [--profile]
    python experiments/host_overhead.py --fake [--shape 32,8,1000,32] [--causal] [--calls 200] [--profile]

On the GPU: for q, k, v (standard normal fp16 on the GPU) and dO: `--calls` forward calls and
`--calls` backward calls (torch.autograd.grad on one saved forward, retain_graph), check_finite=False,
each loop once with the host's clock around the enqueues (no synchronisation inside the loop) and
once with CUDA events around the whole loop after a synchronisation. Host ms per call close to GPU ms
per call means the GPU waits for Python: the launch path, not the kernels, sets the time.
`--profile` adds cProfile's 15 most expensive functions (cumulative) of the backward loop.

--fake: on the CPU, no GPU needed. `fake_gpu()` replaces only what needs a driver: cuda.core's
launch (counted, not run), the device and its arch (an H100's name and sm_90, so that the backward
takes the H100's tuned tiles), loading the kernels (no NVRTC) and torch's current stream (a
constant); everything else runs as on the GPU - torch.library's custom ops and autograd, every
check, the plans, cuda.core's LaunchConfig, torch's allocations (CPU tensors: the kernel device is
"cpu"). It prints microseconds per call, the best of 5 loops of `--calls` calls, of each layer:
autograd's backward (torch.autograd.grad), the attention_bwd op called directly, enqueue_backward;
fa_hw.attention's forward, the attention_fwd op, enqueue_forward (CPU time of the process:
time.process_time, which a machine shared with other work disturbs less than the wall clock).
The fake runs B = H = 1 at the shape's N and d (the same tiles and kernels; the host path depends
on B and H only through its allocations, which on the CPU touch memory - torch.zeros of dq_accum -
where the GPU's caching allocator hands a block back; so the fake fills them on one thread and
keeps freed memory: _keep_freed_memory, in --fake's process). With the custom ops' layers and
enqueue_backward apart, the difference to the top line is autograd's own and fa_hw.attention's
direct path (torch_ops._Attention).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAKE_GPU = "NVIDIA H100 80GB HBM3"
FAKE_ARCH = "sm_90"


@contextlib.contextmanager
def fake_gpu(name: str = FAKE_GPU, arch: str = FAKE_ARCH):
    """fa_hw without a driver (module docstring): -> a list that gets one entry per kernel launch
    (the kernel's name). Everything it replaces is put back on exit, the plan caches emptied both ways."""
    import functools
    import importlib
    import types

    from cuda import core as cuda_core

    from fa_hw import device as hw_device
    from fa_hw import runtime, tensors
    from fa_sim.contract.cubin import ResourceUsage

    hw_backward = importlib.import_module("fa_hw.backward")
    hw_forward = importlib.import_module("fa_hw.forward")
    launches: list = []
    dev = types.SimpleNamespace(device_id=0, arch=arch.removeprefix("sm_"), name=name)
    stream = types.SimpleNamespace(handle=0)

    def launch(s, config, kernel, *args):
        launches.append(kernel)

    fakes = [(cuda_core, "launch", launch), (runtime, "device", lambda: dev), (runtime, "device_arch", lambda: arch),
             (hw_device, "device", lambda ordinal=0: dev), (hw_device, "device_arch", lambda ordinal=0: arch),
             (runtime, "torch_stream", lambda device: stream), (tensors, "KERNEL_DEVICE", "cpu"),
             (runtime, "load_kernel", functools.cache(lambda build: runtime.LoadedKernel(
                 build, "fa2_fwd_kernel", ResourceUsage(96, 0)))),
             (hw_backward, "load_backward", functools.cache(lambda build: hw_backward.LoadedBackward(
                 build, {n: n for n in build.kernels}, {n: ResourceUsage(128, 0) for n in build.kernels}))),
             (hw_backward, "_PLANS", runtime.PlanCache()), (hw_forward, "_PLANS", runtime.PlanCache())]
    missing = object()
    saved = [(obj, attr, getattr(obj, attr, missing)) for obj, attr, _ in fakes]
    from fa_hw import tuned_backward

    tuned_backward._DEVICE_CHOICES.clear()
    try:
        for obj, attr, value in fakes:
            setattr(obj, attr, value)
        yield launches
    finally:
        for obj, attr, value in saved:
            if value is missing:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)
        tuned_backward._DEVICE_CHOICES.clear()


def _keep_freed_memory() -> None:
    """glibc's malloc keeps freed blocks for the next allocation (no mmap/munmap or heap trimming per
    call, whose page faults would be counted), as torch's caching allocator keeps the GPU's: a fixed
    mmap threshold of 32 MB (glibc's largest) and no trimming. A no-op without glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    libc.mallopt(m_trim_threshold, 2**30)


def fake_report(shape, causal: bool, calls: int, profile: bool = False) -> dict:
    """--fake: each layer's CPU microseconds and kernel launches per call (module docstring) ->
    {layer: (us, launches)}; prints them."""
    import torch

    _, _, n, d = shape
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch.zeros' fill on one thread: no OpenMP team spinning in the CPU time
    try:
        return _fake_layers(n, d, causal, calls, profile)
    finally:
        torch.set_num_threads(threads)


def _fake_layers(n: int, d: int, causal: bool, calls: int, profile: bool) -> dict:
    import torch

    import fa_hw
    from fa_hw.backward import enqueue_backward
    from fa_hw.forward import enqueue_forward
    from fa_hw.torch_ops import attention_bwd, attention_fwd

    with fake_gpu() as launches:
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(1, 1, n, d, generator=g).half() for _ in range(4))
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        o, lse = enqueue_forward(q, k, v, causal=causal)
        og = fa_hw.attention(qg, kg, vg, causal, check_finite=False)
        scale = 1.0 / d ** 0.5
        layers = {
            "backward (autograd.grad)": lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True),
            "  attention_bwd op": lambda: attention_bwd(do, q, k, v, o, lse, causal, None, False, False),
            "  enqueue_backward": lambda: enqueue_backward(q, k, v, o, lse, do, causal, scale, False),
            "forward (fa_hw.attention)": lambda: fa_hw.attention(qg, kg, vg, causal, check_finite=False),
            "  attention_fwd op": lambda: attention_fwd(q, k, v, causal, None, False, False),
            "  enqueue_forward": lambda: enqueue_forward(q, k, v, causal=causal),
        }
        out = {}
        print(f"fa_hw.attention host path on a fake GPU ({FAKE_GPU}'s tiles), 1,1,{n},{d} causal={causal}, "
              f"best of 5 x {calls} calls")
        for name, fn in layers.items():
            for _ in range(3):
                fn()
            del launches[:]
            us = min(timeit.repeat(fn, timer=time.process_time, number=calls, repeat=5)) / calls * 1e6
            out[name] = us, len(launches) / (5 * calls)
            print(f"  {name:28s} {us:8.1f} us/call   ({out[name][1]:g} launches/call)")
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                layers["backward (autograd.grad)"]()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            print(s.getvalue())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="32,8,1000,32", help="B,H,N,d (default 32,8,1000,32)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=None, help="calls per loop (default 50; --fake 200)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--fake", action="store_true", help="the host path on the CPU with a fake GPU (module docstring)")
    args = p.parse_args(argv)
    calls = args.calls if args.calls is not None else (200 if args.fake else 50)
    if calls < 1:
        p.error(f"--calls must be >= 1, got {calls}")
    try:
        b, h, n, d = (int(x) for x in args.shape.split(","))
    except ValueError:
        p.error(f"--shape takes B,H,N,d (four integers), got {args.shape!r}")
    if args.fake:
        _keep_freed_memory()  # for the rest of this process
        fake_report((b, h, n, d), args.causal, calls, args.profile)
        return 0
    import torch

    import fa_hw

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def fwd():
        return fa_hw.attention(q, k, v, args.causal, check_finite=False)

    o = fwd()

    def bwd():
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    print(f"fa_hw.attention {args.shape} causal={args.causal}, {calls} calls, {torch.cuda.get_device_name()}")
    for name, fn in (("forward", fwd), ("backward", bwd)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) / calls * 1e3
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        gpu = start.elapsed_time(end) / calls
        print(f"  {name:8s} host {host:7.3f} ms/call   GPU (events) {gpu:7.3f} ms/call")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            bwd()
        torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(15)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
