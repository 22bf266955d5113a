"""The kernel's source: the seed fa2_fwd.cu, its kernel's name, and a variant of it as one value.

Where the seed lives: `fa_hw/kernels/fa2_fwd.cu`, shipped in the same distribution as fa_sim
(pyproject's package data). fa_sim and fa_hw are installed side by side - both in site-packages,
or both in a checkout - so the contract names the file relative to this package's own location
instead of importing fa_hw: the PTX engine, which must not depend on the GPU backend, and fa_hw
both read the seed through this path.

A variant (`--kernel FILE`, `kernel=FILE`) keeps fa2_fwd_kernel's parameters and the FA_* macros.
It is either a whole edited copy (`.cu`) or a unified diff against fa2_fwd.cu (`.patch`, `.diff`),
applied to the current seed when the kernel is built (patch.py), so a variant follows every later
change of the seed that its hunks do not touch. Both backends take the same `KernelSource`: the
CUDA C++ text, the name messages show, and the file it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import KernelSourceError
from .patch import apply_patch

SEED_PATH = Path(__file__).parent.parent.parent / "fa_hw" / "kernels" / "fa2_fwd.cu"
SEED_NAME = SEED_PATH.name
KERNEL_NAME = "fa2_fwd_kernel"  # the __global__ function of fa2_fwd.cu and of every variant
CUDA_SUFFIXES = (".cu",)
PATCH_SUFFIXES = (".patch", ".diff")


@dataclass(frozen=True)
class KernelSource:
    """CUDA C++ to compile as fa2_fwd_kernel, and where it came from."""

    name: str  # the file name messages show: 'fa2_fwd.cu', 'my_variant.cu', 'fa2_fwd_swizzle_r4.patch'
    origin: Path  # absolute path of the file given (the .cu or the .patch); the seed's for the seed
    text: str = field(repr=False)  # the CUDA C++ (for a patch: the seed with the patch applied)

    @property
    def is_seed(self) -> bool:
        return self.origin == SEED_PATH

    @property
    def program_name(self) -> str:
        """What NVRTC calls the program for the PTX engine: the PTX's `.file`, hence the source
        locations of traces and faults, and NVRTC's messages (for a patch: lines of the patched text)."""
        return str(self.origin)


def seed_source() -> KernelSource:
    """fa2_fwd.cu as it is on disk now (read each time: a user may be editing it)."""
    return KernelSource(SEED_NAME, SEED_PATH, _read_text(SEED_PATH, "the kernel source"))


def kernel_source(kernel=None, *, option: str = "kernel=") -> KernelSource:
    """The KernelSource of a --kernel / kernel= value: None (the seed), a KernelSource, or the path
    (str or os.PathLike) of a .cu file or of a .patch/.diff against fa2_fwd.cu. `option` is how
    the user gave it, for messages. Raises KernelSourceError (a ValueError), one line naming the file."""
    if kernel is None:
        return seed_source()
    if isinstance(kernel, KernelSource):
        return kernel
    if not isinstance(kernel, (str, os.PathLike)):
        raise KernelSourceError(f"{option} takes the path of a .cu file or of a .patch/.diff against {SEED_NAME} "
                                f"(or a fa_sim.contract.KernelSource), not {type(kernel).__name__}")
    path = Path(kernel)
    shown = f"{option}{'' if option.endswith('=') else ' '}{kernel}"
    if not path.is_file():
        raise KernelSourceError(f"{shown}: no such file (expected a variant of {SEED_NAME}): give a .cu file, "
                                f"or a .patch/.diff against {SEED_NAME}")
    if path.suffix not in CUDA_SUFFIXES + PATCH_SUFFIXES:
        raise KernelSourceError(f"{shown}: expected a CUDA source file ending in .cu, or a unified diff "
                                f"against {SEED_NAME} ending in .patch or .diff")
    text = _read_text(path, shown)
    if path.suffix in PATCH_SUFFIXES:
        text = apply_patch(seed_source().text, text, name=shown, target=SEED_NAME)
    return KernelSource(path.name, Path(os.path.abspath(path)), text)


def _read_text(path: Path, shown) -> str:
    """UTF-8 text of `path`; anything else is one line naming the file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KernelSourceError(f"{shown}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KernelSourceError(f"{shown}: {path.name} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                                f"{exc.start}); expected CUDA C++ source or a unified diff") from None
    if "\x00" in text:
        raise KernelSourceError(f"{shown}: {path.name} is a binary file (it holds NUL bytes); expected CUDA C++ "
                                "source or a unified diff")
    return text
