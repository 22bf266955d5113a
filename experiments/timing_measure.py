"""Measured kernel times of the validation cases of the timing model (fa_sim.timing), on the GPU.

    python experiments/timing_measure.py --out DIR              # every case, 3 timed batches each
    python experiments/timing_measure.py --list                 # the cases, no GPU needed
    python experiments/timing_measure.py --small --out DIR     # the small launches -> timing_small.json
    python experiments/timing_measure.py --pairs --out DIR     # each option beside its base, interleaved
    ncu --csv --page raw --section WarpStateStats ... python experiments/timing_measure.py --profile --out DIR
                                                                # one launch per profiled case

The cases (`cases()`, deterministic): every config of the family (KernelConfig.family(): the three
shared-memory layouts, d = 32/64/128, 4 and 8 warps, every tile) once without and once with the
causal mask, on a rotating list of shapes that fill the H200's 132 SMs with several waves and
include lengths that are not multiples of the tiles; every schedule option (kv_stages 2 and 3,
q_in_regs, heavy_first, defer_pv (which needs kv_stages >= 2), min_blocks, the FFMA softmax form) alone
and in pairs on six
base configs, each beside its base config on the same shape (the sign of its speedup); a kernel
variant (experiments/variants) beside the kernel it varies. Each case is split into the fitting half or
the validation half by `half()`, so the model is fitted on one and reported on the other.

Timing: the inputs are random normal fp16 torch tensors (never zeros); each batch is `--warmup`
launches, then `--reps` launches each bracketed by CUDA events, enqueued behind a blocking kernel
(LaunchPlan.time: fa_hw/blocking.py; recordings before round 45 had none); a case's time is the median of each
batch, and the three batch medians give the spread. Inputs stay in L2 between launches where they
fit (H200: 50 MB), as in a model's repeated layers. Writes timing_cases.json to --out.

Pairs (`--pairs`, timing_pairs.json): an option's speedup from two cases timed minutes apart
carries the GPU's drift between them (the clock, the temperature, the L2's state), which the
batches of one case do not show: re-measured, three of the recorded signs flipped. So each option
is also timed beside its base config on the same inputs, interleaved: `--rounds` rounds of one
batch of each (the order alternating, base first in even rounds), per round the speedup base
median / option median - 1, and `--passes` passes over all pairs one after another. The pair's
speedup is the median over every round, its range that of the passes' own medians: the sign is
told where the range does not hold 0, i.e. where every pass agrees on it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fa_sim.config import KernelConfig, SoftmaxForm

ROOT = Path(__file__).resolve().parents[1]
VARIANT = ROOT / "experiments" / "variants" / "fa2_fwd_swizzle_r4.patch"
# (B, H, Nq, Nk): 132 SMs x 2-4 resident CTAs; lengths both multiples of 128 and not
SHAPES = ((4, 16, 2048, 2048), (2, 16, 4096, 4096), (8, 8, 1024, 1024), (1, 32, 3000, 3000),
          (16, 16, 512, 512), (1, 16, 8192, 8192), (2, 24, 1500, 1500), (4, 8, 2500, 1700))
OPTION_BASES = ("m64n64d64w4-swizzled", "m128n64d64w4-swizzled", "m128n128d64w8-swizzled",
                "m64n64d128w4-swizzled", "m128n64d128w8-swizzled", "m64n32d32w4-swizzled")
OPTIONS = ({"kv_stages": 2}, {"kv_stages": 3}, {"q_in_regs": True}, {"heavy_first": True}, {"defer_pv": True},
           {"min_blocks": 2}, {"softmax": SoftmaxForm.FFMA}, {"kv_stages": 2, "defer_pv": True},
           {"kv_stages": 3, "defer_pv": True}, {"kv_stages": 2, "q_in_regs": True},
           {"kv_stages": 2, "heavy_first": True})


@dataclass(frozen=True)
class Case:
    tag: str  # KernelConfig.tag (suffixes: options and softmax form)
    shape: tuple[int, int, int, int, int]  # B, H, Nq, Nk, d
    causal: bool
    kernel: str = ""  # a variant's path relative to the repository, "" = fa_hw's own

    @property
    def key(self) -> str:
        b, h, nq, nk, d = self.shape
        return f"{self.tag}/{b}x{h}x{nq}x{nk}x{d}/{'causal' if self.causal else 'full'}" + \
            (f"/{Path(self.kernel).stem}" if self.kernel else "")

    def half(self) -> str:
        """'fit' or 'validate', by a hash of the key (stable across runs and machines)."""
        return "fit" if hashlib.sha256(self.key.encode()).digest()[0] % 2 == 0 else "validate"

    def config(self) -> KernelConfig:
        return KernelConfig.from_tag(self.tag)

    @classmethod
    def from_key(cls, key: str) -> Case:
        """The case of a key 'tag/BxHxNqxNkxd/causal|full' (fa_hw's own kernel)."""
        tag, shape, mode = key.split("/")
        return cls(tag, tuple(int(x) for x in shape.split("x")), mode == "causal")


def _with(base: KernelConfig, changes: dict) -> KernelConfig | None:
    from dataclasses import replace

    try:
        return replace(base, **changes)
    except ValueError:
        return None


def cases() -> list[Case]:
    out: list[Case] = []
    for i, cfg in enumerate(KernelConfig.family()):
        for j, causal in enumerate((False, True)):
            b, h, nq, nk = SHAPES[(2 * i + j) % len(SHAPES)]
            out.append(Case(cfg.tag, (b, h, nq, nk, cfg.head_dim), causal))
    for i, tag in enumerate(OPTION_BASES):
        base = KernelConfig.from_tag(tag)
        for j, changes in enumerate(OPTIONS):
            cfg = _with(base, changes)
            if cfg is None:
                continue
            causal = bool(changes.get("heavy_first")) or (i + j) % 2 == 1
            b, h, nq, nk = SHAPES[(i + 3 * j) % len(SHAPES)]
            out.append(Case(cfg.tag, (b, h, nq, nk, cfg.head_dim), causal))
            out.append(Case(base.tag, (b, h, nq, nk, cfg.head_dim), causal))  # the option's speedup, same shape
    for causal, (b, h, nq, nk) in ((False, SHAPES[0]), (True, SHAPES[1])):
        out.append(Case("m64n64d64w4-swizzled", (b, h, nq, nk, 64), causal, str(VARIANT.relative_to(ROOT))))
        out.append(Case("m64n64d64w4-swizzled", (b, h, nq, nk, 64), causal))
    return list(dict.fromkeys(out))  # each case once


def small_cases() -> list[Case]:
    """Launches of one partial wave or a few (`--small`, timing_small.json: what the launch latency
    and the first wave's fill are fitted on): one CTA of 1, 16 and 64 rounds, one CTA per SM of 1 and 16 rounds, 2 and 4 per
    SM and two waves, on configs of 1, 4 and 6 resident CTAs per SM; and the short causal shapes
    with a query and key tail of `fa compare` (the instruction count of a partial last Q block)."""
    out = []
    for tag, (bm, d) in (("m64n64d64w4-swizzled", (64, 64)), ("m128n128d64w8-swizzled", (128, 64)),
                         ("m64n32d32w4-swizzled", (64, 32))):
        for heads, nk in SMALL_GRIDS:
            out.append(Case(tag, (1, heads, bm, nk, d), False))
        for heads, n, causal in SMALL_SHAPES:
            out.append(Case(tag, (1, heads, n, n, d), causal))
    return out


# (heads, N_k) of one Q block per head: one CTA (1, 16, 64 rounds), a CTA per SM (132), 2 and 4 per SM, two waves
SMALL_GRIDS = ((1, 64), (1, 1024), (1, 4096), (132, 64), (132, 1024), (264, 1024), (528, 1024), (1056, 1024))
# (heads, N, causal): fa compare's shapes and query tails
SMALL_SHAPES = ((8, 512, False), (2, 256, False), (4, 1000, False), (8, 333, True), (16, 1000, True),
                (4, 1500, True))


def _inputs(case: Case):
    import torch

    b, h, nq, nk, d = case.shape
    g = torch.Generator(device="cuda").manual_seed(int(hashlib.sha256(case.key.encode()).hexdigest()[:8], 16))
    return [torch.randn((b, h, n, d), generator=g, device="cuda", dtype=torch.float16) for n in (nq, nk, nk)]


def measure(case: Case, warmup: int, reps: int, batches: int) -> dict:
    from fa_hw.forward import prepare

    q, k, v = _inputs(case)
    plan, dev, _ = prepare(q, k, v, case.causal, None, case.config(),
                           kernel=str(ROOT / case.kernel) if case.kernel else None)
    medians = [statistics.median(plan.time(dev.stream, warmup, reps)) for _ in range(batches)]
    row = {**asdict(case), "key": case.key, "half": case.half(), "kernel_ms": statistics.median(medians),
           "batch_ms": medians, "registers": plan.loaded.registers, "grid": list(plan.grid[:2]),
           "smem_bytes": plan.smem_bytes}
    return row


def base_tag(tag: str) -> str:
    """The tag of a config's base: its tile, warps and layout without any option (what an option case
    is measured beside)."""
    cfg = KernelConfig.from_tag(tag)
    return KernelConfig(block_m=cfg.block_m, block_n=cfg.block_n, head_dim=cfg.head_dim, n_warps=cfg.n_warps,
                        smem=cfg.smem).tag


def option_pairs(all_cases: list[Case]) -> list[tuple[Case, Case]]:
    """(option case, its base case): every case whose config has options (or a kernel variant)
    beside the plain config on the same shape (cases() measures them in pairs)."""
    by_key = {(c.tag, c.shape, c.causal, c.kernel): c for c in all_cases}
    out = []
    for c in all_cases:
        base = by_key.get((base_tag(c.tag), c.shape, c.causal, ""))
        if base is not None and base is not c:
            out.append((c, base))
    return out


def measure_pair(option: Case, base: Case, warmup: int, reps: int, rounds: int) -> dict:
    """One pass: `rounds` rounds of one batch of each, on the option's inputs, the order
    alternating; the batch medians (ms) of each."""
    from fa_hw.forward import prepare

    q, k, v = _inputs(option)
    plans, dev = [], None
    for c in (base, option):
        plan, dev, _ = prepare(q, k, v, c.causal, None, c.config(), kernel=str(ROOT / c.kernel) if c.kernel else None)
        plans.append(plan)
    times: list[list[float]] = [[], []]
    for r in range(rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            times[which].append(statistics.median(plans[which].time(dev.stream, warmup, reps)))
    return {"base_ms": times[0], "option_ms": times[1]}


def pair_summary(passes: list[dict]) -> dict:
    """A pair's speedup from its passes: the median over every round of base / option - 1, and the
    range of the passes' own medians (the sign is told where every pass agrees on it)."""
    per_pass = [[b / o - 1 for b, o in zip(p["base_ms"], p["option_ms"])] for p in passes]
    medians = [statistics.median(s) for s in per_pass]
    return {"speedup": statistics.median([x for s in per_pass for x in s]), "low": min(medians), "high": max(medians),
            "pass_speedups": medians}


def pairs_json(meta: dict, rows: list[dict]) -> str:
    """timing_pairs.json's text: one line per pair."""
    return f'{{"meta": {json.dumps(meta)},\n "pairs": [\n' + ",\n".join(json.dumps(r) for r in rows) + "]}\n"


def _precompile(selected: list[Case]) -> None:
    """Every cubin in parallel (one NVRTC compile per core) before the first timed launch."""
    from fa_hw.runtime import device_arch
    from fa_sim.contract import KernelBuild, kernel_source
    from fa_sim.contract.cubins import compile_many

    arch = device_arch()
    builds = {KernelBuild(c.config(), c.causal, arch, False, kernel_source(ROOT / c.kernel) if c.kernel else None)
              for c in selected}
    compile_many(sorted(builds, key=repr))


def profile_subset(all_cases: list[Case], n: int = 12) -> list[Case]:
    """Spread over the list: the cases Nsight Compute profiles (one launch each)."""
    step = max(1, len(all_cases) // n)
    return all_cases[::step][:n]


#: What tests/data/h200/timing_ncu.json keeps of Nsight Compute's raw page, per profiled launch.
NCU_KEEP = re.compile(r"smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio|smsp__inst_executed\.sum|"
                      r"sm__cycles_elapsed\.max|smsp__cycles_active\.avg|gpu__time_duration\.sum|"
                      r"sm__warps_active\.avg\.pct_of_peak_sustained_active|"
                      r"smsp__issue_active\.avg\.pct_of_peak_sustained_active|"
                      r"sm__inst_executed_pipe_\w+\.avg\.pct_of_peak_sustained_active|launch__occupancy_limit_\w+|"
                      r"launch__registers_per_thread|launch__grid_size|launch__block_size|smsp__warps_launched\.sum|"
                      r"l1tex__data_pipe_lsu_wavefronts\.avg\.pct_of_peak_sustained_elapsed|"
                      r"dram__bytes\.sum\.per_second|lts__t_bytes\.sum\.per_second|"
                      r"sm__throughput\.avg\.pct_of_peak_sustained_elapsed")


def ncu_summary(csv_text: str) -> dict:
    """timing_ncu.json from `ncu --csv --page raw` over `--profile`: the kept metrics of each launch,
    named by the case the --profile run printed before it."""
    import csv
    import io

    keys = [line.split(" ", 1)[1].strip() for line in csv_text.splitlines() if line.startswith("profiled ")]
    rows = list(csv.reader(io.StringIO(csv_text[csv_text.index('"ID"'):])))
    head, data = rows[0], [r for r in rows[2:] if r]
    if len(data) != len(keys):
        raise SystemExit(f"ncu reported {len(data)} launches for {len(keys)} profiled cases")

    def number(text: str):
        try:
            return float(text.replace(",", ""))
        except ValueError:
            return text

    kernels = [{"key": key, **{h: number(v) for h, v in zip(head, row) if NCU_KEEP.fullmatch(h)}}
               for key, row in zip(keys, data)]
    return {"meta": {"tool": "ncu --csv --page raw (sections WarpStateStats SchedulerStats Occupancy LaunchStats "
                             "SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis)",
                     "gpu": "NVIDIA H200"}, "kernels": kernels}


def sass_counts(pairs: list[str]) -> dict:
    """timing_sass_counts.json from Nsight Compute's source pages (`ncu -i REPORT --page source --csv
    --print-source sass`), given as KEY=FILE: per SASS instruction of each case its offset from the
    kernel's first instruction, opcode and warp instructions executed."""
    import csv

    kernels = []
    for pair in pairs:
        key, path = pair.split("=", 1)
        rows = list(csv.reader(Path(path).read_text().splitlines()))
        head = next(r for r in rows if "Instructions Executed" in r)
        data = [r for r in rows[rows.index(head) + 1:] if r and r[0].startswith("0x")]
        at, src = head.index("Instructions Executed"), head.index("Source")
        base = int(data[0][0], 16)
        kernels.append({"key": key, "instructions": [
            [f"{int(r[0], 16) - base:04x}", r[src].split()[1 if r[src].lstrip().startswith("@") else 0], int(r[at])]
            for r in data]})
    return {"meta": {"tool": "ncu --set full --import-source no; ncu -i REPORT --page source --csv --print-source sass",
                     "gpu": "NVIDIA H200", "columns": "SASS offset from the kernel's first instruction (hex), opcode, "
                                                      "Instructions Executed (warp instructions)"},
            "kernels": kernels}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--pairs", action="store_true",
                   help="each option beside its base, interleaved (--rounds rounds), written to timing_pairs.json")
    p.add_argument("--rounds", type=int, default=9, help="--pairs: interleaved rounds per pair and pass")
    p.add_argument("--passes", type=int, default=3, help="--pairs: passes over every pair, one after another")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU)")
    p.add_argument("--profile", action="store_true", help="launch each profiled case once (run under ncu)")
    p.add_argument("--only", type=re.compile, default=None, metavar="REGEX",
                   help="only the cases whose key matches REGEX (re.search), e.g. to profile chosen cases")
    p.add_argument("--small", action="store_true",
                   help="only the small launches (small_cases()), written to timing_small.json")
    p.add_argument("--ncu-csv", type=Path, default=None, metavar="FILE",
                   help="turn ncu's CSV of a --profile run into OUT/timing_ncu.json (no GPU)")
    p.add_argument("--ncu-name", default="timing_ncu.json", help="the file --ncu-csv writes in --out")
    p.add_argument("--sass-csv", nargs="+", default=None, metavar="KEY=FILE",
                   help="turn ncu source pages (one per case) into OUT/timing_sass_counts.json (no GPU)")
    args = p.parse_args(argv)
    if args.pairs and (args.small or args.profile):
        p.error("--pairs times the options of the main cases beside their bases; it takes neither --small nor --profile")
    if args.pairs and min(args.rounds, args.passes) < 1:
        p.error("--rounds and --passes take at least 1")
    if args.sass_csv is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(sass_counts(args.sass_csv), separators=(",", ":")).replace("],[", "],\n[")
        (args.out / "timing_sass_counts.json").write_text(text)
        return 0
    if args.ncu_csv is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / args.ncu_name).write_text(json.dumps(ncu_summary(args.ncu_csv.read_text()), indent=1))
        return 0
    all_cases = [c for c in (small_cases() if args.small else cases()) if args.only is None or args.only.search(c.key)]
    if not all_cases:
        raise SystemExit(f"--only {args.only.pattern!r} matches no case (see --list)")
    if args.pairs:
        return _main_pairs(args)
    if args.list:
        for c in all_cases:
            print(c.half(), c.key)
        print(f"{len(all_cases)} cases, {sum(c.half() == 'fit' for c in all_cases)} to fit", file=sys.stderr)
        return 0
    selected = profile_subset(all_cases) if args.profile and args.only is None and not args.small else all_cases
    t0 = time.time()
    _precompile(selected)
    print(f"compiled {len(selected)} cases in {time.time() - t0:.0f} s", flush=True)
    if args.profile:
        for c in selected:
            measure(c, 0, 1, 1)
            print("profiled", c.key, flush=True)
        return 0
    import torch

    rows = []
    for i, c in enumerate(selected):
        rows.append(measure(c, args.warmup, args.reps, args.batches))
        r = rows[-1]
        print(f"{i:3d} {c.key:60s} {r['kernel_ms']:.4f} ms  spread {max(r['batch_ms']) / min(r['batch_ms']) - 1:.2%}",
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "warmup": args.warmup, "reps": args.reps, "batches": args.batches,
            "kernel_sha256": hashlib.sha256((ROOT / "fa_hw" / "kernels" / "fa2_fwd.cu").read_bytes()).hexdigest()}
    name = "timing_small.json" if args.small else "timing_cases.json"
    (args.out / name).write_text(json.dumps({"meta": meta, "cases": rows}, indent=1))
    print(f"wrote {len(rows)} cases to {args.out / name} in {time.time() - t0:.0f} s")
    return 0


def _main_pairs(args) -> int:
    # --only picks options; each is paired with its base whatever --only says of the base
    pairs = [(option, base) for option, base in option_pairs(cases()) if args.only is None or args.only.search(option.key)]
    if not pairs:
        raise SystemExit("no option case with its base among the selected cases (see --list)")
    if args.list:
        for option, base in pairs:
            print(option.key, "beside", base.key)
        print(f"{len(pairs)} pairs", file=sys.stderr)
        return 0
    t0 = time.time()
    _precompile([c for pair in pairs for c in pair])
    print(f"compiled {len(pairs)} pairs in {time.time() - t0:.0f} s", flush=True)
    import torch

    passes: dict[str, list[dict]] = {option.key: [] for option, _ in pairs}
    for n in range(args.passes):  # pass after pass over every pair: the passes are minutes apart
        for i, (option, base) in enumerate(pairs):
            passes[option.key].append(measure_pair(option, base, args.warmup, args.reps, args.rounds))
            s = pair_summary(passes[option.key][-1:])
            print(f"pass {n} {i:3d} {option.key:60s} {s['speedup']:+.2%}", flush=True)
    rows = [{"key": option.key, "base": base.key, **pair_summary(passes[option.key]), "passes": passes[option.key]}
            for option, base in pairs]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "warmup": args.warmup, "reps": args.reps, "rounds": args.rounds,
            "passes": args.passes,
            "kernel_sha256": hashlib.sha256((ROOT / "fa_hw" / "kernels" / "fa2_fwd.cu").read_bytes()).hexdigest()}
    (args.out / "timing_pairs.json").write_text(pairs_json(meta, rows))
    print(f"wrote {len(rows)} pairs to {args.out / 'timing_pairs.json'} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
