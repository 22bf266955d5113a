"""The PTX parser on every build of fa2_fwd.cu: 78 configs x causal x the checkpoint build, SM80,
plus the seed's packed-batch (FA_VARLEN, causal and not) and split-KV (FA_SPLITKV) builds.

Each of the 315 PTX texts comes from NVRTC through the on-disk PTX cache (fa_sim.contract.nvrtc;
cold, NVRTC takes about 70 s for all 312 on the 2-core development machine, warm the cache
answers in about 1 s) and is parsed for real here (no parsed-module cache), then checked
against oracles read independently from the raw PTX text and from fa2_fwd.cu:
- the opcode histogram equals a line-by-line count of the kernel body;
- every instruction renders back to its own PTX line (modulo whitespace);
- every branch target is a label whose line lies between the instruction before its pc and the
  one at it;
- every register used is declared by a `.reg` line, and Kernel.regs equals those lines;
- the parameters are those of the kernel's C signature (8, plus 3 in the checkpoint build, 2 in
  the packed-batch build, 4 in the split-KV build), at their natural-alignment offsets;
- every instruction has the line and column of the last `.loc` before it, in fa2_fwd.cu, in the
  kernel or in a function the .cu defines, with an inlining chain that starts in the kernel's
  body (line 0, DWARF's "no line", is up to 12% of a build's instructions: NVRTC's choice).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from fa_sim.contract import KERNEL_NAME, SEED_PATH, KernelBuild
from fa_sim.config import KernelConfig
from fa_sim.ptx.debuginfo import short_name
from fa_sim.ptx.parser import parse
from fa_sim.ptx.render import render
from nvrtc_ahead import Kind

pytest.importorskip("cuda.bindings")

BUILDS = [KernelBuild(cfg, causal, "sm_80", ck) for cfg in KernelConfig.family()
          for causal in (False, True) for ck in (False, True)]
BUILDS += [KernelBuild(KernelConfig(), causal, "sm_80", varlen=True) for causal in (False, True)]  # packed batches
BUILDS += [KernelBuild(KernelConfig(), False, "sm_80", splitkv=True)]  # split-KV decoding (no causal mask)
CU = SEED_PATH.read_text()
CU_LINES = CU.count("\n") + 1
KERNEL_LINE = CU[: CU.index(f"{KERNEL_NAME}(")].count("\n") + 1
C_TO_PTX = {"float": ("f32", 4), "int": ("u32", 4)}


def _id(b: KernelBuild) -> str:
    return f"{b.config.tag}-{'causal' if b.causal else 'full'}{'-ck' if b.checkpoints else ''}{'-varlen' if b.varlen else ''}{'-splitkv' if b.splitkv else ''}"


def expected_params(checkpoints: bool, varlen: bool = False, splitkv: bool = False) -> list[tuple[str, str, int]]:
    """(name, type, offset) from fa2_fwd.cu's signature: pointers are .u64, int .u32, float .f32."""
    sig = re.search(rf"{KERNEL_NAME}\((.*?)\)\s*\{{", CU, re.S)[1]
    if not checkpoints:
        sig = re.sub(r"#if FA_CHECKPOINTS.*?#endif", "", sig, flags=re.S)
    if not varlen:  # FA_VARLEN: cu_seqlens_q, cu_seqlens_k (a packed batch)
        sig = re.sub(r"#if FA_VARLEN.*?#endif", "", sig, flags=re.S)
    if not splitkv:  # FA_SPLITKV: cache_seqlens, n_heads, o_accum, lse_accum (split-KV decoding)
        sig = re.sub(r"#if FA_SPLITKV.*?#endif", "", sig, flags=re.S)
    sig = re.sub(r"#\w+[^\n]*", "", sig)
    out, offset = [], 0
    for i, arg in enumerate(a for a in sig.split(",") if a.strip()):
        ptype, size = ("u64", 8) if "*" in arg else C_TO_PTX[arg.split()[-2]]
        offset = -(-offset // size) * size
        out.append((f"{KERNEL_NAME}_param_{i}", ptype, offset))
        offset += size
    return out


def body_lines(ptx: str) -> list[tuple[int, str]]:
    """(line number, code) of the kernel body, comments removed, blank lines dropped."""
    lines = ptx.split("\n")
    start = lines.index("{")  # the body's braces stand alone at column 0 (the kernel has no
    end = lines.index("}", start)  # nested scopes; .debug_str's are indented)
    out = []
    for i in range(start + 1, end):
        code = lines[i].split("//")[0].strip()
        if code:
            out.append((i + 1, code))
    return out


def raw_instructions(body: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, mnemonic, code) of every instruction line: not a directive, label or brace."""
    out = []
    for line, code in body:
        if code[0] in ".{}" or code.endswith(":"):
            continue
        words = code.split()
        out.append((line, (words[1] if words[0].startswith("@") else words[0]).rstrip(";"), code))
    return out


@pytest.fixture(scope="module")
def ptx_of():
    from fa_sim.contract.nvrtc import kernel_ptx

    return kernel_ptx


@pytest.mark.nvrtc_ahead(Kind.PTX, lambda build: build)
@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_build_parses_completely(build, ptx_of):
    ptx = ptx_of(build)
    module = parse(ptx)
    assert list(module.kernels) == [KERNEL_NAME] and module.target == "sm_80"
    k = module.kernels[KERNEL_NAME]
    body = body_lines(ptx)
    raw = raw_instructions(body)

    assert Counter(i.mnemonic for i in k.instructions) == Counter(m for _, m, _ in raw)
    assert [i.ptx_line for i in k.instructions] == [line for line, _, _ in raw]
    for ins, (_, _, code) in zip(k.instructions, raw):
        assert re.sub(r"\s", "", render(ins)) == re.sub(r"\s", "", code), ins.ptx_line

    labels = {code[:-1]: line for line, code in body if code.endswith(":")}
    assert k.labels.keys() == labels.keys()
    lines = [i.ptx_line for i in k.instructions] + [10**9]
    for ins in k.instructions:
        if ins.opcode == "bra":
            target = ins.operands[0].name
            pc = k.labels[target]
            assert (lines[pc - 1] if pc else 0) < labels[target] < lines[pc]

    declared = {m[2]: (m[1], int(m[3])) for m in re.finditer(r"\.reg\s+\.(\w+)\s+(%\w+)<(\d+)>;", ptx)}
    assert k.regs == declared and not k.named_regs
    for name in set(re.findall(r"%[a-z]+\d+\b", "\n".join(c for _, _, c in raw))):
        prefix, index = re.fullmatch(r"(%[a-z]+)(\d+)", name).groups()
        assert int(index) < declared[prefix][1], name

    params = expected_params(build.checkpoints, build.varlen, build.splitkv)
    assert [(p.name, p.type, p.offset) for p in k.params] == params
    assert len(params) == (11 if build.checkpoints else 8) + 2 * build.varlen + 4 * build.splitkv
    assert k.maxntid == (build.config.n_threads, 1, 1) and k.minnctapersm == build.min_blocks
    _check_locations(k, body)


def _check_locations(k, body) -> None:
    last_loc, raw_locs = None, []  # the (line, col) of the last `.loc` before each instruction
    for _, code in body:
        if code.startswith(".loc"):
            last_loc = tuple(int(v) for v in code.replace(",", " ").split()[2:4])
        elif code[0] not in ".{}" and not code.endswith(":"):
            raw_locs.append(last_loc)
    assert [(i.loc.line, i.loc.col) for i in k.instructions] == raw_locs
    files = {i.loc.file for i in k.instructions} | {f for i in k.instructions for f, _, _ in i.loc.inlined_at}
    assert files == {str(SEED_PATH)} and max(i.loc.line for i in k.instructions) <= CU_LINES
    # NVRTC sometimes drops the inlining scope of a sunk instruction (`.loc 1 408 5` alone): the
    # PTX's word is kept, so a location without a chain is the kernel's own
    assert all(i.loc.function == KERNEL_NAME for i in k.instructions if not i.loc.inlined_at)
    for function in {i.loc.function for i in k.instructions if i.loc.inlined_at}:
        name = short_name(function)
        assert name.startswith("fa::"), function
        assert re.search(rf"\b{re.escape(name.split('::')[-1].split('<')[0])}\s*\(", CU), name
    assert min(i.loc.inlined_at[-1][1] for i in k.instructions if i.loc.inlined_at) >= KERNEL_LINE
