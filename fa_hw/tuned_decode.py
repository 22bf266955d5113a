"""config="auto" for split-KV decoding: the kernel config of the split launch, per GPU and decode class.

    out = fa_hw.forward(q, k_cache, v_cache, config="auto", splits="auto", cache_seqlens=lens)
    out.config, out.splits                                   # what ran: the chosen config, its splits

Why its own table. Decoding (a few query rows against a long KV cache) is bound by the K/V bytes it
streams, not by the tensor core, so the dense forward's winners (128-row tiles that amortise the Q
tile over many rows) are the wrong family: a decode CTA holds Nq (GQA packed: g * Nq) useful rows
of its block_m, and what decides its speed is how many K/V bytes each SM keeps in flight (block_n x
kv_stages x CTAs per SM). FlashAttention-2's split kernel for d = 128 takes kBlockM 64, kBlockN 128,
4 warps.

Candidates (`decode_candidates(head_dim)`): configs of the family fa_hw already compiles
(fa_sim.config.KernelConfig), all with the fewest query rows a CTA can have (block_m 64 of 4 warps,
16 rows per warp) but one 8-warp tile, in this order: FlashAttention-2's split tile (block_n 128,
one stage), block_n 128 and 64 with K/V pipelined (kv_stages 2 and 3), the seed tile (block_n 64,
one stage: today's default), block_n 32 with three stages, q_in_regs (Q is read once: decode
has one Q tile per CTA) and lazy_sum on the pipelined tiles, and the 8-warp m128n64 with two stages
(more loads issued per CTA). Members that the family refuses at a head_dim (registers, shared
memory: KernelConfig's own checks) are left out. The split count is chosen for each candidate: "auto"
is fa_sim.splitkv.num_splits_heuristic with that config's CTAs per SM (min_blocks_per_sm, from its
registers and shared memory), so a candidate is timed as it would run.

Decode class (`DecodeClass`, the key of a table entry and of an autotuned choice):

    decode-d128-fp16-q1-k16384-bh512            plain fp16, Nq 1, cache 16384, B*H = 512
    decode-d128-bf16-q8-k65536-bh64-g4p-softcap  bf16, GQA packed 4 Q heads per K/V head (rows 4 Nq)

- head_dim and dtype (and softcap: its tanh per score), exact;
- the GQA packing: '-g{g}p' when the Q heads of a K/V head run as one head of g Nq rows
  (fa_sim.splitkv.packs_gqa), '-g{g}' for grouped K/V run unpacked; none for MHA;
- q: the launch's query rows per (batch, head) - Nq, or g Nq when packed - rounded up to a power of two;
- k: the cache's allocated length Nk (the K/V tiles and the splits come from it) rounded up to a power of two;
- bh: the launch's batch x heads - B H_k when packed, else B H (the CTAs without splits) - rounded up to
  a power of two and capped at MAX_BH (past it the grid fills the GPU many times over with one split).

Tables. `experiments/tune_decode.py` times every candidate on training decode shapes
(its TRAIN: caches of 3000, 12000 and 50000 keys, batch 2, 8, 32 and 48 of 8 heads, Nq 1; disjoint
from experiments/bench_decode.py's held-out rows) and writes the fastest per class as one JSON file
per GPU, fa_hw/tuned/decode/<gpu_key>.json (fa_hw.device.gpu_key):

    {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "nvrtc": "13.0", "entries": [
      {"class": "decode-d128-fp16-q1-k16384-bh512", "config": {KernelConfig JSON, fp16},
       "splits": 1, "times_ms": {"<tag>": 1.6, ...}, "vs_seed": 1.08, "shapes": [[48, 8, 8, 1, 12000]]}, ...]}

Lookup (`lookup`): the entry of the class, else the nearest entry of the same head_dim and softcap
flag: the smallest sum of |log2| distances of q, k and bh, then the same dtype, then the same packing.
A table for another arch is not used; a malformed one is a ValueError naming the file.

No table (or no entry of the head_dim): fa_hw.autotune's path, as the dense forward's config="auto" on
a GPU without a table - the first MAX_AUTOTUNE_CANDIDATES of the pool (the shipped decode tables'
winners for the nearest classes first, then `decode_candidates`; static: the timing model is not
used to prune, see fa_hw.autotune's docstring for why) timed on the GPU on the caller's inputs (the
CLI: random inputs of the shape) with autotune.tune's rounds, the choice cached per GPU and class in
the autotune cache file (autotune/<gpu>-<arch>.json; the class key starts with 'decode-', beside the
dense forward's) for the kernel fingerprint of fa2_fwd.cu and fa2_combine.cu, and reused by later
processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fa_sim.config import KernelConfig

from .tuned import TABLE_FORMAT, TUNED_DIR, Choice, TableFile

DECODE_TUNED_DIR = TUNED_DIR / "decode"
MAX_BH = 4096  # the launch's batch*heads past which the class no longer grows
MAX_AUTOTUNE_CANDIDATES = 6  # configs the autotuner times per decode class on a GPU without a table
# (block_m, block_n, n_warps, kv_stages, options): the decode family in order (module docstring)
_FAMILY = ((64, 128, 4, 1, {}), (64, 128, 4, 2, {}), (64, 64, 4, 2, {}), (64, 64, 4, 3, {}), (64, 64, 4, 1, {}),
           (64, 32, 4, 3, {}), (64, 128, 4, 2, {"q_in_regs": True}), (64, 64, 4, 3, {"q_in_regs": True}),
           (64, 128, 4, 2, {"lazy_sum": True}), (64, 64, 4, 3, {"lazy_sum": True}), (128, 64, 8, 2, {}))


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def decode_candidates(head_dim: int) -> list[KernelConfig]:
    """The decode family at this head_dim (module docstring), the members KernelConfig accepts."""
    out = []
    for m, n, w, stages, opts in _FAMILY:
        try:
            out.append(KernelConfig(block_m=m, block_n=n, head_dim=int(head_dim), n_warps=w, kv_stages=stages, **opts))
        except ValueError:  # registers or shared memory at this head_dim (KernelConfig's checks)
            pass
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class DecodeClass:
    """A decode class (module docstring)."""

    head_dim: int
    dtype: str
    seqlen_q: int  # the launch's rows per (batch, head), power of two
    seqlen_k: int  # the cache's allocated length, power of two
    bh: int  # the launch's batch * heads, power of two, at most MAX_BH
    group: int = 1  # Q heads per K/V head
    packed: bool = False
    softcap: bool = False

    @classmethod
    def of(cls, plan) -> "DecodeClass":
        """The class of a checked split-KV plan (fa_sim.splitkv.SplitPlan; its config's tiles do not
        matter: the launch's rows and heads come from the packing alone)."""
        p, caller = plan.problem, plan.caller
        return cls(p.head_dim, p.config.dtype, _pow2_ceil(p.seqlen_q), _pow2_ceil(p.seqlen_k),
                   min(MAX_BH, _pow2_ceil(p.batch * p.heads)), caller.kv_group, plan.unpacked is not None,
                   bool(caller.softcap))

    @property
    def key(self) -> str:
        group = f"-g{self.group}{'p' if self.packed else ''}" if self.group > 1 else ""
        return (f"decode-d{self.head_dim}-{self.dtype}-q{self.seqlen_q}-k{self.seqlen_k}-bh{self.bh}{group}"
                f"{'-softcap' if self.softcap else ''}")

    @classmethod
    def parse(cls, key: str) -> "DecodeClass":
        """Inverse of `key`; a malformed key is a ValueError naming it."""
        import re

        m = re.fullmatch(r"decode-d(\d+)-(fp16|bf16)-q(\d+)-k(\d+)-bh(\d+)(?:-g(\d+)(p?))?(-softcap)?", str(key))
        if not m:
            raise ValueError(f"{key!r} is not a decode class like 'decode-d128-fp16-q1-k16384-bh512'")
        group = int(m[6] or 1)
        out = cls(int(m[1]), m[2], int(m[3]), int(m[4]), int(m[5]), group, bool(m[7]), bool(m[8]))
        pow2 = all(n >= 1 and n & (n - 1) == 0 for n in (out.seqlen_q, out.seqlen_k, out.bh))
        if out.key != key or group < 2 and m[6] or not pow2 or out.bh > MAX_BH:
            raise ValueError(f"{key!r} is not a canonical decode class (q, k and bh powers of two, bh at most "
                             f"{MAX_BH}, a group of 2 or more)")
        return out

    def distance(self, other: "DecodeClass") -> tuple:
        """lookup's order (module docstring), for entries of the same head_dim and softcap flag."""
        log = lambda a, b: abs(math.log2(a) - math.log2(b))  # noqa: E731
        return (log(self.seqlen_q, other.seqlen_q) + log(self.seqlen_k, other.seqlen_k) + log(self.bh, other.bh),
                int(self.dtype != other.dtype), int((self.group, self.packed) != (other.group, other.packed)))


@dataclass(frozen=True)
class DecodeEntry:
    """The fastest measured config of one decode class."""

    cls: DecodeClass
    config: KernelConfig
    splits: int | None = None
    times_ms: dict | None = None
    vs_seed: float | None = None
    shapes: tuple = ()

    @property
    def key(self) -> str:
        return self.cls.key

    def to_json(self) -> dict:
        return {"class": self.cls.key, "config": self.config.to_json(), "splits": self.splits,
                "times_ms": self.times_ms, "vs_seed": self.vs_seed, "shapes": [list(s) for s in self.shapes]}

    @classmethod
    def from_json(cls, data: dict) -> "DecodeEntry":
        klass = DecodeClass.parse(data["class"])
        config = KernelConfig.from_json(data["config"])
        if config.head_dim != klass.head_dim:
            raise ValueError(f"entry {klass.key} holds a config of head_dim {config.head_dim}")
        if config.dtype != "fp16":
            raise ValueError(f"entry {klass.key} holds a {config.dtype} config; configs are stored in fp16 "
                             f"(the class names the type it was timed in)")
        return cls(klass, config, data.get("splits"), data.get("times_ms"), data.get("vs_seed"),
                   tuple(tuple(s) for s in data.get("shapes", ())))


@dataclass(frozen=True)
class DecodeTable(TableFile):
    """One GPU's decode entries (fa_hw.tuned.TableFile's JSON form)."""

    ENTRY = DecodeEntry
    KIND = "decode table"
    KEY = "decode class"

    def to_json(self) -> dict:
        return {"format": TABLE_FORMAT, "gpu": self.gpu, "arch": self.arch, "nvrtc": self.nvrtc,
                "entries": [e.to_json() for e in sorted(self.entries, key=lambda e: (
                    e.cls.head_dim, e.cls.dtype, e.cls.softcap, e.cls.group, e.cls.packed, e.cls.seqlen_q,
                    e.cls.seqlen_k, e.cls.bh))]}

    def lookup(self, want: DecodeClass) -> DecodeEntry | None:
        """The entry of `want`, else the nearest of the same head_dim and softcap flag (module docstring)."""
        same = [e for e in self.entries if e.cls.head_dim == want.head_dim and e.cls.softcap == want.softcap]
        if not same:
            return None
        return min(same, key=lambda e: (want.distance(e.cls), e.cls.key))


_DIRECTORY = [DECODE_TUNED_DIR]


def use_directory(directory) -> None:
    """Read the GPU's decode table from `directory` from now on in this process (experiments/bench_decode.py
    --tuned-dir DIR: DIR/decode, the table tune_decode.py just wrote); None: the shipped one."""
    _DIRECTORY[0] = DECODE_TUNED_DIR if directory is None else Path(directory)


def table_for(gpu: str, directory: Path | None = None) -> DecodeTable | None:
    return DecodeTable.for_gpu(gpu, _DIRECTORY[0] if directory is None else Path(directory))


def autotune_pool(want: DecodeClass, directory: Path | None = None) -> list[KernelConfig]:
    """What the autotuner times for a class without a table entry (module docstring): the shipped
    decode tables' winners of the same head_dim, nearest class first, then decode_candidates; no
    duplicates, at most MAX_AUTOTUNE_CANDIDATES."""
    directory = _DIRECTORY[0] if directory is None else Path(directory)
    ranked = []
    for path in sorted(Path(directory).glob("*.json")):
        ranked += [(want.distance(e.cls), e.cls.key, e.config) for e in DecodeTable.load(path).entries
                   if e.cls.head_dim == want.head_dim]
    ranked.sort(key=lambda r: r[:2])
    pool = [r[2] for r in ranked] + decode_candidates(want.head_dim)
    return list(dict.fromkeys(pool))[:MAX_AUTOTUNE_CANDIDATES]


def fingerprint() -> str:
    """What a cached decode choice is valid for: fa2_fwd.cu's and fa2_combine.cu's text, NVRTC's version."""
    from fa_sim.cache import cache_key
    from fa_sim.splitkv import COMBINE_PATH

    from .autotune import fingerprint as forward_fingerprint

    return cache_key(forward=forward_fingerprint(), combine=COMBINE_PATH.read_text())


def choose(plan, gpu: str, arch: str, timer_factory, directory: Path | None = None,
           kernel: str | None = None) -> Choice:
    """The decode config for a checked split-KV plan (any config; fa_sim.splitkv.check_splitkv) on
    this GPU: the table's entry for its class (or the nearest), else fa_hw.autotune.choose with the
    pool of `autotune_pool` and `timer_factory(cls, shape, pool)` (a Timer: config -> ms). The
    chosen config is in the plan's dtype."""
    from . import autotune
    from .device import gpu_key

    want = DecodeClass.of(plan)
    dtype = plan.problem.config.dtype
    table = table_for(gpu, directory)
    entry = table.lookup(want) if table is not None and table.arch == arch else None
    if entry is not None:
        near = "" if entry.cls == want else f", nearest to {want.key}"
        return Choice(replace(entry.config, dtype=dtype), f"decode/{gpu_key(gpu)}.json ({entry.cls.key}{near})")
    p = plan.caller
    shape = (p.batch * p.heads, p.seqlen_q, p.seqlen_k, p.head_dim)
    config, source = autotune.choose(want, gpu, arch, autotune_pool(want, directory), timer_factory, shape,
                                     fingerprint() if kernel is None else kernel)
    return Choice(replace(config, dtype=dtype), source)
