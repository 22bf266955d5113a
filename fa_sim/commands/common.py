"""Arguments shared by the subcommands that run the kernel (`fa sim`, `trace`, `banks`, `hw`,
`compare`, `layout`): the problem shape, the kernel config, ranges and refusals.

Config options are generated from KernelConfig's fields (their metadata: meaning, allowed values,
option name), so a new field is an option of every command and reaches `config_from_args`
without an edit here. Every option's help states its meaning, default and allowed values.

Values outside their range raise `UsageError` from inside argparse's type call: argparse passes
any exception that is not a ValueError/TypeError through, so the message keeps our wording and
names the option, and `fa_sim/cli.py` prints it as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import typing
from pathlib import Path

import numpy as np

from ..config import FIELD_CHOICES, FIELD_HELP, FIELD_OPTION, WARP_SIZE, KernelConfig
from ..contract import KernelSourceError, kernel_source
from ..messages import QUOTE_MOST, listed, quoted
from ..reference import random_inputs as _random_inputs
from ..run import CLI, ENGINES, FrontEnd, choose_front_end
from . import UsageError
from .inputs import check_host_memory, inputs_option, load_qkv

INT32_MAX = 2**31 - 1  # the CUDA kernel takes batch, heads and sequence lengths as int
SIZE_RANGE = f"1 .. {INT32_MAX}"
SIZE_ERROR = f"1 .. {INT32_MAX}, the kernel's 32-bit sizes"


def describe(meaning: str, default=None, allowed: str | None = None) -> str:
    """Help text: meaning, then default and allowed values (argparse escapes: %% for %)."""
    parts = [] if default is None else [f"default {default}"]
    parts += [] if allowed is None else [allowed]
    text = f"{meaning} ({'; '.join(parts)})" if parts else meaning
    return text.replace("%", "%%")


def int_in(option: str, lo: int, hi: int | None = None, allowed: str | None = None):
    """argparse type: an integer in lo..hi (hi None: unbounded); the error names the option."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise UsageError(f"{option} takes an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            rng = allowed or (f"{lo} .. {hi}" if hi is not None else f"{lo} or more")
            raise UsageError(f"{option} {text} is out of range; allowed: {rng}")
        return value
    return parse


def positive_float(option: str, fp32: bool = False):
    """argparse type: a positive finite number; with `fp32`, also finite and nonzero in fp32 (the
    kernel's type for it), checked without numpy's overflow warnings."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{option} takes a number, got {text!r}") from None
        if not (0 < value < float("inf")):
            raise UsageError(f"{option} {text} is out of range; allowed: a positive finite number")
        if fp32:
            with np.errstate(over="ignore", under="ignore"):  # the overflow is what is checked here
                single = np.float32(value)
            if not (0 < single < np.inf):
                raise UsageError(f"{option} {text} is out of range; allowed: a positive number that is finite "
                                 f"and nonzero in fp32 (at most {float(np.finfo(np.float32).max):.4g})")
        return value
    return parse


def check_scale(args, head_dim: int) -> None:
    """--scale against the largest scale of this head_dim (fa_sim.validate.max_scale), named as the
    option, before any work."""
    from ..validate import max_scale

    scale = getattr(args, "scale", None)
    if scale is not None and scale > max_scale(head_dim):
        raise UsageError(f"--scale {scale:g} is out of range at head_dim {head_dim}; allowed: at most "
                         f"{max_scale(head_dim):.3g}, so that scale*log2(e)*q.k stays finite in fp32 for every "
                         f"fp16 input")


# -- the simulator's front end and the kernel source ------------------------------------------------
def add_engine_arguments(p, simulator: bool = True) -> None:
    """--engine (simulators) and --kernel (every command that runs the kernel)."""
    if simulator:
        p.add_argument("--engine", choices=ENGINES, default=None, metavar="{program,ptx}",
                       help=describe("simulator front end: program = the hand-written readable model "
                                     "(fa_sim/kernels/fa2_fwd.py); ptx = the PTX NVRTC emits for the kernel "
                                     "source, executed instruction by instruction", "program; ptx with --kernel",
                                     "one of program, ptx"))
    p.add_argument("--kernel", metavar="FILE", default=None,
                   help=describe("a variant of fa2_fwd.cu (same parameters and FA_* macros) to " +
                                 ("simulate on the PTX engine" if simulator else "compile and run") +
                                 ("; `fa compare` also runs it on the GPU" if simulator else ""),
                                 "fa_hw/kernels/fa2_fwd.cu",
                                 "an existing .cu file, or a .patch/.diff against fa2_fwd.cu applied to it"))


def kernel_from_args(args) -> Path | None:
    """The --kernel file, checked by the kernel contract (an existing UTF-8 .cu, or a .patch/.diff
    whose hunks apply to fa2_fwd.cu), or None."""
    if getattr(args, "kernel", None) is None:
        return None
    try:
        kernel_source(args.kernel, option="--kernel")
    except KernelSourceError as exc:
        raise UsageError(str(exc)) from None
    return Path(args.kernel)


def front_end(engine: str | None, kernel, config: KernelConfig, softcap: float | None = None) -> FrontEnd:
    """fa_sim.run.choose_front_end, its messages naming --engine and --kernel; a refusal is a UsageError.
    `softcap`: the hand-written program does not model it (the PTX engine runs it)."""
    from ..problem import Problem

    features = Problem(1, 1, 1, 1, False, 1.0, config, softcap=softcap) if softcap else None
    try:
        return choose_front_end(engine, kernel, config, names=CLI, problem=features)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def engine_from_args(args, config: KernelConfig) -> FrontEnd:
    """The front end --engine and --kernel choose for `config`: --kernel means the PTX engine
    (--engine program with it is refused); neither: the one `config` needs (the PTX engine for
    schedule options or --softcap). Commands pass the value down to fa_sim.simulate(engine=...)."""
    return front_end(getattr(args, "engine", None), getattr(args, "kernel", None), config,
                     getattr(args, "softcap", None))


# -- the problem: shapes, causal flag, scale, seed --------------------------------------------------
PROBLEM_DESTS = ("batch", "heads", "heads_k", "seqlen", "seqlen_k", "head_dim", "seed")


def add_problem_arguments(p, seqlen: int = 128, heads: int = 1, scale: bool = True) -> None:
    """--batch --heads --seqlen --seqlen-k --causal [--scale] --seed (--head-dim is a config field)."""
    size = SIZE_RANGE
    p.add_argument("--batch", type=int_in("--batch", 1, INT32_MAX, SIZE_ERROR), default=1, metavar="B",
                   help=describe("batch size B", 1, size))
    p.add_argument("--heads", type=int_in("--heads", 1, INT32_MAX, SIZE_ERROR), default=heads, metavar="H",
                   help=describe("attention heads H", heads, size))
    p.add_argument("--seqlen", type=int_in("--seqlen", 1, INT32_MAX, SIZE_ERROR), default=seqlen, metavar="N",
                   help=describe("query length Nq", seqlen, size))
    p.add_argument("--seqlen-k", type=int_in("--seqlen-k", 1, INT32_MAX, SIZE_ERROR), default=None, metavar="N",
                   help=describe("key/value length Nk", "Nq", size))
    p.add_argument("--causal", action="store_true",
                   help="top-left aligned causal mask: key k is visible to query q iff k <= q (default off)")
    add_feature_arguments(p)
    if scale:
        p.add_argument("--scale", type=positive_float("--scale", fp32=True), default=None, metavar="S",
                       help=describe("softmax scale s", "1/sqrt(head_dim)",
                                     "a positive number, finite in fp32, at most fa_sim.validate.max_scale(head_dim)"))
    p.add_argument("--seed", type=int_in("--seed", 0), default=0, metavar="N",
                   help=describe("seed of the standard-normal fp16 inputs (fa_sim.reference.random_inputs)",
                                 0, "0 or more"))


def window_pair(text: str) -> tuple[int, int]:
    """argparse type of --window: 'LEFT,RIGHT', each -1 (unbounded) or an integer >= 0."""
    parts = text.split(",")
    try:
        left, right = (int(x.strip(), 10) for x in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        left = right = None
    if left is None or left < -1 or right < -1:
        raise UsageError(f"--window takes LEFT,RIGHT, each -1 (unbounded) or an integer >= 0 (e.g. 256,0), "
                         f"got {text!r}")
    return left, right


def add_feature_arguments(p) -> None:
    """--heads-k --window --softcap: issue 38's grouped-query attention, sliding window, softcap
    (fa_sim.problem; docs/features.md)."""
    p.add_argument("--heads-k", type=int_in("--heads-k", 1, INT32_MAX, SIZE_ERROR), default=None, metavar="N",
                   help=describe("K/V heads (grouped-query / multi-query attention): Q head h reads K/V head "
                                 "h // (H / N)", "H", "1 .. H, a divisor of --heads"))
    p.add_argument("--window", type=window_pair, default=None, metavar="LEFT,RIGHT",
                   help=describe("FlashAttention-2's sliding window, top-left aligned: query i sees keys "
                                 "i-LEFT .. i+RIGHT; whole K/V tiles outside it are skipped; with --causal RIGHT "
                                 "is 0", "-1,-1 (none)", "each -1 (unbounded) or an integer >= 0"))
    p.add_argument("--softcap", type=positive_float("--softcap", fp32=True), default=None, metavar="C",
                   help=describe("logit softcap: the scaled scores x become C*tanh(x/C) before the softmax "
                                 "(Gemma 2); the hand-written program does not model it (--engine ptx)",
                                 "none", "a positive number, finite in fp32"))


def splits_value(text: str):
    """argparse type of --splits: 'auto' or an integer >= 1."""
    if text.strip() == "auto":
        return "auto"
    try:
        n = int(text.strip(), 10)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--splits takes an integer >= 1 or 'auto', got {text!r}")
    return n


def seqlens_list(text: str):
    """argparse type of --cache-seqlens: comma-separated integers (int32 [B])."""
    try:
        lens = [int(x.strip(), 10) for x in text.split(",")]
    except ValueError:
        lens = []
    if not lens or any(n < 1 or n > INT32_MAX for n in lens):
        raise UsageError(f"--cache-seqlens takes one length per batch entry, comma-separated integers >= 1 "
                         f"(e.g. 300,170), got {text!r}")
    return np.array(lens, np.int32)


def packed_seqlens(text: str) -> tuple[int, ...]:
    """argparse type of --seqlens: comma-separated integers >= 0, at least one of them >= 1."""
    try:
        out = tuple(int(x.strip(), 10) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 0 or max(out) < 1 or sum(out) > 2**31 - 1:
        raise UsageError(f"--seqlens takes comma-separated sequence lengths >= 0, not all 0 (e.g. 70,130,5), "
                         f"got {text!r}")
    return out


def add_seqlens_argument(p) -> None:
    """--seqlens of `fa sim`, `fa hw`, `fa time`, `fa trace`, `fa banks` (and `fa compare`, which refuses it):
    a packed batch of random inputs (fa_sim.varlen)."""
    p.add_argument("--seqlens", type=packed_seqlens, default=None, metavar="N,N,...",
                   help="random packed variable-length batch of these sequence lengths (Nk = Nq each; "
                        "fa_sim.varlen), instead of --batch / --seqlen / --seqlen-k (default: none)")


def add_splitkv_arguments(p) -> None:
    """--splits --cache-seqlens: split-KV decoding against a KV cache (fa_sim.splitkv; docs/features.md)."""
    p.add_argument("--splits", type=splits_value, default=None, metavar="N|auto",
                   help=describe("split-KV decoding: the keys of each (batch, head) split over N CTAs, then the "
                                 "LSE-weighted merge (fa2_combine.cu); auto: FlashAttention-2's heuristic",
                                 "none (1 with --cache-seqlens)", "1 .. the cache's K/V tiles, or auto"))
    p.add_argument("--cache-seqlens", type=seqlens_list, default=None, metavar="L,L,...",
                   help=describe("split-KV decoding: keys of the cache (--seqlen-k) each sequence holds, one per "
                                 "batch entry; with --npz, the file's int32 array cache_seqlens instead",
                                 "all", "integers 1 .. Nk"))
    p.add_argument("--pack-gqa", choices=tuple(PACK_GQA), default=None, metavar="{auto,on,off}",
                   help=describe("split-KV decoding with --heads-k: run the Q heads of a K/V head as one head of "
                                 "g*Nq rows, K/V read once per group (FlashAttention-2's seqlenq_ngroups_swapped; "
                                 "pack_gqa= of fa_sim.simulate / fa_hw.forward; auto: packed when g > 1 and Nq < "
                                 "block_m)", "auto", "one of auto, on, off; only with --splits / --cache-seqlens"))


PACK_GQA = {"auto": None, "on": True, "off": False}  # --pack-gqa -> pack_gqa= of the APIs


def packed_engine(args) -> bool:
    """A packed batch (args.cu_seqlens, from --seqlens or an --npz file's offsets) runs on the PTX
    engine, which runs FA_VARLEN (the hand-written program does not model it): args.engine set to
    "ptx", --engine program refused in one line. -> whether the batch is packed."""
    if args.cu_seqlens is None:
        return False
    if args.engine == "program":
        raise UsageError("--engine program does not run a packed batch (--seqlens or an --npz file's cu_seqlens): "
                         "fa2_fwd.cu's FA_VARLEN offsets are not modelled by the hand-written program; drop it "
                         "(the PTX engine runs it)")
    args.engine = "ptx"
    return True


def splitkv(args) -> dict:
    """splits=, cache_seqlens= and pack_gqa= of fa_sim.simulate / fa_hw.forward from --splits,
    --cache-seqlens, an --npz file's cache_seqlens array and --pack-gqa (pack_gqa= only when given:
    auto is the APIs' None); {} when none is given (the plain kernel; --pack-gqa alone is refused)."""
    lens = getattr(args, "cache_seqlens", None)
    npz = getattr(args, "npz", None)
    if npz is not None:
        from .inputs import QKV, load_npz

        stored = load_npz(npz, (), inputs_option(args), QKV, optional=("cache_seqlens",)).get("cache_seqlens")
        if stored is not None and lens is not None:
            raise UsageError(f"{inputs_option(args)} {npz} holds cache_seqlens: drop --cache-seqlens")
        lens = stored if stored is not None else lens
    splits = getattr(args, "splits", None)
    pack = getattr(args, "pack_gqa", None)
    if splits is None and lens is None:
        if pack is not None:
            raise UsageError(f"--pack-gqa {pack} applies to split-KV decoding only: give --splits N|auto or "
                             "--cache-seqlens with it")
        return {}
    if args.causal or getattr(args, "window", None) is not None:
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) take no --causal or --window: this kernel's "
                         "masks are top-left aligned (docs/features.md)")
    return {"splits": 1 if splits is None else splits, "cache_seqlens": lens,
            **({} if pack is None else {"pack_gqa": PACK_GQA[pack]})}


def heads_k(args) -> int:
    """--heads-k (default --heads), which must divide --heads: one line naming both otherwise."""
    hk = getattr(args, "heads_k", None)
    if hk is None:
        return args.heads
    if args.heads % hk:
        raise UsageError(f"--heads-k {hk} does not divide --heads {args.heads}; grouped-query attention needs "
                         f"heads % heads_k == 0")
    return hk


def features(args) -> dict:
    """window= and softcap= of fa_sim.simulate / fa_hw.forward from --window and --softcap."""
    return {"window": getattr(args, "window", None), "softcap": getattr(args, "softcap", None)}


def refuse_features(args, reason: str) -> None:
    """UsageError if --heads-k, --window or --softcap was given: they do not apply <reason>."""
    refuse(args, ("heads_k", "window", "softcap"), reason)


def seqlen_k(args) -> int:
    """Nk from the arguments (default Nq)."""
    return args.seqlen if args.seqlen_k is None else args.seqlen_k


def problem_head_dim(args) -> int:
    """The problem's head_dim d: the --config tag's when a tag names the config (an explicit
    --head-dim must agree with it), else --head-dim."""
    tag = getattr(args, "config", None)
    if tag is None or tag == AUTO_CONFIG or (is_backward_label(tag) and getattr(args, "backward", False)):
        return args.head_dim  # a backward label names no head_dim: the problem's
    d = KernelConfig.from_tag(forward_tag(args)).head_dim
    if "head_dim" in explicit(args) and args.head_dim != d:
        raise UsageError(f"--head-dim {args.head_dim} disagrees with --config {tag}, whose head_dim is {d}; "
                         f"drop --head-dim (the tag names it) or give a d{args.head_dim} tag")
    return d


def problem_shape(args) -> tuple[int, int, int, int, int]:
    """(B, H, Nq, Nk, d) of the random inputs the options describe (d: `problem_head_dim`)."""
    return args.batch, args.heads, args.seqlen, seqlen_k(args), problem_head_dim(args)


def check_input_memory(args) -> None:
    """Refuse random inputs (common.random_inputs) that cannot fit in this machine's memory."""
    b, h, nq, nk, d = problem_shape(args)
    # the fp16 q, k, v and O (bf16: float32 arrays of bf16 values), plus the float64 draw of the
    # largest of them (reference.random_inputs); an upper bound with --heads-k
    size = 4 if getattr(args, "dtype", "fp16") == "bf16" else 2
    need = size * b * h * d * (2 * nq + 2 * nk) + 8 * b * h * d * max(nq, nk)
    check_host_memory(need, f"(B, H, Nq, Nk, d) = ({b}, {h}, {nq}, {nk}, {d})", "q, k, v and O",
                      "lower --batch, --heads, --seqlen or --seqlen-k")


def random_inputs(args, dtype: str = "fp16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal fp16 q [B,H,Nq,d], k and v [B,H,Nk,d] from --seed (fa_sim.reference; dtype
    "bf16": rounded to bf16, as float32 arrays), refused up front when they cannot fit in this
    machine's memory. Commands call it last, after every check (commands/preflight.py)."""
    check_input_memory(args)
    b, h, nq, nk, d = problem_shape(args)
    return _random_inputs(b, h, nq, nk, d, args.seed, heads_k=heads_k(args), dtype=dtype)


def run_inputs(args, config: KernelConfig, files=None) -> tuple:
    """The run's q, k, v: the --npz arrays (`file_inputs`) or `random_inputs` in config.dtype. A bf16
    run reads float16 file arrays through their values (exact in float32), so that the input policy
    takes them when bf16 holds them exactly and names the first value it does not."""
    if files is None:
        return random_inputs(args, config.dtype)
    if config.dtype == "bf16":
        return tuple(np.asarray(x, np.float32) if np.asarray(x).dtype == np.float16 else x for x in files)
    return files


# -- the kernel config, generated from KernelConfig's fields ------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConfigOption:
    field: dataclasses.Field
    option: str
    hint: type

    @property
    def dest(self) -> str:
        return self.field.name

    @property
    def default(self):
        d = self.field.default
        return d.value if isinstance(d, enum.Enum) else d

    @property
    def choices(self) -> tuple | None:
        if isinstance(self.hint, type) and issubclass(self.hint, enum.Enum):
            return tuple(m.value for m in self.hint)
        return self.field.metadata.get(FIELD_CHOICES)

    def parse(self, text: str):
        """argparse type: a value of the field's type among its allowed values."""
        value = text.lower()
        if self.hint in (int, float):
            kind = "an integer" if self.hint is int else "a number"
            try:
                value = int(text, 10) if self.hint is int else float(text)
            except ValueError:
                raise UsageError(f"{self.option} takes {kind}, got {text!r}") from None
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"{self.option} {text}: {self.dest}={value!r} is not one of "
                             f"({', '.join(map(str, self.choices))})")
        return value

    def help(self) -> str:
        meaning = self.field.metadata.get(FIELD_HELP, f"KernelConfig.{self.dest}")
        allowed = None if self.choices is None else "one of " + ", ".join(map(str, self.choices))
        return describe(meaning, self.default, allowed)


def config_options() -> tuple[ConfigOption, ...]:
    hints = typing.get_type_hints(KernelConfig)
    return tuple(ConfigOption(f, f.metadata.get(FIELD_OPTION) or "--" + f.name.replace("_", "-"), hints[f.name])
                 for f in dataclasses.fields(KernelConfig))


AUTO_CONFIG = "auto"  # --config auto: the GPU's tuned choice (fa_hw.tuned)
AUTO_KEEPS = ("head_dim", "dtype")  # the options --config auto takes from the command line (the problem's)


def is_backward_label(text) -> bool:
    """Whether a --config value is a backward label (fa_sim.contract.backward.LABEL_FORMS: 64x8s1fr4p),
    which --backward takes; forward tags (m64n64d64w4-swizzled) never have that form."""
    from ..contract.backward import is_label

    return is_label(text)


def _config_value(text: str) -> str:
    """--config: 'auto', a config tag (KernelConfig.from_tag checks it here, before any work) or a backward
    label (with --backward; its syntax is checked here, its tiles against the problem's head_dim later)."""
    if text != AUTO_CONFIG and not is_backward_label(text):
        shown = text if len(text) <= QUOTE_MOST else quoted(text)
        if text[:1].isdigit():  # meant as a backward label (forward tags start with m): its forms
            from ..contract.backward import parse_label
            try:
                parse_label(text)
            except ValueError as exc:
                raise UsageError(f"--config {shown}: {exc}; or auto") from None
        try:
            KernelConfig.from_tag(text)
        except ValueError as exc:
            hint = "; with --backward a backward label like 64x8s1fr4p, or auto" if shown == text else ""
            raise UsageError(f"--config {shown}: {exc}{hint}") from None
    return text


def forward_tag(args) -> str | None:
    """The forward's --config tag (None: none or auto); a backward label without --backward is a UsageError."""
    tag = getattr(args, "config", None)
    if tag is None or tag == AUTO_CONFIG:
        return None
    if is_backward_label(tag):
        raise UsageError(f"--config {tag} is a backward label (block_m x n_warps s q_stages ...: fa_sim.contract."
                         "backward.LABEL_FORMS), which applies with --backward; the forward takes a config tag like "
                         "m64n64d64w4-swizzled")
    return tag


def add_config_arguments(p) -> None:
    """One option per KernelConfig field (bool fields as --x / --no-x), and --config TAG|auto."""
    group = p.add_argument_group("kernel config (fa_sim.KernelConfig; combinations are checked together)")
    group.add_argument("--config", type=_config_value, default=None, metavar="TAG|LABEL|auto",
                       help=describe("a whole config by its tag, as the tools print it (e.g. "
                                     "m128n64d64w4-swizzled-s2), instead of the options below; or 'auto': the "
                                     "fastest measured config of the GPU for this problem's head_dim, causal flag "
                                     "and size (fa_hw.tuned: the GPU's table, else a documented heuristic), for the "
                                     "commands that run the GPU kernel (fa hw, fa compare), with --head-dim and "
                                     "--dtype the only config options; with --backward a backward label "
                                     "(e.g. 64x8s1fr4p: block_m x n_warps s q_stages, then f r2/r4 p m l for its "
                                     "options, as experiments/tune_bwd.py names its candidates) or 'auto' (the "
                                     "GPU's tuned backward table, fa_hw.tuned_backward; fa time: the modelled GPU's)",
                                     "the config options below (--backward: DEFAULT_TILES)",
                                     f"{AUTO_CONFIG}, a tag of KernelConfig.from_tag, or a backward label"))
    for opt in config_options():
        if opt.hint is bool:
            meaning = opt.field.metadata.get(FIELD_HELP, f"KernelConfig.{opt.dest}")
            group.add_argument(opt.option, dest=opt.dest, action=argparse.BooleanOptionalAction, default=opt.default,
                               help=describe(meaning, "on" if opt.default else "off"))
        else:
            metavar = "{" + ",".join(map(str, opt.choices)) + "}" if opt.choices else opt.dest.upper()
            group.add_argument(opt.option, dest=opt.dest, type=opt.parse, default=opt.default, metavar=metavar,
                               help=opt.help())


def auto_requested(args) -> bool:
    """True for --config auto, after refusing the config options it chooses (all but --head-dim)."""
    if getattr(args, "config", None) != AUTO_CONFIG:
        return False
    refuse(args, [o.dest for o in config_options() if o.dest not in AUTO_KEEPS], "with --config auto, which chooses it")
    return True


def file_inputs(args, packed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """q, k, v of --npz FILE, whose arrays fix the shape (the shape options are refused), or None
    for random inputs (`random_inputs`, drawn after every check). `packed` (fa sim): the file may hold
    a packed batch; args.cu_seqlens is then (cu_seqlens_q, cu_seqlens_k), else None."""
    args.cu_seqlens = None
    if getattr(args, "npz", None) is None:
        return None
    option = inputs_option(args)
    refuse(args, PROBLEM_DESTS, f"with {option}: the file's q, k, v fix the shape")
    if not packed:
        return load_qkv(args.npz, option)
    *qkv, args.cu_seqlens = load_qkv(args.npz, option, packed=True)
    return tuple(qkv)


def inputs_head_dim(args, inputs) -> int:
    """The problem's head_dim: that of the file's `inputs` (a --config tag must agree with it), or
    `problem_head_dim` for random ones (inputs None)."""
    if inputs is None:
        return problem_head_dim(args)
    d = int(np.shape(inputs[0])[-1])
    tag = forward_tag(args)
    if tag is not None and KernelConfig.from_tag(tag).head_dim != d:
        raise UsageError(f"{inputs_option(args)} {args.npz} holds inputs of head_dim {d}, but --config {tag} has "
                         f"head_dim {KernelConfig.from_tag(tag).head_dim}; give a d{d} tag")
    return d


def config_from_args(args, head_dim: int | None = None) -> KernelConfig:
    """The KernelConfig the options name. `head_dim`: that of an input file (`inputs_head_dim`),
    which a --config tag must agree with. A tag names the problem's head_dim too
    (`problem_head_dim`: --head-dim may repeat it, not contradict it).
    --config auto is for the GPU commands (`auto_requested`); elsewhere it is a UsageError."""
    if getattr(args, "config", None) == AUTO_CONFIG:
        raise UsageError("--config auto picks a GPU's fastest measured config, so it applies to fa hw and fa compare; "
                         "here give the config's options (fa hw --config auto reports the tag it ran)")
    tag = forward_tag(args)
    if tag is not None:  # a whole config: the field options would be ignored, so they are refused
        refuse(args, [o.dest for o in config_options() if o.dest != "head_dim"],
               f"with --config {tag}, which names every field")
        config = KernelConfig.from_tag(tag)
        problem_head_dim(args)  # an explicit --head-dim must agree with the tag
        if head_dim is not None and head_dim != config.head_dim:
            raise UsageError(f"the inputs have head_dim {head_dim}, but --config {tag} has head_dim "
                             f"{config.head_dim}; give a d{head_dim} tag")
        return config
    values = {opt.dest: getattr(args, opt.dest) for opt in config_options()}
    return KernelConfig(**{**values, **({} if head_dim is None else {"head_dim": head_dim})})


# -- options that do not apply ---------------------------------------------------------------------
def option_name(dest: str) -> str:
    for opt in config_options():
        if opt.dest == dest:
            return opt.option
    return "--" + dest.replace("_", "-")


def explicit(args) -> frozenset[str]:
    """Destinations given on the command line (fa_sim/cli.py sets args.explicit)."""
    return getattr(args, "explicit", frozenset())


def packed_inputs(args, split: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`file_inputs(args, packed=True)` for `fa sim`, `fa time`, `fa trace` and `fa banks`, then
    --seqlens (random packed inputs of those lengths, Nk = Nq each: args.cu_seqlens set) and the
    refusal of a packed batch with split-KV decoding (`split`: `splitkv(args)`), each in one line."""
    loaded = file_inputs(args, packed=True)
    if args.seqlens is not None:
        if loaded is not None:
            raise UsageError(f"--seqlens does not apply with {args.npz_option} (the file fixes the inputs)")
        refuse(args, ("batch", "seqlen", "seqlen_k"), "with --seqlens, which sets the batch and the lengths")
        from ..varlen import cu_seqlens_of

        cu = cu_seqlens_of(args.seqlens)
        args.cu_seqlens = (cu, cu)
    if split and args.cu_seqlens is not None:
        raise UsageError("--splits / --cache-seqlens (split-KV decoding) take a padded batch, not a packed one "
                         "(--seqlens or an --npz file's cu_seqlens): both use the kernel's grid z")
    return loaded


def packed_problem(args, loaded, config: KernelConfig):
    """The packed launch of args.cu_seqlens (set by `packed_inputs`): of the --npz file's q, k, v
    ([total, H, d]) or of random inputs of the --seqlens lengths (--heads, --heads-k, the config's
    head_dim), with --causal, --scale (where the command has it) and the features; a ValueError of
    fa_sim.varlen.make_varlen_problem (the offsets, heads_k not dividing heads, ...) is one UsageError."""
    from ..varlen import make_varlen_problem

    if loaded is None:
        total_q, total_k, hk = int(args.cu_seqlens[0][-1]), int(args.cu_seqlens[1][-1]), heads_k(args)
        d = config.head_dim
        shapes = [(total_q, args.heads, d), (total_k, hk, d), (total_k, hk, d)]
    else:
        shapes = [tuple(np.shape(x)) for x in loaded]
    try:
        return make_varlen_problem(*[(1, s[1], s[0], s[2]) for s in shapes], *args.cu_seqlens, args.causal,
                                   getattr(args, "scale", None), config, **features(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def packed_random_inputs(args, prob, dtype: str = "fp16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random packed inputs of --seqlens, drawn after every check: q [total_q, H, d], k, v
    [total_k, H_k, d] (the --seed's standard-normal draw of one [1, H, total, d] batch, token-major)."""
    qkv = _random_inputs(1, prob.heads, prob.total_q, prob.total_k, prob.head_dim, args.seed, heads_k=prob.heads_k,
                         dtype=dtype)
    return tuple(np.ascontiguousarray(x[0].transpose(1, 0, 2)) for x in qkv)


def refuse(args, dests, reason: str) -> None:
    """UsageError if any of `dests` was given explicitly: '--seqlen does not apply <reason>'."""
    given = [option_name(d) for d in dests if d in explicit(args)]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise UsageError(f"{', '.join(given)} {verb} not apply {reason}")


def parse_ops(text: str | None):
    """--ops 'LDSM,SHFL' -> frozenset of events.Op (None: all); a list naming no class is refused,
    since it would trace nothing."""
    from ..events import Op

    if text is None:
        return None
    names = [t.strip().upper() for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError(f"--ops {text!r} names no instruction class; give a comma-separated list such as "
                         f"LDSM,SHFL from {', '.join(Op.__members__)}, or drop --ops to keep all")
    bad = [n for n in names if n not in Op.__members__]
    if bad:
        raise UsageError(f"--ops: unknown instruction class(es) {listed(bad)}; choose from {', '.join(Op.__members__)}")
    return frozenset(Op[n] for n in names)


# -- parallel runs (fa_sim.parallel) -----------------------------------------------------------------
def workers_count(text: str):
    """argparse type of --workers: 'auto' or an integer >= 1."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit():
        raise UsageError(f"--workers takes auto or an integer >= 1, got {quoted(text)}")
    return int_in("--workers", 1, None, "auto or an integer >= 1")(text)


def cluster_address(text: str) -> str:
    """argparse type of --cluster: local, tcp://HOST:PORT or HOST:PORT (fa_sim.parallel.cluster)."""
    from ..parallel.cluster import check_address

    try:
        return check_address(text, "--cluster ")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def add_parallel_arguments(p, what: str = "the grid's waves") -> None:
    """--workers N|auto and --cluster ADDRESS."""
    from ..parallel.cluster import CONNECT_TIMEOUT_S

    p.add_argument("--workers", type=workers_count, default="auto", metavar="N",
                   help=describe(f"local processes that share out {what}; results are bit-identical to one "
                                 "process; more than the cores is allowed, with a line on stderr that says so; with "
                                 "--cluster local, the local cluster's workers", "auto (one per core)",
                                 "auto or an integer >= 1"))
    p.add_argument("--cluster", metavar="ADDRESS", type=cluster_address, default=None,
                   help=describe(f"run {what} on a Dask cluster: 'local' starts one on this machine, else a "
                                 f"running scheduler's address, which must answer within {CONNECT_TIMEOUT_S} s "
                                 "(needs pip install flashsim[cluster])", "none: local processes",
                                 "local, tcp://HOST:PORT or HOST:PORT"))


def warp_and_lane(args, n_warps: int) -> tuple[int, int]:
    """(warp, lane) of --thread, or of --warp and --lane, checked against a CTA of n_warps warps."""
    threads = n_warps * WARP_SIZE
    if args.thread is not None:
        refuse(args, ("warp", "lane"), "with --thread, which names the warp and lane itself")
        if args.thread >= threads:
            raise UsageError(f"--thread {args.thread} is outside the CTA: {threads} threads "
                             f"({n_warps} warps), 0..{threads - 1}")
        return divmod(args.thread, WARP_SIZE)
    if args.warp >= n_warps:
        raise UsageError(f"--warp {args.warp} is outside the CTA: {n_warps} warps, 0..{n_warps - 1}")
    if args.lane >= WARP_SIZE:
        raise UsageError(f"--lane {args.lane} is outside the warp: lanes 0..{WARP_SIZE - 1}")
    return args.warp, args.lane


def checkpoint_ctas_option(text, n_ctas: int, allowed=None) -> list[int]:
    """--ctas of `fa compare` and `fa compare --backward`: distinct CTA ids of the grid (default the
    first and the last, or those a recording holds: `allowed`)."""
    if text is None:
        return list(allowed) if allowed is not None else sorted({0, n_ctas - 1})
    try:
        ctas = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--ctas takes comma-separated integers, got {quoted(text)}") from None
    if not ctas or any(not 0 <= c < n_ctas for c in ctas) or len(set(ctas)) != len(ctas):
        bad = [c for c in ctas if not 0 <= c < n_ctas] or sorted({c for c in ctas if ctas.count(c) > 1})
        why = "outside the grid" if any(not 0 <= c < n_ctas for c in ctas) else "repeated"
        raise UsageError(f"--ctas must be distinct CTA ids in 0..{n_ctas - 1}; "
                         + (f"{why}: {listed(bad)}" if bad else "none given"))
    if allowed is not None and not set(ctas) <= set(allowed):
        raise UsageError(f"--ctas {text}: the recording holds checkpoints of CTAs {list(allowed)} only")
    return ctas
