"""The predicted time of the backward pass (fa_hw/kernels/fa2_bwd.cu): its three launches, each
timed by `predict_launch` like any kernel the PTX engine runs (fa_sim/timing/launch.py).

    pred = fa_sim.timing.predict_backward(q, k, v, o, lse, do, causal=True)
    pred.kernel_ms, pred.kernels["fa2_bwd_kernel"].limiter

The launches are fa_sim.simulate_backward's (the same grids, blocks, shared memory and arguments,
built by fa_sim.backward.backward_launches); each runs functionally on the engine (on copies of
its arguments) so that every warp's path through the SASS is the run's, then the busiest SM is
timed cycle by cycle. Nothing here knows the backward's shape.
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
                     dtype: str | None = None) -> BackwardPrediction:
    """The predicted time of the backward pass for these inputs (as fa_sim.simulate_backward takes
    them); `deterministic`: dQ by the dQ kernel (its ordered loop over the K/V blocks) instead of
    the main kernel's atomics and the convert kernel; `kernel`: a variant
    of fa2_bwd.cu (a path); `dtype`: the run's type, as simulate_backward's (bf16: the FA_BF16 build)."""
    from ..backward import backward_launches

    kernels = {}
    for launch in backward_launches(q, k, v, o, lse, do, causal, scale, deterministic, kernel=kernel, dtype=dtype)[0]:
        kernels[launch.kernel] = predict_launch(launch.source, launch.grid, launch.block, launch.args,
                                                launch.smem_bytes, gpu, kernel=launch.kernel, macros=launch.macros)
    return BackwardPrediction(float(np.sum([p.kernel_ms for p in kernels.values()])), kernels, bool(deterministic))
