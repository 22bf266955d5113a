"""Errors of the GPU backend. Every one is a fa_sim.contract.ToolError, which the `fa` CLI prints
as one line and exit status 2 (fa_sim/cli.py), so every message is one self-contained line;
longer material (the compiler log) travels as an attribute."""

from __future__ import annotations

from fa_sim.contract.errors import ToolError


class FaHwError(ToolError):
    """Base class of everything fa_hw raises on purpose."""


class NoGPUError(FaHwError):
    """No CUDA driver, or no NVIDIA GPU visible to it."""


class CompileError(FaHwError):
    """NVRTC rejected the kernel source; `log` holds the compiler's full log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class KernelFault(FaHwError):
    """A launch or the kernel itself failed with a CUDA error; the message names the config."""
