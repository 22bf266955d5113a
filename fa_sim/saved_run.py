"""Saved GPU runs: the versioned .npz that `fa compare --save` writes and `--gpu-npz` replays.

A run holds the inputs, O, LSE, the checkpoint buffer of the selected CTAs and what selected the
kernel (config, causal flag, scale; format 3 also the CUDA source). Formats:
- 1 (no "format" entry): every such run was made with the FFMA softmax form, the only one the
  kernel had; its tag has no softmax suffix and loads as FFMA;
- 2: the config tag names the softmax form, and "config_json" holds the KernelConfig as JSON;
- 3: + "kernel_name" and "kernel_source", the .cu the GPU compiled;
- 4: the launch's features (issue 38, docs/features.md): k and v may have fewer heads than q
  (grouped-query attention: H_k dividing H), "window" (int32 [2], -1 -1 for none) and "softcap"
  (0.0 for none), and a bf16 config's q, k, v, o are float32 arrays of bf16 values.

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

SAVED_RUN_FORMAT = 4  # 4: + window, softcap, GQA's k/v heads, bf16 arrays; 3: + the kernel's file name and
#                       source; 2: the config tag names the softmax form; 1 (no "format" entry): FFMA form
SAVED_ARRAYS = ("q", "k", "v", "o", "lse", "checkpoints", "ctas", "config", "causal", "scale")
OPTIONAL_ARRAYS = ("format", "config_json", "kernel_name", "kernel_source", "window", "softcap")

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
    if config.dtype == "bf16":
        for f in ("q", "k", "v", "o"):
            if (np.ascontiguousarray(data[f]).view(np.uint32) & np.uint32(0xFFFF)).any():
                raise ValueError(f"field {f} holds float32 values that are not bf16 values; a saved run of a bf16 "
                                 f"config ({config.tag}) holds bf16 values there")
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


def _ctas(data: dict, problem: Problem) -> tuple[int, ...]:
    x = np.asarray(data["ctas"])
    if x.ndim != 1 or x.size == 0 or x.dtype.kind not in "iu":
        raise ValueError(f"field ctas holds {_held(x)}; a saved run holds the checkpointed CTA ids there, "
                         f"a 1-D integer array")
    ctas = tuple(int(c) for c in x)
    if len(set(ctas)) != len(ctas) or not all(0 <= c < problem.n_ctas for c in ctas):
        raise ValueError(f"field ctas holds {list(ctas)}; a saved run holds distinct CTA ids of its grid "
                         f"there, 0..{problem.n_ctas - 1}")
    return ctas


def _kernel(data: dict, fmt: int) -> dict:
    """kernel_name and kernel_source (format 3; both or neither)."""
    if fmt < 3 and "kernel_source" not in data:
        return {}
    missing = [n for n in ("kernel_name", "kernel_source") if n not in data]
    if missing:
        raise ValueError(f"format {fmt} lacks {', '.join(missing)} (the kernel the GPU compiled)")
    return {"kernel_name": _scalar(data, "kernel_name", "U", "the kernel's file name"),
            "kernel_source": _scalar(data, "kernel_source", "U", "the kernel's CUDA source")}


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

    @property
    def heads_k(self) -> int:
        return int(self.k.shape[1])

    @property
    def problem(self) -> Problem:
        """The recorded launch (shape, mask, scale, config, features)."""
        b, h, nq, _ = self.q.shape
        return Problem(b, h, nq, self.k.shape[2], self.causal, self.scale, self.config, self.heads_k, self.window,
                       self.softcap)

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
                            softcap=float(self.softcap or 0.0))

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
        b, h, nq, nk, hk = _inputs(data, config)
        feats = _features(data, fmt)
        problem = Problem(b, h, nq, nk, causal, scale, config, hk, **feats)
        ctas = _ctas(data, problem)
        layout = CheckpointLayout(config, problem.n_rounds)
        checkpoints = _array(data, "checkpoints", np.uint32, layout.shape(len(ctas)),
                             "the checkpoint buffer [CTA, checkpoint, round, thread, word] of the recorded CTAs")
        return cls(data["q"], data["k"], data["v"], data["o"], data["lse"], checkpoints, ctas, config, causal, scale,
                   **_kernel(data, fmt), **feats)

    def with_config(self, config: KernelConfig) -> KernelConfig:
        """`config` in this run's softmax form: the form is part of what the GPU ran."""
        return replace(config, softmax=self.config.softmax)
