"""How Nsight Compute counts the shared-memory wavefronts of cp.async.cg (LDGSTS.E.BYPASS.128).

The cross-check found the simulator's bank-rule wavefronts for LDGSTS equal to ncu's for the
swizzled and plain layouts but not for the padded one (ncu: 10.5 per instruction, the rule: 4).
This probe launches one warp per pattern, each lane copying 16 bytes to a chosen shared-memory
offset, and reads ncu's counters per launch, so the rule can be read off.

On the GPU:  python -m fa_sim.calibrate.ldgsts_probe profile --out DIR   (runs itself under ncu)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = r"""
extern "C" __global__ void ldgsts_probe(const unsigned* src, const int* offsets, unsigned* sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int lane = threadIdx.x;
    const int off = offsets[lane];
    if (off < 0) return;  // inactive lanes leave: the copy below is unguarded for the rest
    unsigned base;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(base) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(base + off), "l"(src + 4 * lane));
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    sink[lane] = *(const unsigned*)(smem + off);
}
"""

MODULE = "fa_sim.calibrate.ldgsts_probe"  # what ncu launches (this file, by module name)
METRICS = ("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum",
           "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts_cache_bypass.sum",
           "smsp__inst_executed_op_ldgsts.sum",
           "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum",
           "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum")


def rows(pitch: int, row0: int, lanes_per_row: int, n_lanes: int = 32) -> list[int]:
    return [(row0 + l // lanes_per_row) * pitch + 16 * (l % lanes_per_row) if l < n_lanes else -1 for l in range(32)]


def patterns() -> dict[str, list[int]]:
    p = {"contiguous 512B": [16 * l for l in range(32)],
         "contiguous from +16B": [16 + 16 * l for l in range(32)],
         "contiguous from +64B": [64 + 16 * l for l in range(32)],
         "reversed 512B": [16 * (31 - l) for l in range(32)],
         "pairs on one chunk": [16 * (l // 2) for l in range(32)],
         "stride 128B (8 lanes)": [128 * l if l < 8 else -1 for l in range(32)],
         "stride 128B (32 lanes)": [128 * l for l in range(32)],
         "stride 32B": [32 * l for l in range(32)]}
    for r0 in range(8):
        p[f"pitch 144, rows {r0}..{r0 + 3} (padded d=64)"] = rows(144, r0, 8)
    for k in range(8):
        p[f"one 128B row at +{16 * k}B"] = [16 * k + 16 * l if l < 8 else -1 for l in range(32)]
        p[f"one 128B row at +{16 * k}B, 4 lanes"] = [16 * k + 16 * l if l < 4 else -1 for l in range(32)]
    p["pitch 80, rows 0..7 (padded d=32)"] = rows(80, 0, 4)
    p["pitch 272, rows 0..1 (padded d=128)"] = rows(272, 0, 16)
    p["pitch 256, rows 0..1 (plain d=128)"] = rows(256, 0, 16)
    return p


def run() -> None:
    import cupy as cp
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    kernel = Program(SRC, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin").get_kernel("ldgsts_probe")
    src = cp.arange(32 * 4, dtype=cp.uint32)
    sink = cp.zeros(32, dtype=cp.uint32)
    for offs in patterns().values():
        o = cp.asarray(np.asarray(offs, np.int32))
        launch(stream, LaunchConfig(grid=1, block=32, shmem_size=8192), kernel, src.data.ptr, o.data.ptr, sink.data.ptr)
    stream.sync()


def profile(out: Path) -> None:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--csv", "--page", "raw", "--metrics", ",".join(METRICS), "--kernel-name", "ldgsts_probe",
           sys.executable, "-m", MODULE, "run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = proc.stdout
    table = [r for r in csv.reader(io.StringIO(text[text.find('"ID"'):])) if r]
    head, data = table[0], table[2:]
    names = list(patterns())
    result = {}
    for name, row in zip(names, data):
        vals = dict(zip(head, row))
        result[name] = {m: float(vals[m].replace(",", "")) for m in METRICS if m in vals}
    out.mkdir(parents=True, exist_ok=True)
    (out / "ldgsts_probe.json").write_text(json.dumps({"patterns": patterns(), "ncu": result}, indent=1))
    for name in names:
        r = result.get(name, {})
        print(f"{name:<42} " + " ".join(f"{r.get(m, float('nan')):>6.0f}" for m in METRICS))
    if proc.returncode:
        print(proc.stderr[-2000:])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["run", "profile"])
    ap.add_argument("--out", type=Path, default=Path("experiments/out"))
    a = ap.parse_args()
    run() if a.cmd == "run" else profile(a.out)
