"""The SASS hashes of the seed kernel (tests/data/seed_sass_sha256.json), regenerated without a GPU.

    python -m fa_sim.calibrate.seed_sass --out FILE      (NVRTC and the cubin's ELF sections only)

For the seed config (KernelConfig()) of fa_hw/kernels/fa2_fwd.cu, causal or not, for sm_80 and
sm_90, with and without the checkpoint stores: the sha256 of the cubin's .text.fa2_fwd_kernel
section, the SASS bytes themselves. The kernel options of issue 11 left them as they were
before the options existed (tests/test_kernel_options_build.py compares the two); the hashes
are NVRTC's, so the file names NVRTC's major.minor version and the test skips under another.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from pathlib import Path

KERNEL_SECTION = ".text.fa2_fwd_kernel"
ARCHES = ("sm_80", "sm_90")
SOURCE = ("python -m fa_sim.calibrate.seed_sass: sha256 of the cubin's .text.fa2_fwd_kernel section (the SASS "
          "bytes) of the seed config of fa_hw/kernels/fa2_fwd.cu compiled by NVRTC {nvrtc}; the same bytes as "
          "the kernel before the options of issue 11 (commit 51d8533)")


def key(causal: bool, arch: str, checkpoints: bool) -> str:
    return f"causal={causal} {arch} checkpoints={checkpoints}"


def text_sha256(cubin: bytes) -> str:
    """sha256 of the kernel's SASS section of a cubin."""
    from ..contract.cubin import kernel_code

    return hashlib.sha256(kernel_code(cubin, KERNEL_SECTION.removeprefix(".text."))).hexdigest()


def nvrtc() -> str:
    from ..contract.nvrtc import nvrtc_version

    return "{}.{}".format(*nvrtc_version())


def hashes() -> dict:
    """The file's content for this machine's NVRTC."""
    from ..contract import KernelBuild
    from ..contract.cubins import compile_build

    from ..config import KernelConfig

    sha = {}
    for causal, arch, ck in itertools.product((False, True), ARCHES, (False, True)):
        sha[key(causal, arch, ck)] = text_sha256(compile_build(KernelBuild(KernelConfig(), causal, arch, ck)).cubin)
    version = nvrtc()
    return {"source": SOURCE.format(nvrtc=version), "nvrtc": version, "sha256": sha}


def write(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(hashes(), indent=1) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON to write (tests/data/seed_sass_sha256.json)")
    write(p.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
