"""The GPU backend's cubins: `compile_kernel` builds fa2_fwd.cu for a config and the current GPU's
exact arch; the builder itself, its cache and `CompiledKernel` are the kernel contract's
(fa_sim/contract/cubins.py), which the timing model shares, and are named here as part of fa_hw's API.
"""

from __future__ import annotations

from fa_sim.config import KernelConfig
from fa_sim.contract import KernelBuild
from fa_sim.contract.cubins import (CACHE_FORMAT, PROGRAM_NAME, CompiledKernel, cache_dir, compile_build,  # noqa: F401
                                    compile_many)

from .device import device_arch


def compile_kernel(config: KernelConfig = KernelConfig(), *, causal: bool = False, arch: str | None = None,
                   checkpoints: bool = False, use_cache: bool = True) -> CompiledKernel:
    """Cubin of fa2_fwd.cu for `config`; arch=None means the current GPU's exact arch."""
    if arch is None:
        arch = device_arch()
    return compile_build(KernelBuild(config, bool(causal), arch, bool(checkpoints)), use_cache=use_cache)
