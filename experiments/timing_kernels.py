"""Three kernels that are not attention, timed on the GPU and by the timing model (issue 35, item 2).

    python experiments/timing_kernels.py --list                # the launches, no GPU needed
    python experiments/timing_kernels.py --measure [--out F]   # GPU: -> tests/data/h200/timing_kernels.json
    python experiments/timing_kernels.py --predict [--measured F] [--sizes small]
                                                               # fa_sim.timing.predict_launch beside the measurements

The kernels (experiments/kernels/, plain CUDA C++ with SM80 features, one `extern "C"` kernel each):
- gemm_f16.cu: C = A B, fp16 in, fp32 accumulate; 128 x 128 x 32 tiles, 8 warps, cp.async into
  two shared stages, ldmatrix, mma.sync.m16n8k16 (inline PTX); includes cuda_fp16.h.
- reduce_sum.cu: the sum of an fp32 array: grid-stride float4 loads, shfl.sync.bfly per warp, the
  warps' sums through shared memory, shfl.sync.down in warp 0, one atomicAdd per CTA.
- copy_f4.cu: dst = src, float4 loads and stores in a grid-stride loop (memory-bound).

One table, `LAUNCHES`, gives every launch both modes use: the kernel, the size, the grid, the
block, the dynamic shared memory and the arguments (`Launch.args`: numpy arrays for the pointer
parameters, numpy scalars for the others, from a fixed seed). "large" fills the H200's 132 SMs
(the GEMM 1,024 CTAs of 256 threads at two per SM; the reduction and the copy 8 CTAs of 256
threads per SM over 256 MiB arrays), "small" is a second, smaller launch of each (a GEMM of 256
CTAs, the others over 16 MiB, 2 CTAs per SM). `CPU_SIZES` are the small problems the CPU test
(tests/test_timing_kernels.py) runs on the PTX engine with exact integer-valued data.

--measure compiles each kernel with the project's NVRTC options (fa_sim.contract.nvrtc, CUDA's
headers included) into a cubin for the device's exact arch, launches it through cuda.core as
fa_hw.runtime does, checks one launch's result against numpy, then times `--batches` batches of
`--reps` launches after `--warmup` launches, one pair of CUDA events around each batch; a launch's
time is the median of the batch means. The inputs are random and non-zero (uniform fp16 in [-1, 1]
for the GEMM, uniform [0, 1) fp32 for the reduction, normal fp32 for the copy).

--predict calls fa_sim.timing.predict_launch(source, grid, block, args, smem_bytes, gpu) with the
same launches (the same arguments at their full size: the model runs the kernel functionally) and
prints measured against predicted; a launch the model refuses prints its error on its row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's fa_sim / fa_hw
    sys.path.insert(0, str(ROOT))

KERNEL_DIR = ROOT / "experiments" / "kernels"
DEFAULT_OUT = ROOT / "tests" / "data" / "h200" / "timing_kernels.json"
SIZES = ("large", "small")
SEED = 35


# ---- the kernels: arguments, grid, check ------------------------------------------------------
def _gemm_args(p: dict, rng: np.random.Generator, exact: bool) -> list:
    m, n, k = p["M"], p["N"], p["K"]
    if exact:  # small integers: every product and sum is exact in fp32
        a, b = (rng.integers(-2, 3, s).astype(np.float16) for s in ((m, k), (k, n)))
    else:
        a, b = (rng.uniform(-1, 1, s).astype(np.float16) for s in ((m, k), (k, n)))
    return [a.view(np.uint16), b.view(np.uint16), np.zeros((m, n), np.float32), np.int32(m), np.int32(n), np.int32(k)]


def _gemm_expected(args: list) -> np.ndarray:
    a, b = (x.view(np.float16).astype(np.float64) for x in args[:2])
    return a @ b


def _gemm_check(args: list, out: np.ndarray, exact: bool) -> float:
    want = _gemm_expected(args)
    if exact:
        np.testing.assert_array_equal(out, want.astype(np.float32))
        return 0.0
    k = int(args[5])  # fp32 accumulation over K terms of |a b| <= 1; a wrong tile is off by O(sqrt(K))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    return float(np.abs(out - want).max())


def _gemm_grid(p: dict) -> tuple[int, int, int]:
    if p["M"] % 128 or p["N"] % 128 or p["K"] % 32:
        raise ValueError(f"gemm_f16 needs M and N multiples of 128 and K a multiple of 32, got {p}")
    return (p["N"] // 128, p["M"] // 128, 1)


def _reduce_args(p: dict, rng: np.random.Generator, exact: bool) -> list:
    x = rng.integers(0, 8, p["n"]).astype(np.float32) if exact else rng.random(p["n"], dtype=np.float32)
    return [x, np.zeros(1, np.float32), np.int64(p["n"])]


def _reduce_check(args: list, out: np.ndarray, exact: bool) -> float:
    want = float(args[0].sum(dtype=np.float64))
    if exact:  # integers below 2**24: exact in fp32 in any order
        assert float(out[0]) == want, f"sum {float(out[0])}, numpy {want}"
        return 0.0
    # positive terms: fp32 partial sums are off by a few 1e-6 of the total; a CTA lost is 1e-3 of it
    err = abs(float(out[0]) - want) / want
    assert err < 1e-4, f"sum {float(out[0])}, numpy {want} (relative error {err:.2e})"
    return err


def _copy_args(p: dict, rng: np.random.Generator, exact: bool) -> list:
    return [rng.standard_normal(p["n"], dtype=np.float32), np.zeros(p["n"], np.float32), np.int64(p["n"])]


def _copy_check(args: list, out: np.ndarray, exact: bool) -> float:
    np.testing.assert_array_equal(out, args[0])
    return 0.0


@dataclass(frozen=True)
class Kernel:
    name: str  # the .cu file's stem and the kernel's name
    block: int
    make_args: Callable[[dict, np.random.Generator, bool], list]
    output: int  # the argument the kernel writes
    check: Callable[[list, np.ndarray, bool], float]  # raises when wrong; returns the error
    grid: Callable[[dict], tuple[int, int, int]]
    smem_bytes: int = 0  # dynamic shared memory (these kernels use static shared memory only)
    work: Callable[[dict], tuple[float, str]] = field(default=lambda p: (0.0, ""))  # (amount, unit) per launch

    @property
    def path(self) -> Path:
        return KERNEL_DIR / f"{self.name}.cu"

    def source(self) -> str:
        return self.path.read_text()


def _fixed_grid(ctas: int):
    return lambda p: (ctas, 1, 1)


KERNELS = {
    "gemm_f16": Kernel("gemm_f16", 256, _gemm_args, 2, _gemm_check, _gemm_grid,
                       work=lambda p: (2.0 * p["M"] * p["N"] * p["K"] / 1e12, "TFLOP")),
    "reduce_sum": Kernel("reduce_sum", 256, _reduce_args, 1, _reduce_check, None,
                         work=lambda p: (4.0 * p["n"] / 1e12, "TB")),
    "copy_f4": Kernel("copy_f4", 256, _copy_args, 1, _copy_check, None,
                      work=lambda p: (8.0 * p["n"] / 1e12, "TB")),
}

# (kernel, size) -> problem parameters; the grid-stride kernels carry their grid ("ctas").
# H200: 132 SMs; 8 CTAs of 256 threads fill an SM's 2,048 threads.
PARAMS = {
    ("gemm_f16", "large"): {"M": 4096, "N": 4096, "K": 4096},     # 1,024 CTAs
    ("gemm_f16", "small"): {"M": 2048, "N": 2048, "K": 1024},     # 256 CTAs
    ("reduce_sum", "large"): {"n": 1 << 26, "ctas": 132 * 8},     # 256 MiB
    ("reduce_sum", "small"): {"n": 1 << 22, "ctas": 132 * 2},     # 16 MiB, L2-resident
    ("copy_f4", "large"): {"n": 1 << 26, "ctas": 132 * 8},        # 256 MiB read, 256 MiB written
    ("copy_f4", "small"): {"n": 1 << 22, "ctas": 132 * 2},
}
# The CPU test's problems (PTX engine): several K tiles; array lengths that leave a scalar tail.
CPU_PARAMS = {
    "gemm_f16": {"M": 128, "N": 256, "K": 96},
    "reduce_sum": {"n": 10_003, "ctas": 4},
    "copy_f4": {"n": 10_001, "ctas": 4},
}


@dataclass(frozen=True)
class Launch:
    kernel: Kernel
    size: str
    params: dict

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.kernel.grid(self.params) if self.kernel.grid else (self.params["ctas"], 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.kernel.block, 1, 1)

    @property
    def smem_bytes(self) -> int:
        return self.kernel.smem_bytes

    @property
    def key(self) -> str:
        return f"{self.kernel.name}/{self.size}"

    def args(self, exact: bool = False) -> list:
        """The launch's arguments (host numpy), the same for every call: the seed is fixed."""
        return self.kernel.make_args(self.params, np.random.default_rng(SEED), exact)

    def check(self, args: list, out: np.ndarray, exact: bool = False) -> float:
        return self.kernel.check(args, out, exact)


def launches(sizes=SIZES) -> list[Launch]:
    return [Launch(KERNELS[name], size, PARAMS[(name, size)]) for name in KERNELS for size in sizes]


def cpu_launches() -> list[Launch]:
    return [Launch(KERNELS[name], "cpu", CPU_PARAMS[name]) for name in KERNELS]


# ---- the GPU ----------------------------------------------------------------------------------
def _compile(kernel: Kernel, arch: str):
    """The cuda.core Kernel of `kernel` for the device's arch: the contract's NVRTC options
    (fa_sim.contract.nvrtc.compile_cubin, CUDA's headers on the include path), as fa_hw compiles."""
    from cuda.core import ObjectCode

    from fa_sim.contract.nvrtc import compile_cubin

    cubin, _ = compile_cubin(kernel.source(), name=str(kernel.path), arch=arch)
    return ObjectCode.from_cubin(cubin, name=kernel.name).get_kernel(kernel.name)


def _device_args(args: list, stream) -> tuple[list, list]:
    """(launch arguments, device buffers): arrays uploaded (their pointers as ints), scalars kept
    as numpy scalars (cuda.core packs np.int32 as 4 bytes, np.int64 as 8: fa_hw.runtime's rule)."""
    from fa_hw.runtime import upload

    out, bufs = [], []
    for a in args:
        if isinstance(a, np.ndarray):
            bufs.append(upload(a, stream))
            out.append(int(bufs[-1].handle))
        else:
            out.append(a)
    return out, bufs


def measure_one(launch: Launch, arch: str, stream, warmup: int, reps: int, batches: int) -> dict:
    from cuda.core import EventOptions, LaunchConfig
    from cuda.core import launch as cuda_launch

    from fa_hw.runtime import download, memset_zero

    kernel = _compile(launch.kernel, arch)
    host = launch.args()
    dev_args, bufs = _device_args(host, stream)
    out_ptr, out_host = dev_args[launch.kernel.output], host[launch.kernel.output]
    config = LaunchConfig(grid=launch.grid, block=launch.block, shmem_size=launch.smem_bytes)

    memset_zero(out_ptr, out_host.nbytes, stream)  # the check: one launch on a zeroed output
    cuda_launch(stream, config, kernel, *dev_args)
    got = download(out_ptr, np.empty_like(out_host), stream)
    error = launch.check(host, got)

    def event():
        return stream.record(options=EventOptions(timing_enabled=True))

    for _ in range(warmup):
        cuda_launch(stream, config, kernel, *dev_args)
    batch_ms = []
    for _ in range(batches):
        start = event()
        for _ in range(reps):
            cuda_launch(stream, config, kernel, *dev_args)
        end = event()
        stream.sync()
        batch_ms.append(float(end - start) / reps)
    del bufs
    amount, unit = launch.kernel.work(launch.params)
    ms = statistics.median(batch_ms)
    return {"kernel": launch.kernel.name, "size": launch.size, "params": launch.params, "grid": list(launch.grid),
            "block": list(launch.block), "smem_bytes": launch.smem_bytes, "ms": ms, "batch_ms": batch_ms,
            "check_error": error, "rate": f"{amount / (ms / 1e3):.3f} {unit}/s" if unit else ""}


def measure(sizes=SIZES, warmup: int = 10, reps: int = 20, batches: int = 3) -> dict:
    from fa_hw.device import device, device_arch
    from fa_hw.runtime import own_stream
    from fa_sim.contract.nvrtc import cuda_headers, nvrtc_version

    dev, arch = device(), device_arch()
    stream = own_stream()
    rows = []
    for launch in launches(sizes):
        t0 = time.time()
        rows.append(measure_one(launch, arch, stream, warmup, reps, batches))
        print(f"{launch.key:<18} {rows[-1]['ms']:.4f} ms  ({rows[-1]['rate']}; batches "
              f"{', '.join(f'{b:.4f}' for b in rows[-1]['batch_ms'])}; {time.time() - t0:.1f} s)", flush=True)
    return {"gpu": dev.name, "arch": arch, "sms": int(dev.properties.multiprocessor_count),
            "nvrtc": list(nvrtc_version()), "headers": list(cuda_headers()[1]),
            "warmup": warmup, "reps": reps, "batches": batches, "launches": rows}


# ---- the model ----------------------------------------------------------------------------------
def predict_launch_fn():
    """fa_sim.timing.predict_launch, or None while the timing model has none."""
    import fa_sim.timing as timing

    return getattr(timing, "predict_launch", None)


def predict(measured: dict | None, sizes=SIZES, gpu: str = "h200") -> list[dict]:
    fn = predict_launch_fn()
    if fn is None:
        print("fa_sim.timing.predict_launch does not exist yet in this checkout: the timing model cannot "
              "time a launch of an arbitrary kernel (issue 35, item 2); nothing predicted", file=sys.stderr)
        return []
    by_key = {(r["kernel"], r["size"]): r for r in (measured or {}).get("launches", ())}
    rows = []
    print(f"{'launch':<18} {'grid':>14} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  seconds")
    for launch in launches(sizes):
        t0 = time.time()
        m = by_key.get((launch.kernel.name, launch.size))
        row = {"kernel": launch.kernel.name, "size": launch.size, "measured_ms": m["ms"] if m else None}
        try:
            pred = fn(str(launch.kernel.path), launch.grid, launch.block, launch.args(), smem_bytes=launch.smem_bytes,
                      gpu=gpu)
            row["predicted_ms"] = float(pred.kernel_ms)
        except Exception as exc:  # a refusal is a result of its own: print it on the row
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        seconds = time.time() - t0
        grid = "x".join(map(str, launch.grid[:2]))
        if "predicted_ms" in row:
            err = "" if m is None else f"{row['predicted_ms'] / m['ms'] - 1:+.1%}"
            meas = "-" if m is None else f"{m['ms']:.4f}"
            print(f"{launch.key:<18} {grid:>14} {meas:>12} {row['predicted_ms']:>13.4f} {err:>8}  {seconds:.1f}")
        else:
            print(f"{launch.key:<18} {grid:>14} not predicted: {row['error']}")
        rows.append(row)
    errors = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows if r.get("predicted_ms") and r["measured_ms"]]
    if errors:
        print(f"MAPE {100 * statistics.mean(errors):.1f} % over {len(errors)} launches, worst {100 * max(errors):.1f} %")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the launches")
    mode.add_argument("--measure", action="store_true", help="time the launches on the GPU")
    mode.add_argument("--predict", action="store_true", help="predict the launches with fa_sim.timing.predict_launch")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"--measure's JSON (default {DEFAULT_OUT})")
    ap.add_argument("--measured", type=Path, default=DEFAULT_OUT, help="--predict's measurements to compare with")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {', '.join(SIZES)}")
    ap.add_argument("--gpu", default="h200", help="--predict: the timing model's GPU")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = tuple(s.strip() for s in args.sizes.split(",") if s.strip())
    if not sizes or any(s not in SIZES for s in sizes):
        ap.error(f"--sizes {args.sizes!r}: give a comma-separated subset of {', '.join(SIZES)}")
    if min(args.warmup + 1, args.reps, args.batches) < 1:
        ap.error("--warmup must be >= 0, --reps and --batches >= 1")
    if args.list:
        for launch in launches(sizes):
            print(f"{launch.key:<18} grid {launch.grid} block {launch.block} smem {launch.smem_bytes} {launch.params}")
        return 0
    if args.measure:
        data = measure(sizes, args.warmup, args.reps, args.batches)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out} ({data['gpu']})")
        return 0
    measured = json.loads(args.measured.read_text()) if args.measured.exists() else None
    if measured is None:
        print(f"no measurements at {args.measured}: predictions only (run --measure on a GPU first)", file=sys.stderr)
    rows = predict(measured, sizes, args.gpu)
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
