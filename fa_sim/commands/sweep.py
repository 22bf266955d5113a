"""`fa sweep`: configs x shapes x causal, every case simulated with the bank counter and the hazard
checker and measured against float64 (fa_sim.sweep), the cases spread over local processes
(--workers, default one per core) or a Dask cluster (--cluster).

Each kernel-config option takes a comma-separated list and the sweep runs their product (e.g.
`--smem swizzled,plain,padded --block-n 32,64`); a combination KernelConfig rejects is refused up
front with its reason. `--shape B,H,Nq[,Nk]` may be repeated (Nk defaults to Nq); `--causal` is
off, on or both. Prints one row per case: warp instructions, bank conflicts per class (LDGSTS:
excess wavefronts, which Nsight Compute does not call conflicts), hazards, relative error of O and
max |LSE error|, and with `--timing` the timing model's predicted kernel time (fa time); `--json`
prints a list of objects instead; `--plot DIR` writes the figure
sweep.png/.svg (checked before the sweep runs). Exit status 1 when a case shows hazards, a
non-finite result or an error above its documented bound (fa_sim.accuracy), else 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from ..config import KernelConfig
from ..messages import QUOTE_MOST, quoted
from . import UsageError
from .common import (INT32_MAX, add_engine_arguments, add_parallel_arguments, config_options, describe, front_end,
                     int_in, kernel_from_args)
from .outputs import Kind, Output, check_outputs, save_figure
from .preflight import check_cluster, check_engine

FIGURE = "sweep"
FORMATS = ("png", "svg")
CAUSAL = {"off": (False,), "on": (True,), "both": (False, True)}
DEFAULT_SHAPES = ("1,2,256",)
BOOLS = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="configs x shapes x causal in parallel: instructions, conflicts, hazards, errors",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = p.add_argument_group("kernel configs (comma-separated lists; the sweep runs their product)")
    for opt in config_options():
        default = "swizzled,plain,padded" if opt.dest == "smem" else _text(opt, opt.default)
        allowed = ("each on or off" if opt.hint is bool else
                   None if opt.choices is None else "each one of " + ", ".join(map(str, opt.choices)))
        group.add_argument(opt.option, dest=opt.dest, default=default, metavar="LIST",
                           help=describe(opt.help().split(" (default")[0], default, allowed))
    p.add_argument("--shape", dest="shapes", action="append", default=None, metavar="B,H,Nq[,Nk]",
                   help=describe("a problem shape, repeatable (Nk defaults to Nq)", " ".join(DEFAULT_SHAPES),
                                 "positive integers"))
    p.add_argument("--causal", choices=tuple(CAUSAL), default="both",
                   help=describe("causal mask off, on, or both", "both", "one of off, on, both"))
    p.add_argument("--seed", type=int_in("--seed", 0), default=0, metavar="N",
                   help=describe("seed of every case's standard-normal fp16 inputs", 0, "0 or more"))
    p.add_argument("--mma", default="exact", choices=["exact", "h200"],
                   help="tensor-core accumulation (default exact; one of exact, h200)")
    p.add_argument("--timing", nargs="?", const="h200", default=None, choices=("h200", "a100"), metavar="GPU",
                   help="add the timing model's predicted kernel time (fa time) for each case (GPU default h200; "
                        "one of h200, a100)")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per case, instead of the table")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help=f"write the figure {FIGURE}.png/.svg into DIR, created if missing (default: none)")
    p.add_argument("--force", action="store_true", help="overwrite existing figure files (default: refuse)")
    add_engine_arguments(p)
    add_parallel_arguments(p, "the cases")
    p.set_defaults(func=run)


def configs_from_args(args) -> list[KernelConfig]:
    """The product of the config options' lists; a rejected combination is a UsageError."""
    opts = config_options()
    axes = []
    for opt in opts:
        items = [t.strip() for t in str(getattr(args, opt.dest)).split(",") if t.strip()]
        if not items:
            raise UsageError(f"{opt.option} takes a comma-separated list of values, got an empty one")
        axes.append(list(dict.fromkeys(parse_item(opt, t) for t in items)))
    out = []
    for values in itertools.product(*axes):
        try:
            out.append(KernelConfig(**dict(zip((o.dest for o in opts), values))))
        except ValueError as exc:
            combo = " ".join(f"{o.option} {v}" for o, v in zip(opts, values))
            raise UsageError(f"{combo}: {exc} (narrow the lists so that every combination is valid)") from None
    return out


def _text(opt, value) -> str:
    return ("on" if value else "off") if opt.hint is bool else str(value)


def parse_item(opt, text: str):
    """One value of a config option's list: on/off for a bool field, else the option's own parse."""
    if opt.hint is not bool:
        return opt.parse(text)
    value = BOOLS.get(text.lower())
    if value is None:
        raise UsageError(f"{opt.option} {text}: expected on or off")
    return value


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    shown = text if len(text) <= QUOTE_MOST else quoted(text)
    if len(parts) not in (3, 4):
        raise UsageError(f"--shape {shown}: expected B,H,Nq or B,H,Nq,Nk")
    try:
        vals = [int(x, 10) for x in parts]
    except ValueError:
        raise UsageError(f"--shape {shown}: expected integers B,H,Nq[,Nk]") from None
    if any(not 1 <= x <= INT32_MAX for x in vals):
        raise UsageError(f"--shape {shown}: every size must be in 1 .. {INT32_MAX}")
    return tuple(vals) if len(vals) == 4 else (*vals, vals[2])


def _check(cases, args) -> None:
    """Before any case runs (commands/preflight.py): every config on its engine (the program
    refuses schedule options; the first PTX case's program is compiled, so a --kernel that does not
    build fails here), a --cluster scheduler's answer, then the estimate of the whole sweep
    (refused past this machine's memory) on stderr."""
    from .. import sweep
    from ..parallel import resolve_workers
    from ..run import PtxFrontEnd

    fronts = [front_end(c.engine, c.kernel, c.config) for c in cases]  # the program's configs: checked here
    ptx = next(((f, c) for f, c in zip(fronts, cases) if isinstance(f, PtxFrontEnd)), None)
    if ptx is not None:
        check_engine(ptx[0], ptx[1].config, ptx[1].causal)
    check_cluster(args.cluster)
    workers = 1 if args.cluster is not None else min(resolve_workers(args.workers), len(cases))
    print(f"fa sweep: {sweep.estimate_cases(cases).describe(workers)}", file=sys.stderr, flush=True)


def run(args) -> int:
    from .. import sweep

    plot = None if args.plot is None else Output("--plot", Path(args.plot), Kind.DIR,
                                                 tuple(f"{FIGURE}.{f}" for f in FORMATS))
    check_outputs(args, plot)
    shapes = [parse_shape(s) for s in (args.shapes or DEFAULT_SHAPES)]
    configs = configs_from_args(args)
    for config in configs:  # each config's front end (fa_sim.run), refused before any case runs
        front_end(args.engine, args.kernel, config)
    kernel = kernel_from_args(args)
    engine = args.engine or ("ptx" if kernel is not None else None)
    cases = sweep.make_cases(configs, shapes, CAUSAL[args.causal], args.seed, args.mma, engine,
                             None if kernel is None else str(kernel), args.timing)
    _check(cases, args)
    results = sweep.run_sweep(cases, workers=args.workers, cluster=args.cluster)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1, allow_nan=False))
    else:
        print(sweep.format_table(results, f"fa sweep: {len(cases)} cases"))
    if plot is not None:
        for path in save_figure(sweep.figure(results), plot.path / FIGURE, FORMATS):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1
