"""fa_sim.contract: the kernel contract below both backends - what the simulator's PTX front end
(fa_sim.ptx) and the GPU backend (fa_hw) agree on, and the tools both use. Nothing here needs a GPU,
and nothing here imports either backend.

    source.py     the seed fa2_fwd.cu (SEED_PATH), KERNEL_NAME, KernelSource (name, text, origin)
                  and kernel_source(value): a --kernel / kernel= .cu, or a .patch/.diff applied to
                  the seed at build time
    patch.py      the strict unified-diff applier those patches go through
    build.py      KernelBuild (config + causal + arch + checkpoints -> FA_* macros), the check
                  that a variant uses the macros its config sets (NEUTRAL_MACROS, check_macros_used)
    occupancy.py  min_blocks_per_sm (the __launch_bounds__ heuristic), resident_ctas per SM
    nvrtc.py      the one NVRTC wrapper: PTX for the simulator (cached), cubins for the GPU
    cubin.py      registers and local memory read from a cubin (ResourceUsage)
    sass.py       SASS of a cubin through nvdisasm, opcode counts
    errors.py     ToolError (what the CLI prints as one line), HwExtraMissing, KernelSourceError

The NVRTC bindings and nvdisasm come with the `hw` extra and are loaded only when used.
"""

from .build import NEUTRAL_MACROS, KernelBuild, check_macros_used
from .errors import HW_EXTRA_INSTALL, HwExtraMissing, KernelSourceError, ToolError
from .launch import KernelLaunch
from .occupancy import Limit, Occupancy, min_blocks_per_sm, resident_ctas
from .patch import PatchError, apply_patch
from .source import KERNEL_NAME, SEED_PATH, KernelSource, kernel_source, seed_source

__all__ = [
    "HW_EXTRA_INSTALL", "KERNEL_NAME", "NEUTRAL_MACROS", "SEED_PATH", "HwExtraMissing", "KernelBuild", "KernelLaunch",
    "KernelSource", "KernelSourceError", "Limit", "Occupancy", "PatchError", "ToolError", "apply_patch",
    "check_macros_used", "kernel_source", "min_blocks_per_sm", "resident_ctas", "seed_source",
]
