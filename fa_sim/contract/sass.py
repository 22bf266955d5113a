"""SASS of a cubin through nvdisasm (the `nvidia-cuda-nvdisasm` wheel of the `hw` extra, or one on
PATH), and opcode counts over it: what the CI checks look for (HMMA.16816.F32, LDSM.16.M88.4,
LDSM.16.MT88.4, LDGSTS.E.BYPASS.128, SHFL.BFLY, BAR.SYNC, no LDL/STL local-memory spills).
No GPU is needed; nvdisasm runs as a subprocess."""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import HwExtraMissing, ToolError

# '        /*0dd0*/   @!P0 DEPBAR.LE SB0, 0x0 ;' -> 'DEPBAR.LE'
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)", re.M)
_NEVER = re.compile(r"@!U?PT\s+")  # guarded by "not true": placeholders ptxas emits, never executed


class NvdisasmError(ToolError):
    """nvdisasm rejected a cubin."""


@functools.cache
def nvdisasm_path() -> Path:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel (nvidia/cu*/bin), else from PATH/CUDA_HOME."""
    candidates = []
    for entry in sys.path:
        candidates += sorted(Path(entry).glob("nvidia/cu*/bin/nvdisasm"), reverse=True)
        candidates += sorted(Path(entry).glob("nvidia/cuda_nvdisasm/bin/nvdisasm"))
    found = shutil.which("nvdisasm")
    if found:
        candidates.append(Path(found))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates.append(Path(home) / "bin" / "nvdisasm")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise HwExtraMissing("Reading SASS (nvdisasm)", "nvdisasm is in neither the nvidia-cuda-nvdisasm wheel, "
                         "PATH, $CUDA_HOME/bin nor /usr/local/cuda/bin")


def disassemble(cubin: bytes, encodings: bool = False, lines: bool = False, inlined: bool = False) -> str:
    """nvdisasm's listing of a cubin's code; `encodings`: each instruction's two 64-bit words too
    (-hex: the control bits fa_sim.timing.sass decodes); `lines`: the CUDA source line of each
    instruction (-g; the cubin must be built with -lineinfo); `inlined`: the line with its chain of
    inlining call sites (-gi, fa_sim.timing.stream)."""
    flags = ["-hex"] * encodings + (["-gi"] if inlined else ["-g"] * lines)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([str(nvdisasm_path()), *flags, "-c", f.name], capture_output=True, text=True)
    if run.returncode:
        raise NvdisasmError(f"nvdisasm failed: {' '.join(run.stderr.split())[:300]}")
    return run.stdout


def opcodes(sass: str) -> list[str]:
    """Full opcodes with modifiers, in program order (predicate guards dropped; instructions
    guarded by @!PT, which never execute, left out)."""
    return [op for guard, op in _INSTR.findall(sass) if not _NEVER.fullmatch(guard or "")]


def opcode_counts(sass: str) -> collections.Counter:
    return collections.Counter(opcodes(sass))
