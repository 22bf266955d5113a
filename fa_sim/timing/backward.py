"""The predicted time of the backward pass (fa_hw/kernels/fa2_bwd.cu): its three launches, each
timed by `predict_launch` like any kernel the PTX engine runs (fa_sim/timing/launch.py).

    pred = fa_sim.timing.predict_backward(q, k, v, o, lse, do, causal=True)
    pred.kernel_ms, pred.kernels["fa2_bwd_kernel"].limiter

The launches are fa_sim.simulate_backward's (the same grids, blocks, shared memory and arguments,
built by fa_sim.backward.backward_launches); each runs functionally on the engine (on copies of
its arguments) so that every warp's path through the SASS is the run's, then the busiest SM is
timed cycle by cycle. Nothing here knows the backward's shape: each launch declares its path
classes (KernelLaunch.uniform_axes: the batch-head axis), so one CTA per class runs on the engine.

`predict_backward_seeded` times a shape without arrays (what `fa time --backward` does): the
kernels' branches read the lengths, the mask and blockIdx, never a value of Q, K, V, O, LSE or dO
(tests/test_timing_classes.py compares the paths of the forward's real O and LSE with seeded
ones), so seeded finite values of the right shapes and dtypes stand in and no forward runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .gpus import GpuModel
from .launch import predict_launch
from .predict import Prediction


@dataclass(frozen=True)
class BackwardPrediction:
    kernel_ms: float  # the three launches one after the other
    kernels: dict = field(default_factory=dict)  # kernel name -> Prediction, in launch order
    deterministic: bool = False

    def to_json(self) -> dict:
        return {"kernel_ms": self.kernel_ms, "deterministic": self.deterministic,
                "kernels": {name: p.to_json() for name, p in self.kernels.items()}}


def predict_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                     deterministic: bool = False, gpu: GpuModel | str = "h200", *, kernel=None,
                     dtype: str | None = None, config=None) -> BackwardPrediction:
    """The predicted time of the backward pass for these inputs (as fa_sim.simulate_backward takes
    them); `deterministic`: dQ by the dQ kernel (its ordered loop over the K/V blocks) instead of
    the main kernel's atomics and the convert kernel; `kernel`: a variant
    of fa2_bwd.cu (a path); `dtype`: the run's type, as simulate_backward's (bf16: the FA_BF16 build);
    `config`: a BackwardConfig (a tuned candidate's tiles and options; None: DEFAULT_TILES)."""
    return _predict(q, k, v, o, lse, do, causal, scale, deterministic, gpu, kernel, dtype, None, config)


def _predict(q, k, v, o, lse, do, causal, scale, deterministic, gpu, kernel, dtype, args_key,
             config=None) -> BackwardPrediction:
    from ..backward import backward_launches

    from . import pool
    from .launch import check_launch_cost, path_classes

    pool.env_workers()  # a bad FLASHSIM_TIMING_WORKERS: one line before the launches are built
    launches = backward_launches(q, k, v, o, lse, do, causal, scale, deterministic, kernel=kernel, dtype=dtype,
                                 config=config)[0]
    seconds = [check_launch_cost(launch.source, launch.grid, launch.block, launch.smem_bytes, gpu,
                                 kernel=launch.kernel, macros=launch.macros, uniform_axes=launch.uniform_axes,
                                 cta_instructions=launch.cta_instructions)
               for launch in launches]  # every launch's cost before any runs

    def one(i: int) -> Prediction:
        launch = launches[i]
        return predict_launch(launch.source, launch.grid, launch.block, launch.args, launch.smem_bytes, gpu,
                              kernel=launch.kernel, macros=launch.macros, uniform_axes=launch.uniform_axes,
                              args_key=args_key, cta_instructions=launch.cta_instructions,
                              copy_args=args_key is None)
    # The launches are independent (each runs on its own copies, or on seeded scratch whose values no
    # path reads). Where a launch has several path classes (causal: one per Q or K/V block), its own
    # engine run and SM passes split over the worker processes (pool.py), which keeps them busy in
    # balanced pieces; where none has (non-causal: one CTA per launch, one SM pass), the launches
    # themselves run at once, one worker each. Either way the predictions are those of one process.
    inside = any(len(path_classes(launch.grid, launch.uniform_axes)[0]) > 1 for launch in launches)
    n_proc = 1 if inside else pool.workers(len(launches), float(np.sum(seconds)))
    preds = pool.pmap(one, len(launches), n_proc)
    kernels = {launch.kernel: p for launch, p in zip(launches, preds)}
    return BackwardPrediction(float(np.sum([p.kernel_ms for p in kernels.values()])), kernels, bool(deterministic))


SEED_TILE = 1 << 16  # values drawn per seeded array; the array repeats them


def first_head(shape, tile: np.ndarray) -> np.ndarray:
    """Zeros of `shape` ([B, H, ...]) in tile's dtype with batch-head 0 holding `tile` repeated: the
    seeded timing inputs (the representative CTAs read batch-head 0; the zeros' pages are never written)."""
    out = np.zeros(shape, tile.dtype)
    first = out.reshape(shape[0] * shape[1], -1)[0]  # batch-head 0 (a view)
    first[:] = np.resize(tile, first.shape)
    return out


def seeded_backward_inputs(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, seed: int = 0,
                           dtype: str = "fp16"):
    """Seeded finite q, k, v, o, dO ([B, H, N, d]: fp16, or with dtype "bf16" float32 arrays of bf16
    values, as fa_sim.reference.random_inputs_backward gives them) and lse (float32 [B, H, Nq]) for
    timing: SEED_TILE standard-normal draws per array, repeated over its first batch-head (drawing
    every value of a (8, 32, 8192, 128) problem would take longer than timing it); the other
    batch-heads of q, k, v, o and dO are zeros, allocated by np.zeros, whose pages the system maps
    only when they are written: the timing run's representative CTAs (batch-head 0: grid y is a
    uniform axis) read the draws, and the 2.5 GB of a (8, 32, 8192, 128) problem are never written
    (they took most of a warm run and, on a loaded machine, over a minute of page faults cold). No
    branch reads a value (the module docstring), so zeros time as draws do. lse is log(seqlen_k)
    plus a draw, everywhere."""
    from ..isa.convert import f32_to_bf16_values

    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r:.40}")
    rng = np.random.default_rng(seed)
    qs, ks = (batch, heads, seqlen_q, head_dim), (batch, heads, seqlen_k, head_dim)

    def draw(shape, to=dtype, first_only=True):
        x = rng.standard_normal(SEED_TILE).astype(np.float32)
        x = x.astype(np.float16) if to == "fp16" else f32_to_bf16_values(x) if to == "bf16" else x
        return first_head(shape, x) if first_only else np.resize(x, shape)

    q, k, v, o, do = draw(qs), draw(ks), draw(ks), draw(qs), draw(qs)
    lse = (draw(qs[:3], "fp32", False) + np.float32(np.log(max(seqlen_k, 1)))).astype(np.float32)
    return q, k, v, o, lse, do


def predict_backward_seeded(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                            causal: bool = False, scale: float | None = None, deterministic: bool = False,
                            gpu: GpuModel | str = "h200", *, kernel=None, seed: int = 0,
                            dtype: str = "fp16", config=None) -> BackwardPrediction:
    """predict_backward of a shape on seeded_backward_inputs in `dtype` (no forward run: see the
    module docstring); the launch predictions' disk cache keys on the seed, dtype and shapes, not
    the bytes (the config's tiles and options reach it through the build's macros)."""
    arrays = seeded_backward_inputs(batch, heads, seqlen_q, seqlen_k, head_dim, seed, dtype)
    key = f"seeded_backward_inputs:v3:{SEED_TILE}:{seed}:{dtype}:{(batch, heads, seqlen_q, seqlen_k, head_dim)}"
    return _predict(*arrays, causal, scale, deterministic, gpu, kernel, dtype, key, config)
