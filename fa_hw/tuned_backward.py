"""The backward's tiles per GPU: the fastest measured BackwardConfig per (head_dim, causal, size class).

    cfg = fa_hw.tuned_backward.device_config(head_dim=64, causal=False, seqlen_k=4096, dtype="fp16")
    choice = fa_hw.tuned_backward.lookup(64, False, 4096, gpu="NVIDIA H100 80GB HBM3", arch="sm_90")
    choice.config, choice.source

Tables. `experiments/tune_bwd.py` times every candidate of CANDIDATES[head_dim] (block_m, n_warps, q_stages, softmax,
dq_red, dq_frag, lse_async, dq_warp_rows, smem_swizzle)
on the device, on training shapes disjoint from the benchmark's held-out set (experiments/hw_sets.py
BWD_TRAIN), and writes the fastest per (head_dim, causal, size class) as JSON; the package ships one
file per GPU in fa_hw/tuned/backward/ (a subfolder: fa_hw.tuned reads every fa_hw/tuned/*.json as a
forward table), named by fa_hw.device.gpu_key:

    {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "nvrtc": "13.0", "entries": [
      {"head_dim": 64, "causal": false, "size": "medium", "block_m": 64, "n_warps": 8, "q_stages": 2,
       "softmax": "ffma", "dq_red": 2, "vs_default": 1.31, "vs_flash": 0.97, "shapes": [[4, 16, 4096, 64]]}, ...]}

(softmax: BackwardConfig.softmax, "fmul_fsub" when absent; dq_red: BackwardConfig.dq_red, 1 when absent;
dq_frag: BackwardConfig.dq_frag, lse_async: BackwardConfig.lse_async, smem_swizzle: BackwardConfig.smem_swizzle,
written only when true; dq_warp_rows: BackwardConfig.dq_warp_rows, written only when not 16: tables written before
they existed.)

vs_default: the geometric mean over the key's shapes of DEFAULT_TILES' time / the winner's;
vs_flash: the same against SDPA-flash's backward (fp16, fa2_bwd.cu's kernels alone against SDPA's
autograd backward: tune_bwd.py's docstring). Size classes are fa_hw.tuned's (seqlen_k <= 1024
"short", <= 4096 "medium", above "long": how many CTAs the grid has and how many Q blocks each loops over).

Labels. A candidate or an entry is named by its label (BackwardConfig.label, e.g. 64x8s1fr4p:
fa_sim.contract.backward.LABEL_FORMS), as tune_bwd.py reports it; `--config LABEL` with --backward runs
it in the fa commands, and `--config auto` runs lookup()'s choice (fa time: for the modelled GPU).

Lookup. The entry for (head_dim, causal, size) of the device's table, if its arch is the device's;
else that table's entry for the same head_dim and causal in the nearest size class; else
DEFAULT_TILES (fa_sim.contract.backward), which `Choice.source` says. A GPU without a table of its
own (or with one for another arch) borrows the first table of its arch by file name, and the source
says so. A table that is missing or for
another arch is not used; one whose entries are malformed is a ValueError naming the file.

Who reads it: fa_hw.attention's backward (fa_hw.backward.enqueue_backward) and fa_hw.backward with
config="auto". fa_hw.backward's default (config=None) stays DEFAULT_TILES: the simulator's default,
which `fa compare --backward` and the recorded checkpoints (tests/data/h100/bwd_checkpoints_*.npz)
describe. dK, dV and the deterministic mode's dQ do not depend on the tiles (each element sums the
same k16 segments of queries, or keys, in ascending order in one fp32 accumulator:
tests/test_backward_tiles.py checks them bit for bit on the PTX engine); the atomic mode's dQ sums
one partial per K/V block, so block_n changes its order, within the same bound. The softmax form
does change them: an "ffma" candidate computes the bits of BackwardConfig(head_dim, softmax="ffma")
(its own P), within the same bound of float64. dq_red (2, 4: sm_90's red.global.add.v2/.v4.f32 for the
atomic dQ) changes no bit of dK, dV and adds the same terms to each dQ_accum element; before sm_90
`candidates(d, arch=...)` leaves it out and compile_backward refuses it (so tune_bwd.py never writes it
into an older GPU's table). dq_frag (dq_accum in the fragment order) adds the same terms to each element
too, in another place of dq_accum that the convert kernel reads back: dQ, dK, dV keep their bits.
lse_async (LSE and D by cp.async), dq_warp_rows 32 (32-row warp tiles of the dQ GEMM) and smem_swizzle (swizzled
instead of padded tiles: the same values in other shared-memory places) change no bit either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fa_sim.contract.backward import (DEFAULT_TILES, DQ_RED_WIDTHS, HEAD_DIMS, SOFTMAX_FORMS, BackwardConfig, label,
                                      vector_reductions_ok)

from .tuned import SIZE_CLASSES, TABLE_FORMAT, TUNED_DIR, TableFile, size_class

BWD_TUNED_DIR = TUNED_DIR / "backward"
#: (block_m, n_warps, q_stages, softmax, dq_red) that experiments/tune_bwd.py times per head_dim, DEFAULT_TILES' first
#: (q_stages 1, softmax fmul_fsub, dq_red 1). q_stages 2 double-buffers the Q block (Q, dO, LSE, D: FA_Q_STAGES), the next one
#: loading under the whole round instead of under the dQ GEMM alone, as FlashAttention-2's backward
#: does; each tile below is timed with 1 and 2 stages where two fit (`tiles`). Every one
#: compiles for sm_90 without spills in both dQ modes, causal or not, fp16 and bf16 (at most 255
#: registers; tests/test_backward_tiles.py), and runs on the PTX engine with the default's dK, dV and
#: deterministic dQ bits. n_warps 8 is block_n 128 keys per CTA, FlashAttention-2's backward tile
#: for d <= 64 (its 128 x 128 of 8 warps); block_m 64 at d=128 is its 64 x 128 (here 64 x 64 or
#: 64 x 128 keys). Configs that do not tile (BackwardConfig) or spill are not listed: d=32 and 96 take
#: no block_m 32 with 8 warps (a warp's dQ columns would be an odd number of n8 tiles), d=128 no
#: block_m 128 (175 KB of shared memory, over the 163 KB a CTA can have on SM80).
#: the tiles also timed with softmax "ffma" (FA_SOFTMAX_FFMA, one FMUL less per score: 64 of the ~900-1200
#: SASS instructions of a block_m 128 iteration): the 8-warp tiles of block_m >= 64, those that won on the H100
#: (experiments/tune_bwd_h100.md)
FFMA_MIN_BLOCK_M, FFMA_N_WARPS = 64, 8
#: the tiles also timed with vector dQ reductions (dq_red 2 and 4: FA_DQ_RED, sm_90): the same 8-warp tiles
#: of block_m >= 64 with one Q stage (the tiles that won on the H100; two stages lost everywhere). Why: the
#: timing model's stalls of the winners at (8, 16, 2048, 64) and (4, 16, 2048, 128) are led by lg_throttle
#: (the 32 scalar reds per thread and Q block queueing on the L2's atomic units) and the barrier the other
#: warps wait at meanwhile (docs/backward.md, "Where the main kernel's time goes"); v2 halves the requests,
#: v4 halves them again for two shuffles and six selects per n8 tile.
DQ_RED_MIN_BLOCK_M, DQ_RED_N_WARPS = 64, 8
TILES = {
    32: ((64, 4), (32, 4), (64, 8), (128, 8)),
    64: ((64, 4), (32, 4), (32, 8), (64, 8), (128, 8)),
    96: ((64, 4), (32, 4), (64, 8), (128, 8)),
    128: ((32, 4), (16, 4), (64, 4), (16, 8), (32, 8), (64, 8)),
    160: ((32, 4),),
    192: ((16, 4),),
}
assert all(TILES[d][0] == DEFAULT_TILES[d] for d in HEAD_DIMS), "DEFAULT_TILES first"


def _fits(d: int, bm: int, nw: int, stages: int) -> bool:
    try:
        BackwardConfig(d, block_m=bm, n_warps=nw, q_stages=stages)
    except ValueError:  # two Q block buffers past the shared memory a CTA can have
        return False
    return True


#: head_dim 160 and 192 keep the default alone (not tuned: tune_bwd.py's head dims are 32-128; two Q
#: stages at 192 spill 8 bytes).
def _softmaxes(d: int, bm: int, nw: int) -> tuple[str, ...]:
    ffma = d <= 128 and nw == FFMA_N_WARPS and bm >= FFMA_MIN_BLOCK_M
    return SOFTMAX_FORMS if ffma else SOFTMAX_FORMS[:1]


#: (head_dim, block_m, n_warps, softmax, dq_red, dq_frag) left out because ptxas spills it (sm_90: 8 bytes of local
#: memory)
DQ_RED_SPILLS = {(96, 128, 8, "ffma", 4, False), (64, 128, 8, "fmul_fsub", 4, True)}
#: the dq_red widths also timed with dq_accum in the fragment order (dq_frag, FA_DQ_FRAG; "p" in tune_bwd.py's
#: labels): each warp reduction covers 32 dq_red contiguous fp32, whole 128-byte lines, where the row-major
#: order touches one 32-byte sector in each of 8 rows (FlashAttention-2 permutes its dq_accum the same way);
#: the v4 form then needs no lane exchange. Why: at dq_red 2 the H100 adds ~200 G dQ elements/s, below the
#: ~230+ G/s SDPA-flash's scalar atomics reach in full lines (docs/backward.md, "Where the main kernel's time goes")
DQ_FRAG_WIDTHS = (4,)


#: (lse_async, dq_warp_rows) also timed with the fragment-order v4 candidates (the H100's winners at every key) of
#: the head dims and tiles below ("l", "m" in tune_bwd.py's labels; (False, 16) is every candidate's). Why: the
#: H100's d=128 rows missed SDPA-flash by 1.6-3.5 % with FlashAttention-2's own 64 x 128 tile of 8 warps. lse_async:
#: LSE and D came by ld.global + st.shared after BAR_DS, so warps 0 and 1 waited for an L2 round trip before their
#: dQ GEMM and the CTA for them at the next BAR_LOAD (FlashAttention-2 loads LSE a round early); dq_warp_rows 32:
#: 32 x 32 warp tiles of dQ (FlashAttention-2's AtomLayoutMdQ 2) take 176 instead of 184 LDSM.x4 per warp and Q
#: block at d=128 (FlashAttention-2's five GEMMs take ~144 plus two 16 KB tile stores).
LOOP_OPTIONS = ((True, 16), (False, 32), (True, 32))
LOOP_OPTION_TILES = {(128, 64, 8), (64, 128, 8)}
#: the same tiles' fragment-order v4 candidates with two Q stages and lse_async (at the end of CANDIDATES[d]): two
#: stages load the next Q block at the top of the round, where the synchronous LSE and D load held warps 0 ..
#: block_m / 32 - 1 before their S GEMM and the CTA for them at BAR_DS (the timing model, (1, 16, 4096, 128)
#: non-causal, ffma: 64x8s2fr4p 3.7 % behind 64x8s1fr4p, 64x8s2fr4pl 1.2 %)
STAGE2_LOOP_OPTIONS = ((True, 16),)


def _loop_options(d: int, bm: int, nw: int, red: int, frag: bool) -> tuple[tuple[bool, int], ...]:
    more = LOOP_OPTIONS if frag and red == 4 and (d, bm, nw) in LOOP_OPTION_TILES else ()
    return ((False, 16), *more)


#: the candidates also timed with swizzled tiles (smem_swizzle, FA_SMEM_SWIZZLE; "z" in tune_bwd.py's labels):
#: (head_dim, label without the "z") of the H100's winners (fa_hw/tuned/backward/h100_80gb_hbm3.json: 64x8s1fr4p
#: and 128x8s1fr4p at d = 32, 128x8s1fr4p and 128x8s1r4p at d = 96, 64x8s1r4pm at d = 128)
#: and 64x8s1fr4pm (d = 128's other softmax form). Why: the padded rows (d + 8 halves) make each cp.async pass's
#: 16-byte chunks straddle 128-byte lines, 10.5 wavefronts per LDGSTS at d = 64, 128 and 15 at d = 32, 96 where 4
#: would do (`fa banks --backward --config 64x8s1r4pm`); the swizzled rows fill whole lines (4.00) with every
#: LDSM, LDS and STS still conflict-free; the forward's padded layout ran 4-14 % behind its swizzled one on the
#: GPU (README, "Timing").
#: d = 64's winner is left out (SWIZZLE_SPILLS): its 64 x 8-warp tile with the same options stands in.
SWIZZLE_OF = {(32, "64x8s1fr4p"), (32, "128x8s1fr4p"), (64, "64x8s1fr4p"), (96, "128x8s1fr4p"), (96, "128x8s1r4p"),
              (128, "64x8s1r4pm"), (128, "64x8s1fr4pm")}
#: (head_dim, label without the "z") whose swizzled form ptxas spills (sm_90: 8 bytes of local memory in the
#: deterministic mode's main kernel, non-causal, fp16 and bf16; the padded form sits at 255 registers without):
#: every block_m 128 x 8-warp tile at d = 64 (128x8s1f, 128x8s1fr4, 128x8s1r4, 128x8s1fr4p, 128x8s1fr4pl and
#: 128x8s1fr4pm checked): each ldmatrix column step of the swizzled rows is an XOR that takes a register where the
#: padded rows' sum is the instruction's immediate (pinning them to their GEMMs by an opaque mov did not help)
SWIZZLE_SPILLS = {(64, "128x8s1fr4p")}
assert not SWIZZLE_OF & SWIZZLE_SPILLS


def _dq_reds(d: int, bm: int, nw: int, st: int, sm: str) -> tuple[tuple[int, bool], ...]:
    vec = d <= 128 and nw == DQ_RED_N_WARPS and bm >= DQ_RED_MIN_BLOCK_M and st == 1
    reds = [(r, False) for r in (DQ_RED_WIDTHS if vec else DQ_RED_WIDTHS[:1])]
    reds += [(r, True) for r in (DQ_FRAG_WIDTHS if vec else ())]
    return tuple((r, p) for r, p in reds if (d, bm, nw, sm, r, p) not in DQ_RED_SPILLS)


_PADDED = {d: tuple((bm, nw, st, sm, red, frag, la, wr) for bm, nw in tiles for sm in _softmaxes(d, bm, nw)
                    for st in ((1, 2) if d <= 128 else (1,)) if _fits(d, bm, nw, st)
                    for red, frag in _dq_reds(d, bm, nw, st, sm) for la, wr in _loop_options(d, bm, nw, red, frag))
           + tuple((bm, nw, 2, sm, 4, True, la, wr) for dd, bm, nw in sorted(LOOP_OPTION_TILES) if dd == d
                   for sm in _softmaxes(d, bm, nw) if _fits(d, bm, nw, 2) and (d, bm, nw, sm, 4, True) not in DQ_RED_SPILLS
                   for la, wr in STAGE2_LOOP_OPTIONS)
           for d, tiles in TILES.items()}
#: (block_m, n_warps, q_stages, softmax, dq_red, dq_frag, lse_async, dq_warp_rows, smem_swizzle) per head_dim: the
#: padded candidates, then the swizzled forms of SWIZZLE_OF's (at the end: the earlier ones keep their places)
CANDIDATES = {d: tuple((*c, False) for c in cands)
                 + tuple((*c, True) for c in cands if (d, label(*c)) in SWIZZLE_OF)
              for d, cands in _PADDED.items()}
assert all(sum((d, label(*c[:8])) in SWIZZLE_OF for c in cands if c[8]) == len([x for x in SWIZZLE_OF if x[0] == d])
           for d, cands in CANDIDATES.items()), "every SWIZZLE_OF label is a padded candidate"


def candidates(head_dim: int, dtype: str = "fp16", arch: str | None = None) -> list[BackwardConfig]:
    """CANDIDATES[head_dim] as BackwardConfigs (ValueError for a head_dim the backward refuses); with
    `arch` ("sm_80", "sm_90", ...) only those that compile for it (dq_red 2, 4 need sm_90)."""
    BackwardConfig(head_dim, dtype=dtype)  # the one-line error for a head_dim without a backward
    vec_ok = arch is None or vector_reductions_ok(arch)
    return [BackwardConfig(head_dim, block_m=bm, n_warps=nw, dtype=dtype, q_stages=st, softmax=sm, dq_red=red,
                           dq_frag=frag, lse_async=la, dq_warp_rows=wr, smem_swizzle=swz)
            for bm, nw, st, sm, red, frag, la, wr, swz in CANDIDATES[head_dim] if red == 1 or vec_ok]


@dataclass(frozen=True)
class Entry:
    """The fastest measured tiles of one (head_dim, causal, size) key."""

    head_dim: int
    causal: bool
    size: str
    block_m: int
    n_warps: int
    q_stages: int = 1
    vs_default: float | None = None
    vs_flash: float | None = None
    shapes: tuple = ()
    softmax: str = SOFTMAX_FORMS[0]  # BackwardConfig.softmax (last: the positional fields keep their places)
    dq_red: int = 1  # BackwardConfig.dq_red
    dq_frag: bool = False  # BackwardConfig.dq_frag
    lse_async: bool = False  # BackwardConfig.lse_async
    dq_warp_rows: int = 16  # BackwardConfig.dq_warp_rows
    smem_swizzle: bool = False  # BackwardConfig.smem_swizzle

    @property
    def key(self) -> tuple[int, bool, str]:
        return self.head_dim, self.causal, self.size

    def config(self, dtype: str = "fp16") -> BackwardConfig:
        return BackwardConfig(self.head_dim, block_m=self.block_m, n_warps=self.n_warps, dtype=dtype,
                              q_stages=self.q_stages, softmax=self.softmax, dq_red=self.dq_red,
                              dq_frag=self.dq_frag, lse_async=self.lse_async, dq_warp_rows=self.dq_warp_rows,
                              smem_swizzle=self.smem_swizzle)

    def to_json(self) -> dict:
        return {"head_dim": self.head_dim, "causal": self.causal, "size": self.size, "block_m": self.block_m,
                "n_warps": self.n_warps, "q_stages": self.q_stages, "softmax": self.softmax, "dq_red": self.dq_red, **({"dq_frag": True} if self.dq_frag else {}),
                **({"lse_async": True} if self.lse_async else {}),
                **({"dq_warp_rows": self.dq_warp_rows} if self.dq_warp_rows != 16 else {}),
                **({"smem_swizzle": True} if self.smem_swizzle else {}),
                "vs_default": self.vs_default, "vs_flash": self.vs_flash,
                "shapes": [list(s) for s in self.shapes]}

    @classmethod
    def from_json(cls, data: dict) -> "Entry":
        head_dim, causal, size = data["head_dim"], data["causal"], data["size"]
        if head_dim not in HEAD_DIMS or not isinstance(causal, bool) or size not in SIZE_CLASSES:
            raise ValueError(f"bad key (head_dim={head_dim!r}, causal={causal!r}, size={size!r}); head_dim is one "
                             f"of {HEAD_DIMS}, causal a bool, size one of {SIZE_CLASSES}")
        out = cls(head_dim, causal, size, int(data["block_m"]), int(data["n_warps"]), int(data.get("q_stages", 1)),
                  data.get("vs_default"), data.get("vs_flash"), tuple(tuple(s) for s in data.get("shapes", ())),
                  str(data.get("softmax", SOFTMAX_FORMS[0])), data.get("dq_red", 1), data.get("dq_frag", False),
                  data.get("lse_async", False), data.get("dq_warp_rows", 16), data.get("smem_swizzle", False))
        out.config()  # tiles that do not tile or fit: BackwardConfig's ValueError
        return out


@dataclass(frozen=True)
class Table(TableFile):
    """One GPU's measured backward entries (JSON as the forward's: fa_hw.tuned.TableFile)."""

    ENTRY = Entry
    KIND = "backward tuned table"
    KEY = "(head_dim, causal, size)"

    def to_json(self) -> dict:
        order = sorted(self.entries, key=lambda e: (e.head_dim, e.causal, SIZE_CLASSES.index(e.size)))
        return {"format": TABLE_FORMAT, "gpu": self.gpu, "arch": self.arch, "nvrtc": self.nvrtc,
                "entries": [e.to_json() for e in order]}

    def lookup(self, head_dim: int, causal: bool, size: str) -> Entry | None:
        """The entry of this key, else the same head_dim and causal in the nearest size class."""
        same = [e for e in self.entries if e.head_dim == head_dim and e.causal == causal]
        if not same:
            return None
        want = SIZE_CLASSES.index(size)
        return min(same, key=lambda e: (abs(SIZE_CLASSES.index(e.size) - want), SIZE_CLASSES.index(e.size)))


def table_for(gpu: str, directory: Path = BWD_TUNED_DIR) -> Table | None:
    """The shipped backward table of this GPU (None when there is none)."""
    return Table.for_gpu(gpu, directory)


@dataclass(frozen=True)
class Choice:
    config: BackwardConfig
    source: str  # for reports: 'h100_80gb_hbm3.json (d=64, causal, medium)' or 'DEFAULT_TILES (...)'


def lookup(head_dim: int, causal: bool, seqlen_k: int, gpu: str, arch: str, dtype: str = "fp16",
           directory: Path = BWD_TUNED_DIR) -> Choice:
    """The tiles for one problem on `gpu` (module docstring); no GPU needed."""
    from .device import gpu_key

    default = BackwardConfig(head_dim, dtype=dtype)
    table, name = table_for(gpu, directory), gpu_key(gpu)
    if table is None or table.arch != arch:
        why = "no backward table" if table is None else f"its table is for {table.arch}"
        same = _same_arch_table(arch, directory)
        if same is None:
            return Choice(default, f"DEFAULT_TILES ({gpu}: {why})")
        (name, table), borrowed = same, f"; {gpu}: {why}, {arch} like this one"
    else:
        borrowed = ""
    entry = table.lookup(head_dim, causal, size_class(seqlen_k))
    if entry is None:
        return Choice(default, f"DEFAULT_TILES ({table.gpu}'s table has no d={head_dim} "
                               f"{'causal' if causal else 'non-causal'} entry{borrowed})")
    return Choice(entry.config(dtype), f"backward/{name}.json (d={head_dim}, "
                                       f"{'causal' if causal else 'non-causal'}, {entry.size}{borrowed})")


def _same_arch_table(arch: str, directory: Path) -> tuple[str, Table] | None:
    """A GPU without a table of its own borrows one of the same arch (the first by file name): tiles
    measured on another GPU of its SM generation (an H100's on an H200 or H800: the same SM, other
    clocks, memory and SM counts) beat DEFAULT_TILES, which no tuning chose."""
    for path in sorted(Path(directory).glob("*.json")):
        table = Table.load(path)
        if table.arch == arch:
            return path.stem, table
    return None


_DEVICE_CHOICES: dict = {}
_DIRECTORY = [BWD_TUNED_DIR]


def use_directory(directory) -> None:
    """Read the device's table from `directory` from now on in this process (experiments/bench_hw.py
    --backward --tuned-dir DIR: DIR/backward, a table tune_bwd.py just wrote); None: the shipped one."""
    _DIRECTORY[0] = BWD_TUNED_DIR if directory is None else Path(directory)
    _DEVICE_CHOICES.clear()


def device_config(head_dim: int, causal: bool, seqlen_k: int, dtype: str = "fp16",
                  directory: Path | None = None) -> BackwardConfig:
    """lookup() for the current GPU (its name and arch), cached per key for the process; directory
    None: the shipped tables (or use_directory's)."""
    directory = _DIRECTORY[0] if directory is None else Path(directory)
    key = (head_dim, causal, size_class(seqlen_k), dtype, str(directory))
    if key not in _DEVICE_CHOICES:
        from .device import device, device_arch

        _DEVICE_CHOICES[key] = lookup(head_dim, causal, seqlen_k, device().name, device_arch(), dtype,
                                      directory).config
    return _DEVICE_CHOICES[key]
