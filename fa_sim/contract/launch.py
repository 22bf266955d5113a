"""One launch of a kernel of a .cu file, as fa_sim.ptx.launch runs it and fa_sim.timing.predict_launch
times it: the multi-launch passes (the backward's three kernels, split-KV's split and combine
kernels) list theirs as these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class KernelLaunch:
    """A kernel's launch; `args` are shared between the launches of one pass, in launch order (an
    array one writes, the next reads)."""

    kernel: str
    source: str  # the .cu path
    grid: tuple
    block: tuple
    smem_bytes: int
    args: list
    macros: dict
