"""PTX instructions that go through the machine: loads and stores in every state space, cp.async,
ldmatrix, mma, shfl, barriers, address conversion.

PTX anchors: `#data-movement-and-conversion-instructions-ld`, `...-st`, `...-cp-async`,
`...-cvta`, `#warp-level-matrix-instructions-ldmatrix`, `#warp-level-matrix-instructions-mma`,
`#data-movement-and-conversion-instructions-shfl-sync`,
`#parallel-synchronization-and-communication-instructions-bar`.

Addresses: shared memory is the CTA's window from 0 (what `mov r, shared_var` gives); generic
addresses of shared memory are that offset plus SHARED_WINDOW (`cvta.shared`), anything else
generic is global. Parameters are read from the launch's parameter bytes. Every handler builds
full [C, W, L] lane arrays for the machine (threads outside the group inactive) and writes the
results back to the group's registers. The opcode table (fa_sim/ptx/optable.py) says which
handler executes which opcode.
"""

from __future__ import annotations


import numpy as np

from ..errors import KernelFault
from ..isa import shfl as isa_shfl
from ..isa.sm80 import FULL_MASK
from .ir import Imm, Instruction, PredPair, Reg, Vec, named
from .ops import Unsupported
from .shared_lanes import address, operand_lanes
from .shared_lanes import smem_lanes as _smem_lanes
from .regs import immediate
from .state import Group, WaveState
from .types import DTYPES, bits, is_type

SHARED_WINDOW = 0x0001_0000_0000_0000  # generic address of shared byte 0
LOCAL_WINDOW = 0x0002_0000_0000_0000  # generic address of each thread's local byte 0
SPACES = ("param", "shared", "global", "local", "const")


def _space(ins: Instruction) -> str:
    return next((m.split("::")[0] for m in ins.mods if m.split("::")[0] in SPACES), "generic")


def _vtype(ins: Instruction) -> tuple[int, str]:
    """(vector length, element type) of a load or store."""
    n = next((int(m[1:]) for m in ins.mods if m in ("v2", "v4", "v8")), 1)
    t = [m for m in ins.mods if is_type(m)]
    if not t:
        raise Unsupported(f"{ins.mnemonic} has no type")
    return n, t[-1]


def _elements_to_bytes(values: list, etype: str) -> np.ndarray:
    """[n] arrays of one type -> [n, N * size] uint8."""
    dt = DTYPES[etype] if etype != "pred" else np.dtype(np.uint8)
    cols = [np.ascontiguousarray(np.asarray(v).astype(dt, copy=False)) for v in values]
    return np.stack(cols, axis=-1).view(np.uint8).reshape(cols[0].shape[0], -1)


def _bytes_to_elements(data: np.ndarray, n_el: int, etype: str) -> list:
    """[n, N * size] uint8 -> N arrays [n] of etype."""
    arr = np.ascontiguousarray(data).view(DTYPES[etype]).reshape(data.shape[0], n_el)
    return [arr[:, i] for i in range(n_el)]


def _write_vector(eng: WaveState, op, values: list, etype: str, group: Group) -> None:
    items = op.items if isinstance(op, Vec) else (op,)
    for item, v in zip(items, values):
        eng.write(item, v, etype, group.idx, group.n)


def _region(eng: WaveState, addr: np.ndarray, space: str, width: int) -> tuple[str, np.ndarray]:
    """Resolve the generic space of an access (shared or local when every address lies in that
    window, else global): -> (space, addresses in it)."""
    if space != "generic":
        return space, addr
    for name, base, size in (("shared", SHARED_WINDOW, eng.m.smem_bytes), ("local", LOCAL_WINDOW, eng.local.shape[1])):
        inside = (addr >= base) & (addr < base + size)
        if inside.all():
            return name, addr - base
        if inside.any():
            raise Unsupported(f"a generic access whose lanes mix {name} and other addresses")
    return "global", addr


def _local(eng: WaveState, addr: np.ndarray, size: int, group: Group, data: np.ndarray | None = None):
    """ld.local / st.local: each thread's own bytes [addr, addr + size) (KernelFault outside)."""
    if addr.size and (addr.min() < 0 or addr.max() + size > eng.local.shape[1]):
        raise KernelFault(f"local-memory access outside the thread's {eng.local.shape[1]} bytes")
    rows = np.arange(eng.n)[:, None] if group.mask is None else group.idx[:, None]
    cols = addr[:, None] + np.arange(size)
    if data is None:
        return eng.local[rows, cols]
    eng.local[rows, cols] = data


def ld(eng: WaveState, group: Group, ins: Instruction) -> None:
    n_el, etype = _vtype(ins)
    space = _space(ins)
    size = bits(etype) // 8 * n_el
    addr = address(eng, ins.operands[1], group, space)
    space, addr = _region(eng, addr, space, size)
    if space == "param":
        data = eng.param_bytes(addr, size)
    elif space == "local":
        data = _local(eng, addr, size, group)
    elif space == "const":  # __constant__ variables are global buffers, read through the constant cache: no event
        data = eng.m.memory.gather(addr, size, np.ones(addr.shape, bool), "ld.const")
    elif space == "shared":
        instr = eng.activate(ins.pc, group)
        lanes = _smem_lanes(eng, addr, size, group, ins.pc)
        units = eng.m.ld_shared(instr, lanes, _reg_name(ins.operands[0]))  # [C, W, L, 1, k]
        data = eng.gather(np.ascontiguousarray(units).view(np.uint8).reshape(*eng.cw, size), group)
    elif space == "global":
        instr = eng.activate(ins.pc, group)
        got = eng.m.ld_global(instr, eng.scatter(addr, group)[..., None], size,
                              np.ones((*eng.cw, 1), bool), _reg_name(ins.operands[0]))  # [C, W, L, 1, size]
        data = eng.gather(got[..., 0, :], group)
    else:
        raise Unsupported(f"ld.{space}")
    _write_vector(eng, ins.operands[0], _bytes_to_elements(data, n_el, etype), etype, group)


def st(eng: WaveState, group: Group, ins: Instruction) -> None:
    n_el, etype = _vtype(ins)
    space = _space(ins)
    size = bits(etype) // 8 * n_el
    addr = address(eng, ins.operands[0], group, space)
    space, addr = _region(eng, addr, space, size)
    data = _elements_to_bytes(eng.vector(ins.operands[1], etype, group), etype)  # [n, size]
    if space == "local":
        _local(eng, addr, size, group, data)
        return
    instr = eng.activate(ins.pc, group)
    name = _reg_name(ins.operands[1])
    if space == "shared":
        unit = {1: np.uint8, 2: np.uint16}.get(size, np.uint32)
        words = eng.scatter_rows(np.ascontiguousarray(data).view(unit), group)  # [C, W, L, k]
        eng.m.st_shared(instr, _smem_lanes(eng, addr, size, group, ins.pc), words[..., None, :], name)
    elif space == "global":
        unit = {1: np.uint8, 2: np.uint16}.get(size, np.uint32)
        words = eng.scatter_rows(np.ascontiguousarray(data).view(unit), group)
        eng.m.st_global(instr, eng.scatter(addr, group)[..., None], words[..., None, :],
                        np.ones((*eng.cw, 1), bool), name)
    else:
        raise Unsupported(f"st.{space}")


def _reg_name(op) -> str:
    if isinstance(op, Vec):
        return "{" + ", ".join(getattr(x, "name", "_") for x in op.items) + "}"
    return getattr(op, "name", "value")


def cp_async(eng: WaveState, group: Group, ins: Instruction) -> None:
    if not ins.mods or ins.mods[0] != "async":
        raise Unsupported(f"{ins.mnemonic}")
    instr = eng.activate(ins.pc, group)
    if "commit_group" in ins.mods:
        eng.m.commit_group(instr)
        return
    if "wait_group" in ins.mods:
        eng.m.wait_group(instr, int(_uniform(eng, ins.operands[0], group)))
        return
    if "wait_all" in ins.mods:
        eng.m.commit_group(instr)
        eng.m.wait_group(instr, 0)
        return
    cache = "cg" if "cg" in ins.mods else "ca" if "ca" in ins.mods else None
    spaces = [m.split("::")[0] for m in ins.mods]
    if cache is None or "shared" not in spaces or "global" not in spaces:
        raise Unsupported(f"{ins.mnemonic} (only cp.async.{{ca,cg}}.shared.global)")
    dst, src, cp_size = ins.operands[0], ins.operands[1], int(_uniform(eng, ins.operands[2], group))
    src_size = eng.read(ins.operands[3], "u32", group.idx, group.n) if len(ins.operands) > 3 else np.full(group.n, cp_size)
    from ..isa.cp_async import check_sizes
    try:
        check_sizes(cp_size, np.asarray(src_size), cache)
    except ValueError as exc:  # undefined on hardware: the kernel's bug, reported with its lines
        raise KernelFault(str(exc)) from None
    s = address(eng, src, group, "global")
    eng.m.cp_async(instr, operand_lanes(eng, (dst,), cp_size, group, ins.pc), eng.scatter(s, group)[..., None],
                   eng.scatter(np.asarray(src_size, np.int64), group)[..., None])


def _uniform(eng: WaveState, op, group: Group):
    v = np.asarray(eng.read(op, "s64", group.idx, group.n))
    if v.size and not (v == v.flat[0]).all():
        raise Unsupported("a value that must be the same for every thread differs between threads")
    return v.flat[0] if v.size else 0


def cvta(eng: WaveState, group: Group, ins: Instruction) -> None:
    t = next(m for m in reversed(ins.mods) if is_type(m))
    to = "to" in ins.mods
    space = next((m for m in ins.mods if m in SPACES), None)
    a = eng.read(ins.operands[1], t, group.idx, group.n).astype(np.int64)
    if space in ("shared", "local"):
        base = SHARED_WINDOW if space == "shared" else LOCAL_WINDOW
        a = a - base if to else a + base
    elif space != "global":
        raise Unsupported(f"cvta to/from .{space}")
    eng.write(ins.operands[0], a.astype(DTYPES[t]), t, group.idx, group.n)


def ldmatrix(eng: WaveState, group: Group, ins: Instruction) -> None:
    num = next(int(m[1:]) for m in ins.mods if m in ("x1", "x2", "x4"))
    trans = "trans" in ins.mods
    if "m8n8" not in ins.mods or "b16" not in ins.mods:
        raise Unsupported(f"{ins.mnemonic} (only m8n8 .b16)")
    lanes = operand_lanes(eng, (ins.operands[1],), 16, group, ins.pc)
    instr = eng.activate(ins.pc, group)
    regs = eng.m.ldmatrix(instr, lanes, num, trans, _reg_name(ins.operands[0]))
    values = eng.gather(regs[..., 0, :], group)  # [n, num]
    _write_vector(eng, ins.operands[0], [values[:, i] for i in range(num)], "b32", group)


MMA_FORM = ("sync", "aligned", "m16n8k16", "row", "col", "f32", "f16", "f16", "f32")
MMA_FORM_BF16 = ("sync", "aligned", "m16n8k16", "row", "col", "f32", "bf16", "bf16", "f32")
MMA_OPERAND = {MMA_FORM: "f16", MMA_FORM_BF16: "bf16"}  # the modelled forms and their A/B type


def mma(eng: WaveState, group: Group, ins: Instruction) -> None:
    operand = MMA_OPERAND.get(ins.mods)
    if operand is None:
        raise Unsupported(f"{ins.mnemonic} (the engine models mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                          f"and .f32.bf16.bf16.f32)")
    d, a, b, c = ins.operands
    def lanes(op, t):  # -> [C, W, L, k]
        return np.stack([eng.scatter(v, group) for v in eng.vector(op, t, group)], axis=-1)
    instr = eng.activate(ins.pc, group)
    out = eng.m.mma(instr, lanes(a, "b32")[..., None, :], lanes(b, "b32")[..., None, :],
                    lanes(c, "f32")[..., None, None, :], operand)  # [C, W, L, 1, 1, 4]
    values = eng.gather(out[..., 0, 0, :], group)
    _write_vector(eng, d, [values[:, i] for i in range(4)], "f32", group)


def shfl(eng: WaveState, group: Group, ins: Instruction) -> None:
    mode = ins.mods[1] if len(ins.mods) > 1 else ""
    if ins.mods[0] != "sync" or "b32" not in ins.mods:
        raise Unsupported(f"{ins.mnemonic} (only shfl.sync.*.b32)")
    dst, a, b, c, mask = ins.operands
    static = _static_shfl(eng, group, b, c, mask, ins.pc)
    if static is not None and not eng.observed and eng.geo.threads % 32 == 0:
        _shfl_wave(eng, ins, mode, static)
        return
    x = eng.scatter(eng.read(a, "b32", group.idx, group.n), group)
    if static is not None:
        bb, cc, mm = static
    else:
        bb, cc = (eng.scatter(eng.read(o, "b32", group.idx, group.n).astype(np.int64), group) for o in (b, c))
        mm = _warp_membermask(eng, eng.scatter(eng.read(mask, "b32", group.idx, group.n).astype(np.int64), group),
                              group)
    instr = eng.activate(ins.pc, group)
    out = dst.p if isinstance(dst, PredPair) else dst
    y, valid = eng.m.shfl(instr, x, mode, bb, cc, (_reg_name(a), _reg_name(out)), mm)
    if isinstance(dst, PredPair):
        eng.write(dst.p, eng.gather(y, group), "b32", group.idx, group.n)
        eng.write(dst.q, eng.gather(valid, group), "pred", group.idx, group.n)
    else:
        eng.write(dst, eng.gather(y, group), "b32", group.idx, group.n)


def _shfl_wave(eng: WaveState, ins: Instruction, mode: str, static: tuple[int, int, int]) -> None:
    """shfl.sync of the whole wave, unobserved, with static operands (_static_shfl): what
    Machine.shfl computes then (counted per warp; every lane takes part, so nothing to check), one
    gather of the source lanes of every warp straight from the register. The views it gathers
    from and into are the engine's for as long as it runs: found once per source array
    (`_shfl_plan`)."""
    x = eng.read(ins.operands[1], "b32", None, eng.n)
    key = ("shfl", ins.pc, mode, static[:2])
    plan = eng.bound.get(key)
    if plan is None or plan[0] is not x:
        plan = eng.bound[key] = _shfl_plan(eng, ins, mode, static, x)
    _, src, j, into, pred, ok = plan
    eng.m.count(eng.activate(ins.pc, eng.wave))
    dst = ins.operands[0]
    if into is not None:  # gathered straight into the register
        np.take(src, j, axis=1, out=into)
    else:
        eng.write(dst.p if isinstance(dst, PredPair) else dst, src[:, j].reshape(-1), "b32", None, eng.n)
    if pred is not None:
        pred[...] = ok
    elif isinstance(dst, PredPair):
        eng.write(dst.q, np.broadcast_to(ok, (eng.n // 32, 32)).reshape(-1), "pred", None, eng.n)


def _shfl_plan(eng: WaveState, ins: Instruction, mode: str, static: tuple[int, int, int], x: np.ndarray) -> tuple:
    """(x, x by warp [N / 32, 32], source lanes j [32], the destination register's row by warp to
    gather into (None: it is not a 32-bit register, or it shares memory with x), the predicate's
    row by warp (None: no predicate register to set so), in range [32]) of `_shfl_wave`."""
    dst = ins.operands[0]
    j, ok = isa_shfl.warp_source(mode, static[0], static[1])
    row = eng.regs.row(dst.p if isinstance(dst, PredPair) else dst, 32)
    into = None if row is None or np.may_share_memory(row, x) else row.view(x.dtype).reshape(-1, 32)
    pred = eng.regs.row(dst.q, 1) if isinstance(dst, PredPair) else None
    return x, x.reshape(-1, 32), j, into, None if pred is None else pred.reshape(-1, 32), ok


SHUFFLE_MODES = ("up", "down", "bfly", "idx")


def block_shuffle(ins: Instruction) -> bool:
    """Whether a shfl.sync can join a lane block (fa_sim/ptx/fused.py): unguarded shfl.sync.mode.b32
    from a register into a register (or a register and a predicate: d|p)."""
    ops = ins.operands
    dst = (ops[0].p, ops[0].q) if ops and isinstance(ops[0], PredPair) else ops[:1]
    return (ins.opcode == "shfl" and ins.guard is None and len(ins.mods) == 3 and ins.mods[0] == "sync"
            and ins.mods[1] in SHUFFLE_MODES and ins.mods[2] == "b32" and len(ops) == 5
            and all(isinstance(op, Reg) and not op.special and not op.negate for op in (*dst, ops[1])))


def shuffle_operands(inss: tuple[Instruction, ...], k: int) -> tuple | None:
    """The membermask, lane and clamp operands of the shfl inss[k] of a lane block as the block can
    take them before it runs: an integer where an immediate or the block's last write before the
    shfl (a mov of an immediate into a 32-bit register) gives their bits, the operand where no
    instruction of the block before the shfl writes it (read when the block starts); None when
    another instruction writes one there."""
    _, _, b, c, mask = inss[k].operands
    out = []
    for op in (mask, b, c):
        if isinstance(op, Imm):
            out.append(int(np.asarray(immediate(op, "b32"))))
            continue
        writer = next((ins for ins in reversed(inss[:k]) if op.name in named(ins.operands[0])), None) \
            if isinstance(op, Reg) and not op.special else None
        if writer is None:
            out.append(op)
        elif writer.opcode == "mov" and len(writer.mods) == 1 and writer.mods[0] in ("b32", "u32", "s32") and \
                isinstance(writer.operands[1], Imm) and writer.operands[0] == op:
            out.append(int(np.asarray(immediate(writer.operands[1], writer.mods[0])).astype(np.int64)) & 0xFFFFFFFF)
        else:
            return None
    return tuple(out)


def shuffle_lanes(eng: WaveState, group: Group, shuffles: tuple) -> tuple | None:
    """(source lanes [32], in range [32]) of each shfl of a lane block, `shuffles` its (instruction,
    shuffle_operands), when the whole wave runs them unobserved with static operands (as
    _static_shfl finds them; those the block does not set read before it runs) - the case
    _shfl_wave gathers, where nothing can fail - else None (the block then runs one instruction
    at a time)."""
    if group.mask is not None or eng.observed or eng.geo.threads % 32 or eng.exited.any():
        return None
    out = []
    for ins, ops in shuffles:
        try:
            values = [op if isinstance(op, int) else _static_value(eng, op, ins.pc) for op in ops]
        except (Unsupported, KernelFault):  # an operand the engine does not read: the single instruction raises
            return None
        if None in values or values[0] != FULL_MASK:
            return None
        out.append(isa_shfl.warp_source(ins.mods[1], values[1], values[2]))
    return tuple(out)


def shuffled(eng: WaveState, ins: Instruction, x: np.ndarray, lanes: tuple) -> np.ndarray:
    """A lane block's shfl (shuffle_lanes gave its source lanes and in-range lanes) at its place:
    counted per warp as _shfl_wave counts it, each warp's source lanes of x [N] gathered."""
    eng.m.count(eng.activate(ins.pc, eng.wave))
    return np.take(x.reshape(-1, 32), lanes[0], axis=1).reshape(-1)


def shuffle_in_range(lanes: tuple, n: int) -> np.ndarray:
    """A lane block's shfl's predicate (its d|p): each lane's in-range bit, on every warp of n threads."""
    return np.broadcast_to(lanes[1], (n // 32, 32)).reshape(-1)


def _static_shfl(eng: WaveState, group: Group, b, c, mask, pc: int) -> tuple[int, int, int] | None:
    """(b, c, membermask) as integers when the whole wave runs with no thread exited and each of
    them has one value on every thread (registers set by a mov, in fa2_fwd's PTX), the mask being
    every lane: each warp's membermask is then FULL_MASK on every lane and the shuffle's source
    lanes are the same [32] in every warp (the isa's one-take path: the same values and checks as
    with per-lane operands). None otherwise."""
    if group.mask is not None or eng.exited.any():
        return None
    out = []
    for op in (mask, b, c):
        v = _static_value(eng, op, pc)
        if v is None:
            return None
        out.append(v)
    member, bb, cc = out
    return (bb, cc, member) if member == FULL_MASK else None


def _static_value(eng: WaveState, op, pc: int) -> int | None:
    """An operand of the shfl at pc as an integer when it has one value (b32) on every thread of
    the wave, else None. A register that holds its loop writer's constant (fa_sim/ptx/invariant.py
    `holds_constant`) is read once per engine."""
    const = isinstance(op, Reg) and eng.compiled.invariants.holds_constant(eng, op.name, pc)
    if const and op.name in eng.constants:
        return eng.constants[op.name]
    v = eng.read(op, "b32", None, eng.n)
    first = v[0]
    if v.strides != (0,) and not (v == first).all():  # an immediate is one value broadcast
        return None
    if const:
        eng.constants[op.name] = int(first)
    return int(first)


def _warp_membermask(eng: WaveState, mm: np.ndarray, group: Group) -> np.ndarray:
    """[C, W, L] the membermask each warp's executing lanes give (they must agree), minus lanes that
    exited (they owe the shuffle nothing), on every lane of the warp."""
    active = group.full(eng.n).reshape(eng.cw)
    warp = np.where(active, mm, 0).max(axis=-1, keepdims=True)  # [C, W, 1]
    if np.any(active & (mm != warp)):
        raise KernelFault("shfl.sync: lanes of one warp give different membermasks")
    return np.broadcast_to(warp, eng.cw) & ~_exited_bits(eng)


def _exited_bits(eng: WaveState) -> np.ndarray:
    """[C, W, L] int64: per warp, the bit mask of its exited lanes (on every lane of the warp)."""
    ex = (~eng.running).astype(np.int64) << np.arange(32)
    return np.broadcast_to(ex.sum(axis=-1, keepdims=True), eng.cw)


def barrier(eng: WaveState, group: Group, ins: Instruction) -> None:
    if "warp" in ins.mods:
        warp_sync(eng, group, ins)
        return
    if set(ins.mods) - {"cta", "aligned"} != {"sync"}:  # not .arrive / .red (bar.cta.arrive is no bar.sync)
        raise Unsupported(f"{ins.mnemonic} (only bar{{.cta}}.sync / barrier{{.cta}}.sync{{.aligned}})")
    if len(ins.operands) > 1:
        count = int(_uniform(eng, ins.operands[1], group))
        if count != eng.geo.threads:
            raise Unsupported(f"bar.sync with a thread count ({count}) below the CTA's {eng.geo.threads}")
    if int(_uniform(eng, ins.operands[0], group)) != 0:
        raise Unsupported("named barriers other than 0")
    instr = eng.activate(ins.pc, group)
    eng.m.bar_sync(instr, eng.running)


def warp_sync(eng: WaveState, group: Group, ins: Instruction) -> None:
    """bar.warp.sync membermask (__syncwarp; #parallel-synchronization-and-communication-instructions-bar-warp-sync):
    the lanes of membermask meet before any goes on. Here a warp's lanes that run together are
    already in step and memory is sequentially consistent, so what remains is the rule: every lane
    that executes it must be in its own membermask (else the behaviour is undefined: a KernelFault)."""
    if set(ins.mods) != {"warp", "sync"} or len(ins.operands) != 1:
        raise Unsupported(f"{ins.mnemonic} (only bar.warp.sync membermask)")
    mm = eng.read(ins.operands[0], "b32", group.idx, group.n).astype(np.int64)
    lane = (group.idx if group.idx is not None else np.arange(eng.n)) % 32
    if np.any((mm >> lane) & 1 == 0):
        raise KernelFault("bar.warp.sync: a lane that executes it is not in its membermask")
    eng.activate(ins.pc, group)


def vote(eng: WaveState, group: Group, ins: Instruction) -> None:
    """vote.sync.{all,any,uni}.pred d, a, membermask and vote.sync.ballot.b32 d, a, membermask
    (#parallel-synchronization-and-communication-instructions-vote-sync): per warp, over the lanes
    of the membermask (every executing lane must name the same mask and be in it; lanes of the mask
    that exited count as absent), a predicate reduction or the ballot's bit mask (bit i: lane i's a)."""
    mode = next((m for m in ins.mods if m in ("all", "any", "uni", "ballot")), None)
    if "sync" not in ins.mods or mode is None or len(ins.operands) != 3:
        raise Unsupported(f"{ins.mnemonic} (only vote.sync.{{all,any,uni}}.pred and vote.sync.ballot.b32)")
    d, a, mask = ins.operands
    pred = eng.scatter(eng.read(a, "pred", group.idx, group.n), group, fill=False).astype(bool)  # [C, W, L]
    mm = _warp_membermask(eng, eng.scatter(eng.read(mask, "b32", group.idx, group.n).astype(np.int64), group),
                          group)
    active = group.full(eng.n).reshape(eng.cw)
    lane_bit = np.int64(1) << np.arange(32)
    if np.any(active & ((mm & lane_bit) == 0)):
        raise KernelFault(f"{ins.mnemonic}: a lane that executes it is not in its membermask")
    member = (mm & lane_bit) != 0  # [C, W, L]: the lanes the vote reads (on every lane of the warp: its mask)
    if np.any(member & ~active & eng.running.reshape(eng.cw)):
        raise KernelFault(f"{ins.mnemonic}: a lane of the membermask does not execute it with the others "
                          "(the warp diverged before the vote)")
    voters = member & active
    if mode == "ballot":
        value = ((pred & voters) * lane_bit).sum(axis=-1, keepdims=True)
        out, t = np.broadcast_to(value, eng.cw).astype(np.uint32), "b32"
    else:
        yes, no = (pred & voters).any(axis=-1, keepdims=True), (~pred & voters).any(axis=-1, keepdims=True)
        out, t = np.broadcast_to({"all": ~no, "any": yes, "uni": ~(yes & no)}[mode], eng.cw), "pred"
    eng.activate(ins.pc, group)
    eng.write(d, eng.gather(out, group), t, group.idx, group.n)


def fence(eng: WaveState, group: Group, ins: Instruction) -> None:
    """Memory ordering only: warps run in lockstep and memory is sequentially consistent here."""



# -- atomics ---------------------------------------------------------------------------------------
ATOM_OPS = {
    "add": lambda old, b, c: old + b, "min": lambda old, b, c: np.minimum(old, b),
    "max": lambda old, b, c: np.maximum(old, b), "and": lambda old, b, c: old & b,
    "or": lambda old, b, c: old | b, "xor": lambda old, b, c: old ^ b, "exch": lambda old, b, c: b,
    "inc": lambda old, b, c: np.where(old >= b, 0, old + 1).astype(old.dtype),
    "dec": lambda old, b, c: np.where((old == 0) | (old > b), b, old - 1).astype(old.dtype),
    "cas": lambda old, b, c: np.where(old == b, c, old),
}


def atomic(eng: WaveState, group: Group, ins: Instruction) -> None:
    """atom / red on global or shared memory (#parallel-synchronization-and-communication-instructions-atom).

    The threads' operations are applied one after another in ascending thread order (CTA, then
    thread): each step updates every distinct address once, so a float sum is that sequential sum.
    atom returns each thread's old value. Atomics are executed, not observed: they produce no
    events, so the bank counter and the hazard checker do not see them.

    sm_90's vector reduction `red.global.add.v2.f32 [a], {b0, b1}` (and .v4; PTX ISA 8.1) is one
    atomic add per element, element i at a + 4 i (the PTX ISA guarantees atomicity per element,
    not across the vector): the engine applies them as 2 (4) scalar reductions of the thread, so a
    sum gets the same terms; the address must be aligned to the vector's size (else KernelFault,
    the GPU's misaligned-address error)."""
    space = next((m for m in ins.mods if m in ("global", "shared")), "generic")
    op = next((m for m in ins.mods if m in ATOM_OPS), None)
    etype = [m for m in ins.mods if is_type(m)]
    vec = [int(m[1:]) for m in ins.mods if m.startswith("v") and m[1:].isdigit()]
    if vec and not (ins.opcode == "red" and op == "add" and etype and etype[-1] == "f32" and vec[0] in (2, 4)
                    and space == "global"):
        raise Unsupported(f"{ins.mnemonic} (vector atomics: red.global.add.v2.f32 and .v4.f32 only)")
    if op is None or not etype:
        raise Unsupported(f"{ins.mnemonic} (atom/red: add, min, max, and, or, xor, exch, inc, dec, cas on scalars)")
    etype = etype[-1]
    ret = ins.opcode == "atom"
    ops = ins.operands[1:] if ret else ins.operands
    addr = address(eng, ops[0], group, space)
    if vec:
        n_el, size = vec[0], bits(etype) // 8
        if addr.size and np.any(addr % (n_el * size)):
            raise KernelFault(f"{ins.mnemonic}: address not aligned to the vector's {n_el * size} bytes")
        vals = eng.vector(ops[1], etype, group)
        if len(vals) != n_el:
            raise Unsupported(f"{ins.mnemonic} takes {n_el} values, got {len(vals)}")
        # element-major: each element's reductions in thread order, then the next element's (their
        # addresses differ, so the order between elements changes no sum)
        addr = np.concatenate([addr + size * i for i in range(n_el)])
        b = np.concatenate([np.asarray(v) for v in vals])
        thread = np.arange(eng.n) if group.mask is None else group.idx
        _apply_atomics(eng, space, addr, b, None, etype, op, np.tile(thread, n_el))
        return
    space, addr = _region(eng, addr, space, bits(etype) // 8)
    b = eng.read(ops[1], etype, group.idx, group.n)
    c = eng.read(ops[2], etype, group.idx, group.n) if op == "cas" else None
    thread = np.arange(eng.n) if group.mask is None else group.idx
    old = _apply_atomics(eng, space, addr, np.asarray(b), None if c is None else np.asarray(c), etype, op, thread)
    if ret:
        eng.write(ins.operands[0], old, etype, group.idx, group.n)


def _apply_atomics(eng: WaveState, space: str, addr, b, c, etype: str, op: str, thread) -> np.ndarray:
    """Apply the atomics of threads `thread` [n] (one per address addr [n]) in (address, thread) order."""
    size, dtype = bits(etype) // 8, DTYPES[etype]
    n = addr.size
    key = addr if space == "global" else addr + (thread // eng.geo.slots) * (1 << 40)  # shared: per CTA
    order = np.lexsort((thread, key))  # by address, then thread
    ks = key[order]
    first = np.ones(n, bool)
    first[1:] = ks[1:] != ks[:-1]
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    old = np.empty(n, dtype)
    for r in range(int(rank.max()) + 1 if n else 0):  # each step touches every address at most once
        sel = np.flatnonzero(rank == r)
        cur = _atomic_load(eng, space, addr[sel], size, thread[sel]).view(dtype)[:, 0]
        old[sel] = cur
        new = ATOM_OPS[op](cur, b[sel], None if c is None else c[sel]).astype(dtype)
        _atomic_store(eng, space, addr[sel], np.ascontiguousarray(new).view(np.uint8).reshape(-1, size), thread[sel])
    return old


def _atomic_load(eng: WaveState, space: str, addr, size: int, thread) -> np.ndarray:
    if space == "global":
        return eng.m.memory.gather(addr, size, np.ones(addr.shape, bool), "atomic")
    cta, smem = thread // eng.geo.slots, eng.m.smem
    if addr.size and (addr.min() < 0 or addr.max() + size > eng.m.smem_bytes):
        raise KernelFault("atomic on shared memory outside the CTA's allocation")
    return smem[cta[:, None], addr[:, None] + np.arange(size)]


def _atomic_store(eng: WaveState, space: str, addr, data, thread) -> None:
    if space == "global":
        eng.m.memory.scatter(addr, data, np.ones(addr.shape, bool), "atomic")
    else:
        cta = thread // eng.geo.slots
        eng.m.smem[cta[:, None], addr[:, None] + np.arange(data.shape[1])] = data
