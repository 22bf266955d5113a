"""Saved GPU runs: the versioned .npz that `fa compare --save` writes and `--gpu-npz` replays.

A run holds the inputs, O, LSE, the checkpoint buffer of the selected CTAs and what selected the
kernel (config, causal flag, scale; format 3 also the CUDA source). Formats:
- 1 (no "format" entry): every such run was made with the FFMA softmax form, the only one the
  kernel had; its tag has no softmax suffix and loads as FFMA;
- 2: the config tag names the softmax form, and "config_json" holds the KernelConfig as JSON;
- 3: + "kernel_name" and "kernel_source", the .cu the GPU compiled;
- 4: the launch's features (issue 38, docs/features.md): k and v may have fewer heads than q
  (grouped-query attention: H_k dividing H), "window" (int32 [2], -1 -1 for none) and "softcap"
  (0.0 for none), and a bf16 config's q, k, v, o are float32 arrays of bf16 values;
- 5: the launch kinds of `fa compare --seqlens` and `--splits` (issue 38), each optional (absent:
  a dense launch, as formats 1-4, which still read):
  - a packed variable-length batch: "cu_seqlens_q" and "cu_seqlens_k" (int32 [B + 1], both or
    neither; fa_sim.varlen's checks), q [total_q, H, d], k and v [total_k, H_k, d], o of q's shape
    and lse [H, total_q] (FlashAttention-2's varlen layouts); "ctas" are ids of the packed grid
    (ceil(max Nq / block_m), H, B) and the checkpoint buffer has the rounds of the longest
    sequence's keys;
  - split-KV decoding: "splits" (the number the GPU ran, "auto" resolved), "cache_seqlens" (int32
    [B], each sequence's keys in the cache k, v [B, H_k, Nk, d]), "pack_gqa" (whether GQA ran
    packed: the resolved choice, so a replay runs the same grid), q, k, v, o, lse as a dense run's
    (no causal mask or window); "ctas" are ids of the split grid and the checkpoint buffer is
    fa_sim.splitkv.checkpoint_layout's; with splits > 1 also the fp32 workspace "o_accum"
    [splits, B*H, Nq, d] and "lse_accum" [splits, B*H, Nq] (every split's partial O and LSE; B*H
    of the launch, H_k heads of g*Nq rows when GQA is packed) and "combine_source", the
    fa2_combine.cu the GPU compiled (kernel_source is the fa2_fwd.cu of the split kernel).

A file is checked field by field when it is read (`SavedRun.from_arrays`): every array's type,
rank, dtype and shape, and that the fields agree with one another (the config tag with the JSON,
the inputs with the config's head_dim, O and LSE with the inputs, the checkpoint buffer with the
config, the grid and the CTAs). A file that fails is one ValueError line naming the field, what
it holds and what a saved run holds there - never a numpy broadcast or truth-value message, and
never a field silently read as something else (a causal flag "no" is refused, not read as True).
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, replace

import numpy as np

from .checkpoints import CheckpointLayout
from .config import KernelConfig, SoftmaxForm
from .problem import Problem, check_softcap, check_window

SAVED_RUN_FORMAT = 5  # 5: + packed batches (cu_seqlens_q/k) and split-KV runs (splits, cache_seqlens,
#                       pack_gqa, the workspace o_accum / lse_accum, the combine's source); 4: + window,
#                       softcap, GQA's k/v heads, bf16 arrays; 3: + the kernel's file name and source; 2: the config tag names the softmax form; 1 (no "format" entry): FFMA form
SAVED_ARRAYS = ("q", "k", "v", "o", "lse", "checkpoints", "ctas", "config", "causal", "scale")
PACKED_ARRAYS = ("cu_seqlens_q", "cu_seqlens_k")
SPLIT_ARRAYS = ("splits", "cache_seqlens", "pack_gqa", "o_accum", "lse_accum", "combine_source")
OPTIONAL_ARRAYS = ("format", "config_json", "kernel_name", "kernel_source", "window", "softcap", *PACKED_ARRAYS,
                   *SPLIT_ARRAYS)

_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile)


def config_from_tag(tag: str, softmax: SoftmaxForm = SoftmaxForm.FMUL_FSUB) -> KernelConfig:
    """KernelConfig.tag back to a config, e.g. 'm64n64d64w4-swizzled' or '...-swizzled-ffma';
    `softmax` is the form of a tag without a suffix (KernelConfig.from_tag)."""
    return KernelConfig.from_tag(tag, softmax)


def _read_npz(path) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except _READ_ERRORS as exc:  # missing, not a zip, truncated, a pickle (allow_pickle=False)
        why = "not an .npz archive (only a pickle could be read, which is refused)" if "pickle" in str(exc) \
            else " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"cannot read {path}: {why}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"cannot read {path}: it holds one array, not an .npz archive of a saved GPU run")
    try:
        with archive:
            return {name: archive[name] for name in archive.files}
    except _READ_ERRORS as exc:  # a truncated or corrupt member
        raise ValueError(f"cannot read {path}: {' '.join(str(exc).split()) or type(exc).__name__}") from None


# -- field checks: each names the field, what it holds and what a saved run holds there ---------------
def _held(x: np.ndarray) -> str:
    if x.ndim == 0:
        shown = repr(x.item()) if x.dtype.kind != "U" or len(str(x)) <= 40 else repr(str(x)[:40] + "...")
        return f"{shown} ({x.dtype})"
    return f"an array of shape {x.shape} and dtype {x.dtype}"


def _scalar(data: dict, name: str, kinds: str, what: str):
    """The single value of field `name`, whose dtype kind must be one of `kinds`."""
    x = np.asarray(data[name])
    if x.ndim != 0 or x.dtype.kind not in kinds:
        raise ValueError(f"field {name} holds {_held(x)}; a saved run holds {what} there")
    return x.item()


def _array(data: dict, name: str, dtype, shape: tuple, meaning: str) -> np.ndarray:
    """Field `name` as an array of exactly `dtype` and `shape`."""
    x = np.asarray(data[name])
    if x.dtype != np.dtype(dtype) or x.shape != tuple(shape):
        raise ValueError(f"field {name} holds {_held(x)}; a saved run holds {meaning}: {np.dtype(dtype)} of "
                         f"shape {tuple(shape)} for these inputs and config")
    return x


def _format(data: dict) -> int:
    if "format" not in data:
        return 1
    fmt = _scalar(data, "format", "iu", "an integer saved-run format")
    if not 1 <= fmt <= SAVED_RUN_FORMAT:
        raise ValueError(f"saved-run format {fmt}; this flashsim reads formats 1 to {SAVED_RUN_FORMAT}")
    return fmt


def _config(data: dict, fmt: int) -> KernelConfig:
    """The config of the tag, which config_json (formats 2+) must name too."""
    tag = _scalar(data, "config", "U", "the config's tag, e.g. 'm64n64d64w4-swizzled'")
    try:
        config = config_from_tag(tag, SoftmaxForm.FFMA if fmt == 1 else SoftmaxForm.FMUL_FSUB)
    except ValueError as exc:
        raise ValueError(f"field config: {exc}") from None
    if "config_json" not in data:
        return config
    text = _scalar(data, "config_json", "U", "the config as KernelConfig JSON")
    try:
        described = KernelConfig.from_json(text)
    except ValueError as exc:
        raise ValueError(f"field config_json: {exc}") from None
    if described != config:
        raise ValueError(f"field config {tag!r} contradicts field config_json, which describes {described.tag!r}; "
                         f"the file is inconsistent")
    return config


def _inputs(data: dict, config: KernelConfig) -> tuple[int, int, int, int, int]:
    """(B, H, Nq, Nk, H_k) after checking q, k, v: [B, H, N, d] with d the config's head_dim, k and v
    of H_k heads dividing H; float16, or for a bf16 config float32 arrays of bf16 values."""
    q, k = np.asarray(data["q"]), np.asarray(data["k"])
    name = "float16" if config.dtype == "fp16" else "float32 (bf16 values)"
    if q.ndim != 4 or 0 in q.shape:
        raise ValueError(f"field q holds {_held(q)}; a saved run holds {name} q [B, H, Nq, d] there")
    b, h, nq, d = q.shape
    if d != config.head_dim:
        raise ValueError(f"field q has head_dim {d}, but the run's config {config.tag} has head_dim "
                         f"{config.head_dim}")
    nk = k.shape[2] if k.ndim == 4 and k.shape[2] >= 1 else 1
    hk = k.shape[1] if k.ndim == 4 and k.shape[1] >= 1 and h % k.shape[1] == 0 else h
    dtype = np.float16 if config.dtype == "fp16" else np.float32
    _array(data, "q", dtype, (b, h, nq, d), "the inputs q [B, H, Nq, d]")
    _array(data, "k", dtype, (b, hk, nk, d), "the keys k [B, H_k, Nk, d], with q's B and d and H_k dividing q's H")
    _array(data, "v", dtype, (b, hk, nk, d), "the values v, of k's shape")
    _array(data, "o", dtype, (b, h, nq, d), "the GPU's output O, of q's shape")
    _array(data, "lse", np.float32, (b, h, nq), "the GPU's LSE [B, H, Nq]")
    _bf16_values(data, config, ("q", "k", "v", "o"))
    return b, h, nq, nk, hk


def _features(data: dict, fmt: int) -> dict:
    """window and softcap (format 4; absent: none), checked as fa_sim.problem checks them."""
    out = {"window": None, "softcap": None}
    if fmt < 4:
        return out
    if "window" in data:
        w = np.asarray(data["window"])
        if w.shape != (2,) or w.dtype.kind not in "iu":
            raise ValueError(f"field window holds {_held(w)}; a saved run holds the window (left, right) there, "
                             f"an int32 array of 2 (-1 -1: none)")
        try:
            window = check_window((int(w[0]), int(w[1])))
        except ValueError as exc:
            raise ValueError(f"field window: {exc}") from None
        out["window"] = None if window == (-1, -1) else window
    if "softcap" in data:
        cap = float(_scalar(data, "softcap", "fiu", "the softcap, a number (0.0: none)"))
        if cap != 0.0:
            try:
                out["softcap"] = check_softcap(cap)
            except ValueError as exc:
                raise ValueError(f"field softcap: {exc}") from None
    return out


def _ctas(data: dict, n_ctas: int) -> tuple[int, ...]:
    x = np.asarray(data["ctas"])
    if x.ndim != 1 or x.size == 0 or x.dtype.kind not in "iu":
        raise ValueError(f"field ctas holds {_held(x)}; a saved run holds the checkpointed CTA ids there, "
                         f"a 1-D integer array")
    ctas = tuple(int(c) for c in x)
    if len(set(ctas)) != len(ctas) or not all(0 <= c < n_ctas for c in ctas):
        raise ValueError(f"field ctas holds {list(ctas)}; a saved run holds distinct CTA ids of its grid "
                         f"there, 0..{n_ctas - 1}")
    return ctas


def _kind(data: dict, fmt: int) -> str:
    """"dense", "packed" or "split" (format 5's optional fields; a field of the other kind, or one
    of a pair without the other, is refused)."""
    packed = [n for n in PACKED_ARRAYS if n in data]
    split = [n for n in SPLIT_ARRAYS if n in data]
    if (packed or split) and fmt < 5:
        raise ValueError(f"format {fmt} holds {', '.join(packed + split)}, which only format 5 has")
    if packed and split:
        raise ValueError(f"fields {', '.join(packed)} (a packed batch) and {', '.join(split)} (split-KV decoding) are "
                         f"both present; a saved run is one launch, of one kind")
    if packed and len(packed) != len(PACKED_ARRAYS):
        raise ValueError("a packed run holds both cu_seqlens_q and cu_seqlens_k; this file holds only "
                         f"{packed[0]}")
    if split:
        missing = [n for n in ("splits", "cache_seqlens", "pack_gqa") if n not in data]
        if missing:
            raise ValueError(f"a split-KV run holds splits, cache_seqlens and pack_gqa; this file lacks "
                             f"{', '.join(missing)}")
    return "packed" if packed else "split" if split else "dense"


def _packed_problem(data: dict, config: KernelConfig, causal: bool, scale: float, fmt: int) -> Problem:
    """The packed launch of q [total_q, H, d], k, v [total_k, H_k, d] and the offsets (fa_sim.varlen's
    checks, each named by field), after checking o [total_q, H, d] and lse [H, total_q]."""
    from .varlen import make_varlen_problem

    q, k = np.asarray(data["q"]), np.asarray(data["k"])
    dtype = np.float16 if config.dtype == "fp16" else np.float32
    name = "float16" if config.dtype == "fp16" else "float32 (bf16 values)"
    if q.ndim != 3 or 0 in q.shape:
        raise ValueError(f"field q holds {_held(q)}; a packed run holds {name} q [total_q, H, d] there")
    total_q, h, d = q.shape
    if d != config.head_dim:
        raise ValueError(f"field q has head_dim {d}, but the run's config {config.tag} has head_dim "
                         f"{config.head_dim}")
    total_k = k.shape[0] if k.ndim == 3 else 0
    hk = k.shape[1] if k.ndim == 3 and k.shape[1] >= 1 and h % k.shape[1] == 0 else h
    _array(data, "q", dtype, (total_q, h, d), "the packed inputs q [total_q, H, d]")
    _array(data, "k", dtype, (total_k, hk, d), "the packed keys k [total_k, H_k, d], with q's d and H_k dividing "
                                               "q's H")
    _array(data, "v", dtype, (total_k, hk, d), "the packed values v, of k's shape")
    _array(data, "o", dtype, (total_q, h, d), "the GPU's output O, of q's shape")
    _array(data, "lse", np.float32, (h, total_q), "the GPU's LSE [H, total_q] (the varlen layout)")
    _bf16_values(data, config, ("q", "k", "v", "o"))
    feats = _features(data, fmt)
    cu = []
    for f in PACKED_ARRAYS:
        x = np.asarray(data[f])
        if x.ndim != 1 or x.dtype.kind not in "iu":
            raise ValueError(f"field {f} holds {_held(x)}; a packed run holds int32 offsets [B + 1] there")
        cu.append(x)
    try:
        return make_varlen_problem((1, h, total_q, d), (1, hk, total_k, d), (1, hk, total_k, d), *cu, causal, scale,
                                   config, **feats)
    except ValueError as exc:
        raise ValueError(f"fields cu_seqlens_q / cu_seqlens_k with q, k: {exc}") from None


def _bf16_values(data: dict, config: KernelConfig, fields) -> None:
    if config.dtype == "bf16":
        for f in fields:
            if (np.ascontiguousarray(data[f]).view(np.uint32) & np.uint32(0xFFFF)).any():
                raise ValueError(f"field {f} holds float32 values that are not bf16 values; a saved run of a bf16 "
                                 f"config ({config.tag}) holds bf16 values there")


def _split_plan(data: dict, problem: Problem):
    """The split-KV plan (fa_sim.splitkv.check_splitkv's checks, named by field) and the workspace
    (splits > 1: o_accum, lse_accum of workspace_shapes; one split: none)."""
    from .splitkv import check_splitkv, workspace_shapes

    splits = _scalar(data, "splits", "iu", "the number of splits the GPU ran, an integer >= 1")
    pack = _scalar(data, "pack_gqa", "b", "whether GQA ran packed, True or False")
    lens = np.asarray(data["cache_seqlens"])
    if lens.dtype != np.int32 or lens.shape != (problem.batch,):
        raise ValueError(f"field cache_seqlens holds {_held(lens)}; a split-KV run holds each sequence's keys there, "
                         f"int32 of shape ({problem.batch},)")
    try:
        plan = check_splitkv(problem, int(splits), lens, None, bool(pack))
    except ValueError as exc:
        raise ValueError(f"fields splits / cache_seqlens / pack_gqa: {exc}") from None
    if bool(pack) and plan.unpacked is None:
        raise ValueError(f"field pack_gqa holds True, but this run has one Q head per K/V head (H = H_k = "
                         f"{problem.heads}): GQA cannot run packed")
    work = [n for n in ("o_accum", "lse_accum") if n in data]
    if plan.splits == 1:
        if work:
            raise ValueError(f"field {work[0]} is present, but a run of one split writes no workspace (the split "
                             f"kernel stores O and LSE itself)")
        return plan, None
    if len(work) != 2:
        raise ValueError(f"a split-KV run of {plan.splits} splits holds its workspace o_accum and lse_accum; this "
                         f"file lacks {', '.join(n for n in ('o_accum', 'lse_accum') if n not in data)}")
    oa_shape, la_shape = workspace_shapes(plan)
    o_accum = _array(data, "o_accum", np.float32, oa_shape, "every split's partial O [splits, B*H, Nq, d]")
    lse_accum = _array(data, "lse_accum", np.float32, la_shape, "every split's partial LSE [splits, B*H, Nq]")
    return plan, (o_accum, lse_accum)


def _kernel(data: dict, fmt: int) -> dict:
    """kernel_name and kernel_source (format 3; both or neither)."""
    if fmt < 3 and "kernel_source" not in data:
        return {}
    missing = [n for n in ("kernel_name", "kernel_source") if n not in data]
    if missing:
        raise ValueError(f"format {fmt} lacks {', '.join(missing)} (the kernel the GPU compiled)")
    return {"kernel_name": _scalar(data, "kernel_name", "U", "the kernel's file name"),
            "kernel_source": _scalar(data, "kernel_source", "U", "the kernel's CUDA source")}


def _combine(data: dict) -> dict:
    """combine_source: the fa2_combine.cu of a split-KV run of several splits."""
    if "combine_source" not in data:
        raise ValueError("a split-KV run of several splits holds combine_source (the fa2_combine.cu the GPU "
                         "compiled); this file lacks it")
    return {"combine_source": _scalar(data, "combine_source", "U", "the combine kernel's CUDA source")}


@dataclass(frozen=True, eq=False)
class SavedRun:
    """One GPU run kept for comparison: inputs, O, LSE, the checkpoint buffer of `ctas`, and what
    selected the kernel: its config and (format 3) the CUDA source the GPU compiled, so a later
    replay simulates exactly that kernel even after fa2_fwd.cu or a variant has changed. Formats 1
    and 2 hold no source (kernel_source ""): they were made with fa_hw's own kernel."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    checkpoints: np.ndarray  # uint32 [cta_sel, checkpoint, round, thread, word]
    ctas: tuple[int, ...]
    config: KernelConfig
    causal: bool
    scale: float
    kernel_name: str = "fa2_fwd.cu"
    kernel_source: str = ""
    window: tuple[int, int] | None = None  # format 4: the launch's features (GQA: k's heads)
    softcap: float | None = None
    # format 5: a packed batch (q [total_q, H, d], lse [H, total_q]) ...
    cu_seqlens: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # ... or split-KV decoding: the splits run, the cache lengths, whether GQA ran packed, the
    # workspace (splits > 1) and the combine kernel's source
    splits: int | None = None
    cache_seqlens: np.ndarray | None = None
    pack_gqa: bool | None = None
    o_accum: np.ndarray | None = None
    lse_accum: np.ndarray | None = None
    combine_source: str = ""

    @property
    def kind(self) -> str:
        """"dense", "packed" (cu_seqlens) or "split" (split-KV decoding)."""
        return "packed" if self.cu_seqlens is not None else "split" if self.splits is not None else "dense"

    @property
    def heads_k(self) -> int:
        return int(self.k.shape[1])  # dense and split [B, H_k, Nk, d], packed [total_k, H_k, d]

    @property
    def problem(self) -> Problem:
        """The recorded launch (shape, mask, scale, config, features; packed: the offsets, B
        sequences of the longest Nq and Nk; split-KV: the caller's problem, `plan` the launch)."""
        if self.cu_seqlens is not None:
            lq, lk = (np.diff(np.asarray(c, np.int64)) for c in self.cu_seqlens)
            return Problem(len(lq), self.q.shape[1], int(lq.max()), int(lk.max()), self.causal, self.scale,
                           self.config, self.heads_k, self.window, self.softcap, cu_seqlens=self.cu_seqlens)
        b, h, nq, _ = self.q.shape
        return Problem(b, h, nq, self.k.shape[2], self.causal, self.scale, self.config, self.heads_k, self.window,
                       self.softcap)

    @property
    def plan(self):
        """A split-KV run's launch (fa_sim.splitkv.SplitPlan: the grid its CTA ids index)."""
        from .splitkv import check_splitkv

        if self.splits is None:
            raise ValueError("this saved run is not of split-KV decoding: it has no split plan")
        return check_splitkv(self.problem, self.splits, self.cache_seqlens, None, self.pack_gqa)

    @property
    def n_ctas(self) -> int:
        """CTAs of the recorded grid (split-KV: the split kernel's)."""
        return self.plan.n_ctas if self.kind == "split" else self.problem.n_ctas

    def save(self, path) -> None:
        """Write the run to `path` (a file name or an open binary file). q, k, v, o are stored in the
        config's storage type (float16; bf16: float32 of bf16 values): inputs given as other types
        (an --npz file's float32 values that fp16 holds exactly, which the kernel's input policy
        takes) are stored as the values the kernel read."""
        dt = np.float16 if self.config.dtype == "fp16" else np.float32
        q, k, v, o = (np.asarray(x, dt) for x in (self.q, self.k, self.v, self.o))
        np.savez_compressed(path, format=SAVED_RUN_FORMAT, q=q, k=k, v=v, o=o, lse=self.lse,
                            checkpoints=self.checkpoints, ctas=np.asarray(self.ctas, np.int64),
                            config=self.config.tag, config_json=json.dumps(self.config.to_json()),
                            causal=self.causal, scale=self.scale, kernel_name=self.kernel_name,
                            kernel_source=self.kernel_source,
                            window=np.asarray(self.window if self.window is not None else (-1, -1), np.int32),
                            softcap=float(self.softcap or 0.0), **self._launch_kind_arrays())

    def _launch_kind_arrays(self) -> dict:
        """Format 5's fields of a packed or split-KV run (none for a dense one)."""
        if self.cu_seqlens is not None:
            return {"cu_seqlens_q": np.asarray(self.cu_seqlens[0], np.int32),
                    "cu_seqlens_k": np.asarray(self.cu_seqlens[1], np.int32)}
        if self.splits is None:
            return {}
        out = {"splits": np.int64(self.splits), "cache_seqlens": np.asarray(self.cache_seqlens, np.int32),
               "pack_gqa": bool(self.pack_gqa)}
        if self.splits > 1:
            out.update(o_accum=np.asarray(self.o_accum, np.float32), lse_accum=np.asarray(self.lse_accum, np.float32),
                       combine_source=self.combine_source)
        return out

    @classmethod
    def load(cls, path) -> "SavedRun":
        """Read a run; an unreadable file, a missing or malformed field, fields that disagree or an
        unknown format is one ValueError."""
        return cls.from_arrays(_read_npz(path), path)

    @classmethod
    def from_arrays(cls, data: dict, path=None) -> "SavedRun":
        """The run from the arrays of its .npz, every field checked (module docstring); errors
        start with `path` when it is given."""
        where = "" if path is None else f"{path}: "
        missing = [n for n in SAVED_ARRAYS if n not in data]
        if missing:
            raise ValueError(f"{where}not a saved GPU run (fa compare --save): it lacks {', '.join(missing)}")
        try:
            return cls._checked(data)
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from None

    @classmethod
    def _checked(cls, data: dict) -> "SavedRun":
        fmt = _format(data)
        config = _config(data, fmt)
        causal = bool(_scalar(data, "causal", "b", "the causal flag, True or False"))
        scale = float(_scalar(data, "scale", "fiu", "the softmax scale, a positive number"))
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"field scale holds {scale!r}; a saved run holds a positive finite softmax scale there")
        kind = _kind(data, fmt)
        extra: dict = {}
        if kind == "packed":
            problem = _packed_problem(data, config, causal, scale, fmt)
            feats = {"window": problem.window, "softcap": problem.softcap}
            extra["cu_seqlens"] = problem.cu_seqlens
            n_ctas, layout = problem.n_ctas, CheckpointLayout(config, problem.n_rounds)
        else:
            b, h, nq, nk, hk = _inputs(data, config)
            feats = _features(data, fmt)
            problem = Problem(b, h, nq, nk, causal, scale, config, hk, **feats)
            n_ctas, layout = problem.n_ctas, CheckpointLayout(config, problem.n_rounds)
            if kind == "split":
                from .splitkv import checkpoint_layout

                plan, work = _split_plan(data, problem)
                n_ctas, layout = plan.n_ctas, checkpoint_layout(plan)
                extra.update(splits=plan.splits, cache_seqlens=plan.cache_seqlens, pack_gqa=plan.unpacked is not None)
                if work is not None:
                    extra.update(o_accum=work[0], lse_accum=work[1], **_combine(data))
                elif "combine_source" in data:
                    raise ValueError("field combine_source is present, but a run of one split launches no combine")
        ctas = _ctas(data, n_ctas)
        checkpoints = _array(data, "checkpoints", np.uint32, layout.shape(len(ctas)),
                             "the checkpoint buffer [CTA, checkpoint, round, thread, word] of the recorded CTAs")
        return cls(data["q"], data["k"], data["v"], data["o"], data["lse"], checkpoints, ctas, config, causal, scale,
                   **_kernel(data, fmt), **feats, **extra)

    def with_config(self, config: KernelConfig) -> KernelConfig:
        """`config` in this run's softmax form: the form is part of what the GPU ran."""
        return replace(config, softmax=self.config.softmax)
