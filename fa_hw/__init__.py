"""fa_hw: the FlashAttention-2 forward kernel for real, compiled by NVRTC (cuda.core) and launched
on an NVIDIA GPU, with the same schedule (fa_sim/kernels/SCHEDULE.md), configuration family and
checkpoint layout as the simulator.

    import fa_hw
    out = fa_hw.forward(q, k, v, causal=False, scale=None, config=None)   # .o .lse .kernel_ms
    out = fa_hw.forward(q, k, v, config="auto")   # this GPU's fastest measured config (fa_hw.tuned)
    ck = fa_hw.compile_kernel(fa_sim.KernelConfig(), arch="sm_90")         # no GPU needed
    ck.usage.registers, ck.usage.stack_bytes, ck.sass()           # read from the cubin
"""

from .compile import CompiledKernel, KernelBuild, compile_kernel
from .cubin import ResourceUsage
from .errors import CompileError, FaHwError, KernelFault, NoGPUError
from .forward import HwResult, forward
from .runtime import device_arch, has_gpu

__all__ = [
    "CompileError", "CompiledKernel", "FaHwError", "HwResult", "KernelBuild", "KernelFault", "NoGPUError",
    "ResourceUsage", "compile_kernel", "device_arch", "forward", "has_gpu",
]
