"""Microbenchmarks of the SM units the timing model (fa_sim.timing) parameterises, on the GPU and in
the model, side by side.

    python -m fa_sim.calibrate.timing_microbench --measure --out DIR   # on the GPU: timing_microbench.json
    python -m fa_sim.calibrate.timing_microbench                       # the model against the recording

Each benchmark is a straight-line CUDA kernel (its block written out, no loop) that reads the SM clock
(clock64) before and after a block of one kind of instruction, in 4 warps of one CTA on one SM
(one warp per sub-partition) or 16 (four each): the tensor pipe's rate (independent HMMA.16816),
MUFU.EX2's rate and latency (independent chains; one dependent chain), the fma pipe's rate, the
shared-memory pipe's rate (conflict-free ldmatrix.x4, every warp) and an 8-way-conflicted one;
MUFU.RCP's latency and div.rn.f32's (the softcap's tanh: MUFU.RCP, FCHK, FFMAs, a branch around
the slow path) dependent chain and rate, which tests/data/h200/timing_microbench.json does not hold
(tests/data/h100/timing_microbench_h100.json does; each step is (x + 1) / d, never a zero numerator: a
first recording's x / d divided lane 0's zero in chain 0, which takes div.rn's slow path on the GPU); and for the softcap's error (docs/timing.md, "Features"), recorded on the H100
(tests/data/h100/timing_microbench_h100.json): MUFU.RCP's rate, MUFU.EX2's with four warps per
sub-partition, the softcap's tanh chain (MUFU.EX2, FADD, MUFU.RCP, FFMA) alone, beside HMMAs and MUFU.EX2
beside ldmatrix (tests/test_timing_model.py holds each one's SASS mix and the model to the H100's cycles).
--measure records the cycles between the two clock reads of every warp; a benchmark's time is its
slowest warp's (median over 20 launches: the block is done when every warp is).
The model runs the same cubin's SASS (NVRTC for sm_90, decoded by fa_sim.timing.sass) on its SM
and takes the cycles between the same two instructions' issue; tests/test_timing_model.py holds
the model to the recording (tests/data/h200/timing_microbench.json).

The issue-policy probes (POLICY) run one CTA of 4 k warps (k = 2, 3, 4 per sub-partition), every
warp the same block of FFMAs, and record each warp's two clock reads themselves (the SM's clock),
relative to the CTA's first read: with 8 independent chains one warp can issue every cycle, so a
greedy scheduler finishes its warps one after another (staggered by a warp's block) while a
round-robin one finishes them together; with one dependent chain (latency-bound) both interleave.
`--measure --policy-only` records only these (the "policy" key of the recording).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "h200" / "timing_microbench.json"
HEAD = r"""
extern "C" __global__ void bench(unsigned long long* cycles, float* sink) {
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __shared__ __align__(16) unsigned short smem[8192];
  for (int i = threadIdx.x; i < 8192; i += blockDim.x) smem[i] = (unsigned short)i;
  __syncthreads();
  float f0 = lane * 0.001f, f1 = f0 + 1, f2 = f0 + 2, f3 = f0 + 3, f4 = f0 + 4, f5 = f0 + 5, f6 = f0 + 6,
        f7 = f0 + 7;
  unsigned r0 = lane, r1 = lane * 3, r2 = lane * 5, r3 = lane * 7, b0 = lane * 11, b1 = lane * 13;
  float c[4][4] = {};
  unsigned addr = (unsigned)__cvta_generic_to_shared(smem) + ADDRESS;
  unsigned long long t0 = clock64();
BODY
  unsigned long long t1 = clock64();
  if (lane == 0) cycles[blockIdx.x * 32 + warp] = t1 - t0;
  float s = 0;
  for (int j = 0; j < 4; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  sink[threadIdx.x] = f0 + f1 + f2 + f3 + f4 + f5 + f6 + f7 + s + r0 + r1;
}
"""
MMA = ('    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, '
       '{%0,%1,%2,%3};" : "+f"(c[J][0]), "+f"(c[J][1]), "+f"(c[J][2]), "+f"(c[J][3]) : "r"(r0), "r"(r1), "r"(r2), '
       '"r"(r3), "r"(b0 + J), "r"(b1));')
EX2 = '    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(fJ));'
FMA = '    asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(fJ));'
# rcp then an add (ptxas folds rcp(rcp(x)) into x): the chain's step is MUFU.RCP's latency plus FADD's
RCP = '    asm volatile("rcp.approx.ftz.f32 %0, %0;\\n\\tadd.ftz.f32 %0, %0, 0f3FC00000;" : "+f"(fJ));'
# div.rn.f32 as the softcap's tanh divides (fa2_fwd.cu tanh_ex2): MUFU.RCP, FCHK, five FFMAs and a branch
# around the slow path, which these operands never take: each step is (x + 1) / d with d in [1.5, 1.54), so x
# stays in [0.65, 8.5) (a zero numerator takes the slow path: the first recording's chain 0 divided lane 0's 0)
DIV = ('    asm volatile("add.f32 %0, %0, 0f3F800000;\\n\\tdiv.rn.f32 %0, %0, %1;" : "+f"(fJ) : "f"(f0 + 1.5f));')
LDSM = ('    { unsigned x0, x1, x2, x3; asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" '
        ': "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(addr + STEP * I)); r0 ^= x0 ^ x1 ^ x2 ^ x3; }')
# the softcap's tanh as fa2_fwd.cu computes it per score (tanh_ex2 after the fmul): MUFU.EX2, FADD, MUFU.RCP,
# FFMA; the chain stays in (-1, 1)
TANH = ('    asm volatile("mul.f32 %0, %0, 0f3E000000;\\n\\tex2.approx.ftz.f32 %0, %0;\\n\\tadd.f32 %0, %0, 0f3F800000;'
        '\\n\\trcp.approx.ftz.f32 %0, %0;\\n\\tfma.rn.f32 %0, %0, 0fC0000000, 0f3F800000;" : "+f"(fJ));')
# an ldmatrix per chain and repeat, each at its own address (STEP apart)
LDSM_J = LDSM.replace("STEP * I", "STEP * (8 * I + J)")

# name: (statement, chains J, repeats I, warps, the address each lane gives ldmatrix, its step per repeat);
# every ldmatrix reads other addresses (ptxas merges loads of one address); rows 16 bytes apart are
# conflict-free, rows 128 bytes apart put a phase's 8 rows in the same banks (8-way)
BENCHES = {
    "hmma_rate": (MMA, 4, 32, 4, "0", 0),
    "ex2_rate": (EX2, 8, 32, 4, "0", 0),
    "ex2_latency": (EX2, 1, 128, 4, "0", 0),
    "ffma_rate": (FMA, 8, 64, 4, "0", 0),
    # issue 37's softcap and backward timing (recorded on the H100): MUFU.RCP's latency, div.rn's chain and rate
    "rcp_latency": (RCP, 1, 128, 4, "0", 0),
    "div_latency": (DIV, 1, 32, 4, "0", 0),
    "div_rate": (DIV, 8, 8, 16, "0", 0),
    # the softcap's MUFU load (issue 38): MUFU.RCP's rate (as ex2_rate), MUFU.EX2's rate with four warps per
    # sub-partition sharing its XU, the softcap's tanh chain in 16 warps alone, beside two HMMAs per tanh
    # (do the XU and the tensor pipe overlap?) and two MUFU.EX2 beside an ldmatrix.x4 (do MUFU and
    # shared-memory loads queue behind each other in the MIO?); recorded on the H100
    "rcp_rate": (RCP, 8, 32, 4, "0", 0),
    "ex2_rate_16w": (EX2, 8, 8, 16, "0", 0),
    "tanh_rate_16w": (TANH, 8, 8, 16, "0", 0),
    "tanh_hmma_16w": (TANH + "\n" + MMA + "\n" + MMA, 4, 16, 16, "0", 0),
    "ex2_ldsm_16w": (EX2 + "\n" + EX2 + "\n" + LDSM_J, 4, 8, 16, "(lane * 16) % 512", 256),
    "ldsm_rate": (LDSM, 1, 63, 16, "(lane * 16) % 512", 256),
    "ldsm_8way": (LDSM, 1, 32, 16, "(lane * 128) % 4096", 16),
}


# name: (chains, repeats, warps); every warp runs chains x repeats FFMAs
POLICY = {f"{kind}_{w}w": (chains, repeat, w) for w in (8, 12, 16)
          for kind, chains, repeat in (("ffma_indep", 8, 48), ("ffma_dep", 1, 192))}


def source(name: str) -> str:
    if name in POLICY:
        chains, repeat, _ = POLICY[name]
        body = "\n".join(FMA.replace("J", str(j)) for _ in range(repeat) for j in range(chains))
        head = HEAD.replace("if (lane == 0) cycles[blockIdx.x * 32 + warp] = t1 - t0;",
                            "if (lane == 0) { cycles[2 * warp] = t0; cycles[2 * warp + 1] = t1; }")
        return head.replace("BODY", body).replace("ADDRESS", "0")
    stmt, chains, repeat, _, address, step = BENCHES[name]
    body = "\n".join(stmt.replace("J", str(j)).replace("STEP", str(step)).replace("I", str(i))
                     for i in range(repeat) for j in range(chains))  # written out: straight-line SASS
    return HEAD.replace("BODY", body).replace("ADDRESS", address)


def _policy_rows(dev, stream, arch) -> dict:
    """Per policy probe: each warp's (start, end) clock relative to the CTA's first start, medians
    over 20 launches (after one warm-up)."""
    import numpy as np
    from cuda.bindings import driver
    from cuda.core import LaunchConfig, ObjectCode, launch

    from ..contract.nvrtc import compile_cubin

    rows = {}
    for name, (_, _, warps) in POLICY.items():
        cubin, _ = compile_cubin(source(name), name=f"{name}.cu", arch=arch)
        kernel = ObjectCode.from_cubin(cubin).get_kernel("bench")
        cycles = dev.allocate(8 * 2 * warps, stream=stream)
        sink = dev.allocate(4 * 32 * warps, stream=stream)
        runs = []
        for _ in range(21):
            launch(stream, LaunchConfig(grid=1, block=32 * warps), kernel, cycles.handle, sink.handle)
            stream.sync()
            host = np.empty(2 * warps, np.uint64)
            driver.cuMemcpyDtoH(host.ctypes.data, int(cycles.handle), host.nbytes)
            rel = host.astype(np.int64) - int(host[0::2].min())
            runs.append(rel.reshape(warps, 2).tolist())
        med = np.median(np.array(runs[1:], float), axis=0)
        rows[name] = {"warps": warps, "start": med[:, 0].tolist(), "end": med[:, 1].tolist(), "runs": runs[1:]}
        print(name, "end", med[:, 1].round().astype(int).tolist(), flush=True)
    return rows


def measure(out: Path, policy_only: bool = False) -> None:
    import numpy as np
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from ..contract.nvrtc import compile_cubin

    dev = Device()
    dev.set_current()
    arch = f"sm_{''.join(map(str, dev.compute_capability))}"
    stream = dev.create_stream()
    rows = {}
    policy = _policy_rows(dev, stream, arch)
    for name, (_, _, _, warps, _, _) in ({} if policy_only else BENCHES).items():
        cubin, _ = compile_cubin(source(name), name=f"{name}.cu", arch=arch)
        kernel = ObjectCode.from_cubin(cubin).get_kernel("bench")
        cycles = dev.allocate(8 * 32, stream=stream)
        sink = dev.allocate(4 * 32 * warps, stream=stream)
        per_launch = []
        for _ in range(21):
            launch(stream, LaunchConfig(grid=1, block=32 * warps), kernel, cycles.handle, sink.handle)
            stream.sync()
            host = np.empty(32, np.uint64)
            from cuda.bindings import driver
            driver.cuMemcpyDtoH(host.ctypes.data, int(cycles.handle), host.nbytes)
            per_launch.append(host[:warps].astype(float).tolist())
        block = [max(w) for w in per_launch[1:]]  # the block of every warp: its slowest warp
        rows[name] = {"warps": warps, "cycles": statistics.median(block), "per_warp": per_launch[1:]}
        print(name, rows[name]["cycles"], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    record = {"gpu": dev.name, "arch": arch, "rows": rows, "policy": policy}
    (out / "timing_microbench.json").write_text(json.dumps(record, indent=1))


def _model_clocks(name: str, gpu) -> dict:
    """Per warp of the model's run of `name`'s SASS: the issue cycles of its two clock reads."""
    from ..contract.nvrtc import compile_cubin
    from ..contract.sass import disassemble
    from ..timing.program import step
    from ..timing.sass import parse
    from ..timing.sm import run_sm

    warps = POLICY[name][2] if name in POLICY else BENCHES[name][3]
    cubin, _ = compile_cubin(source(name), name=f"{name}.cu", arch=gpu.arch)
    instrs = [i for i in parse(disassemble(cubin, encodings=True)) if i.guard != "@!PT"]
    end = next(n for n, i in enumerate(instrs) if i.opcode == "EXIT") + 1
    wavefronts = {"LDSM": 32 if name == "ldsm_8way" else 4}
    stream = [step(i.opcode, i.operands, i.guard, i.control, gpu, wavefronts) for i in instrs[:end]]
    clocks = [n for n, i in enumerate(instrs[:end]) if i.opcode.startswith("CS2R") and "SR_CLOCK" in i.operands]
    issued: list = []
    run_sm([stream], warps, gpu, account=False, timeline=issued)
    at: dict = {}
    for t, _, warp, _, _, _ in issued:
        at.setdefault(warp, []).append(t)
    return {w: (at[w][clocks[0]], at[w][clocks[1]]) for w in sorted(at)}


def model_cycles(name: str, gpu=None) -> float:
    """The model's cycles between the two clock reads of the slowest warp, on the same SASS."""
    from ..timing import GPUS

    return float(max(b - a for a, b in _model_clocks(name, gpu or GPUS["h200"]).values()))


def model_policy(name: str, gpu=None) -> tuple[list[float], list[float]]:
    """A policy probe in the model: each warp's (start, end) clock read, relative to the first start."""
    from ..timing import GPUS

    clocks = _model_clocks(name, gpu or GPUS["h200"])
    first = min(a for a, _ in clocks.values())
    return [a - first for a, _ in clocks.values()], [b - first for _, b in clocks.values()]


def report() -> str:
    rec = json.loads(DATA.read_text())["rows"]
    lines = ["| benchmark | warps | H200 cycles | model cycles | model / H200 |", "|---|---|---|---|---|"]
    for name, r in rec.items():
        m = model_cycles(name)
        lines.append(f"| {name} | {r['warps']} | {r['cycles']:.0f} | {m:.0f} | {m / r['cycles']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--policy-only", action="store_true", help="with --measure: only the issue-policy probes")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    args = ap.parse_args(argv)
    if args.measure:
        measure(args.out, args.policy_only)
    else:
        print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
