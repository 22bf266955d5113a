"""What occupancy buys: kernel time with the CTAs per SM forced down, on the GPU and in the timing model.

    python experiments/timing_occupancy.py --measure --out DIR     # on the GPU: DIR/timing_occupancy.json
    python experiments/timing_occupancy.py                         # the recording against the model
    python experiments/timing_occupancy.py --data DIR/timing_occupancy.json
    ncu --csv --page raw --section WarpStateStats --section SchedulerStats \
        python experiments/timing_occupancy.py --profile            # on the GPU: stalls per occupancy

An SM holds as many CTAs as its registers, shared memory and threads allow (the kernel's own
occupancy k). Launched with more dynamic shared memory than it uses, the same kernel - the same
cubin, registers and instructions - fits fewer: for j = 1 .. k the measurement takes the largest
dynamic shared memory, in STEP-byte steps down from 233,472 bytes per SM (the H200's) over j less
the 1 KB the driver reserves per CTA, for which the driver's occupancy calculator
(cuOccupancyMaxActiveBlocksPerMultiprocessor) gives exactly j CTAs per SM (the arithmetic alone is
not enough: the SM's shared-memory carve-out comes in steps, so 45,670 bytes give the seed-size
m64n32d32w4 4 CTAs, not 5); a j no padding gives is skipped. Each (case, j): `--batches` batches of `--reps` launches after `--warmup`, CUDA
events, the median of the batch medians; inputs random normal fp16 (seeded by the case's key).

The model side is fa_sim.timing.predict(prob, ctas_per_sm=j): the SM run with j resident CTAs and
the grid dispatched over j slots per SM. Where the two curves part says which part of the model
is off: the one-CTA end (j = 1) is one CTA's latency, the full end its throughput with k resident
CTAs; an option that changes the occupancy (registers: kv_stages, heavy_first, q_in_regs) moves
a case along its curve, so a curve whose slope is wrong gets that option's sign wrong. The report
prints each case's curve on both sides and each side's gain from j = 1 and from j = k - 1 to k.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the timed cases' keys and their seeded inputs
from timing_measure import ROOT, Case, _inputs

from fa_sim.problem import Problem
from fa_sim.timing.gpus import H200

DATA = ROOT / "tests" / "data" / "h200" / "timing_occupancy.json"


def problem(case: Case) -> Problem:
    b, h, nq, nk, _ = case.shape
    return Problem(b, h, nq, nk, case.causal, 1.0, case.config())


#: m64n32d32w4 is the config whose options the model gets most wrong (docs/timing.md), causal with
#: the options that change its occupancy (kv_stages 2: 7 CTAs per SM, the base 6, q_in_regs 5) and
#: non-causal; two configs of 4 and 2 CTAs per SM beside them.
CASES = (Case("m64n32d32w4-swizzled", (8, 16, 2048, 2048, 32), False),
         Case("m64n32d32w4-swizzled", (1, 16, 8192, 8192, 32), True),
         Case("m64n32d32w4-swizzled-s2", (1, 16, 8192, 8192, 32), True),
         Case("m64n32d32w4-swizzled-qr", (1, 16, 8192, 8192, 32), True),
         Case("m64n64d64w4-swizzled", (4, 16, 2048, 2048, 64), False),
         Case("m128n64d64w4-swizzled", (4, 16, 2048, 2048, 64), False))


STEP = 256  # bytes: the padding's search step


def padded_smem(smem_bytes: int, j: int, gpu=H200) -> int | None:
    """The most dynamic shared memory that leaves room for j CTAs per SM by the arithmetic alone
    (where the search for the driver's j starts; None: the kernel's own shared memory allows fewer)."""
    pad = gpu.smem_per_sm // j - gpu.smem_reserved
    if pad < smem_bytes or gpu.smem_per_sm // (pad + gpu.smem_reserved) != j:
        return None
    return pad


def driver_padding(occupancy_at, smem_bytes: int, j: int) -> int | None:
    """The largest dynamic shared memory (from padded_smem down, STEP bytes at a time, not below the
    kernel's own) for which `occupancy_at(smem)` - the driver's CTAs per SM - is j; None if none is."""
    start = padded_smem(smem_bytes, j)
    if start is None:
        return None
    for smem in range(start, smem_bytes - 1, -STEP):
        got = occupancy_at(smem)
        if got == j:
            return smem
        if got > j:
            return None
    return None


def _driver_occupancy(kernel, threads: int, smem: int) -> int:
    """CTAs per SM the driver computes for a launch of `kernel` with `smem` dynamic shared memory."""
    from cuda.bindings import driver

    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        err, handle = driver.cuKernelGetFunction(handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuKernelGetFunction failed: {err}")
    err, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(handle, threads, smem)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
    return int(n)


def forced():
    """(case, j, own, the launch plan padded to j CTAs per SM, its device) for every case of CASES and
    j = 1 .. own that some padding gives (GPU)."""
    from fa_hw import runtime
    from fa_hw.forward import prepare

    for case in CASES:
        q, k, v = _inputs(case)
        plan, dev, _ = prepare(q, k, v, case.causal, None, case.config())
        threads = plan.block[0]
        runtime._set_max_dynamic_smem(plan.loaded.kernel, H200.smem_per_sm - H200.smem_reserved,
                                      runtime.device().device_id)  # the most any padding asks for
        own = _driver_occupancy(plan.loaded.kernel, threads, plan.smem_bytes)
        def occupancy_at(smem, kernel=plan.loaded.kernel, threads=threads):
            return _driver_occupancy(kernel, threads, smem)
        for j in range(1, own + 1):
            smem = plan.smem_bytes if j == own else driver_padding(occupancy_at, plan.smem_bytes, j)
            if smem is None:
                print(f"{case.key:48s} {j} of {own} CTAs per SM: no padding gives it (skipped)", flush=True)
                continue
            yield case, j, own, replace(plan, smem_bytes=smem), dev


def profile() -> None:
    """One launch of every case at each forced occupancy, for Nsight Compute (each announced by a line
    `profiled KEY J` before it)."""
    for case, j, _, padded, dev in forced():
        print("profiled", case.key, j, flush=True)
        padded.time(dev.stream, 0, 1)


def measure(out: Path, warmup: int, reps: int, batches: int) -> Path:
    """Time every case at each forced occupancy on the GPU; write out/timing_occupancy.json."""
    import torch

    rows = []
    for case, j, own, padded, dev in forced():
        medians = [statistics.median(padded.time(dev.stream, warmup, reps)) for _ in range(batches)]
        rows.append({"key": case.key, "ctas_per_sm": j, "own": own, "smem_bytes": padded.smem_bytes,
                     "registers": padded.loaded.registers, "kernel_ms": statistics.median(medians),
                     "batch_ms": medians})
        print(f"{case.key:48s} {j} of {own} CTAs per SM  {rows[-1]['kernel_ms']:.4f} ms", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timing_occupancy.json"
    meta = {"gpu": torch.cuda.get_device_name(), "warmup": warmup, "reps": reps, "batches": batches,
            "kernel_sha256": hashlib.sha256((ROOT / "fa_hw" / "kernels" / "fa2_fwd.cu").read_bytes()).hexdigest()}
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return path


def load(path: Path = DATA) -> dict[str, dict[int, float]]:
    """The recording: key -> {CTAs per SM: measured ms}."""
    out: dict[str, dict[int, float]] = {}
    for row in json.loads(path.read_text())["rows"]:
        out.setdefault(row["key"], {})[int(row["ctas_per_sm"])] = float(row["kernel_ms"])
    return out


def model_curve(key: str, levels) -> dict[int, float]:
    """The model's ms of a case at each forced occupancy of `levels`."""
    from fa_sim.timing import predict

    prob = problem(Case.from_key(key))
    return {j: predict(prob, "h200", ctas_per_sm=j).kernel_ms for j in levels}


def report(measured: dict[str, dict[int, float]]) -> str:
    lines = ["| case | CTAs per SM | GPU ms | model ms | model / GPU - 1 |", "|---|---|---|---|---|"]
    gains = ["", "| case | GPU: k over 1 | model: k over 1 | GPU: k over k - 1 | model: k over k - 1 |",
             "|---|---|---|---|---|"]
    for key, gpu in measured.items():
        model = model_curve(key, sorted(gpu))
        for j in sorted(gpu):
            lines.append(f"| {key if j == min(gpu) else ''} | {j} | {gpu[j]:.4f} | {model[j]:.4f} | "
                         f"{model[j] / gpu[j] - 1:+.1%} |")
        k = max(gpu)

        def gain(side, a, k=k):
            return f"{side[a] / side[k] - 1:+.1%}" if a in side else "-"
        gains.append(f"| {key} | {gain(gpu, 1)} | {gain(model, 1)} | {gain(gpu, k - 1)} | {gain(model, k - 1)} |")
    return "\n".join(lines + gains)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true", help="time the cases on the GPU")
    ap.add_argument("--profile", action="store_true",
                    help="launch each case once at each forced occupancy (GPU; run it under ncu)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "out")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--data", type=Path, default=DATA, help="the recording the report reads")
    args = ap.parse_args(argv)
    if args.measure:
        print(f"wrote {measure(args.out, args.warmup, args.reps, args.batches)}")
        return 0
    if args.profile:
        profile()
        return 0
    if not args.data.exists():
        raise SystemExit(f"no recording at {args.data}: run with --measure on a GPU first")
    print(report(load(args.data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
