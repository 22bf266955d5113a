"""fa_hw: the FlashAttention-2 forward kernel for real, compiled by NVRTC (cuda.core) and launched
on an NVIDIA GPU, with the same schedule (fa_sim/kernels/SCHEDULE.md), configuration family and
checkpoint layout as the simulator.

    import fa_hw
    out = fa_hw.forward(q, k, v, causal=False, scale=None, config=None)   # .o .lse .kernel_ms
    out = fa_hw.forward(q, k, v, config="auto")   # this GPU's fastest measured config (fa_hw.tuned;
                                                  # without a table: fa_hw.autotune, cached per class)
    ck = fa_hw.compile_kernel(fa_sim.KernelConfig(), arch="sm_90")         # no GPU needed
    g = fa_hw.backward(q, k, v, out.o, out.lse, do, deterministic=False)  # .dq .dk .dv (docs/backward.md)
    ck.usage.registers, ck.usage.stack_bytes, ck.sass()           # read from the cubin
    o = fa_hw.attention(q, k, v, causal=True)     # differentiable, torch tensors (fa_hw/torch_ops.py)

fa_hw.attention needs PyTorch (the `torch` extra); fa_hw itself imports without it.

The kernel contract both backends share (the kernel source and its variants, KernelBuild and its
FA_* macros, the NVRTC wrapper, cubin and SASS reading) lives in fa_sim.contract; KernelBuild and
ResourceUsage are re-exported here as part of fa_hw's API.
"""

from fa_sim.contract import KernelBuild
from fa_sim.contract.cubin import ResourceUsage

from .backward import HwBackwardResult, backward
from .compile import CompiledKernel, compile_kernel
from .device import device_arch, has_gpu
from .errors import CompileError, FaHwError, KernelFault, NoGPUError
from .forward import HwResult, forward



def attention(q, k, v, causal: bool = False, scale: float | None = None, *, deterministic: bool = False,
              check_finite: bool = True):
    """Differentiable attention for torch tensors (fa_hw.torch_ops: fp16 CUDA runs fa2_fwd.cu and
    fa2_bwd.cu, float64 runs the float64 reference; check_finite: NaN/Inf in q, k, v and dO refused,
    one wait for the GPU per call); needs PyTorch."""
    try:
        from .torch_ops import attention as _attention
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ImportError("fa_hw.attention needs PyTorch, which is not installed: pip install 'flashsim[torch]'") from None
    return _attention(q, k, v, causal, scale, deterministic=deterministic, check_finite=check_finite)


__all__ = [
    "CompileError", "CompiledKernel", "FaHwError", "HwBackwardResult", "HwResult", "KernelBuild", "KernelFault",
    "NoGPUError", "ResourceUsage", "attention", "backward", "compile_kernel", "device_arch", "forward", "has_gpu",
]
