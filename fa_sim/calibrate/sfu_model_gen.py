"""Write fa_sim/calibrate/sfu_model.cu, the CUDA twin of fa_sim/isa/mufu.py, and check the two agree.

    python -m fa_sim.calibrate.sfu_model_gen write          (from fa_sim/isa/mufu_data/mufu_tables.json)
    python -m fa_sim.calibrate.sfu_model_gen check [--n N]  (g++ on this machine, against the numpy model)

The .cu defines `__device__ float model_<op>(float)` for every fp32 op of fa_sim/calibrate/sfu_ops.py
that fa_sim/isa/mufu.py models (run 2: `python -m fa_sim.calibrate.sfu_probe verify --model
fa_sim/calibrate/sfu_model.cu`).
It is plain C++ as well (no CUDA intrinsics outside #ifdef __CUDACC__), so the very same text is
compiled for the host and compared with the numpy model bit for bit on edge cases and random
inputs: the GPU then only has to compare it with the hardware.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..isa import mufu_table as mt
from .sfu_ops import OPS as PROBE_OPS
from .sfu_ops import sample_inputs
from .sfu_results import load_family, read_dumps

MODEL_CU = Path(__file__).with_name("sfu_model.cu")
OPS = ("ex2_ftz", "ex2", "lg2_ftz", "lg2", "rcp_ftz", "rcp", "rsqrt_ftz", "rsqrt", "sqrt_ftz", "sqrt",
       "sin_ftz", "sin", "cos_ftz", "cos")

_PRELUDE = r"""#ifndef __CUDACC__
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
#endif
"""

_BODY = r"""
#define MUFU_MASK23 0x7fffffLL
#define MUFU_NAN 0x7fffffffu
#define MUFU_INF 0x7f800000u

__device__ __forceinline__ unsigned int mufu_bits(float x) {
#ifdef __CUDACC__
    return __float_as_uint(x);
#else
    unsigned int u; std::memcpy(&u, &x, 4); return u;
#endif
}
__device__ __forceinline__ float mufu_float(unsigned int u) {
#ifdef __CUDACC__
    return __uint_as_float(u);
#else
    float x; std::memcpy(&x, &u, 4); return x;
#endif
}
__device__ __forceinline__ int mufu_bitlen(long long v) {  // v > 0
#ifdef __CUDACC__
    return 64 - __clzll(v);
#else
    return 64 - __builtin_clzll((unsigned long long)v);
#endif
}

// The truncated folded squarer: x_i at column 2i, x_i x_j (i < j) at column i + j + 1, columns
// below 2 nx - 15 dropped. For one i the kept x_j (j >= j0) sum to (xl with bits < j0 cleared).
__device__ __forceinline__ long long mufu_sq(long long xl, int nx) {
    const int cut = 2 * nx - 15;
    long long acc = 0;
    for (int i = 0; i < nx; ++i) {
        if (!((xl >> i) & 1)) continue;
        if (2 * i >= cut) acc += 1LL << (2 * i);
        const int j0 = (i + 1 > cut - i - 1) ? i + 1 : cut - i - 1;
        if (j0 < nx) acc += ((xl >> j0) << j0) << (i + 1);
    }
    return acc >> cut;
}

// Q = C0 + C1 xl + C2 sq(xl) for the 23-bit fraction f (bank: rsqrt/sqrt octave).
__device__ __forceinline__ long long mufu_q(const long long (*t)[3], int xl_bits, long long f, int bank) {
    const long long seg = (f >> xl_bits) + ((long long)bank << (23 - xl_bits));
    const long long xl = f & ((1LL << xl_bits) - 1);
    return t[seg][0] + t[seg][1] * xl + t[seg][2] * mufu_sq(xl, xl_bits);
}

// sig * 2^(exp - 23), sig in [2^23, 2^24]; flush to zero below 2^-126, inf above the largest finite.
__device__ __forceinline__ unsigned int mufu_pack(long long sig, long long exp) {
    long long b = ((exp + 127) << 23) + (sig - (1LL << 23));
    if (b < 0x800000LL) b = 0;
    if (b > 0x7f800000LL) b = 0x7f800000LL;
    return (unsigned int)b;
}

// mag * 2^-frac truncated to 24 significant bits (mag >= 0; results stay normal here).
__device__ __forceinline__ unsigned int mufu_fixed(long long mag, int frac) {
    if (mag == 0) return 0;
    const int len = mufu_bitlen(mag);
    const long long sig = len > 24 ? mag >> (len - 24) : mag << (24 - len);
    return mufu_pack(sig, len - 1 - frac);
}

// The results of special inputs: +-0 / subnormal, +-inf, NaN, and negative normal inputs.
__device__ __forceinline__ bool mufu_special(unsigned int u, unsigned int zero, unsigned int inf, bool neg_nan,
                                             unsigned int* out) {
    const unsigned int sign = u & 0x80000000u, mag = u & 0x7fffffffu;
    if (mag > MUFU_INF) { *out = MUFU_NAN; return true; }
    if (neg_nan && sign && mag >= 0x800000u) { *out = MUFU_NAN; return true; }
    if (mag < 0x800000u) { *out = zero | sign; return true; }
    if (mag == MUFU_INF) { *out = inf | sign; return true; }
    return false;
}

__device__ __forceinline__ float model_ex2_ftz(float x) {
    const unsigned int u = mufu_bits(x);
    if ((u & 0x7fffffffu) > MUFU_INF) return mufu_float(MUFU_NAN);
    const float a = fabsf(x) < 255.0f ? fabsf(x) : 255.0f;
    long long m = (long long)(a * 8388608.0f);              // exact product, truncated
    if (u >> 31) m = ~m + ((m & MUFU_MASK23) == 0);           // 2^-(n+1) 2^(~f), or exactly 2^-n
    const long long q = mufu_q(MUFU_T_EX2, 17, m & MUFU_MASK23, 0);
    return mufu_float(mufu_pack(q >> 15, m >> 23));
}
__device__ __forceinline__ float model_ex2(float x) {
    if (x < -126.0f) { const float t = model_ex2_ftz(x * 0.5f); return t * t; }
    return model_ex2_ftz(x);
}

__device__ __forceinline__ float model_rcp_ftz(float x) {
    const unsigned int u = mufu_bits(x);
    unsigned int r;
    if (mufu_special(u, MUFU_INF, 0u, false, &r)) return mufu_float(r);
    const long long e = (long long)((u >> 23) & 0xff) - 127, m = u & MUFU_MASK23;
    const long long q = mufu_q(MUFU_T_RCP, 16, m, 0);
    return mufu_float(mufu_pack(q >> 15, -e - 1) | (u & 0x80000000u));
}
__device__ __forceinline__ float model_rcp(float x) {
    const float a = fabsf(x);
    float s = a < 1.17549435e-38f ? 16777216.0f : 1.0f;
    s = a > 8.50705917e37f ? 0.25f : s;
    return s * model_rcp_ftz(x * s);
}

__device__ __forceinline__ float mufu_root(float x, bool rsq) {
    const unsigned int u = mufu_bits(x);
    unsigned int r;
    if (mufu_special(u, rsq ? MUFU_INF : 0u, rsq ? 0u : MUFU_INF, true, &r)) return mufu_float(r);
    const long long e = (long long)((u >> 23) & 0xff) - 127, m = u & MUFU_MASK23;
    const int octave = (int)(e & 1);
    const long long k = e >> 1;                               // x = 4^k m4
    if (rsq) {
        const long long q = mufu_q(MUFU_T_RSQRT, 17, m, octave);
        return mufu_float(mufu_pack((m == 0 && octave == 0) ? (1LL << 24) : q >> 16, -k - 1));
    }
    return mufu_float(mufu_pack(mufu_q(MUFU_T_SQRT, 17, m, octave) >> 17, k));
}
__device__ __forceinline__ float model_rsqrt_ftz(float x) { return mufu_root(x, true); }
__device__ __forceinline__ float model_sqrt_ftz(float x) { return mufu_root(x, false); }
__device__ __forceinline__ float model_rsqrt(float x) {
    return fabsf(x) < 1.17549435e-38f ? model_rsqrt_ftz(x * 16777216.0f) * 4096.0f : model_rsqrt_ftz(x);
}
__device__ __forceinline__ float model_sqrt(float x) {
    return fabsf(x) < 1.17549435e-38f ? model_sqrt_ftz(x * 16777216.0f) * 2.44140625e-4f : model_sqrt_ftz(x);
}

__device__ __forceinline__ float model_lg2_ftz(float x) {
    const unsigned int u = mufu_bits(x);
    unsigned int r;
    if (mufu_special(u, 0xff800000u, MUFU_INF, true, &r)) return mufu_float(r);
    if (u == 0x3f800000u) return 0.0f;                        // log2(1) = +0
    const long long e = (long long)((u >> 23) & 0xff) - 127, m = u & MUFU_MASK23;
    const long long fx = (e << 36) + (mufu_q(MUFU_T_LG2, 17, m, 0) >> 2);  // e + log2(m) at 2^-36
    return mufu_float(fx < 0 ? mufu_fixed(~fx, 36) | 0x80000000u : mufu_fixed(fx, 36));
}
__device__ __forceinline__ float model_lg2(float x) {
    return fabsf(x) < 1.17549435e-38f ? model_lg2_ftz(x * 16777216.0f) - 24.0f : model_lg2_ftz(x);
}

// FMUL.RZ x * 0x3E22F983, as ptxas emits before MUFU.SIN / MUFU.COS.
__device__ __forceinline__ float mufu_mul_rz_inv2pi(float x) {
    const float c = mufu_float(0x3e22f983u);
#ifdef __CUDACC__
    return __fmul_rz(x, c);
#else
    const double p = (double)x * (double)c;                   // exact
    float t = (float)p;
    if (std::fabs((double)t) > std::fabs(p)) t = std::nextafter(t, 0.0f);
    return t;
#endif
}
__device__ __forceinline__ float mufu_trig(float x, long long quarter) {
    const unsigned int u = mufu_bits(x);
    if ((u & 0x7fffffffu) >= MUFU_INF) return mufu_float(MUFU_NAN);
    const double t = fabs((double)mufu_mul_rz_inv2pi(x));
    const long long angle = (t < 16777216.0 ? (long long)(t * 33554432.0) : 0) + quarter;  // revolutions at 2^-25
    const long long q = (angle >> 23) & 3, f = angle & MUFU_MASK23;
    const long long g = (q & 1) ? MUFU_MASK23 - f : f;
    const long long s = mufu_q(MUFU_T_SIN, 17, g, 0) >> 1;   // sin(pi/2 g/2^23) at 2^-37
    const bool neg = (q >= 2) != (quarter == 0 && (u >> 31));
    return mufu_float(mufu_fixed(s, 37) | (neg ? 0x80000000u : 0u));
}
__device__ __forceinline__ float model_sin_ftz(float x) { return mufu_trig(x, 0); }
__device__ __forceinline__ float model_sin(float x) { return mufu_trig(x, 0); }
__device__ __forceinline__ float model_cos_ftz(float x) { return mufu_trig(x, 1LL << 23); }
__device__ __forceinline__ float model_cos(float x) { return mufu_trig(x, 1LL << 23); }
"""

_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
typedef float (*Fn)(float);
static const Fn FNS[] = {%s};
int main(int argc, char** argv) {
    FILE* in = std::fopen(argv[1], "rb");
    std::vector<unsigned int> x;
    unsigned int v;
    while (std::fread(&v, 4, 1, in) == 1) x.push_back(v);
    std::fclose(in);
    FILE* out = std::fopen(argv[2], "wb");
    const int only = argc > 3 ? std::atoi(argv[3]) : -1;  // one op, or all of them
    std::vector<unsigned int> y(x.size());
    for (int k = 0; k < (int)(sizeof(FNS) / sizeof(FNS[0])); ++k) {
        if (only >= 0 && k != only) continue;
        for (size_t i = 0; i < x.size(); ++i) y[i] = mufu_bits(FNS[k](mufu_float(x[i])));
        std::fwrite(y.data(), 4, y.size(), out);
    }
    std::fclose(out);
    return 0;
}
"""


def source(tables: dict[str, mt.Table] | None = None) -> str:
    """The text of sfu_model.cu: the tables as constant arrays, then the model."""
    tables = tables or mt.tables()
    lines = ["// Generated by fa_sim/calibrate/sfu_model_gen.py from fa_sim/isa/mufu_data/mufu_tables.json:",
             "// the CUDA (and host C++) twin of fa_sim/isa/mufu.py. Do not edit; regenerate.", ""]
    for op in ("ex2", "rcp", "rsqrt", "sqrt", "lg2", "sin"):
        rows = tables[op].rows()
        body = ",\n".join("    {%dLL, %dLL, %dLL}" % tuple(r) for r in rows)
        lines.append(f"__device__ const long long MUFU_T_{op.upper()}[{len(rows)}][3] = {{\n{body}\n}};")
    return "\n".join(lines[:3]) + _PRELUDE + "\n" + "\n".join(lines[3:]) + "\n" + _BODY


def edge_inputs(n_random: int, seed: int = 0) -> np.ndarray:
    """Every recorded-sample edge of every op, plus random bit patterns and values in each op's range."""
    rng = np.random.default_rng(seed)
    parts = [sample_inputs(op) for op in PROBE_OPS]
    parts.append(rng.integers(0, 2**32, n_random, dtype=np.uint32))
    parts.append(rng.uniform(-160, 160, n_random // 4).astype(np.float32).view(np.uint32))
    parts.append(np.exp2(rng.uniform(-149, 128, n_random // 4)).astype(np.float32).view(np.uint32))
    return np.unique(np.concatenate(parts).astype(np.uint32))


class HostModel:
    """fa_sim/calibrate/sfu_model.cu compiled for this machine (g++), run on uint32 bit patterns."""

    def __init__(self, src: str | None = None, cxx: str = "g++"):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)
        src = src if src is not None else MODEL_CU.read_text()
        (self.dir / "m.cpp").write_text(src + _HARNESS % ", ".join(f"model_{op}" for op in OPS))
        subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-o", str(self.dir / "m"),
                        str(self.dir / "m.cpp")], check=True, capture_output=True, text=True)

    def __call__(self, x: np.ndarray, op: str | None = None) -> np.ndarray:
        """[len(OPS), x.size] outputs, or [x.size] of one op."""
        np.ascontiguousarray(x, dtype=np.uint32).tofile(self.dir / "in.bin")
        extra = [] if op is None else [str(OPS.index(op))]
        subprocess.run([str(self.dir / "m"), str(self.dir / "in.bin"), str(self.dir / "out.bin")] + extra, check=True)
        y = np.fromfile(self.dir / "out.bin", dtype=np.uint32)
        return y if op is not None else y.reshape(len(OPS), x.size)

    def close(self) -> None:
        self._tmp.cleanup()


def numpy_outputs(x: np.ndarray) -> np.ndarray:
    from ..isa import mufu

    xf = x.view(np.float32)
    out = []
    for op in OPS:
        fn = getattr(mufu, op.removesuffix("_ftz"))
        out.append(fn(xf, ftz=op.endswith("_ftz")).view(np.uint32))
    return np.stack(out)


def cmd_write(args) -> int:
    MODEL_CU.write_text(source())
    print(f"wrote {MODEL_CU} ({MODEL_CU.stat().st_size} bytes)")
    return 0


def cmd_check(args) -> int:
    if source() != MODEL_CU.read_text():
        print(f"{MODEL_CU} is stale: run `python -m fa_sim.calibrate.sfu_model_gen write`")
        return 1
    x = edge_inputs(args.n)
    t0 = time.time()
    model = HostModel()
    if args.run1:
        return _check_run1(model, args.run1)
    host, ref = model(x), numpy_outputs(x)
    bad = 0
    for k, op in enumerate(OPS):
        diff = np.flatnonzero(host[k] != ref[k])
        bad += diff.size
        first = "" if not diff.size else f", first x=0x{x[diff[0]]:08x}: C 0x{host[k, diff[0]]:08x} numpy 0x{ref[k, diff[0]]:08x}"
        print(f"{op:10s} {x.size} inputs, {diff.size} differ{first}")
    print(f"{time.time() - t0:.1f} s")
    return 1 if bad else 0


def _check_run1(model: HostModel, d: Path) -> int:
    """The host-compiled C model against every output run 1 recorded (dumps and samples)."""
    bad = 0
    for family in ("ex2", "lg2", "rcp", "rsq", "sin", "cos"):
        for op, arrays in load_family(d / f"sfu_{family}.npz").items():
            if op not in OPS:
                continue
            pairs = [(arrays["samples_x"], arrays["samples_y"])] + (list(read_dumps(arrays).values())
                                                                   if "dump_meta" in arrays else [])
            x = np.concatenate([p[0] for p in pairs])
            y = np.concatenate([p[1] for p in pairs])
            n_bad = int(np.count_nonzero(model(x, op) != y))
            bad += n_bad
            print(f"{op:10s} {x.size:>10d} recorded outputs, {n_bad} differ from the C model")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("write", help="regenerate fa_sim/calibrate/sfu_model.cu from the tables")
    c = sub.add_parser("check", help="compile the model for the host and compare with the numpy model")
    c.add_argument("--n", type=int, default=2_000_000, help="random inputs on top of the edge cases")
    c.add_argument("--run1", type=Path, help="instead: every output recorded in this run-1 directory")
    args = p.parse_args(argv)
    return cmd_write(args) if args.cmd == "write" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
