"""`fa compare`: the simulator against the GPU on the same seeded inputs, checkpoint by checkpoint.

Runs fa_sim.simulate and fa_hw.forward (debug build) on the same inputs (random, or q, k, v from
`--npz FILE` as in `fa sim`), recording the
checkpoints of the chosen CTAs (default: the first and the last CTA of the grid), and prints per
checkpoint the fraction of bit-identical values, the largest difference in ulps against its
documented bound (fa_sim.crosscheck.BOUNDS) and the first mismatch; then O and LSE statistics.
Exit status 0 only when every checkpoint is within its bound, 1 otherwise.

`--save FILE` keeps the GPU side (inputs, O, LSE, checkpoint buffer, config as tag and as
KernelConfig JSON, causal flag, scale, the features: k's heads, window, softcap, bf16 values as
float32; a packed batch's offsets; a split-KV run's splits, cache lengths, pack_gqa, workspace and
combine source; fa_sim.saved_run format 5) in an .npz (refused if FILE exists, unless --force;
checked before the GPU runs). `--gpu-npz FILE` compares against such a file instead of launching,
so the comparison runs on machines without a GPU: the file's inputs, config, causal flag, scale,
launch kind and CTAs are used; an option that disagrees with them is refused (--seqlens, --splits,
--cache-seqlens, --pack-gqa always: the file fixes the launch), `--ctas` may pick a subset of the
recorded CTAs. A packed batch (--seqlens, a packed --npz file) is compared checkpoint by checkpoint
(FA_VARLEN's debug build on both sides; the simulator's side on the PTX engine): each CTA at its
sequence's coordinates, CTA ids those of the packed grid (ceil(max Nq / block_m), H, B),
blockIdx.x + n_m_blocks (h + H b), default the first and the last CTA that runs (not with --config
auto). Split-KV decoding (--splits N|auto, --cache-seqlens, --pack-gqa) too:
the split kernel's debug build (FA_SPLITKV with FA_CHECKPOINTS) on both sides for the CTAs of
--ctas (ids of the split grid, blockIdx.x + n_m_blocks (bh + B H split), default the first and the
last that run; round t a split's t-th K/V block; with splits > 1 no sO), then every split's partial
O and LSE (the fp32 workspace) and the combine's O and LSE, all bit for bit (docs/features.md, "The
commands"); its replay runs the recorded fa2_fwd.cu and fa2_combine.cu. `--banks` sets the
simulator's shared-memory counts beside Nsight Compute's (needs ncu and a GPU); `--timing` the
kernel's measured time and Nsight Compute's stall reasons beside the timing model's (fa time); both
take the features (--heads-k, --window, --softcap, --dtype bf16: that build profiled, simulated and
predicted). A packed batch's FA_VARLEN launch is profiled whole (its --banks counts are `fa banks
--seqlens`'); split-KV's split launch (FA_SPLITKV, selected by its kernel name; fa2_combine.cu uses no
shared memory, so --banks counts the split launch alone, as `fa banks --splits`), its --timing the
time of both launches beside `fa time --splits`' sum, the stall reasons the split launch's.

`--backward` compares the backward pass instead (fa_sim/commands/backward_gpu.py): fa_hw.backward on
the GPU against fa_sim.simulate_backward (mma model h200) from the same q, k, v, seeded dO and the
GPU forward's O and LSE, both running the main kernel's debug build (FA_BWD_CHECKPOINTS) for the
CTAs of `--ctas` (linear ids of its grid, n_block + n_kv_blocks * bh): per checkpoint (S, P, dP,
dS, dV, dK per round, the sQ, sdO, sK, sV images) the fraction of bit-identical values and the
first mismatch, every one required bit for bit in both dQ modes; then the gradients: `--dq
deterministic` (default) requires dQ, dK, dV bit for bit; `--dq atomic` dK, dV bit for bit and dQ
within the float64 bound on both sides (the GPU's order of the atomic additions varies from run to run).
`--dtype bf16` compares the bf16 builds (ulps of bf16).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from ..cache import stored_file
from ..config import KernelConfig
from ..contract import kernel_source, seed_source
from ..crosscheck import (
    SavedRun,
    build_report,
    format_report,
    simulate_with_checkpoints,
)
from ..problem import Problem
from ..saved_run import OPTIONAL_ARRAYS, SAVED_ARRAYS
from ..timing.cost import timing_cost
from ..reference import random_inputs as reference_inputs
from . import UsageError
from .common import (
    add_seqlens_argument,
    add_splitkv_arguments,
    add_config_arguments,
    packed_engine,
    packed_inputs,
    packed_problem,
    packed_random_inputs,
    checkpoint_ctas_option,
    add_engine_arguments,
    add_problem_arguments,
    auto_requested,
    check_input_memory,
    check_scale,
    config_from_args,
    config_options,
    explicit,
    features,
    front_end,
    heads_k,
    kernel_from_args,
    inputs_head_dim,
    option_name,
    problem_shape,
    refuse,
    run_inputs,
    splitkv,
)
from .backward import add_backward_arguments
from .inputs import HelpFormatter, add_inputs_argument, load_npz
from .outputs import Kind, Output, atomic_path, check_outputs
from .preflight import announce, check_engine, problem_of, qkv_shapes

SIM_MMA = "h200"  # the tensor-core model simulate_with_checkpoints runs (fa_sim.crosscheck)

FIELDS = SAVED_ARRAYS
ACCEPTED = "a GPU run written by fa compare --save (arrays " + ", ".join(FIELDS) + ")"


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="simulator against GPU, checkpoint by checkpoint",
                              description=__doc__, formatter_class=HelpFormatter)
    add_problem_arguments(p)
    add_config_arguments(p)
    add_engine_arguments(p)
    add_inputs_argument(p)
    add_seqlens_argument(p)
    add_splitkv_arguments(p)
    p.add_argument("--ctas", default=None,
                   help="comma-separated linear CTA ids to checkpoint (with --backward: of the main kernel's "
                        "grid, n_block + n_kv_blocks * bh) (default: the first and the last)")
    p.add_argument("--save", metavar="FILE", default=None,
                   help="save the GPU side to FILE (.npz) for later --gpu-npz runs (default: not saved)")
    p.add_argument("--gpu-npz", metavar="FILE", default=None,
                   help="compare against a saved GPU run instead of launching: no GPU needed (default: launch)")
    p.add_argument("--banks", action="store_true", help="bank conflicts: simulator beside Nsight Compute (needs ncu)")
    p.add_argument("--timing", action="store_true",
                   help="kernel time: measured (CUDA events) and Nsight Compute's stall reasons beside the timing "
                        "model's prediction (fa time; needs ncu)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--force", action="store_true", help="overwrite an existing --save file (default: refuse)")
    add_backward_arguments(p)
    p.set_defaults(func=run)


def load_recording(path) -> SavedRun:
    """A saved GPU run (fa_sim.crosscheck.SavedRun); bad files are one UsageError naming --gpu-npz
    and the file."""
    data = load_npz(path, FIELDS, "--gpu-npz", ACCEPTED, optional=OPTIONAL_ARRAYS)
    try:
        return SavedRun.from_arrays(data)
    except ValueError as exc:
        raise UsageError(f"--gpu-npz {path}: {exc}") from None


def _given(dest: str, value) -> str:
    """How a value reads as options: '--seqlen 128', '--causal on'."""
    shown = (("on" if value else "off") if isinstance(value, bool)
             else ",".join(map(str, value)) if isinstance(value, tuple) else value)
    return f"{option_name(dest)} {shown}"


def _check_against(args, rec: SavedRun, path) -> None:
    """Refuse explicit options that disagree with what the file recorded."""
    refuse(args, ("save", "banks", "timing"), "with --gpu-npz, which launches nothing")
    refuse(args, ("config",), "with --gpu-npz, whose recording fixes the config")
    refuse(args, ("npz",), "with --gpu-npz, whose recording holds the inputs")
    prob = rec.problem
    d = prob.head_dim
    recorded = {"heads": prob.heads, "heads_k": rec.heads_k, "causal": rec.causal, "scale": rec.scale,
                "window": rec.window, "softcap": rec.softcap,
                **{o.dest: v for o, v in zip(config_options(), rec.config.to_json().values())}}
    if rec.kind == "packed":
        refuse(args, ("batch", "seqlen", "seqlen_k"), f"with --gpu-npz {path}, a packed batch whose offsets fix the "
                                                      f"lengths")
    else:
        recorded.update(batch=prob.batch, seqlen=prob.seqlen_q, seqlen_k=prob.seqlen_k)
    for dest, value in recorded.items():
        mine = getattr(args, dest)
        if dest == "window" and mine is not None and value is None:
            value = (-1, -1)  # a recording without a window: --window -1,-1 agrees with it
        if dest in explicit(args) and mine != value:
            raise UsageError(f"{_given(dest, mine)} disagrees with --gpu-npz {path}, recorded with "
                             f"{_given(dest, value)}; drop the option (the file fixes inputs, config, causal flag, "
                             f"scale and features)")
    if "seed" in explicit(args):
        if rec.kind == "packed":  # commands/common.packed_random_inputs: one [1, H, total, d] draw, token-major
            again = reference_inputs(1, prob.heads, prob.total_q, prob.total_k, d, args.seed, heads_k=rec.heads_k,
                                     dtype=rec.config.dtype)
            again = [x[0].transpose(1, 0, 2) for x in again]
        else:
            again = reference_inputs(prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, d, args.seed,
                                     heads_k=rec.heads_k, dtype=rec.config.dtype)
        if not all(np.array_equal(x, y) for x, y in zip(again, (rec.q, rec.k, rec.v))):
            raise UsageError(f"--seed {args.seed}: the inputs in --gpu-npz {path} are not the random inputs "
                             f"of this seed; drop --seed (the file holds its inputs)")


def _recorded_kernel(args, rec: SavedRun):
    """The kernel to simulate for a recording: --kernel if given (its source must be the recorded
    one), the shipped kernel when the recording ran it (or predates recorded sources), else the
    recorded source itself, written once to the cache, or to a temporary file where there is no
    usable cache (the PTX engine simulates it)."""
    given = kernel_from_args(args)
    if not rec.kernel_source:
        return given
    if given is not None:
        if kernel_source(given).text != rec.kernel_source:
            raise UsageError(f"--kernel {given} is not the kernel --gpu-npz {args.gpu_npz} was recorded with "
                             f"({rec.kernel_name}); drop --kernel to replay the recorded source")
        return given
    if rec.kernel_source == seed_source().text:
        return None
    return _stored_source(rec.kernel_source, rec.kernel_name)


def _stored_source(source: str, name: str) -> Path:
    """A recorded CUDA source written once to the cache (or a temporary file where there is no
    usable cache), for the PTX engine."""
    text = source.encode()
    # the recorded text is CUDA C++ even when the run came from a patch: a .cu file either way
    path = stored_file("recorded_kernels", f"{hashlib.sha256(text).hexdigest()[:16]}-{Path(name).stem}.cu", text)
    print(f"replaying the recorded kernel {name} on the PTX engine", file=sys.stderr)
    return path


def _replay(args, rec: SavedRun):
    """A dense or packed recording: its inputs, config, CTAs (--ctas: a subset), GPU side, kernel."""
    kernel = _recorded_kernel(args, rec)
    if rec.kind == "packed":  # FA_VARLEN runs on the PTX engine
        if args.engine == "program":
            raise UsageError(f"--engine program does not run a packed batch (--gpu-npz {args.gpu_npz} holds one): "
                             f"fa2_fwd.cu's FA_VARLEN offsets are not modelled by the hand-written program; drop it")
        args.engine = "ptx"
    ctas = checkpoint_ctas_option(args.ctas, rec.n_ctas, rec.ctas)
    rows = [rec.ctas.index(c) for c in ctas]
    feats = {"window": rec.window, "softcap": rec.softcap}
    if rec.kind == "packed":
        feats.update(cu_seqlens_q=np.asarray(rec.cu_seqlens[0], np.int32),
                     cu_seqlens_k=np.asarray(rec.cu_seqlens[1], np.int32))
    return ((rec.q, rec.k, rec.v), rec.config, rec.causal, ctas, (rec.o, rec.lse, rec.checkpoints[rows], rec.scale),
            kernel, feats)


def _replay_split(args, rec: SavedRun) -> int:
    """A split-KV recording on the PTX engine: the recorded fa2_fwd.cu and fa2_combine.cu (the shipped
    files when they are the same text), the recorded CTAs (--ctas: a subset), then the workspace and
    the combine's O and LSE against the recording's, as a live `fa compare --splits`."""
    from ..contract.source import SEED_PATH
    from ..crosscheck import SplitRun
    from ..splitkv import COMBINE_PATH

    if args.kernel is not None:
        raise UsageError(f"--kernel does not apply with --gpu-npz {args.gpu_npz}, a split-KV run of fa_hw's own kernel "
                         f"(the recording holds its source); drop --kernel")
    _split_engine(args)
    ctas = checkpoint_ctas_option(args.ctas, rec.n_ctas, rec.ctas)
    rows = [rec.ctas.index(c) for c in ctas]
    sources = None
    combine_now = COMBINE_PATH.read_text()
    if rec.kernel_source != seed_source().text or (rec.splits > 1 and rec.combine_source != combine_now):
        fwd = SEED_PATH if rec.kernel_source == seed_source().text else _stored_source(rec.kernel_source,
                                                                                       rec.kernel_name)
        comb = COMBINE_PATH if rec.splits == 1 or rec.combine_source == combine_now else \
            _stored_source(rec.combine_source, COMBINE_PATH.name)
        sources = (fwd, comb)
    gpu = SplitRun(rec.o, rec.lse, rec.o_accum, rec.lse_accum, rec.checkpoints[rows])
    return _split_report(args, (rec.q, rec.k, rec.v), rec.scale, rec.config, ctas, rec.splits, rec.cache_seqlens,
                         rec.pack_gqa, rec.softcap, gpu, sources)


def _launch_config(args, d: int, shapes):
    if auto_requested(args):  # the GPU's tuned choice; the simulator runs the same config
        from fa_hw.autotune import Features
        from fa_hw.tuned import auto_for_device

        try:  # the launch's checks (the file's shapes, the features) before any timing
            plain = problem_of(shapes, args.causal, args.scale, KernelConfig(head_dim=d, dtype=args.dtype),
                               **features(args))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return auto_for_device(d, args.causal, plain.seqlen_k, plain.seqlen_q, plain.batch * plain.heads,
                               Features.of(plain)).config  # in --dtype: the candidates were timed in it
    return config_from_args(args, head_dim=d)


def _launch(args, save: Output | None):
    """Every check (commands/preflight.py), then the inputs, then the GPU run."""
    import fa_hw

    files = packed_inputs(args, None)  # args.cu_seqlens: a packed --npz file's offsets or --seqlens'
    if args.cu_seqlens is not None:
        return _launch_packed(args, save, files)
    d = inputs_head_dim(args, files)
    check_scale(args, d)
    shapes = ([tuple(np.shape(x)) for x in files] if files is not None
              else qkv_shapes(problem_shape(args), heads_k(args)))
    (b, h, nq, _), nk = shapes[0], shapes[1][2]
    config = _launch_config(args, d, shapes)
    ctas = checkpoint_ctas_option(args.ctas, Problem(b, h, nq, nk, args.causal, 1.0, config).n_ctas)
    if args.timing:  # the timing model runs after the GPU: its sizes are checked before (fa_sim.timing.cost)
        try:
            timing_cost(Problem(b, h, nq, nk, args.causal, 1.0, config, heads_k=shapes[1][1],
                                **features(args))).check(
                f"--timing at (B, H, Nq, Nk) = ({b}, {h}, {nq}, {nk})", "drop --timing or lower the sizes")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    kernel = kernel_from_args(args)
    front = _front(args, config, kernel, args.softcap)
    if files is None:
        check_input_memory(args)
    from fa_hw.runtime import check_launch

    check_launch(config, args.causal, kernel, checkpoints=True)
    try:
        prob = problem_of(shapes, args.causal, args.scale, config, **features(args))
    except ValueError as exc:  # the file's shapes (k's heads not dividing q's, ...)
        raise UsageError(str(exc)) from None
    announce("compare", prob, SIM_MMA, reference=False)
    q, k, v = run_inputs(args, config, files)
    out = fa_hw.forward(q, k, v, causal=args.causal, scale=args.scale, config=config, checkpoint_ctas=ctas,
                        kernel=kernel, **features(args))
    if save is not None:
        source = kernel_source(kernel)  # what the GPU compiled: a patch is saved applied
        with atomic_path(save.path) as tmp, open(tmp, "wb") as f:
            SavedRun(q, k, v, np.asarray(out.o), out.lse, out.checkpoints, tuple(ctas), config, args.causal,
                     out.scale, source.name, source.text, args.window, args.softcap).save(f)
        print(f"wrote {save.path}", file=sys.stderr)
    return (q, k, v), config, args.causal, ctas, (out.o, out.lse, out.checkpoints, out.scale), front, features(args)


def _launch_packed(args, save: Output | None, files):
    """A packed batch (fa2_fwd.cu's FA_VARLEN debug build on both sides): every check, then the inputs
    (the --npz file's, or random ones of --seqlens), then the GPU run."""
    import fa_hw

    packed_engine(args)  # the PTX engine runs FA_VARLEN; --engine program refused in one line
    if auto_requested(args):
        raise UsageError("--config auto does not apply to a packed batch in fa compare: name a config tag (or "
                         "drop --config for the default)")
    d = inputs_head_dim(args, files)
    check_scale(args, d)
    config = config_from_args(args, head_dim=d)
    prob = packed_problem(args, files, config)  # the offsets, heads_k, the features: one line each
    ctas = checkpoint_ctas_option(args.ctas, prob.n_ctas, None if args.ctas is not None else _default_packed(prob))
    kernel = kernel_from_args(args)
    if args.timing:  # the timing model's packed launch (fa time --seqlens), its size checked before the GPU runs
        if kernel is not None:
            raise UsageError("--timing of a packed batch times fa2_fwd.cu's own FA_VARLEN build (fa time --seqlens): "
                             "drop --kernel or --timing")
        from ..timing.launches import varlen_cta_rounds

        _check_timing_size(prob.config, varlen_cta_rounds(prob), f"--timing of the packed batch of query lengths "
                           f"{','.join(map(str, prob.seqlens_q)):.60}")
    front = _front(args, config, kernel, args.softcap)
    if files is None:
        check_input_memory(args)
    from fa_hw.runtime import check_launch

    check_launch(config, args.causal, kernel, checkpoints=True)
    announce("compare", prob, SIM_MMA, reference=False)
    q, k, v = files if files is not None else packed_random_inputs(args, prob, config.dtype)
    cu = {"cu_seqlens_q": args.cu_seqlens[0], "cu_seqlens_k": args.cu_seqlens[1]}
    out = fa_hw.forward(q, k, v, causal=args.causal, scale=args.scale, config=config, checkpoint_ctas=ctas,
                        kernel=kernel, **features(args), **cu)
    if save is not None:
        source = kernel_source(kernel)  # what the GPU compiled: a patch is saved applied
        with atomic_path(save.path) as tmp, open(tmp, "wb") as f:
            SavedRun(q, k, v, np.asarray(out.o), out.lse, out.checkpoints, tuple(ctas), config, args.causal,
                     out.scale, source.name, source.text, args.window, args.softcap,
                     cu_seqlens=prob.cu_seqlens).save(f)
        print(f"wrote {save.path}", file=sys.stderr)
    return (q, k, v), config, args.causal, ctas, (out.o, out.lse, out.checkpoints, out.scale), front, \
        {**features(args), **cu}


def _check_timing_size(config, cta_rounds, what: str) -> None:
    """--timing of a packed batch or of split-KV: the timing model's size limit (fa_sim.timing.launches.
    check_size, on the H200 model fa_hw.profile.timing_comparison predicts with) as one UsageError line."""
    from ..timing.gpus import gpu_model
    from ..timing.launches import check_size

    try:
        check_size(config, cta_rounds, gpu_model("h200"), what, "drop --timing or lower the sizes")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _default_packed(prob: Problem) -> list[int]:
    """The default CTAs of a packed launch: the first and the last that run (a CTA whose Q block is
    past its sequence's end exits at once and records nothing)."""
    return _first_and_last(np.flatnonzero(prob.rounds_per_cta(np.arange(prob.n_ctas)) > 0))


def _first_and_last(live) -> list[int]:
    """The default CTAs of a launch whose CTAs `live` (ascending ids) run at least one round."""
    return sorted({int(live[0]), int(live[-1])})


def _front(args, config, recorded, softcap=None):
    """The simulator's front end for this run (the kernel the GPU ran, if any: --kernel's or the
    recording's), checked now (commands/preflight.check_engine: a PTX program is compiled)."""
    if recorded is not None and args.engine == "program":
        raise UsageError("--engine program runs the shipped kernel; this run's kernel "
                         f"({Path(recorded).name}) is simulated by the PTX engine: drop --engine program")
    front = front_end(args.engine, recorded, config, softcap)
    check_engine(front, config, args.causal, checkpoints=True)
    return front


def _run_split(args, split: dict) -> int:
    """Split-KV decoding (`split`: commands/common.splitkv): the split kernel's debug build on the GPU
    and on the PTX engine for the CTAs of --ctas (ids of the split grid, default the first and the
    last that run), then the workspace and the combine's O and LSE; every check before the inputs."""
    import fa_hw

    save = None if args.save is None else Output("--save", Path(args.save), Kind.FILE)
    check_outputs(args, save)  # before the GPU runs
    if auto_requested(args) or args.kernel is not None:
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) run fa_hw's own kernel: without --config auto "
                         "or --kernel")
    _split_engine(args)
    files = packed_inputs(args, split)  # a packed batch with splits: one line
    d = inputs_head_dim(args, files)
    check_scale(args, d)
    config = config_from_args(args, head_dim=d)
    shapes = ([tuple(np.shape(x)) for x in files] if files is not None
              else qkv_shapes(problem_shape(args), heads_k(args)))
    from ..splitkv import check_splitkv

    try:
        prob = problem_of(shapes, False, args.scale, config, **features(args))
        sms = None
        if split["splits"] == "auto":  # the GPU's choice: its SM count
            from fa_hw.device import device

            sms = device().properties.multiprocessor_count
        plan = check_splitkv(prob, split["splits"], split["cache_seqlens"], sms, split.get("pack_gqa"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.timing:  # the timing model's two launches (fa time --splits), their size checked before the GPU runs
        from ..timing.launches import splitkv_cta_rounds

        _check_timing_size(config, splitkv_cta_rounds(plan), f"--timing of split-KV decoding with {plan.splits} splits")
    live = [c for c in range(plan.n_ctas) if plan.cta(c)[4] > 0]
    ctas = checkpoint_ctas_option(args.ctas, plan.n_ctas, None if args.ctas is not None else _first_and_last(live))
    if files is None:
        check_input_memory(args)
    from fa_hw.runtime import check_launch

    check_launch(config, False, None, checkpoints=True)
    announce("compare", prob, SIM_MMA, reference=False)
    q, k, v = run_inputs(args, config, files)
    pack = {} if "pack_gqa" not in split else {"pack_gqa": split["pack_gqa"]}
    out = fa_hw.forward(q, k, v, causal=False, scale=args.scale, config=config, checkpoint_ctas=ctas,
                        **features(args), splits=plan.splits, cache_seqlens=split["cache_seqlens"], **pack)
    from ..crosscheck import SplitRun

    work = out.workspace
    gpu = SplitRun(out.o, out.lse, work[0], work[1], out.checkpoints)
    if save is not None:  # the workspace only with several splits: with one the kernel does not write it
        from ..contract.source import seed_source as fwd_source
        from ..splitkv import COMBINE_PATH

        many = plan.splits > 1
        with atomic_path(save.path) as tmp, open(tmp, "wb") as f:
            SavedRun(q, k, v, np.asarray(out.o), out.lse, out.checkpoints, tuple(ctas), config, False, out.scale,
                     fwd_source().name, fwd_source().text, None, args.softcap, splits=plan.splits,
                     cache_seqlens=plan.cache_seqlens, pack_gqa=plan.unpacked is not None,
                     o_accum=work[0] if many else None, lse_accum=work[1] if many else None,
                     combine_source=COMBINE_PATH.read_text() if many else "").save(f)
        print(f"wrote {save.path}", file=sys.stderr)
    banks = timing = None
    launch = {"splits": plan.splits, "cache_seqlens": split["cache_seqlens"], **pack}  # the splits that ran
    if args.banks:  # the split launch, simulated and profiled (fa2_combine.cu uses no shared memory)
        from fa_hw.profile import bank_comparison

        banks = bank_comparison(q, k, v, False, args.scale, config, window=args.window, softcap=args.softcap,
                                **launch)
    if args.timing:
        from fa_hw.profile import timing_comparison

        timing = timing_comparison(q, k, v, False, args.scale, config, window=args.window, softcap=args.softcap,
                                   **launch)
    return _split_report(args, (q, k, v), out.scale, config, ctas, plan.splits, split["cache_seqlens"],
                         split.get("pack_gqa"), args.softcap, gpu, banks=banks, timing=timing)


def _split_engine(args) -> None:
    """Split-KV runs on the PTX engine only: --engine program refused in one line."""
    if args.engine == "program":
        raise UsageError("--engine program does not run split-KV decoding: the PTX engine runs fa2_fwd.cu's FA_SPLITKV "
                         "and fa2_combine.cu; drop --engine")


def _split_report(args, qkv, scale, config, ctas, splits, cache_seqlens, pack_gqa, softcap, gpu, sources=None, *,
                  banks=None, timing=None) -> int:
    """The simulator's side of a split-KV run (the split kernel's debug build for `ctas`, the combine)
    against `gpu` (a live run's or a recording's SplitRun): the report printed (with --banks' and
    --timing's comparisons of a live run), the exit status."""
    from ..crosscheck import build_splitkv_report, simulate_splitkv_with_checkpoints

    sim, plan = simulate_splitkv_with_checkpoints(*qkv, scale, config, ctas, splits, cache_seqlens, pack_gqa, softcap,
                                                  sources=sources)
    report = build_splitkv_report(qkv[0], qkv[1], plan, ctas, sim, gpu)
    _print(args, report, banks, timing)
    return 0 if report.ok else 1


def _print(args, report, banks, timing) -> None:
    """The report, then --banks' and --timing's comparisons (fa_hw.profile) if made: one JSON object
    with --json, else the tables."""
    if args.json:
        obj = report.to_json()
        if banks is not None:
            obj["banks"] = banks.to_json()
        if timing is not None:
            obj["timing"] = timing.to_json()
        print(json.dumps(obj))
        return
    print(format_report(report))
    if banks is not None:
        from fa_hw.profile import format_bank_comparison

        print(format_bank_comparison(banks))
    if timing is not None:
        from fa_hw.profile import format_timing_comparison

        print(format_timing_comparison(timing))


def run(args) -> int:
    from . import backward

    backward.check_options(args, ("kernel", "save", "gpu_npz", "banks", "timing"))
    if args.backward:
        from .backward_gpu import compare
        return compare(args)
    rec = None
    if args.gpu_npz is not None:  # the recording fixes the launch: dense, packed or split-KV
        refuse(args, ("seqlens", "splits", "cache_seqlens", "pack_gqa"),
               "with --gpu-npz, whose recording fixes the launch (its offsets, splits and cache lengths, if any)")
        rec = load_recording(args.gpu_npz)
        _check_against(args, rec, args.gpu_npz)
        if rec.kind == "split":
            return _replay_split(args, rec)
    else:
        split = splitkv(args)  # --splits, --cache-seqlens (or the --npz file's), --pack-gqa (alone: refused)
        if split:
            return _run_split(args, split)
    save = None if args.save is None else Output("--save", Path(args.save), Kind.FILE)
    if rec is not None:
        (q, k, v), config, causal, ctas, gpu, recorded, feats = _replay(args, rec)
        front = _front(args, config, recorded, feats["softcap"])
    else:
        check_outputs(args, save)
        (q, k, v), config, causal, ctas, gpu, front, feats = _launch(args, save)
    o, lse, gpu_buf, scale = gpu
    sim_res, sim_buf = simulate_with_checkpoints(q, k, v, causal, scale, config, ctas, engine=front, **feats)
    kernel = kernel_from_args(args)  # what Nsight Compute profiles below: the user's --kernel
    report = build_report(q, k, v, causal, config, ctas, sim_res, sim_buf, o, lse, gpu_buf, **feats)
    banks = None
    if args.banks:  # that feature's build; a packed batch's FA_VARLEN launch (feats: its offsets)
        from fa_hw.profile import bank_comparison

        banks = bank_comparison(q, k, v, causal, scale, config, kernel, **feats)
    timing = None
    if args.timing:
        from fa_hw.profile import timing_comparison

        timing = timing_comparison(q, k, v, causal, scale, config, kernel, **feats)
    _print(args, report, banks, timing)
    return 0 if report.ok else 1
