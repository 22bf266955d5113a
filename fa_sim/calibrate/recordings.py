"""Every recorded file under tests/data and traces/golden, the command that regenerates it, and
the comparison of a regenerated file with the committed one.

    python -m fa_sim.calibrate.recordings list           (file, GPU or not, command)
    python -m fa_sim.calibrate.recordings commands --out OUT --work W   (the GPU commands, for the device)
    python -m fa_sim.calibrate.recordings compare DIR    (each file of DIR against the committed one)

tests/data/README.md is this table in prose; experiments/device_regenerate.sh runs the GPU
commands on the device and then `compare`. A regenerated file equals the committed one when
every array (or JSON value) the committed file holds is equal in the new one; provenance text
(`source`, `origin`, the kernel source a saved run carries) is reported, not compared, and a
saved run of an older format is compared field by field through crosscheck.SavedRun.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # a checkout of the repository
H200 = "tests/data/h200"
H100 = "tests/data/h100"  # recordings an H100 made (the device lent then); sm_90 as the H200


class Kind(enum.Enum):
    """How a regenerated file is compared with the committed one."""
    ARRAYS = "arrays"          # every array of the committed .npz, equal (provenance text reported)
    ALU = "alu"                # alu_probe.npz: the committed forms, a prefix of today's
    SAVED_RUN = "saved run"    # fa compare --save: inputs, config, outputs, checkpoints
    JSON = "json"              # equal JSON values
    TEXT = "text"              # equal bytes
    TIMES = "times"            # measured times: the same cases, each within TIME_TOLERANCE (timing_*.json)
    SIGNS = "signs"            # paired speedups: the same pairs, the same sign where both files' passes agree
    SPANS = "spans"            # per-CTA traces: the same cases, each grid's span within SPAN_TOLERANCE


@dataclass(frozen=True)
class Recording:
    path: str           # relative to the repository root
    gpu: bool           # the command needs an NVIDIA GPU (the H200 for the committed values)
    command: str        # OUT: the directory the regenerated files go to
    records: str
    kind: Kind
    seconds: int = 0    # the device script's time limit for the command (about 3x its time on the H200)


def _compare(args: str, name: str) -> str:
    return f"python -m fa_sim.cli compare {args} --save OUT/{name} --force"


RECORDINGS = (
    Recording(f"{H200}/alu_probe.npz", True, "python -m fa_sim.calibrate.alu_probe run --out OUT",
              "4096 inputs of each ALU/MUFU probe form and the GPU's outputs", Kind.ALU, 180),
    Recording(f"{H200}/mma_probe_192.npz", True,
              "python -m fa_sim.calibrate.mma_probe run --tiles 8192 --out W && python -m fa_sim.calibrate.mma_probe "
              "excerpt W/mma_probe.npz --tiles 0:64,4096:4224 --out OUT/mma_probe_192.npz",
              "192 m16n8k16 MMAs (64 with C = 0): A, B, C and the tensor core's D", Kind.ARRAYS, 120),
    Recording(f"{H200}/ldgsts_probe.json", True, "python -m fa_sim.calibrate.ldgsts_probe profile --out OUT",
              "Nsight Compute's LDGSTS wavefront counters per cp.async shared-memory pattern (needs ncu)", Kind.JSON, 150),
    Recording(f"{H200}/compare_seed_n128.npz", True,
              _compare("--seqlen 128 --heads 1 --softmax ffma", "compare_seed_n128.npz"),
              "a saved GPU run (seed config, FFMA softmax): inputs, O, LSE, checkpoints of CTAs 0 and 1",
              Kind.SAVED_RUN, 120),
    Recording(f"{H200}/compare_causal_tails.npz", True,
              _compare("--causal --seqlen 200 --seqlen-k 333 --heads 2 --softmax ffma", "compare_causal_tails.npz"),
              "a saved causal GPU run with partial tiles (FFMA softmax), CTAs 0 and 7", Kind.SAVED_RUN, 120),
    Recording(f"{H200}/compare_causal_s200_k333.npz", True,
              _compare("--causal --seqlen 200 --seqlen-k 333 --heads 2", "compare_causal_s200_k333.npz"),
              "the README's saved causal GPU run (default softmax), CTAs 0 and 7", Kind.SAVED_RUN, 120),
    Recording(f"{H200}/compare_variant_swizzle_r4.npz", True,
              _compare("--kernel experiments/variants/fa2_fwd_swizzle_r4.patch --seqlen 256 --heads 2",
                       "compare_variant_swizzle_r4.npz"),
              "a saved GPU run of the swizzle variant, with the source the GPU compiled", Kind.SAVED_RUN, 180),
    Recording(f"{H200}/mufu_replay.npz", True,
              "python -m fa_sim.calibrate.sfu_probe run --out W/sfu && python -m fa_sim.calibrate.sfu_fit replay "
              "W/sfu --out OUT/mufu_replay.npz",
              "MUFU outputs: every edge-case sample of run 1 and 1536 random points per dumped band, per op",
              Kind.ARRAYS, 300),
    Recording(f"{H200}/mufu_binding.npz", True, "python -m fa_sim.calibrate.sfu_binding record --out OUT/mufu_binding.npz",
              "MUFU outputs at the inputs that bind each table coefficient (the committed file may be the "
              "model's stand-in, origin 'model', until the H200 recording replaces it)", Kind.ARRAYS, 180),
    Recording(f"{H200}/timing_cases.json", True, "python experiments/timing_measure.py --out OUT",
              "the timing model's cases: kernel times (CUDA events, medians of 3 batches) of 252 launches",
              Kind.TIMES, 240),
    Recording(f"{H200}/timing_pairs.json", True, "python experiments/timing_measure.py --pairs --out OUT",
              "each option timed beside its base config on the same inputs, interleaved (the option signs)",
              Kind.SIGNS, 240),
    Recording(f"{H200}/timing_dispatch.npz", True, "python experiments/timing_dispatch.py --measure --out OUT",
              "each CTA's SM, start and end on the GPU (the trace variant) in 24 causal grids, heavy_first and not",
              Kind.SPANS, 150),
    Recording(f"{H200}/timing_rounds.npz", True,
              "python experiments/timing_dispatch.py --measure --rounds --launches 1 --out OUT",
              "the same with each K/V round's start (the round-trace variant), the 8 grids of one CTA per SM",
              Kind.SPANS, 120),
    Recording(f"{H200}/timing_occupancy.json", True, "python experiments/timing_occupancy.py --measure --out OUT",
              "kernel times of 6 cases at each occupancy from one CTA per SM to their own (dynamic shared memory "
              "padded, the driver's occupancy checked)", Kind.TIMES, 90),
    Recording(f"{H200}/timing_kernels.json", True,
              "python experiments/timing_kernels.py --measure --out OUT/timing_kernels.json",
              "three kernels that are not attention (GEMM, reduction, copy) at two sizes: kernel times",
              Kind.TIMES, 150),
    Recording(f"{H200}/timing_edits.json", True, "python experiments/timing_edits.py --measure --out OUT/timing_edits.json",
              "the seed kernel and fifteen edits of fa2_fwd.cu at two shapes: kernel times", Kind.TIMES, 180),
    Recording(f"{H100}/bwd_checkpoints_70x90_d64.npz", True,
              "python experiments/record_backward_checkpoints.py --out OUT --force",
              "the backward's checkpoint buffer (every CTA, deterministic dQ), inputs and gradients: 70 x 90, d = 64",
              Kind.ARRAYS, 90),
    Recording(f"{H100}/bwd_checkpoints_70x90_d64_causal.npz", True,
              "python experiments/record_backward_checkpoints.py --out OUT --force",
              "the same, causal", Kind.ARRAYS, 90),
    Recording(f"{H100}/compare_gqa_window.npz", True,
              _compare("--heads 4 --heads-k 2 --seqlen 200 --seqlen-k 333 --window 60,20", "compare_gqa_window.npz"),
              "a saved GPU run of GQA (2 K/V heads for 4) with a window (60, 20), partial tiles, CTAs 0 and 15",
              Kind.SAVED_RUN, 120),
    Recording(f"{H100}/compare_bf16_softcap_causal.npz", True,
              _compare("--heads 2 --seqlen 333 --causal --softcap 15 --dtype bf16", "compare_bf16_softcap_causal.npz"),
              "a saved causal bf16 GPU run with softcap 15 and a partial tile, CTAs 0 and 11", Kind.SAVED_RUN, 120),
    Recording(f"{H100}/compare_d256_causal.npz", True,
              _compare("--heads 2 --seqlen 150 --causal --head-dim 256", "compare_d256_causal.npz"),
              "a saved causal GPU run at head_dim 256 with a partial tile, CTAs 0 and 5", Kind.SAVED_RUN, 150),
    Recording(f"{H100}/compare_packed.npz", True,
              _compare("--seqlens 70,130,5 --heads 4 --heads-k 2 --causal --head-dim 64 --ctas 0,17,33",
                       "compare_packed.npz"),
              "a saved causal GPU run of a packed batch (lengths 70, 130, 5; GQA 2 K/V heads for 4; d = 64; format 5 "
              "with the offsets), CTAs 0, 17 (a tail Q block) and 33 (the last that runs)", Kind.SAVED_RUN, 120),
    Recording(f"{H100}/compare_splitkv.npz", True,
              _compare("--batch 2 --heads 4 --heads-k 1 --seqlen 2 --seqlen-k 300 --cache-seqlens 300,70 --head-dim 64 "
                       "--splits 3 --ctas 0,1,4,5", "compare_splitkv.npz"),
              "a saved GPU run of split-KV decoding (3 splits, MQA packed, cache lengths 300 and 70; format 5 with "
              "the workspace), CTAs 0, 1, 4 (1 and 4 with a partial tile) and 5 (an empty split)", Kind.SAVED_RUN, 120),
    Recording(f"{H100}/timing_features.json", True,
              "python experiments/timing_features.py --measure --out OUT/timing_features.json",
              "the forward features (bf16, GQA, MQA, softcap, windows, all at once) beside the plain config at three "
              "shapes: kernel times", Kind.TIMES, 240),
    Recording(f"{H100}/timing_backward.json", True,
              "python experiments/timing_backward.py --measure --out OUT/timing_backward.json",
              "the backward's three kernels at three shapes, causal and not, both dQ modes: kernel times",
              Kind.TIMES, 150),
    Recording(f"{H200}/timing_pingpong.json", True,
              "python experiments/timing_pingpong.py --measure --out OUT/timing_pingpong.json",
              "four 8-warp configs with and without pingpong at three shapes: kernel times", Kind.TIMES, 120),
    Recording(f"{H200}/timing_small.json", True, "python experiments/timing_measure.py --small --out OUT",
              "the timing model's 42 small launches (one CTA to two waves): kernel times, for the launch latency",
              Kind.TIMES, 120),
    Recording(f"{H200}/timing_ncu_small.json", True,
              "ncu --csv --page raw -k regex:fa2_fwd_kernel --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,"
              "sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,smsp__cycles_active.avg "
              "python experiments/timing_measure.py --profile --small > W/ncu_small.csv && "
              "python experiments/timing_measure.py --ncu-csv W/ncu_small.csv --ncu-name timing_ncu_small.json --out OUT",
              "Nsight Compute on the 42 small launches: instructions executed (query tails), SM cycles (needs ncu)",
              Kind.TIMES, 200),
    Recording(f"{H200}/timing_ncu.json", True,
              "ncu --target-processes all -k fa2_fwd_kernel --section WarpStateStats --section SchedulerStats "
              "--section Occupancy --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis "
              "--section MemoryWorkloadAnalysis --metrics smsp__inst_executed.sum,sm__cycles_elapsed.max,"
              "smsp__cycles_active.avg --csv --page raw python experiments/timing_measure.py --profile > W/ncu.csv "
              "&& python experiments/timing_measure.py --ncu-csv W/ncu.csv --out OUT",
              "Nsight Compute on 12 of those launches: instructions executed, stall reasons, pipes (needs ncu)",
              Kind.TIMES, 240),
    Recording(f"{H200}/timing_sass_counts.json", True,
              "ncu --set full --import-source no -k regex:fa2_fwd_kernel -o W/sass1 -f python experiments/timing_measure.py --profile --only '^m64n32d32w4-swizzled/1x16x8192x8192x32/causal$' && "
              'ncu -i W/sass1.ncu-rep --page source --csv --print-source sass > W/sass1.csv && '
              "ncu --set full --import-source no -k regex:fa2_fwd_kernel -o W/sass2 -f python experiments/timing_measure.py --profile --only '^m64n32d32w4-swizzled-s2/1x16x8192x8192x32/causal$' && "
              'ncu -i W/sass2.ncu-rep --page source --csv --print-source sass > W/sass2.csv && '
              'python experiments/timing_measure.py --sass-csv m64n32d32w4-swizzled/1x16x8192x8192x32/causal=W/sass1.csv m64n32d32w4-swizzled-s2/1x16x8192x8192x32/causal=W/sass2.csv --out OUT',
              "Nsight Compute's executed count of every SASS instruction of two causal launches (needs ncu)",
              Kind.JSON, 240),
    Recording(f"{H200}/timing_auto.json", True, "python experiments/timing_auto.py --measure --out OUT",
              "every config=auto candidate timed on 12 problems (the model's pick against the measured best)",
              Kind.TIMES, 200),
    Recording(f"{H200}/timing_microbench.json", True, "python -m fa_sim.calibrate.timing_microbench --measure --out OUT",
              "SM clock cycles of the timing model's unit microbenchmarks (tensor, MUFU, fma and shared-memory pipes)",
              Kind.TIMES, 120),
    Recording(f"{H100}/timing_microbench_h100.json", True,
              "python -m fa_sim.calibrate.timing_microbench --measure --out W && "
              "mv W/timing_microbench.json OUT/timing_microbench_h100.json",
              "the same microbenchmarks on an H100, with MUFU.RCP's latency and rate, div.rn.f32's latency and "
              "rate and the softcap's probes (MUFU.EX2 in 16 warps, the tanh chain alone, beside HMMAs and ldmatrix)",
              Kind.TIMES, 120),
    Recording(f"{H100}/ncu_layouts_edits.json", True, "python experiments/ncu_counters.py --out OUT",
              "Nsight Compute counters of the seed kernel, two rolled-loop edits, three shared-memory layouts and "
              "softcap 30 (local memory, L1 hits, wavefronts, stalls, pipe use; needs ncu)", Kind.TIMES, 240),
    Recording(f"{H100}/timing_ncu_splitkv.json", True, "python experiments/ncu_splitkv_instructions.py --out OUT",
              "Nsight Compute's warp instructions executed by split-KV decoding's split launch (2 sequences of "
              "2000 and 700 keys, 4 splits: two empty, warp 0 diverging in store_partial; needs ncu), which the "
              "timing model's SASS walk issues (tests/test_timing_launches.py)", Kind.TIMES, 120),
    Recording(f"{H100}/timing_edits_fuzz.json", True,
              "python experiments/timing_edits.py --measure --set fuzz --out OUT/timing_edits_fuzz.json",
              "the seed kernel and the sixteen fa2_fwd.cu edits of experiments/variants/edits_fuzz/ at two shapes: "
              "kernel times", Kind.TIMES, 180),
    Recording(f"{H100}/timing_backward_tuned_kernels.json", True,
              "python experiments/timing_backward_tuned.py --measure-kernels OUT/timing_backward_tuned_kernels.json",
              "the backward's three kernels timed apart (queued launches) on the 96 tuned rows of "
              "timing_backward_tuned.json: where the model's error on the whole pass lies", Kind.TIMES, 240),
    Recording(f"{H100}/timing_backward_tuned.json", False,
              "python experiments/timing_backward_tuned.py --predict --redo --jobs 2",
              "the timing model's predictions (H200 model, no GPU; about 30 min of CPU) of 96 backward rows whose "
              "times the H100's tune_bwd runs measured (experiments/tune_bwd_h100*.json), rewritten in place; the "
              "h200_dispatch key is round 41's dispatch experiment (commit 215bd8b, --key h200_dispatch)", Kind.JSON),
    Recording("tests/data/seed_sass_sha256.json", False,
              "python -m fa_sim.calibrate.seed_sass --out OUT/seed_sass_sha256.json",
              "sha256 of the seed kernel's SASS, 8 builds (NVRTC 13.0; no GPU)", Kind.JSON),
    Recording("traces/golden", False, "python -m fa_sim.calibrate.golden_traces --out OUT/golden",
              "two golden traces and their lane stories (the simulator; no GPU)", Kind.TEXT),
)
BY_NAME = {Path(r.path).name: r for r in RECORDINGS}
PROVENANCE = ("source", "origin", "kernel_source", "kernel_name")  # reported, not compared


@dataclass(frozen=True)
class Verdict:
    name: str
    equal: bool
    detail: str


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def compare_arrays(new: Path, old: Path) -> tuple[bool, str]:
    a, b = _npz(new), _npz(old)
    missing = [k for k in b if k not in a]
    differ = [k for k in b if k in a and k not in PROVENANCE and not _same(a[k], b[k])]
    notes = [f"{k} differs" for k in PROVENANCE if k in a and k in b and not _same(a[k], b[k])]
    bad = [f"missing {', '.join(missing)}"] * bool(missing) + [f"DIFFERENT {', '.join(differ)}"] * bool(differ)
    return not bad, "; ".join(bad + notes) or "identical arrays"


def compare_alu(new: Path, old: Path) -> tuple[bool, str]:
    a, b = _npz(new), _npz(old)
    n = b["gpu"].shape[0]
    if list(a["forms"][:n]) != list(b["forms"]) or int(a["seed"]) != int(b["seed"]):
        return False, "DIFFERENT form list or seed"
    bad = [str(b["forms"][k]) for k in range(n) if not np.array_equal(a["gpu"][k], b["gpu"][k])]
    extra = a["gpu"].shape[0] - n
    return not bad, (f"DIFFERENT outputs of {len(bad)} forms, first {bad[0]}" if bad else
                     f"the {n} committed forms identical" + (f"; {extra} forms more (added since)" if extra else ""))


def compare_saved_run(new: Path, old: Path) -> tuple[bool, str]:
    from ..crosscheck import SavedRun

    a, b = SavedRun.load(new), SavedRun.load(old)
    differ = [f for f in ("q", "k", "v", "o", "lse", "checkpoints") if not _same(getattr(a, f), getattr(b, f))]
    differ += [f for f in ("ctas", "config", "causal", "scale", "kind", "cu_seqlens", "splits", "pack_gqa")
               if getattr(a, f) != getattr(b, f)]
    # format 5: a split-KV run's cache lengths and workspace (None in other runs)
    differ += [f for f in ("cache_seqlens", "o_accum", "lse_accum")
               if (getattr(a, f) is None) != (getattr(b, f) is None)
               or (getattr(a, f) is not None and not _same(getattr(a, f), getattr(b, f)))]
    note = "" if a.kernel_source == b.kernel_source else "; the kernel source is not the recorded one (edited since)"
    if a.combine_source != b.combine_source:
        note += "; the combine kernel's source is not the recorded one (edited since)"
    return not differ, (f"DIFFERENT {', '.join(differ)}" if differ else "identical inputs, config, O, LSE, checkpoints") + note


def compare_json(new: Path, old: Path) -> tuple[bool, str]:
    a, b = json.loads(new.read_text()), json.loads(old.read_text())
    notes = "; source differs" if isinstance(a, dict) and a.get("source") != b.get("source") else ""
    if isinstance(a, dict):
        a, b = ({k: v for k, v in d.items() if k != "source"} for d in (a, b))
    return a == b, ("identical values" if a == b else "DIFFERENT values") + notes


def compare_tree(new: Path, old: Path) -> tuple[bool, str]:
    """A directory of goldens: every committed file, byte for byte (npz: array for array)."""
    bad = []
    for f in sorted(p for p in old.rglob("*") if p.is_file()):
        g = new / f.relative_to(old)
        if not g.is_file():
            bad.append(f"missing {f.relative_to(old)}")
        elif f.suffix == ".npz":
            bad += [] if compare_arrays(g, f)[0] else [f"DIFFERENT {f.relative_to(old)}"]
        elif f.read_bytes() != g.read_bytes():
            bad.append(f"DIFFERENT {f.relative_to(old)}")
    return not bad, "; ".join(bad) or "identical files"


TIME_TOLERANCE = 0.05  # measured times of one case on two machine sessions: median 0.5 %, at most 3.8 % apart


def _measurements(data: dict) -> dict:
    """{case: what is compared} of a timing file: kernel times, or Nsight Compute's exact counts."""
    if "cases" in data:
        return {c["key"]: c["kernel_ms"] for c in data["cases"]}
    if "kernels" in data:
        return {k["key"]: int(k["smsp__inst_executed.sum"]) for k in data["kernels"]}
    if isinstance(data["rows"], dict):  # timing_microbench.json: cycles per benchmark
        return {name: row["cycles"] for name, row in data["rows"].items()}
    if isinstance(data.get("launches"), dict):  # ncu_layouts_edits.json: Nsight Compute's time per launch
        return {name: m["gpu__time_duration.sum"] for name, m in data["launches"].items()}
    if "launches" in data:  # timing_kernels.json: kernels that are not attention
        return {(r["kernel"], r["size"]): r["ms"] for r in data["launches"]}
    if data["rows"] and "ctas_per_sm" in data["rows"][0]:  # timing_occupancy.json: a time per forced occupancy
        return {(r["key"], r["ctas_per_sm"]): r["kernel_ms"] for r in data["rows"]}
    if data["rows"] and "kernels_ms" in data["rows"][0]:  # timing_backward_tuned_kernels.json: the three's sum
        return {(tuple(r["shape"]), r["causal"], r["label"]): r["total_ms"] for r in data["rows"]}
    if data["rows"] and "deterministic" in data["rows"][0]:  # timing_backward.json: the three kernels' sum
        return {(tuple(r["shape"]), r["causal"], r["deterministic"]): r["total_ms"] for r in data["rows"]}
    if data["rows"] and "case" in data["rows"][0]:  # timing_features.json: each shape's plain case first and last
        times: dict = {}
        for r in data["rows"]:
            times.setdefault((r["case"], tuple(r["shape"]), r["causal"]), []).append(r["ms"])
        return {k: float(np.median(v)) for k, v in times.items()}
    if data["rows"] and "edit" in data["rows"][0]:  # timing_edits.json: the seed timed first and last
        out: dict = {}
        for r in data["rows"]:
            out.setdefault((r["edit"], tuple(r["shape"]), r["causal"]), []).append(r["ms"])
        return {k: float(np.median(v)) for k, v in out.items()}
    if data["rows"] and "config" in data["rows"][0]:  # timing_pingpong.json
        return {(r["config"], tuple(r["shape"]), r["causal"]): r["ms"] for r in data["rows"]}
    return {(tuple(r["problem"]), r["tag"]): r["kernel_ms"] for r in data["rows"]}


def compare_times(new: Path, old: Path) -> tuple[bool, str]:
    """The same cases; times within TIME_TOLERANCE, instruction counts equal."""
    a, b = (_measurements(json.loads(p.read_text())) for p in (new, old))
    if set(a) != set(b):
        return False, f"DIFFERENT cases ({len(set(a) ^ set(b))} not in both)"
    off = [k for k in b if (a[k] != b[k] if isinstance(b[k], int) else abs(a[k] / b[k] - 1) > TIME_TOLERANCE)]
    worst = max((abs(a[k] / b[k] - 1) for k in b), default=0.0)
    return not off, (f"{len(b)} cases, at most {worst:.1%} apart" if not off else
                     f"{len(off)} of {len(b)} cases DIFFER beyond {TIME_TOLERANCE:.0%} (e.g. {off[0]})")


def compare_signs(new: Path, old: Path) -> tuple[bool, str]:
    """The same pairs; the same sign of the speedup wherever both files' passes agree on one (a range
    of pass medians that holds 0 tells no sign)."""
    a, b = ({r["key"]: r for r in json.loads(p.read_text())["pairs"]} for p in (new, old))
    if set(a) != set(b):
        return False, f"DIFFERENT pairs ({len(set(a) ^ set(b))} not in both)"
    def sign(r: dict) -> int:
        return 0 if r["low"] <= 0 <= r["high"] else 1 if r["low"] > 0 else -1
    told = [k for k in b if sign(a[k]) and sign(b[k])]
    off = [k for k in told if sign(a[k]) != sign(b[k])]
    return not off, (f"{len(b)} pairs, {len(told)} signed in both, all alike" if not off else
                     f"{len(off)} of {len(told)} signs DIFFER (e.g. {off[0]})")


SPAN_TOLERANCE = 0.08  # a grid's span, median of 3 single launches: two recordings a session apart differ
# by 0.8 % in the median case, at most 4.6 %


def _spans(path: Path) -> dict:
    """{case: the median over its launches of the last CTA's end (ns)} of a timing_dispatch.npz."""
    with np.load(path) as z:
        keys, case, launch, end = json.loads(str(z["meta"]))["keys"], z["case"], z["launch"], z["end_ns"]
    return {key: float(np.median([end[(case == n) & (launch == i)].max() for i in np.unique(launch[case == n])]))
            for n, key in enumerate(keys)}


def compare_spans(new: Path, old: Path) -> tuple[bool, str]:
    """The same cases; each grid's span within SPAN_TOLERANCE."""
    a, b = _spans(new), _spans(old)
    if set(a) != set(b):
        return False, f"DIFFERENT cases ({len(set(a) ^ set(b))} not in both)"
    off = [k for k in b if abs(a[k] / b[k] - 1) > SPAN_TOLERANCE]
    worst = max((abs(a[k] / b[k] - 1) for k in b), default=0.0)
    return not off, (f"{len(b)} cases, spans at most {worst:.1%} apart" if not off else
                     f"{len(off)} of {len(b)} spans DIFFER beyond {SPAN_TOLERANCE:.0%} (e.g. {off[0]})")


COMPARE = {Kind.ARRAYS: compare_arrays, Kind.ALU: compare_alu, Kind.SAVED_RUN: compare_saved_run,
           Kind.JSON: compare_json, Kind.TEXT: compare_tree, Kind.TIMES: compare_times, Kind.SIGNS: compare_signs,
           Kind.SPANS: compare_spans}


def compare(new: Path, rec: Recording, root: Path = ROOT) -> Verdict:
    name = Path(rec.path).name
    target = new / name
    if not target.exists():
        return Verdict(name, False, "not regenerated (see the step's log)")
    try:
        ok, detail = COMPARE[rec.kind](target, root / rec.path)
    except Exception as exc:  # noqa: BLE001 - one unreadable file must not hide the others' verdicts
        ok, detail = False, f"cannot compare: {type(exc).__name__}: {exc}"
    return Verdict(name, ok, detail)


def command(rec: Recording, out: str, work: str) -> str:
    """The recording's command with its output directory OUT and scratch directory W filled in."""
    return re.sub(r"\bW\b", work, re.sub(r"\bOUT\b", out, rec.command))


def cmd_list(args) -> int:
    for r in RECORDINGS:
        print(f"{r.path:46s} {'GPU' if r.gpu else 'CPU'}  {r.command}")
    return 0


def cmd_commands(args) -> int:
    """One line per GPU recording for experiments/device_regenerate.sh: name, time limit, command."""
    for r in RECORDINGS:
        if r.gpu:
            print(f"{Path(r.path).stem}\t{r.seconds}\t{command(r, args.out, args.work)}")
    return 0


def cmd_compare(args) -> int:
    if not args.dir.is_dir():
        raise SystemExit(f"{args.dir}: not a directory (the OUT of the regeneration commands)")
    wanted = {"all": lambda r: True, "gpu": lambda r: r.gpu, "cpu": lambda r: not r.gpu,
              "present": lambda r: (args.dir / Path(r.path).name).exists()}[args.which]
    recs = [r for r in RECORDINGS if wanted(r)]
    verdicts = [compare(args.dir, r) for r in recs]
    width = max(len(v.name) for v in verdicts)
    print(f"{'file':{width}s}  verdict  detail")
    for v in verdicts:
        print(f"{v.name:{width}s}  {'equal  ' if v.equal else 'DIFFERS'}  {v.detail}")
    return 0 if all(v.equal for v in verdicts) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every recorded file and its command")
    m = sub.add_parser("commands", help="the GPU commands with OUT and W filled in (tab-separated: name, limit, command)")
    m.add_argument("--out", required=True)
    m.add_argument("--work", required=True)
    c = sub.add_parser("compare", help="regenerated files (named as the committed ones) against the committed ones")
    c.add_argument("dir", type=Path)
    c.add_argument("--which", choices=("all", "gpu", "cpu", "present"), default="all",
                   help="which recordings: all (default), those made on the GPU or on the CPU, or those DIR holds")
    args = p.parse_args(argv)
    return {"list": cmd_list, "commands": cmd_commands, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
