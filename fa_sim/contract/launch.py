"""One launch of a kernel of a .cu file, as fa_sim.ptx.launch runs it and fa_sim.timing.predict_launch
times it: the multi-launch passes (the backward's three kernels, split-KV's split and combine
kernels) list theirs as these."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, eq=False)
class KernelLaunch:
    """A kernel's launch; `args` are shared between the launches of one pass, in launch order (an
    array one writes, the next reads). `uniform_axes`: the grid axes (0 x, 1 y, 2 z) along which no
    warp's control-flow path changes - CTAs that differ only in these blockIdx coordinates take the
    same branches and differ only in the addresses they touch (e.g. the B*H axis of the attention
    kernels). The builder of the launch declares it, as a fact of the kernel's code;
    fa_sim.timing.predict_launch then runs one representative CTA per class on the PTX engine
    (tests/test_timing_classes.py checks the declarations against full runs)."""

    kernel: str
    source: str  # the .cu path
    grid: tuple
    block: tuple
    smem_bytes: int
    args: list
    macros: dict
    uniform_axes: tuple = field(default=())
    cta_instructions: object = None  # the builder's estimate of each CTA's warp instructions (an array in
    # launch order, or one number for all), for the timing model's cost check before any work; None: none
