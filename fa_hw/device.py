"""The GPU itself, through cuda.core: the current Device, its exact arch, whether there is one.

Below both fa_hw.compile (which compiles for the current GPU's arch when none is given) and
fa_hw.runtime (which loads and launches), so neither imports the other to ask.
"""

from __future__ import annotations

import functools

from fa_sim.contract.errors import HW_EXTRA_INSTALL

from .errors import KernelFault, NoGPUError


def driver_call(result, what: str):
    """A cuda.bindings.driver call's result without its CUresult: KernelFault naming `what` when the
    call failed; the one value, or the list of values, it returned."""
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise KernelFault(f"{what} failed: {err.name if hasattr(err, 'name') else err}")
    return rest[0] if len(rest) == 1 else rest


def short(exc: BaseException) -> str:
    """An exception's text on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


@functools.cache
def device(ordinal: int = 0):
    """The cuda.core Device, made current; NoGPUError when there is no driver or no GPU."""
    try:
        from cuda.core import Device  # lazy on purpose: the hw extra is optional
    except ImportError:
        raise NoGPUError(f"cuda.core is not installed; install flashsim[hw] to run the GPU backend "
                         f"({HW_EXTRA_INSTALL})") from None
    try:
        dev = Device(ordinal)
        dev.set_current()
    except Exception as exc:  # no libcuda.so (no driver), CUDA_ERROR_NO_DEVICE, bad ordinal
        raise NoGPUError(f"no usable NVIDIA GPU/driver for fa_hw (device {ordinal}): {short(exc)}") from None
    return dev


def device_arch(ordinal: int = 0) -> str:
    """'sm_90' on the H200: the exact arch to compile the cubin for."""
    return f"sm_{device(ordinal).arch}"


def has_gpu() -> bool:
    try:
        device()
    except NoGPUError:
        return False
    return True


def gpu_key(name: str) -> str:
    """The table's file stem for a device name: 'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' -> 'a100_sxm4_80gb'."""
    words = str(name).lower().replace("nvidia", " ").split()
    return "_".join("".join(c if c.isalnum() else " " for c in " ".join(words)).split())
