"""Errors of the GPU backend. Every one is a fa_sim.contract.ToolError, which the `fa` CLI prints
as one line and exit status 2 (fa_sim/cli.py), so every message is one self-contained line;
longer material (the compiler log) travels as an attribute."""

from __future__ import annotations

from fa_sim.contract.errors import CompileError, ToolError  # noqa: F401 (CompileError: the contract's cubin builder raises it)


class FaHwError(ToolError):
    """Base class of everything fa_hw raises on purpose."""


class NoGPUError(FaHwError):
    """No CUDA driver, or no NVIDIA GPU visible to it."""


class KernelFault(FaHwError):
    """A launch or the kernel itself failed with a CUDA error; the message names the config."""
