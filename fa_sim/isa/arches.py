"""What differs between the GPU architectures the kernel is built for, where the config family
depends on it: the largest dynamic shared memory one CTA may opt into
(cudaFuncAttributeMaxDynamicSharedMemorySize).

Values: the CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per
Compute Capability", row "Maximum amount of shared memory per thread block" (8.0 and 8.7: 163 KB;
8.6 and 8.9: 99 KB; 9.0 and 10.0: 227 KB; 12.0: 99 KB). Everything else the simulator assumes of the
machine is SM80's (fa_sim.isa.sm80); sm_90 runs the same PTX.
"""

from __future__ import annotations

import re

from .sm80 import SMEM_OPT_IN_BYTES

SMEM_OPT_IN_BYTES_BY_ARCH = {
    "sm_80": SMEM_OPT_IN_BYTES,  # 166,912: A100
    "sm_86": 99 * 1024,  # 101,376: RTX 30xx, A10, A40
    "sm_87": 163 * 1024,  # Jetson Orin
    "sm_89": 99 * 1024,  # RTX 40xx, L4, L40
    "sm_90": 227 * 1024,  # 232,448: H100, H200
    "sm_100": 227 * 1024,  # B200
    "sm_120": 99 * 1024,  # RTX 50xx
}
#: The most any architecture allows: what a KernelConfig may need at all (sm_90's 227 KB).
SMEM_OPT_IN_MAX_BYTES = max(SMEM_OPT_IN_BYTES_BY_ARCH.values())

_ARCH = re.compile(r"(?:sm|compute)_(\d+)[af]?")


def arch_key(arch) -> str:
    """'sm_90' for 'sm_90', 'sm_90a' or 'compute_90'; anything else is a ValueError naming the form."""
    m = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if m is None:
        raise ValueError(f"arch {arch!r:.40} is not a CUDA architecture: give e.g. 'sm_80' or 'sm_90'")
    return f"sm_{m[1]}"


def smem_opt_in_bytes(arch) -> int:
    """The largest dynamic shared memory per CTA on `arch`; an architecture not in the table is a
    ValueError naming those that are (a guessed limit would be silently wrong)."""
    key = arch_key(arch)
    if key not in SMEM_OPT_IN_BYTES_BY_ARCH:
        raise ValueError(f"no shared-memory limit is known for {arch}: the kernel's targets are "
                         f"{', '.join(SMEM_OPT_IN_BYTES_BY_ARCH)}")
    return SMEM_OPT_IN_BYTES_BY_ARCH[key]
