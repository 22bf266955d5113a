// Kernels of fa_sim/calibrate/sfu_probe.py: exhaustive measurement of the special-function unit (MUFU).
// The host prepends `enum Op { OP_EX2_FTZ, ... }` (from sfu_ops.OPS) and appends one
// SFU_KERNELS / SFU_VERIFY line per op, so the op list lives in one place (the Python table).
//
// A sweep block covers 2^16 consecutive fp32 bit patterns (1/128 of one sign+exponent band), so its
// band is uniform and its counters reduce in shared memory before one global atomic per counter.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FULL_MASK 0xffffffffu
#define NBINS 40      // see bin_of
#define DCLIP 16      // ulp differences beyond +-DCLIP share an overflow bin
#define NCHG 23       // ctz(mantissa + 1) of a step u -> u + 1 inside a band: 0..22
#define NHYP 4        // hypotheses per op in check_body
#define PER_THREAD 256
#define BLOCK_SHIFT 16  // 256 threads x 256 inputs
#define CANON_NAN 0x7fffffffu
#define TINY 1.17549435e-38f  // 2^-126
#define I32_MAX 2147483647
#define I32_MIN (-2147483647 - 1)

__device__ __forceinline__ float as_f(u32 u) { return __uint_as_float(u); }
__device__ __forceinline__ u32 as_u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ bool is_nan_bits(u32 u) { return (u & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ float flush(float x) { return fabsf(x) < TINY ? copysignf(0.0f, x) : x; }
__device__ __forceinline__ bool is_normal(float x) { return fabsf(x) >= TINY && fabsf(x) < __int_as_float(0x7f800000); }

// ---- the hardware ops: one PTX instruction each (SASS in sfu_probe.py's docstring) ----
template <int OP> __device__ float hw(float x);
#define HW(OPID, PTX) \
    template <> __device__ __forceinline__ float hw<OPID>(float x) { \
        float y; asm volatile(PTX " %0, %1;" : "=f"(y) : "f"(x)); return y; }
HW(OP_EX2_FTZ, "ex2.approx.ftz.f32")
HW(OP_EX2, "ex2.approx.f32")
HW(OP_LG2_FTZ, "lg2.approx.ftz.f32")
HW(OP_LG2, "lg2.approx.f32")
HW(OP_RCP_FTZ, "rcp.approx.ftz.f32")
HW(OP_RCP, "rcp.approx.f32")
HW(OP_RSQRT_FTZ, "rsqrt.approx.ftz.f32")
HW(OP_RSQRT, "rsqrt.approx.f32")
HW(OP_SQRT_FTZ, "sqrt.approx.ftz.f32")
HW(OP_SQRT, "sqrt.approx.f32")
HW(OP_SIN_FTZ, "sin.approx.ftz.f32")
HW(OP_SIN, "sin.approx.f32")
HW(OP_COS_FTZ, "cos.approx.ftz.f32")
HW(OP_COS, "cos.approx.f32")
HW(OP_TANH, "tanh.approx.f32")

// ---- correctly rounded references from double precision (NaN made canonical) ----
// Double rounding is harmless for 1/x and sqrt (53 >= 2*24 + 2); for the transcendental ones the
// double result is within an ulp of 2^-52, so only inputs within 2^-29 of an fp32 midpoint can be
// misjudged: a handful over 2^32, immaterial for histograms (dumps never depend on it).
template <int OP> __device__ float ref_cr(float x);
#define REF(OPID, FTZ, EXPR) \
    template <> __device__ float ref_cr<OPID>(float x_in) { \
        const float x = (FTZ) ? flush(x_in) : x_in; const double d = (double)x; \
        float r = __double2float_rn(EXPR); if (FTZ) r = flush(r); \
        return isnan(r) ? as_f(CANON_NAN) : r; }
REF(OP_EX2_FTZ, 1, exp2(d))
REF(OP_EX2, 0, exp2(d))
REF(OP_LG2_FTZ, 1, log2(d))
REF(OP_LG2, 0, log2(d))
REF(OP_RCP_FTZ, 1, 1.0 / d)
REF(OP_RCP, 0, 1.0 / d)
REF(OP_RSQRT_FTZ, 1, 1.0 / sqrt(d))
REF(OP_RSQRT, 0, 1.0 / sqrt(d))
REF(OP_SQRT_FTZ, 1, sqrt(d))
REF(OP_SQRT, 0, sqrt(d))
REF(OP_SIN_FTZ, 1, sin(d))
REF(OP_SIN, 0, sin(d))
REF(OP_COS_FTZ, 1, cos(d))
REF(OP_COS, 0, cos(d))
REF(OP_TANH, 0, tanh(d))

template <int OP> __device__ float model(float x);  // specialised by the verify build only

template <int OP, int MODE>  // MODE 0: correctly rounded reference; 1: candidate model
__device__ __forceinline__ float expected(float x) {
    if constexpr (MODE == 0) return ref_cr<OP>(x);
    else return model<OP>(x);
}

// ---- counters ----
__device__ __forceinline__ i64 ord(u32 u) { return (u >> 31) ? -(i64)(u & 0x7fffffffu) : (i64)u; }

// Bins: 0..32 ulp difference -16..16 (16 = bit-identical), 33 below -16, 34 above 16,
// 35 both NaN with equal bits, 36 both NaN with other bits, 37 only y NaN, 38 only the
// expectation NaN, 39 equal value but other bits (+0 against -0).
__device__ __forceinline__ int bin_of(u32 y, u32 r, i64* d_out) {
    const bool yn = is_nan_bits(y), rn = is_nan_bits(r);
    if (yn && rn) return y == r ? 35 : 36;
    if (yn) return 37;
    if (rn) return 38;
    const i64 d = ord(y) - ord(r);
    *d_out = d;
    if (d == 0) return y == r ? DCLIP : 39;
    if (d < -DCLIP) return 33;
    if (d > DCLIP) return 34;
    return (int)d + DCLIP;
}

// Adds 1 to s[key] for every lane whose key >= 0, one shared atomic per distinct key of the warp.
__device__ __forceinline__ void add_keyed(u32* s, int key) {
    const u32 peers = __match_any_sync(FULL_MASK, key);
    if (key >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&s[key], __popc(peers));
}

// The step u -> u + 1 inside a band flips mantissa bits 0..ctz(m + 1): key of a changed output.
__device__ __forceinline__ int change_key(u32 u, bool changed) {
    const u32 m = u & 0x7fffffu;
    return (changed && m != 0x7fffffu) ? __ffs(m + 1) - 1 : -1;
}

__device__ __forceinline__ int sat32(i64 d) { return (int)max((i64)I32_MIN, min((i64)I32_MAX, d)); }

struct BlockStats {
    u32 hist[NBINS];
    u32 chg[NCHG];
    int dmin, dmax;
    u32 first_bad;
};

__device__ void stats_init(BlockStats* s) {
    for (int i = threadIdx.x; i < NBINS; i += blockDim.x) s->hist[i] = 0;
    for (int i = threadIdx.x; i < NCHG; i += blockDim.x) s->chg[i] = 0;
    if (threadIdx.x == 0) { s->dmin = I32_MAX; s->dmax = I32_MIN; s->first_bad = 0xffffffffu; }
    __syncthreads();
}

__device__ void stats_flush(BlockStats* s, u32 band, u64* hist, u64* chg, int* dmin, int* dmax, u32* first_bad) {
    __syncthreads();
    for (int i = threadIdx.x; i < NBINS; i += blockDim.x)
        if (s->hist[i]) atomicAdd(&hist[band * NBINS + i], (u64)s->hist[i]);
    for (int i = threadIdx.x; i < NCHG; i += blockDim.x)
        if (s->chg[i]) atomicAdd(&chg[band * NCHG + i], (u64)s->chg[i]);
    if (threadIdx.x == 0) {
        atomicMin(&dmin[band], s->dmin);
        atomicMax(&dmax[band], s->dmax);
        atomicMin(&first_bad[band], s->first_bad);
    }
}

// Every input of blocks [block0, block0 + gridDim.x): y = hw(x) against the expectation, binned,
// plus where y changes between neighbouring inputs (which low input bits the unit ignores).
template <int OP, int MODE>
__device__ void sweep_body(u32 block0, u64* hist, u64* chg, int* dmin, int* dmax, u32* first_bad) {
    __shared__ BlockStats s;
    stats_init(&s);
    const u32 u0 = ((block0 + blockIdx.x) << BLOCK_SHIFT) + threadIdx.x * PER_THREAD;
    u32 prev = 0, first = 0xffffffffu;
    int lo = I32_MAX, hi = I32_MIN;
    for (int i = 0; i < PER_THREAD; ++i) {
        const u32 u = u0 + i;
        const u32 y = as_u(hw<OP>(as_f(u))), r = as_u(expected<OP, MODE>(as_f(u)));
        i64 d = 0;
        const int b = bin_of(y, r, &d);
        add_keyed(s.hist, b);
        if (b <= 34 || b == 39) { lo = min(lo, sat32(d)); hi = max(hi, sat32(d)); }
        if (b != DCLIP && b != 35) first = min(first, u);
        add_keyed(s.chg, i > 0 ? change_key(u - 1, prev != y) : -1);
        prev = y;
    }
    const u32 last = u0 + PER_THREAD - 1;
    add_keyed(s.chg, change_key(last, as_u(hw<OP>(as_f(last + 1))) != prev));
    lo = __reduce_min_sync(FULL_MASK, lo);
    hi = __reduce_max_sync(FULL_MASK, hi);
    first = __reduce_min_sync(FULL_MASK, first);
    if ((threadIdx.x & 31) == 0) { atomicMin(&s.dmin, lo); atomicMax(&s.dmax, hi); atomicMin(&s.first_bad, first); }
    stats_flush(&s, u0 >> 23, hist, chg, dmin, dmax, first_bad);
}

template <int OP, int MODE>
__device__ void eval_body(const u32* in, u32* hw_out, u32* exp_out, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = as_f(in[i]);
    hw_out[i] = as_u(hw<OP>(x));
    if (exp_out) exp_out[i] = as_u(expected<OP, MODE>(x));
}

// ---- structure hypotheses: a prediction of hw(x) from hw at another input (ok: it applies) ----
template <int OP> __device__ float predict(int h, float x, bool* ok) { *ok = false; return 0.0f; }

// ex2 h0: 2^(n + f) = 2^(n - 1) * 2^(1 + f) for |x| >= 1; h1..h3: |x| < 1 read on a 2^-23 grid
// (truncated, to nearest even, floored) and shifted by one into [1, 2) or [-2, -1).
template <> __device__ float predict<OP_EX2_FTZ>(int h, float x, bool* ok) {
    const float a = fabsf(x);
    if (h == 0) {
        if (!(a >= 1.0f && a < 128.0f)) { *ok = false; return 0.0f; }
        const float n = truncf(a), f = a - n;
        const int k = (int)n - 1;
        const float p = scalbnf(hw<OP_EX2_FTZ>(copysignf(1.0f + f, x)), x > 0 ? k : -k);
        *ok = is_normal(p);
        return p;
    }
    *ok = a >= TINY && a < 1.0f;
    const float t = x * 8388608.0f;  // exact
    const float q = (h == 1 ? truncf(t) : h == 2 ? rintf(t) : floorf(t)) * 1.1920928955078125e-7f;
    return q >= 0.0f ? hw<OP_EX2_FTZ>(1.0f + q) * 0.5f : hw<OP_EX2_FTZ>(q - 1.0f) * 2.0f;
}

// lg2 h0/h1: e + lg2(m) for x = 2^e * m, e != 0, the sum rounded to nearest / toward zero.
template <> __device__ float predict<OP_LG2_FTZ>(int h, float x, bool* ok) {
    const int e = ilogbf(x);
    *ok = h < 2 && x >= TINY && x < __int_as_float(0x7f800000) && e != 0;
    if (!*ok) return 0.0f;
    const float l = hw<OP_LG2_FTZ>(scalbnf(x, -e));
    return h == 0 ? __fadd_rn((float)e, l) : __fadd_rz((float)e, l);
}

// rcp h0: 1/(2^e m) = 2^-e / m with the sign outside; h1: odd symmetry.
template <> __device__ float predict<OP_RCP_FTZ>(int h, float x, bool* ok) {
    if (h == 1) { *ok = !isnan(x); return -hw<OP_RCP_FTZ>(-x); }
    if (h != 0 || !is_normal(x)) { *ok = false; return 0.0f; }
    const int e = ilogbf(x);
    const float p = copysignf(scalbnf(hw<OP_RCP_FTZ>(scalbnf(fabsf(x), -e)), -e), x);
    *ok = is_normal(p);
    return p;
}

// rsqrt / sqrt h0: x = 4^k * m4 with m4 in [1, 4).
template <int OP, int SIGN> __device__ float predict_quarter(int h, float x, bool* ok) {
    if (h != 0 || !(x >= TINY && x < __int_as_float(0x7f800000))) { *ok = false; return 0.0f; }
    const int k = ilogbf(x) >> 1;  // floor(e / 2)
    const float p = scalbnf(hw<OP>(scalbnf(x, -2 * k)), SIGN * k);
    *ok = is_normal(p);
    return p;
}
template <> __device__ float predict<OP_RSQRT_FTZ>(int h, float x, bool* ok) { return predict_quarter<OP_RSQRT_FTZ, -1>(h, x, ok); }
template <> __device__ float predict<OP_SQRT_FTZ>(int h, float x, bool* ok) { return predict_quarter<OP_SQRT_FTZ, 1>(h, x, ok); }

// sin, tanh: odd; cos: even (the FMUL.RZ by 1/2pi before MUFU is symmetric too).
template <int OP, int ODD> __device__ float predict_sym(int h, float x, bool* ok) {
    *ok = h == 0 && !isnan(x);
    return ODD ? -hw<OP>(-x) : hw<OP>(-x);
}
template <> __device__ float predict<OP_SIN_FTZ>(int h, float x, bool* ok) { return predict_sym<OP_SIN_FTZ, 1>(h, x, ok); }
template <> __device__ float predict<OP_SIN>(int h, float x, bool* ok) { return predict_sym<OP_SIN, 1>(h, x, ok); }
template <> __device__ float predict<OP_COS_FTZ>(int h, float x, bool* ok) { return predict_sym<OP_COS_FTZ, 0>(h, x, ok); }
template <> __device__ float predict<OP_COS>(int h, float x, bool* ok) { return predict_sym<OP_COS, 0>(h, x, ok); }
template <> __device__ float predict<OP_TANH>(int h, float x, bool* ok) { return predict_sym<OP_TANH, 1>(h, x, ok); }

// Non-ftz forms, h0: the SASS ptxas emits around the raw MUFU (= the ftz form), read off nvdisasm.
template <> __device__ float predict<OP_EX2>(int h, float x, bool* ok) {
    *ok = h == 0;
    if (x >= -126.0f || isnan(x)) return hw<OP_EX2_FTZ>(x);
    const float t = hw<OP_EX2_FTZ>(x * 0.5f);
    return __fmul_rn(t, t);
}
template <> __device__ float predict<OP_LG2>(int h, float x, bool* ok) {
    *ok = h == 0;
    if (!(fabsf(x) < TINY)) return hw<OP_LG2_FTZ>(x);
    return __fadd_rn(hw<OP_LG2_FTZ>(x * 16777216.0f), -24.0f);
}
template <> __device__ float predict<OP_RSQRT>(int h, float x, bool* ok) {
    *ok = h == 0;
    return fabsf(x) < TINY ? hw<OP_RSQRT_FTZ>(x * 16777216.0f) * 4096.0f : hw<OP_RSQRT_FTZ>(x);
}
template <> __device__ float predict<OP_SQRT>(int h, float x, bool* ok) {
    *ok = h == 0;
    return fabsf(x) < TINY ? hw<OP_SQRT_FTZ>(x * 16777216.0f) * 2.44140625e-4f : hw<OP_SQRT_FTZ>(x);
}
template <> __device__ float predict<OP_RCP>(int h, float x, bool* ok) {
    *ok = h == 0;
    float s = fabsf(x) < TINY ? 16777216.0f : 1.0f;
    s = fabsf(x) > 8.50705917e37f ? 0.25f : s;  // 2^126
    return s * hw<OP_RCP_FTZ>(x * s);
}

template <int OP>
__device__ void check_body(u32 block0, u64* mism, u64* appl, u32* first) {
    __shared__ u32 s_m[NHYP], s_a[NHYP], s_f[NHYP];
    if (threadIdx.x < NHYP) { s_m[threadIdx.x] = 0; s_a[threadIdx.x] = 0; s_f[threadIdx.x] = 0xffffffffu; }
    __syncthreads();
    const u32 u0 = ((block0 + blockIdx.x) << BLOCK_SHIFT) + threadIdx.x * PER_THREAD;
    for (int i = 0; i < PER_THREAD; ++i) {
        const u32 u = u0 + i;
        const u32 y = as_u(hw<OP>(as_f(u)));
        for (int h = 0; h < NHYP; ++h) {
            bool ok;
            const u32 p = as_u(predict<OP>(h, as_f(u), &ok));
            const bool bad = ok && p != y;
            const u32 n_ok = __popc(__ballot_sync(FULL_MASK, ok)), n_bad = __popc(__ballot_sync(FULL_MASK, bad));
            const u32 f = __reduce_min_sync(FULL_MASK, bad ? u : 0xffffffffu);
            if ((threadIdx.x & 31) == 0 && n_ok) { atomicAdd(&s_a[h], n_ok); atomicAdd(&s_m[h], n_bad); atomicMin(&s_f[h], f); }
        }
    }
    __syncthreads();
    const u32 band = u0 >> 23;
    if (threadIdx.x < NHYP && s_a[threadIdx.x]) {
        atomicAdd(&appl[band * NHYP + threadIdx.x], (u64)s_a[threadIdx.x]);
        atomicAdd(&mism[band * NHYP + threadIdx.x], (u64)s_m[threadIdx.x]);
        atomicMin(&first[band * NHYP + threadIdx.x], s_f[threadIdx.x]);
    }
}

#define SFU_KERNELS(NAME, OPID) \
    extern "C" __global__ void __launch_bounds__(256) sweep_##NAME(u32 b0, u64* h, u64* c, int* lo, int* hi, u32* f) { \
        sweep_body<OPID, 0>(b0, h, c, lo, hi, f); } \
    extern "C" __global__ void eval_##NAME(const u32* in, u32* y, u32* r, u32 n) { eval_body<OPID, 0>(in, y, r, n); } \
    extern "C" __global__ void __launch_bounds__(256) check_##NAME(u32 b0, u64* m, u64* a, u32* f) { check_body<OPID>(b0, m, a, f); }

// The op alone between a load and a store: what `sfu_probe.py sass` disassembles.
#define SFU_SASS(NAME, OPID) \
    extern "C" __global__ void sass_##NAME(const float* a, float* b) { b[threadIdx.x] = hw<OPID>(a[threadIdx.x]); }

#define SFU_VERIFY(NAME, OPID) \
    template <> __device__ float model<OPID>(float x) { return model_##NAME(x); } \
    extern "C" __global__ void __launch_bounds__(256) vsweep_##NAME(u32 b0, u64* h, u64* c, int* lo, int* hi, u32* f) { \
        sweep_body<OPID, 1>(b0, h, c, lo, hi, f); } \
    extern "C" __global__ void veval_##NAME(const u32* in, u32* y, u32* r, u32 n) { eval_body<OPID, 1>(in, y, r, n); }

// ---- 16-bit forms: all 2^16 scalar results, then every packed x2 input against them ----
#define SFU_HALF(NAME, PTX) \
    __device__ __forceinline__ unsigned short h1_##NAME(unsigned short a) { \
        unsigned short y; asm volatile(PTX " %0, %1;" : "=h"(y) : "h"(a)); return y; } \
    __device__ __forceinline__ u32 h2_##NAME(u32 a) { \
        u32 y; asm volatile(PTX "x2 %0, %1;" : "=r"(y) : "r"(a)); return y; } \
    extern "C" __global__ void half_all_##NAME(unsigned short* out) { \
        const u32 i = blockIdx.x * blockDim.x + threadIdx.x; if (i < 65536u) out[i] = h1_##NAME((unsigned short)i); } \
    extern "C" __global__ void __launch_bounds__(256) half_x2_##NAME(const unsigned short* t, u64* mism, u32* first) { \
        const u32 u0 = (blockIdx.x << BLOCK_SHIFT) + threadIdx.x * PER_THREAD; u32 bad = 0, f = 0xffffffffu; \
        for (int i = 0; i < PER_THREAD; ++i) { const u32 w = u0 + i; \
            const u32 e = (u32)t[w & 0xffffu] | ((u32)t[w >> 16] << 16); \
            if (h2_##NAME(w) != e) { ++bad; f = min(f, w); } } \
        bad = __reduce_add_sync(FULL_MASK, bad); f = __reduce_min_sync(FULL_MASK, f); \
        if ((threadIdx.x & 31) == 0 && bad) { atomicAdd(mism, (u64)bad); atomicMin(first, f); } }
