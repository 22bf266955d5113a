"""pingpong timed on the GPU and by the timing model (issue 35: "pingpong timed").

    python experiments/timing_pingpong.py --measure [--out F]   # GPU: -> tests/data/h200/timing_pingpong.json
    python experiments/timing_pingpong.py --predict [--measured F]

Each pingpong config beside the same config without pingpong, at the shapes in `SHAPES` (random
normal fp16 inputs from a fixed seed, CUDA events around each launch after warm-up, the median of
3 batches of 20: fa_hw.profile.measure_time). --predict prints measured against predicted
(fa_sim.timing.predict) and, per pair, the measured and predicted effect of pingpong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "tests" / "data" / "h200" / "timing_pingpong.json"
CONFIGS = ("m128n64d64w8-swizzled-s2", "m256n128d64w8-swizzled-s2", "m256n64d128w8-swizzled-s2",
           "m128n64d128w8-swizzled-s3")
SHAPES = ((4, 16, 4096, 4096, False), (4, 16, 4096, 4096, True), (2, 16, 3000, 3000, True))


def cases() -> list[tuple[str, tuple]]:
    """(config tag, shape) of every launch: each config with and without pingpong."""
    return [(tag + pp, shape) for tag in CONFIGS for pp in ("", "-pp") for shape in SHAPES]


def _config(tag: str):
    from fa_sim.config import KernelConfig

    return KernelConfig.from_tag(tag)


def measure(out: Path) -> None:
    from fa_hw.device import device
    from fa_hw.profile import measure_time

    rows = []
    for tag, (b, h, nq, nk, causal) in cases():
        rng = np.random.default_rng(38)
        q, k, v = (rng.standard_normal((b, h, n, _config(tag).head_dim)).astype(np.float16) for n in (nq, nk, nk))
        ms, batches = measure_time(q, k, v, causal, None, _config(tag))
        rows.append({"config": tag, "shape": [b, h, nq, nk], "causal": causal, "ms": ms, "batches": list(batches)})
        print(f"{tag:32s} {b}x{h}x{nq}x{nk} causal={causal!s:5s} {ms:8.4f} ms", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device().name, "rows": rows}, indent=1) + "\n")


def predict(measured: Path, gpu: str) -> None:
    from fa_sim.problem import Problem
    from fa_sim.timing import predict as model

    data = json.loads(measured.read_text())
    got = {}
    print(f"{'config':32s} {'shape':16s} causal  measured  predicted  error")
    for r in data["rows"]:
        b, h, nq, nk = r["shape"]
        p = model(Problem(b, h, nq, nk, r["causal"], 1.0, _config(r["config"])), gpu).kernel_ms
        got[(r["config"], tuple(r["shape"]), r["causal"])] = (r["ms"], p)
        print(f"{r['config']:32s} {'x'.join(map(str, r['shape'])):16s} {r['causal']!s:6s} {r['ms']:8.4f}  "
              f"{p:9.4f}  {100 * (p / r['ms'] - 1):+6.1f} %")
    print("\npingpong's effect (with / without - 1):")
    for (tag, shape, causal), (ms, p) in got.items():
        if tag.endswith("-pp"):
            ms0, p0 = got[(tag[:-3], shape, causal)]
            print(f"{tag:32s} {'x'.join(map(str, shape)):16s} {causal!s:6s} measured {100 * (ms / ms0 - 1):+6.1f} %, "
                  f"predicted {100 * (p / p0 - 1):+6.1f} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--measure", action="store_true")
    mode.add_argument("--predict", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--measured", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--gpu", default="h200")
    args = ap.parse_args(argv)
    if args.measure:
        measure(args.out)
    else:
        if not args.measured.is_file():
            print(f"no measurements at {args.measured}: run --measure on a GPU first", file=sys.stderr)
            return 2
        predict(args.measured, args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
