"""SASS instructions of one iteration of fa2_bwd.cu's main loop, per opcode class, for the tuned tiles
(no GPU: NVRTC + nvdisasm).

    python experiments/bwd_sass_loop.py [--kernel FILE]

The loop is the main kernel's longest backward branch; "unmasked" leaves out the forward-branch blocks
inside it that hold the mask's FSELs (the mask pass, which only the key tail and the causal diagonal
take). Prints, per (head_dim, tiles, softmax form), the registers, the local memory, the whole loop body
and an unmasked iteration with its HMMA, LDSM, LDS, FMUL, FADD, FFMA, FSEL, MUFU, F2FP, REDG counts.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa_sim.contract.backward import MAIN_KERNEL, BackwardBuild, BackwardConfig, compile_backward  # noqa: E402
from fa_sim.contract.sass import disassemble  # noqa: E402

TILES = ((32, 128, 8), (64, 128, 8), (96, 64, 8), (128, 64, 8), (64, 64, 4))
CLASSES = ("HMMA", "LDSM", "LDS", "STS", "REDG", "MUFU", "FMUL", "FADD", "FFMA", "FSEL", "F2FP", "BAR")
_BRA = re.compile(r"BRA `\((\.L_x_\d+)\)")
_OP = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def loop_opcodes(cubin: bytes, unmasked: bool) -> list[str]:
    text = disassemble(cubin)
    lines = text.split(".text." + MAIN_KERNEL + ":")[1].split(".section")[0].splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    back = [(labels[m.group(1)], i) for i, line in enumerate(lines)
            if (m := _BRA.search(line)) and labels.get(m.group(1), 1 << 30) < i]
    lo, hi = max(back, key=lambda b: b[1] - b[0])
    skip = set()
    for i in range(lo, hi + 1):
        m = _BRA.search(lines[i])
        if m and i < labels.get(m.group(1), -1) <= hi:
            block = lines[i + 1:labels[m.group(1)]]
            if any("FSEL" in x for x in block) and not any("REDG" in x or "LDGSTS" in x for x in block):
                skip.update(range(i + 1, labels[m.group(1)]))
    return [m.group(1).split(".")[0] for j in range(lo, hi + 1)
            if not (unmasked and j in skip) and (m := _OP.match(lines[j]))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default=None, help="a variant of fa2_bwd.cu (default: the file)")
    args = p.parse_args(argv)
    for d, bm, nw in TILES:
        for sm in ("fmul_fsub", "ffma"):
            build = BackwardBuild(BackwardConfig(d, block_m=bm, n_warps=nw, softmax=sm), kernel=args.kernel)
            c = compile_backward(build)
            u = c.usage[MAIN_KERNEL]
            whole, ops = loop_opcodes(c.cubin, False), loop_opcodes(c.cubin, True)
            cnt = collections.Counter(ops)
            print(f"d={d} {bm}x{nw} {sm:9s} regs {u.registers} local {u.stack_bytes} loop {len(whole)} "
                  f"unmasked {len(ops)}: " + " ".join(f"{k} {cnt.get(k, 0)}" for k in CLASSES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
