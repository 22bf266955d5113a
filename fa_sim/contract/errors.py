"""The errors of the kernel contract, and the base class every backend's deliberate errors share.

`ToolError` is what the `fa` CLI prints as one line `fa CMD: error: ...` with exit status 2
(fa_sim/cli.py): the contract's errors below and fa_hw's `FaHwError` derive from it, so the CLI
recognises a GPU error by its class without importing the GPU backend. Every message is one
self-contained line; longer material (a compiler log) travels as an attribute.
"""

from __future__ import annotations

#: What to run when the CUDA Python packages are missing: a checkout, or an installed flashsim.
HW_EXTRA_INSTALL = 'pip install -e ".[hw]" in a checkout, or pip install "flashsim[hw]"'


class ToolError(Exception):
    """Base of the errors the kernel toolchain and the backends raise on purpose."""


class HwExtraMissing(ToolError, ImportError):
    """A CUDA Python package of the `hw` extra (cuda-bindings, cuda-core, nvidia-cuda-nvdisasm) is
    not installed; the message names what needed it and the command that installs it."""

    def __init__(self, what: str, missing: str) -> None:
        super().__init__(f"{what} needs the 'hw' extra, which is not installed ({missing}): {HW_EXTRA_INSTALL}")


class KernelSourceError(ValueError):
    """A --kernel / kernel= value that is not a usable variant of fa2_fwd.cu (missing, wrong kind of
    file, not UTF-8 text, a patch that does not apply)."""


class CompileError(ToolError):
    """NVRTC rejected the kernel source of a KernelBuild; `log` holds the compiler's full log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log
