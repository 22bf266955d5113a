"""Probe the H200's mma.sync m16n8k16 f32 accumulation and fit fa_sim.tensorcore's model to it.

On the GPU:   python -m fa_sim.calibrate.mma_probe run --out DIR      (writes DIR/mma_probe.npz)
              ... run --dtype bf16 --out DIR                          (mma .bf16: DIR/mma_probe_bf16.npz)
Anywhere:     python -m fa_sim.calibrate.mma_probe fit DIR/mma_probe.npz   (the file says its dtype)
Anywhere:     python -m fa_sim.calibrate.mma_probe excerpt DIR/mma_probe.npz --tiles 0:64,4096:4224 --out FILE

Inputs are random fp16 A (16x16, row) and B (8x16, col) with a wide exponent spread, and random
fp32 C (a quarter of the tiles with C = 0, as in the kernel's first K segment), so that alignment,
truncation and rounding of the accumulation all show in the last bits. With --dtype bf16 the
operands are bf16 (stored as their float32 values; a wider exponent spread) and the MMA is
mma.sync...f32.bf16.bf16.f32, the kernel's FA_BF16 form: `fit` then scores the models applied to
bf16 (FusedDotModel.for_operand), which is how the H200 model's fit to bf16 is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

PROBE_SRC = r"""
extern "C" __global__ void mma_probe(const unsigned short* A, const unsigned short* B,
                                     const float* C, float* D, int n_tiles) {
    int tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (tile >= n_tiles) return;
    int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const unsigned short* a = A + tile * 256;  // [16 m][16 k]
    const unsigned short* b = B + tile * 128;  // [8 n][16 k]
    const float* c = C + tile * 128;           // [16 m][8 n]
    float* d = D + tile * 128;
    unsigned ra[4], rb[2];
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        ra[i] = a[row * 16 + col] | (unsigned(a[row * 16 + col + 1]) << 16);
    }
    for (int i = 0; i < 2; ++i) {
        int k = 2 * t + 8 * i;
        rb[i] = b[g * 16 + k] | (unsigned(b[g * 16 + k + 1]) << 16);
    }
    float acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}
"""


def probe_source(dtype: str = "fp16") -> str:
    """PROBE_SRC with the MMA of `dtype`'s operands (bf16: mma.sync...f32.bf16.bf16.f32)."""
    return PROBE_SRC if dtype == "fp16" else PROBE_SRC.replace(".f32.f16.f16.f32", ".f32.bf16.bf16.f32")


def make_inputs(n_tiles: int, seed: int, dtype: str = "fp16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 A, B (bf16: float32 arrays of bf16 values, exponents over a wider range) and fp32 C."""
    rng = np.random.default_rng(seed)

    def spread(shape, lo, hi, dtype):
        mant = rng.uniform(1.0, 2.0, size=shape)
        return (rng.choice([-1.0, 1.0], size=shape) * np.ldexp(mant, rng.integers(lo, hi, size=shape))).astype(dtype)

    if dtype == "bf16":
        from ..isa.convert import f32_to_bf16_values

        a = f32_to_bf16_values(spread((n_tiles, 16, 16), -20, 20, np.float32))
        b = f32_to_bf16_values(spread((n_tiles, 8, 16), -20, 20, np.float32))
    else:
        a = spread((n_tiles, 16, 16), -8, 8, np.float16)
        b = spread((n_tiles, 8, 16), -8, 8, np.float16)
    c = spread((n_tiles, 16, 8), -6, 12, np.float32)
    c[: n_tiles // 4] = 0.0
    return a, b, c


def run_on_gpu(a, b, c, dtype: str = "fp16") -> np.ndarray:
    import cupy as cp
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    prog = Program(probe_source(dtype), code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
    kernel = prog.compile("cubin").get_kernel("mma_probe")
    n_tiles = a.shape[0]
    def bits(x):  # the 16-bit patterns of A and B: fp16's, or a bf16 value's upper half
        return x.view(np.uint16) if x.dtype == np.float16 else (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    da, db, dc = cp.asarray(bits(a)), cp.asarray(bits(b)), cp.asarray(c)
    dd = cp.zeros((n_tiles, 16, 8), dtype=cp.float32)
    cfg = LaunchConfig(grid=(n_tiles + 3) // 4, block=128)
    launch(stream, cfg, kernel, da.data.ptr, db.data.ptr, dc.data.ptr, dd.data.ptr, np.int32(n_tiles))
    stream.sync()
    return cp.asnumpy(dd)


def dot_operands(a, b, c):
    """Per output element: the 16 A values of its row, the 16 B values of its column, and c."""
    av = np.broadcast_to(a[:, :, None, :], (a.shape[0], 16, 8, 16))
    bv = np.broadcast_to(b[:, None, :, :], (b.shape[0], 16, 8, 16))
    return av, bv, c


def parse_tiles(text: str) -> np.ndarray:
    """'0:64,4096:4224' -> the tile indices of those half-open ranges, in order."""
    try:
        ranges = [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
        if any(len(r) != 2 or not 0 <= r[0] < r[1] for r in ranges):
            raise ValueError
    except ValueError:
        raise SystemExit(f"--tiles {text!r}: expects comma-separated START:STOP ranges, 0 <= START < STOP") from None
    return np.concatenate([np.arange(a, b) for a, b in ranges])


def excerpt(src: Path, tiles: np.ndarray, out: Path) -> None:
    """Keep some tiles of a recording (tests/data/h200/mma_probe_192.npz is tiles 0:64 and
    4096:4224 of `run --tiles 8192`: 64 with C = 0, 128 with random C)."""
    with np.load(src) as rec:
        n = rec["a"].shape[0]
        if tiles.max() >= n:
            raise SystemExit(f"--tiles reaches tile {tiles.max()}, but {src} holds {n} tiles")
        arrays = {k: rec[k][tiles] for k in ("a", "b", "c", "d")}
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({tiles.size} tiles of {n})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--tiles", type=int, default=4096)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="the operands' type (default fp16)")
    f = sub.add_parser("fit")
    f.add_argument("npz", type=Path)
    e = sub.add_parser("excerpt", help="keep some tiles of a recording (no GPU)")
    e.add_argument("npz", type=Path)
    e.add_argument("--tiles", required=True, help="START:STOP ranges, e.g. 0:64,4096:4224")
    e.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "excerpt":
        excerpt(args.npz, parse_tiles(args.tiles), args.out)
        return 0
    if args.cmd == "run":
        a, b, c = make_inputs(args.tiles, args.seed, args.dtype)
        d = run_on_gpu(a, b, c, args.dtype)
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / ("mma_probe.npz" if args.dtype == "fp16" else "mma_probe_bf16.npz")
        extra = {} if args.dtype == "fp16" else {"dtype": np.array("bf16")}
        np.savez_compressed(out, a=a, b=b, c=c, d=d, **extra)
        print(f"wrote {out} ({args.tiles} tiles)")
        return 0
    from ..tensorcore import fit

    data = np.load(args.npz)
    operand = "bf16" if "dtype" in data.files and str(data["dtype"]) == "bf16" else "f16"
    av, bv, c = dot_operands(data["a"], data["b"], data["c"])
    for res in fit(av, bv, c, data["d"], operand)[:8]:
        print(f"{res.mismatches:8d} / {res.total} mismatches  {res.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
