"""config="auto": the fastest measured kernel config for a problem, from a table per GPU.

    fa_hw.forward(q, k, v, causal=True, config="auto")
    choice = fa_hw.tuned.auto_config(head_dim=128, causal=True, seqlen_k=8192, gpu="NVIDIA H200", arch="sm_90")
    choice.config, choice.source

Tables. `experiments/tune_hw.py` times a set of candidate configs on the device for every
(head_dim, causal, size class) of its training shapes (experiments/hw_sets.py TRAIN; the benchmark
reports on the disjoint TEST set) and writes the fastest per key as JSON; the package
ships one file per GPU, named by `gpu_key` ("NVIDIA H200" -> fa_hw/tuned/h200.json):

    {"format": 1, "gpu": "NVIDIA H200", "arch": "sm_90", "nvrtc": "13.0", "entries": [
      {"head_dim": 64, "causal": false, "size": "medium", "config": {KernelConfig JSON},
       "tflops": 331.0, "vs_flash": 1.1, "shapes": [[4, 16, 4096, 64]]}, ...]}

Size classes (what a config choice depends on besides head_dim and causal: rounds per CTA, which
amortise the prologue and epilogue and set how many loads a pipeline can keep in flight):
seqlen_k <= 1024 "short", <= 4096 "medium", above "long". With a sliding window the class is that
of the keys one query row can see (`effective_keys`: left + 1 + right, at most seqlen_k), which is
what sets the rounds per CTA.

Feature classes (issue 38; `FeatureClass`): an entry may also name the 16-bit type ("dtype":
"bf16"), a grouped-query launch ("group": "gqa", any heads / heads_k > 1; MQA included) and a
softcap ("softcap": true); absent, the entry is for the plain fp16 kernel, as every format-1 entry
written before these keys was. `experiments/tune_hw.py --features` times them on training shapes of
its own (FEATURE_TRAIN there) and merges them into the GPU's table. Head dims 96-256 need no feature
key: they are head_dim values of the plain table. Configs are stored in fp16; the launch's dtype is
applied when one is chosen.

Lookup. The entry for (head_dim, causal, size, feature class) of the device's table whose arch is
the device's; else, among that GPU's entries for the same head_dim and causal, the nearest: first
the same softcap flag (softcap adds MUFU work to every score: a different balance), then the
nearest size class, then the same dtype, then the same group (bf16 and GQA change no per-score work;
`Table.lookup`). On a real GPU
without a table (`device_choice`, what fa_hw.forward, `fa hw` and `fa compare` use), the autotuner
answers (fa_hw.autotune): a few candidates timed on the GPU once per problem class, the choice
cached on disk per GPU and reused by later processes. Without a device (`auto_config`, what `fa time`
uses for a modelled GPU), the timing model's ranking (below). A table that is missing, unreadable or for another GPU is simply not used
(the model answers, and `Choice.source` says so); a table whose entries are malformed is a
ValueError naming the file, never a silent wrong config.

No table entry: the timing model (fa_sim.timing.rank) ranks the autotuner's candidates
(`autotune_candidates`: the shipped tables' winners and their neighbours, the heuristic's tile) on
the GPU's model (sm_90: the H200's, sm_80: the A100's, from public figures) and the fastest predicted
is chosen;
`Choice.source` says so. Where no model covers the arch, the heuristic below answers.

Heuristic (no table entry and no timing model): the H200 profiles of issue 11 show the seed tile (16 query rows per
warp) bound by shared-memory bandwidth (L1/TEX 74 %, one ldmatrix.x4 per two MMAs), so the
heuristic takes 32 rows per warp (block_m 128, 4 warps), which halves ldmatrix per MMA, with the
block_n of the best family member measured there before tuning: 128 at head_dim 64 (1.08x
SDPA-flash), 32 at head_dim 128 (0.88x; block_n 64 spills at 255 registers), 64 at head_dim 32.
It adds no unmeasured schedule option. The default of fa_hw.forward stays the seed config.
head_dim 96, 160, 192, 256 (issue 38, no measurements yet): FlashAttention-2's sm80 forward tiles
where they compile without register spills (docs/head_dims.md): 128 x 64 of 4 warps at 96, 128 x 32
of 4 warps at 160, 128 x 64 of 8 warps at 192 and 256; the autotuner times CANDIDATES[d] for them.

Every candidate list is for an arch (the GPU's, the modelled GPU's; TABLE_ARCH, sm_90, by default) and
holds only configs whose shared memory fits it (KernelConfig.fits: 163 KiB per CTA on sm_80, 227 KiB
on sm_90); on sm_90 the autotuner's pool adds BIG_TILES at head_dim 192 and 256.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from fa_sim.config import HEAD_DIMS, KernelConfig

from .device import device, device_arch, gpu_key

TUNED_DIR = Path(__file__).parent / "tuned"
TABLE_FORMAT = 1
SIZE_CLASSES = ("short", "medium", "long")
SHORT_MAX_KEYS, MEDIUM_MAX_KEYS = 1024, 4096
AUTO = "auto"
TABLE_ARCH = "sm_90"  # the arch of the shipped tables' GPUs (H100, H200): the candidates' default target
# The configs experiments/tune_hw.py times (its docstring says why these), by head_dim; causal
# launches time each with heavy_first as well (`candidates`). lazy_sum (-ls) and poly_exp (-e1, -e2)
# are issue 19's options on the best tiles of issue 11; pingpong (-pp) runs 256-row tiles of 8 warps.
CANDIDATES = {
    32: ("m64n64d32w4-swizzled", "m128n64d32w4-swizzled", "m128n128d32w4-swizzled", "m128n64d32w4-swizzled-s2",
         "m128n128d32w4-swizzled-s2", "m128n128d32w4-swizzled-s2-ls", "m128n128d32w4-swizzled-s2-e1",
         "m128n128d32w4-swizzled-s2-ls-e1", "m128n64d32w4-swizzled-s2-ls", "m256n128d32w8-swizzled-s2-pp-ls",
         "m256n64d32w8-swizzled-s2-pp"),
    64: ("m64n64d64w4-swizzled", "m128n64d64w4-swizzled", "m128n128d64w4-swizzled", "m128n128d64w4-swizzled-s2",
         "m128n64d64w4-swizzled-s2", "m128n64d64w4-swizzled-s2-qr", "m128n64d64w4-swizzled-s2-dp",
         "m128n64d64w4-swizzled-s2-qr-dp", "m128n64d64w4-swizzled-s3-qr-dp", "m128n128d64w8-swizzled-s2-dp",
         "m64n64d64w4-swizzled-ls", "m128n128d64w4-swizzled-s2-ls", "m128n128d64w4-swizzled-s2-e1",
         "m128n128d64w4-swizzled-s2-e2", "m128n128d64w4-swizzled-s2-ls-e1", "m256n128d64w8-swizzled-s2-pp",
         "m256n128d64w8-swizzled-s2-pp-ls", "m256n64d64w8-swizzled-s2-pp-ls", "m256n64d64w8-swizzled-s3-pp-ls"),
    128: ("m64n64d128w4-swizzled", "m128n32d128w4-swizzled", "m128n32d128w4-swizzled-s2",
          "m128n32d128w4-swizzled-s2-dp", "m128n32d128w4-swizzled-s3-dp", "m128n64d128w4-swizzled",
          "m128n64d128w4-swizzled-s2", "m128n64d128w4-swizzled-s2-dp", "m64n64d128w4-swizzled-s2-qr",
          "m128n128d128w8-swizzled-s2", "m128n64d128w4-swizzled-ls", "m128n64d128w4-swizzled-s2-ls",
          "m128n64d128w4-swizzled-e1", "m128n64d128w4-swizzled-s2-e1", "m128n64d128w4-swizzled-s2-ls-e1",
          "m256n64d128w8-swizzled-s2-pp", "m256n64d128w8-swizzled-s2-pp-ls", "m256n32d128w8-swizzled-s2-pp-ls",
          "m256n32d128w8-swizzled-s3-pp-ls"),
}
# head_dim 96-256 (issue 38): no measured candidates yet; a few tiles that compile without spills
# (docs/head_dims.md), FlashAttention-2's sm80 tiles first, which the autotuner times on a GPU
# without a table entry and the timing model ranks.
# lazy_sum (-ls) variants of the tiles that won on the H100 (experiments/tune_features_h100.md) come
# last, so that tune_hw.py --features' pool (feature_candidates: the list from its end) times them.
CANDIDATES.update({
    96: ("m128n64d96w4-swizzled", "m128n64d96w8-swizzled", "m64n64d96w4-swizzled", "m128n128d96w8-swizzled",
         "m128n64d96w4-swizzled-s2", "m128n64d96w8-swizzled-s2", "m128n64d96w4-swizzled-ls",
         "m128n64d96w4-swizzled-s2-ls"),
    160: ("m128n32d160w4-swizzled", "m128n64d160w8-swizzled", "m64n64d160w4-swizzled", "m128n32d160w4-swizzled-s2",
          "m128n64d160w8-swizzled-s2", "m128n128d160w8-swizzled"),
    # 192 and 256: the spill-free members of the whole family worth timing on an H100
    # (experiments/family_bigdims_sm90.md, docs/head_dims.md "The H100 sweep"): FlashAttention-2's
    # tile and the H100's winners first, then q_in_regs on the 16-rows-per-warp tiles (the model's
    # fastest), the untimed m64n128 tile, and 4-warp tiles that keep 2 or 3 CTAs per SM with K/V
    # pipelined (m64n32, defer_pv + lazy_sum; -b3: 168 registers, three CTAs); the tiles measured well
    # under the winners (m128n32 of 8 warps, m64n64 with two stages: one CTA per SM) are left out.
    192: ("m128n64d192w8-swizzled", "m64n64d192w4-swizzled", "m128n128d192w8-swizzled", "m64n64d192w4-swizzled-ls",
          "m128n64d192w8-swizzled-s2", "m128n128d192w8-swizzled-ls", "m64n128d192w4-swizzled",
          "m128n64d192w8-swizzled-qr", "m128n64d192w8-swizzled-s2-qr", "m64n32d192w4-swizzled-s2-dp-ls",
          "m64n32d192w4-swizzled-s2-dp-ls-b3", "m64n64d192w4-swizzled-qr", "m64n64d192w4-swizzled-qr-ls"),
    256: ("m128n64d256w8-swizzled", "m64n64d256w4-swizzled", "m64n64d256w4-swizzled-ls", "m128n64d256w8-swizzled-ls",
          "m64n128d256w4-swizzled", "m64n64d256w4-swizzled-s2-dp",
          "m64n32d256w4-swizzled-s2-dp-ls", "m64n32d256w4-swizzled-b3", "m64n32d256w4-swizzled-ls-b3",
          "m64n32d256w4-swizzled-qr"),
})
# Tiles of more than 163 KiB of shared memory (sm_90 only: 227 KiB per CTA; fa_sim.config.smem_limit_bytes):
# 8 warps of 16 rows with K/V pipelined three (d = 192) or two (d = 256) stages deep, or 128 keys per
# round at d = 256; one CTA per SM. The timing model's fastest of them at (4, 16, 4096, d) on the H200
# model (docs/head_dims.md, "sm_90's larger tiles"): at 192 m128n64d192w8-s3-qr-dp 2.663 ms non-causal
# against auto's 2.901, at 256 none under auto's 3.610 (m128n128d256w8-ls 3.675). autotune_candidates
# adds them after the heuristic's tile where the arch fits them; candidates() (tune_hw.py) times them
# with the other sm_90-only tiles below and, at 192, q_in_regs + defer_pv on two stages, which fits
# sm_80 too (the model's fastest at 192: 2.582 ms).
BIG_TILES = {
    192: ("m128n64d192w8-swizzled-s3-qr-dp", "m128n64d192w8-swizzled-s3-dp"),
    256: ("m128n128d256w8-swizzled-ls", "m128n64d256w8-swizzled-s2-dp"),
}
CANDIDATES[192] += BIG_TILES[192] + ("m128n64d192w8-swizzled-s2-pp-ls", "m64n128d192w4-swizzled-s2",
                                     "m128n64d192w8-swizzled-s2-qr-dp")
CANDIDATES[256] += BIG_TILES[256] + ("m128n128d256w8-swizzled", "m128n64d256w8-swizzled-s2-pp-ls")
HEURISTIC = {32: KernelConfig(block_m=128, block_n=64, head_dim=32, n_warps=4),
             64: KernelConfig(block_m=128, block_n=128, head_dim=64, n_warps=4),
             128: KernelConfig(block_m=128, block_n=32, head_dim=128, n_warps=4),
             # issue 38, unmeasured: FlashAttention-2's sm80 forward tiles where they compile without
             # spills (docs/head_dims.md); at 160, its non-causal 128 x 32 of 4 warps
             96: KernelConfig(block_m=128, block_n=64, head_dim=96, n_warps=4),
             160: KernelConfig(block_m=128, block_n=32, head_dim=160, n_warps=4),
             192: KernelConfig(block_m=128, block_n=64, head_dim=192, n_warps=8),
             256: KernelConfig(block_m=128, block_n=64, head_dim=256, n_warps=8)}


def size_class(seqlen_k: int) -> str:
    """'short' (seqlen_k <= 1024), 'medium' (<= 4096) or 'long'."""
    return "short" if seqlen_k <= SHORT_MAX_KEYS else "medium" if seqlen_k <= MEDIUM_MAX_KEYS else "long"


def effective_keys(seqlen_k: int, window: tuple[int, int] = (-1, -1), causal: bool = False) -> int:
    """The keys one query row sees: seqlen_k, or with a window (left, right; -1 unbounded, the
    effective bounds of fa_sim.problem.Problem, where a causal launch's right side is -1) bounded on
    both sides (causal: the right side is 0), left + 1 + right, at most seqlen_k (the size class of
    a windowed launch)."""
    left, right = window
    right = 0 if causal else right
    if left < 0 or right < 0:  # (-1, r) keeps the row's prefix, (l, -1) its suffix
        return int(seqlen_k)
    return int(min(seqlen_k, left + 1 + right))


DTYPES = ("fp16", "bf16")
GROUPS = ("mha", "gqa")  # heads_k == heads; heads_k < heads (GQA and MQA)


@dataclass(frozen=True)
class FeatureClass:
    """The feature part of a table key (module docstring): 16-bit type, K/V group class, softcap."""

    dtype: str = "fp16"
    group: str = "mha"
    softcap: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES or self.group not in GROUPS or not isinstance(self.softcap, bool):
            raise ValueError(f"bad feature class (dtype={self.dtype!r}, group={self.group!r}, softcap={self.softcap!r}); "
                             f"dtype is one of {DTYPES}, group one of {GROUPS}, softcap a bool")

    @classmethod
    def of(cls, features) -> "FeatureClass":
        """The class of a launch's fa_hw.autotune.Features (None: the plain kernel)."""
        if features is None:
            return cls()
        return cls(features.dtype, "gqa" if features.kv_group > 1 else "mha", bool(features.softcap))

    @property
    def plain(self) -> bool:
        return self == FeatureClass()

    def describe(self) -> str:
        """'' for the plain kernel, else ', bf16, gqa, softcap' (what is not the default)."""
        parts = [self.dtype] * (self.dtype != "fp16") + [self.group] * (self.group != "mha") + ["softcap"] * self.softcap
        return "".join(f", {p}" for p in parts)

    def distance(self, other: "FeatureClass") -> tuple[int, int, int]:
        """(softcap differs, dtype differs, group differs): Table.lookup's order of preference."""
        return int(self.softcap != other.softcap), int(self.dtype != other.dtype), int(self.group != other.group)


@dataclass(frozen=True)
class Entry:
    """The fastest measured config for one (head_dim, causal, size, feature class) key."""

    head_dim: int
    causal: bool
    size: str
    config: KernelConfig
    tflops: float | None = None
    vs_flash: float | None = None
    shapes: tuple = ()
    features: FeatureClass = FeatureClass()

    @property
    def key(self) -> tuple:
        return self.head_dim, self.causal, self.size, self.features

    def to_json(self) -> dict:
        out = {"head_dim": self.head_dim, "causal": self.causal, "size": self.size}
        f = self.features  # only what is not the plain kernel's: a plain entry is written as before
        out.update({"dtype": f.dtype} if f.dtype != "fp16" else {})
        out.update({"group": f.group} if f.group != "mha" else {})
        out.update({"softcap": True} if f.softcap else {})
        out.update(config=self.config.to_json(), tflops=self.tflops, vs_flash=self.vs_flash,
                   shapes=[list(s) for s in self.shapes])
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Entry":
        head_dim, causal, size = data["head_dim"], data["causal"], data["size"]
        if head_dim not in HEAD_DIMS or not isinstance(causal, bool) or size not in SIZE_CLASSES:
            raise ValueError(f"bad key (head_dim={head_dim!r}, causal={causal!r}, size={size!r}); head_dim is one "
                             f"of {HEAD_DIMS}, causal a bool, size one of {SIZE_CLASSES}")
        features = FeatureClass(data.get("dtype", "fp16"), data.get("group", "mha"), data.get("softcap", False))
        config = KernelConfig.from_json(data["config"])
        if config.head_dim != head_dim:
            raise ValueError(f"entry for head_dim {head_dim} holds a config of head_dim {config.head_dim}")
        if config.dtype != "fp16":
            raise ValueError(f"entry for d={head_dim} holds a {config.dtype} config; configs are stored in fp16 "
                             f"(the entry's \"dtype\" names the type it was timed in)")
        return cls(head_dim, causal, size, config, data.get("tflops"), data.get("vs_flash"),
                   tuple(tuple(s) for s in data.get("shapes", ())), features)


@dataclass(frozen=True)
class TableFile:
    """A tuned table's JSON form, shared by the forward's Table and fa_hw.tuned_backward's: format
    TABLE_FORMAT, gpu, arch, nvrtc and entries (each ENTRY.from_json, keys unique). A subclass is a
    frozen dataclass (gpu, arch, entries, nvrtc) naming ENTRY, KIND (for errors) and KEY (the key's
    fields, for the duplicate-key error)."""

    gpu: str
    arch: str
    entries: tuple
    nvrtc: str = ""

    ENTRY = None  # the entry class (a subclass's)
    KIND = "tuned table"
    KEY = ""

    @classmethod
    def for_gpu(cls, gpu: str, directory: Path):
        """The table shipped in `directory` for this GPU (None when there is none)."""
        path = Path(directory) / f"{gpu_key(gpu)}.json"
        return cls.load(path) if path.is_file() else None

    @classmethod
    def from_json(cls, data: dict, where: str | None = None):
        where = where or cls.KIND
        try:
            if data.get("format") != TABLE_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {TABLE_FORMAT}")
            entries = tuple(cls.ENTRY.from_json(e) for e in data["entries"])
            keys = [e.key for e in entries]
            if len(set(keys)) != len(keys):
                raise ValueError(f"two entries for one {cls.KEY}")
            return cls(str(data["gpu"]), str(data["arch"]), entries, str(data.get("nvrtc", "")))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{where} is not a valid {cls.KIND}: {exc}") from None

    @classmethod
    def load(cls, path):
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read the {cls.KIND} {path}: {exc}") from None
        return cls.from_json(data, str(path))


@dataclass(frozen=True)
class Table(TableFile):
    """One GPU's measured entries."""

    ENTRY = Entry
    KEY = "(head_dim, causal, size, dtype, group, softcap)"

    def to_json(self) -> dict:
        return {"format": TABLE_FORMAT, "gpu": self.gpu, "arch": self.arch, "nvrtc": self.nvrtc,
                "entries": [e.to_json() for e in sorted(self.entries, key=lambda e: (
                    e.features.softcap, e.features.dtype, e.features.group, e.head_dim, e.causal,
                    SIZE_CLASSES.index(e.size)))]}

    def lookup(self, head_dim: int, causal: bool, size: str, features: FeatureClass = FeatureClass()) -> Entry | None:
        """The entry of this key, else among the same head_dim and causal the nearest (module
        docstring): the same softcap flag, the nearest size class, the same dtype, the same group."""
        same = [e for e in self.entries if e.head_dim == head_dim and e.causal == causal]
        if not same:
            return None
        want = SIZE_CLASSES.index(size)

        def order(e: Entry) -> tuple:
            cap, dtype, group = features.distance(e.features)
            return cap, abs(SIZE_CLASSES.index(e.size) - want), dtype, group, SIZE_CLASSES.index(e.size)
        return min(same, key=order)

    def plain(self) -> "Table":
        """The entries of the plain kernel only (what the autotuner's pool and a plain tuning take)."""
        return replace(self, entries=tuple(e for e in self.entries if e.features.plain))


def table_for(gpu: str, directory: Path = TUNED_DIR) -> Table | None:
    """The shipped table of this GPU (None when there is none)."""
    return Table.for_gpu(gpu, directory)


@dataclass(frozen=True)
class Choice:
    config: KernelConfig
    source: str  # where it came from, for reports: 'h200.json (d=64, causal, medium)' or 'heuristic (...)'


def candidates(head_dim: int, causal: bool, arch: str = TABLE_ARCH) -> list[KernelConfig]:
    """What tune_hw.py times for this head_dim on `arch`: CANDIDATES that fit its shared memory
    (KernelConfig.fits: the tiles of more than 163 KiB only on sm_90); causal, each with heavy_first,
    plus the seed and the heuristic's config without it (what heavy_first alone changes)."""
    from dataclasses import replace

    base = [c for c in (KernelConfig.from_tag(t) for t in CANDIDATES.get(head_dim, ())) if c.fits(arch)]
    if not causal:
        return base
    plain = [c for c in (KernelConfig(head_dim=head_dim), HEURISTIC.get(head_dim)) if c is not None]
    return [replace(c, heavy_first=True) for c in base] + plain


def model_candidates(head_dim: int, causal: bool, seqlen_k: int, arch: str = TABLE_ARCH) -> list[KernelConfig]:
    """The candidates the timing model ranks where no table answers: the autotuner's pool
    (`autotune_candidates`, at most MAX_AUTOTUNE_CANDIDATES), the configs fa_hw.autotune would time
    on the GPU for this problem, so that `fa time --config auto` and the GPU agree on what is
    compared and a cold ranking stays within fa time's 30 s (about 5 s per uncached candidate on
    the 2-core development machine; all of `candidates`, 17-21 per head_dim, took 133 s)."""
    return autotune_candidates(head_dim, causal, seqlen_k, arch=arch)


def heuristic(head_dim: int) -> KernelConfig:
    if head_dim not in HEURISTIC:
        raise ValueError(f"config='auto' covers head_dim {HEAD_DIMS}, got {head_dim}")
    return HEURISTIC[head_dim]


def _entry_source(gpu: str, entry: Entry, size: str, want: FeatureClass) -> str:
    exact = "" if entry.size == size else f", nearest to {size}"
    feats = entry.features.describe()
    if entry.features != want:
        feats += f", nearest to{want.describe()[1:] or ' the plain kernel'}"
    return (f"{gpu_key(gpu)}.json (d={entry.head_dim}, {'causal' if entry.causal else 'non-causal'}, {entry.size}{exact}"
            f"{feats})")


def auto_config(head_dim: int, causal: bool, seqlen_k: int, gpu: str, arch: str,
                directory: Path = TUNED_DIR, features=None) -> Choice:
    """The config "auto" means for this problem on this GPU (module docstring: lookup order);
    `features`: the launch's fa_hw.autotune.Features (None: the plain kernel), its class and window."""
    want = FeatureClass.of(features)
    size = size_class(effective_keys(seqlen_k, features.window, causal) if features is not None else seqlen_k)
    table = table_for(gpu, directory)
    entry = table.lookup(head_dim, bool(causal), size, want) if table is not None and table.arch == arch else None
    if entry is not None:
        return Choice(replace(entry.config, dtype=want.dtype), _entry_source(gpu, entry, size, want))
    why = "no table for this GPU" if table is None else (
        f"the table is for {table.arch}" if table.arch != arch else f"no entry for d={head_dim}")
    model = MODEL_OF_ARCH.get(arch)
    if model is None or head_dim not in HEURISTIC:
        return Choice(heuristic(head_dim), f"heuristic ({why}; no timing model for {arch})")
    return model_choice(head_dim, causal, seqlen_k, model, why)


#: The timing model (fa_sim.timing.GPUS) that ranks the candidates on a GPU of this arch without a table.
MODEL_OF_ARCH = {"sm_90": "h200", "sm_80": "a100"}


def model_choice(head_dim: int, causal: bool, seqlen_k: int, model: str, why: str = "") -> Choice:
    """The candidate the timing model predicts fastest (fa_sim.timing.rank), for a GPU or problem
    class without a measured entry; `why` says why the table did not answer."""
    from fa_sim.timing.gpus import gpu_model
    from fa_sim.timing.rank import family_candidates, rank

    arch = gpu_model(model).arch
    pool = tuple(model_candidates(head_dim, causal, seqlen_k, arch)) or tuple(family_candidates(head_dim))
    best = rank(pool, int(seqlen_k), bool(causal), model)[0]
    note = f"{why}; " if why else ""
    return Choice(best.config, f"timing model ({note}ranked {len(pool)} candidates on the {model} model: "
                               f"{best.kernel_ms:.3f} ms predicted)")


MAX_AUTOTUNE_CANDIDATES = 6  # configs fa_hw.autotune times per problem class at most


def autotune_candidates(head_dim: int, causal: bool, seqlen_k: int, directory: Path = TUNED_DIR,
                        arch: str = TABLE_ARCH) -> list[KernelConfig]:
    """The configs fa_hw.autotune times for a problem on a GPU of `arch` without a table (that
    module's docstring says why these): the shipped tables' winners for (head_dim, causal) of the
    nearest size class (every table's, in file-name order); the first one's neighbours, the other
    kv_stages (1 or 2) and lazy_sum toggled; the tables' winners of the other size classes, nearest
    first; the heuristic tile (heavy_first when causal); the tiles of more than 163 KiB worth timing
    where `arch` fits them (BIG_TILES: sm_90; heavy_first when causal); only configs that fit `arch`'s shared memory, no
    duplicates, at most MAX_AUTOTUNE_CANDIDATES."""
    from dataclasses import replace

    want = SIZE_CLASSES.index(size_class(seqlen_k))
    ranked = []  # (distance of the size class, size class, table, config)
    for t, path in enumerate(sorted(Path(directory).glob("*.json"))):
        ranked += [(abs(SIZE_CLASSES.index(e.size) - want), SIZE_CLASSES.index(e.size), t, e.config)
                   for e in Table.load(path).plain().entries if e.head_dim == head_dim and e.causal == bool(causal)]
    ranked.sort(key=lambda r: r[:3])
    out: list[KernelConfig] = []
    if not ranked:  # no table holds this head_dim (96-256 today): its candidates, the heuristic's tile first
        out = [replace(KernelConfig.from_tag(t), heavy_first=bool(causal)) for t in CANDIDATES.get(head_dim, ())]
    else:
        nearest = [r[3] for r in ranked if r[0] == ranked[0][0]]
        best = nearest[0]
        out = list(nearest)
        for change in ({"kv_stages": 2 if best.kv_stages == 1 else 1}, {"lazy_sum": not best.lazy_sum}):
            try:
                out.append(replace(best, **change))
            except ValueError:  # not a valid config of the family (KernelConfig says why): not timed
                pass
        out += [r[3] for r in ranked if r[0] != ranked[0][0]]
    tile = heuristic(head_dim)
    out.append(replace(tile, heavy_first=True) if causal else tile)
    out += [replace(KernelConfig.from_tag(t), heavy_first=bool(causal)) for t in BIG_TILES.get(head_dim, ())]
    return list(dict.fromkeys(c for c in out if c.fits(arch)))[:MAX_AUTOTUNE_CANDIDATES]


def device_choice(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int, batch_heads: int, gpu: str,
                  arch: str, timer_factory, directory: Path = TUNED_DIR, kernel: str | None = None,
                  features: "autotune.Features | None" = None) -> Choice:
    """What "auto" means on a real GPU: its shipped table's entry (as auto_config), else the choice
    autotuned for this problem class on this GPU - cached on disk, or timed now with
    `timer_factory` (fa_hw.autotune; the timing model is not consulted). `kernel`: the cache's
    fingerprint (fa_hw.autotune.fingerprint, computed when None). `features`: issue 38's
    grouped-query K/V, window, softcap and dtype of the launch (fa_hw.autotune.Features; None: none),
    which the autotuned class and its timed launches carry; a shipped table answers by the
    launch's feature class and the window's effective keys (Table.lookup)."""
    from . import autotune

    feats = autotune.Features() if features is None else features
    want = FeatureClass.of(feats)
    size = size_class(effective_keys(seqlen_k, feats.window, causal))
    table = table_for(gpu, directory)
    entry = table.lookup(head_dim, bool(causal), size, want) if table is not None and table.arch == arch else None
    if entry is not None:  # in the run's dtype (the tables hold fp16 configs)
        return Choice(replace(entry.config, dtype=feats.dtype), _entry_source(gpu, entry, size, want))
    heuristic(head_dim)  # an unsupported head_dim is refused before any timing
    cls = autotune.ProblemClass.of(batch_heads, seqlen_q, seqlen_k, head_dim, causal, feats)
    shape = autotune.timing_shape(batch_heads, seqlen_q, seqlen_k, head_dim, feats.kv_group)
    pool = autotune_candidates(head_dim, bool(causal), seqlen_k, directory, arch)
    config, source = autotune.choose(cls, gpu, arch, pool, timer_factory, shape, kernel)
    return Choice(replace(config, dtype=feats.dtype), source)  # timed as feats.dtype builds


def auto_for_device(head_dim: int, causal: bool, seqlen_k: int, seqlen_q: int | None = None,
                    batch_heads: int | None = None, features: "autotune.Features | None" = None) -> Choice:
    """device_choice for the current GPU (its name and exact arch); without a table entry, the
    candidates are timed on random inputs of the problem's shape (batch*heads capped:
    fa_hw.autotune.timing_shape) with its `features`. seqlen_q defaults to seqlen_k, batch_heads to 64."""
    from .autotune import device_timer_factory

    return device_choice(int(head_dim), bool(causal), int(seqlen_k if seqlen_q is None else seqlen_q),
                         int(seqlen_k), 64 if batch_heads is None else int(batch_heads), device().name,
                         device_arch(), device_timer_factory(features=features), features=features)


def is_auto(config) -> bool:
    """config="auto" (any case, spaces around it); any other string is a config tag, which
    fa_sim.validate checks as simulate does."""
    return isinstance(config, str) and config.strip().lower() == AUTO


def resolve(config, q_shape, k_shape, causal: bool, timer_factory=None, features=None):
    """forward()'s config argument: "auto" -> the current GPU's choice for these shapes
    (device_choice; without a table entry or cached choice, timed with `timer_factory`, default
    random inputs, with `features`: fa_hw.autotune.Features); anything else as given (a KernelConfig,
    None or a config tag, which fa_sim.validate checks as simulate does)."""
    if not is_auto(config):
        return config
    if timer_factory is None:
        from .autotune import device_timer_factory

        timer_factory = device_timer_factory(features=features)
    b, h, nq, d = (int(n) for n in q_shape)
    return device_choice(d, bool(causal), nq, int(k_shape[2]), b * h, device().name, device_arch(),
                         timer_factory, features=features).config
