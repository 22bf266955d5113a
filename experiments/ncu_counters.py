"""Nsight Compute counters of a few forward launches, gathered into one JSON file: the seed kernel,
two edits of fa2_fwd.cu that keep a loop rolled (local memory), the m64n64d64w4 config in its
three shared-memory layouts (bank conflicts) and the seed with softcap 30, all at (4, 16, 2048, 64)
non-causal.

    python experiments/ncu_counters.py --out OUT      # on a GPU with ncu: OUT/ncu_layouts_edits.json

Each launch is `fa hw` under `ncu --metrics METRICS --csv -k regex:fa2_fwd -c 1` (one profiled
kernel launch per process). METRICS: time, registers, warps active, local-memory requests and
sectors with their L1 hit rates, L2 sectors from the L1, DRAM bytes, shared-memory wavefronts and
bank conflicts, instructions, SM cycles, issue activity, the xu / fma / alu / tensor pipes' instruction
rates against their peaks, the shared-memory data pipe's load and the stall reasons per issued instruction
(smsp__average_warps_issue_stalled_*_per_issue_active). The JSON maps each launch's name to
{metric: value} (numbers as Nsight Compute prints them, thousands separators removed), beside the
GPU's name and this command.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDITS = ROOT / "experiments" / "variants" / "edits"
SHAPE = ["--batch", "4", "--heads", "16", "--seqlen", "2048", "--head-dim", "64"]
M64 = ["--block-m", "64", "--block-n", "64", "--warps", "4"]
LAUNCHES = {
    "seed": [],
    "edit qk_rolled (seed config)": ["--kernel", str(EDITS / "qk_rolled.patch")],
    "edit pv_rolled (seed config)": ["--kernel", str(EDITS / "pv_rolled.patch")],
    "m64n64d64w4-swizzled": M64 + ["--smem", "swizzled"],
    "m64n64d64w4-padded": M64 + ["--smem", "padded"],
    "m64n64d64w4-plain": M64 + ["--smem", "plain"],
    # issue 38's softcap (docs/timing.md, "Features"): the model takes it 13 % fast on this shape; its pipe
    # utilisations and stall reasons beside the seed's say where the GPU spends the extra MUFU time
    "softcap30 (seed config)": ["--softcap", "30"],
}
STALLS = ("long_scoreboard", "short_scoreboard", "lg_throttle", "mio_throttle", "barrier", "wait",
          "math_pipe_throttle", "not_selected", "selected", "dispatch_stall", "no_instruction")
METRICS = (
    "gpu__time_duration.sum", "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct",
    "l1tex__t_sector_pipe_lsu_mem_local_op_st_hit_rate.pct", "lts__t_sectors_srcunit_tex.sum",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "smsp__inst_executed.sum", "smsp__cycles_active.avg",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
) + tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALLS)


def parse(text: str) -> dict[str, float]:
    """Nsight Compute's --csv output (one kernel) -> {metric: value}."""
    rows = [r for r in csv.reader(io.StringIO(text)) if len(r) > 10]
    if not rows or "Metric Name" not in rows[0]:
        raise ValueError("no Nsight Compute metric table in the output (did ncu profile a kernel?)")
    name, value = rows[0].index("Metric Name"), rows[0].index("Metric Value")
    return {r[name]: float(r[value].replace(",", "")) for r in rows[1:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for ncu_layouts_edits.json")
    args = p.parse_args(argv)
    if shutil.which("ncu") is None:
        print("ncu_counters: Nsight Compute's ncu is not on PATH (it needs a GPU machine with ncu)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout.splitlines()[0].strip()
    launches = {}
    for name, extra in LAUNCHES.items():
        cmd = ["ncu", "--metrics", ",".join(METRICS), "--csv", "-k", "regex:fa2_fwd", "-c", "1",
               sys.executable, "-m", "fa_sim.cli", "hw", *SHAPE, *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            print(f"ncu_counters: {name}: ncu exited {res.returncode}: {res.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        launches[name] = parse(res.stdout)
        print(f"{name:32s} {launches[name]['gpu__time_duration.sum'] / 1e3:9.1f} us")
    out = {"gpu": gpu, "tool": "python experiments/ncu_counters.py --out OUT (ncu --metrics ... --csv -k "
           "regex:fa2_fwd -c 1 python -m fa_sim.cli hw ...)", "shape": [4, 16, 2048, 2048, 64], "causal": False,
           "launches": launches}
    (args.out / "ncu_layouts_edits.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out / 'ncu_layouts_edits.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
