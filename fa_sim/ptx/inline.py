"""Calls of the module's own functions (`__noinline__` device functions: `call.uni (retval0), f,
(param0, ...)`, #control-flow-instructions-call) inlined into the kernel before it runs, so that the
engine, which executes one instruction list, runs them.

What a call does, here in place: the caller stores the arguments to call-sequence `.param`
variables, the callee loads them from its parameters, computes, stores its results to its return
parameters and returns, and the caller loads them. `inline_calls` splices a copy of the callee's
body at each call: the callee's registers renamed apart per copy (`%f3` of copy 2 is `%cc_f3`),
its labels likewise, its parameters and returns read and written as the call's own `.param`
variables, every `ret` a branch to the instruction after the call. The call-sequence `.param`
variables become per-thread `.local` ones (each thread's own slots, as the GPU keeps them in
registers or its stack frame), and the callee's own `.local` variables (its frame) are copied per
call. Each instruction keeps its CUDA source location (the callee's lines). A call of a function
the module only declares (printf's vprintf) stays a call, which the engine refuses if a thread
reaches it; a recursive call, or a call through a register, is Unsupported. Each copy is recorded
(Kernel.calls: the callee, its pcs, the call's source location, the copy that made the call): the
timing walk ties a called SASS function's branches to the copy of its call site (fa_sim.timing.walk).
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Addr, Inlined, Instruction, Kernel, Module, ParamList, PredPair, Reg, Sym, Variable, Vec
from .ops import Unsupported
from .render import render

MAX_DEPTH = 16  # nested calls inlined; deeper is taken for recursion


def inline_calls(module: Module, kernel: Kernel) -> Kernel:
    """`kernel` with every call of a function of `module` replaced by the function's body (the
    module docstring); the kernel itself when it calls nothing."""
    if not any(i.opcode == "call" for i in kernel.instructions):
        return kernel
    return _Inliner(module, kernel).run()


class _Inliner:
    def __init__(self, module: Module, kernel: Kernel):
        self.module, self.kernel = module, kernel
        self.copies = 0
        self.regs = dict(kernel.regs)
        self.named = dict(kernel.named_regs)
        params = {v.name for v in kernel.variables if v.space == "param"}
        self.variables = [replace(v, space="local") if v.name in params else v for v in kernel.variables]
        self.local_params = set(params)
        self.calls: list = []  # (callee, call loc, parent copy) per copy; its pcs from the markers (copy, 0 / 1)

    def run(self) -> Kernel:
        code, labels = self._body(self.kernel, {}, "", None, 0, None)
        out, at, pcs = [], {}, {}
        for item in code:
            if isinstance(item, str):
                at[item] = len(out)
            elif isinstance(item, tuple):  # (copy, 0 start / 1 end)
                pcs[item] = len(out)
            else:
                out.append(replace(item, pc=len(out)))
        out = [self._local_param(i) for i in out]
        calls = tuple(Inlined(callee, pcs[(k, 0)], pcs[(k, 1)], loc, parent)
                      for k, (callee, loc, parent) in enumerate(self.calls))
        return replace(self.kernel, regs=self.regs, named_regs=self.named, variables=tuple(self.variables),
                       labels=at, instructions=tuple(out), calls=calls)

    def _body(self, fn: Kernel, rename: dict, tag: str, ret_label: str | None, depth: int,
              copy: int | None) -> tuple[list, dict]:
        """fn's instructions (renamed by `rename` / `tag`) with label markers (str) among them, its calls
        inlined; `ret_label`: where its `ret` goes (None: the kernel's own ret stays); `copy`: the
        copy it is (an index of self.calls, None: the kernel)."""
        at_pc: dict = {}
        for name, pc in fn.labels.items():
            at_pc.setdefault(pc, []).append(name + tag)
        out: list = []
        for ins in fn.instructions:
            out += at_pc.get(ins.pc, [])
            ins = self._renamed(ins, rename, tag)
            if ins.opcode == "ret" and ret_label is not None:
                out.append(self._branch(ins, ret_label))
            elif ins.opcode == "call":
                out += self._call(ins, depth, copy)
            else:
                out.append(ins)
        out += at_pc.get(len(fn.instructions), [])
        return out, at_pc

    def _call(self, ins: Instruction, depth: int, parent: int | None) -> list:
        rets, callee = ins.operands[0], ins.operands[1]
        args = ins.operands[2] if len(ins.operands) > 2 else ParamList(())
        if not isinstance(callee, Sym):
            return [ins]  # through a register: the engine refuses it if a thread reaches it
        fn = self.module.functions.get(callee.name)
        if fn is None or not fn.instructions:  # printf's vprintf, an .extern function: the engine says so if
            return [ins]                       # a thread reaches it
        if depth >= MAX_DEPTH:
            raise Unsupported(f"calls nested over {MAX_DEPTH} deep (recursion?) at `{ins.text}` at {ins.where()}")
        if len(args.items) != len(fn.params) or len(rets.items) != len(fn.returns):
            raise Unsupported(f"`{ins.text}` at {ins.where()} passes {len(args.items)} arguments and "
                              f"{len(rets.items)} returns to {fn.name}, which has {len(fn.params)} and "
                              f"{len(fn.returns)}")
        k = self.copies
        self.copies += 1
        self.calls.append((fn.name, ins.loc, parent))
        tag = f"__c{k}"
        rename: dict = {}
        for p, a in zip((*fn.params, *fn.returns), (*args.items, *rets.items)):
            if not isinstance(a, Sym):
                raise Unsupported(f"a call argument that is not a .param variable ({a}) in `{ins.text}` at "
                                  f"{ins.where()}")
            rename[p.name] = a.name
        code = _letters(k)  # register prefixes hold no digit (fa_sim.ptx.regs reads %prefixN)
        for prefix, (ptype, count) in fn.regs.items():
            self.regs[f"%c{code}_{prefix[1:]}"] = (ptype, count)
            rename[("reg", prefix)] = f"%c{code}_{prefix[1:]}"
        for name, ptype in fn.named_regs.items():
            new = f"%c{code}_{name.lstrip('%')}"
            self.named[new] = ptype
            rename[("named", name)] = new
        for v in fn.variables:
            new = v.name + tag
            rename[v.name] = new
            self.variables.append(replace(v, name=new, space="local" if v.space == "param" else v.space))
            if v.space == "param":
                self.local_params.add(new)
        done = f"$__ret{tag}"
        body, _ = self._body(fn, rename, tag, done, depth + 1, k)
        return [(k, 0), *body, (k, 1), done]

    def _branch(self, ins: Instruction, label: str) -> Instruction:
        b = Instruction(ins.pc, "bra", ("uni",) if ins.guard is None else (), (Sym(label),), ins.guard, "",
                        ins.ptx_line, ins.loc)
        return replace(b, text=render(b))

    def _renamed(self, ins: Instruction, rename: dict, tag: str) -> Instruction:
        if not rename and not tag:
            return ins

        def reg(r: Reg) -> Reg:
            if r.special:
                return r
            if ("named", r.name) in rename:
                return replace(r, name=rename[("named", r.name)])
            stem = r.name.rstrip("0123456789")
            new = rename.get(("reg", stem))
            return replace(r, name=new + r.name[len(stem):]) if new else r

        def op(o):
            if isinstance(o, Reg):
                return reg(o)
            if isinstance(o, Sym):
                if o.name in rename:
                    return Sym(rename[o.name])
                return Sym(o.name + tag) if ins.opcode == "bra" else o
            if isinstance(o, Addr):
                return replace(o, base=op(o.base)) if o.base is not None else o
            if isinstance(o, Vec):
                return replace(o, items=tuple(op(x) for x in o.items))
            if isinstance(o, PredPair):
                return replace(o, p=op(o.p), q=op(o.q))
            if isinstance(o, ParamList):
                return replace(o, items=tuple(op(x) for x in o.items))
            return o

        guard = replace(ins.guard, reg=reg(ins.guard.reg)) if ins.guard is not None else None
        new = replace(ins, operands=tuple(op(o) for o in ins.operands), guard=guard)
        return replace(new, text=render(new))

    def _local_param(self, ins: Instruction) -> Instruction:
        """ld.param / st.param of a call-sequence variable as ld.local / st.local (its per-thread slot)."""
        if ins.opcode not in ("ld", "st") or "param" not in ins.mods:
            return ins
        addr = ins.operands[1] if ins.opcode == "ld" else ins.operands[0]
        if not (isinstance(addr, Addr) and isinstance(addr.base, Sym) and addr.base.name in self.local_params):
            return ins
        new = replace(ins, mods=tuple("local" if m == "param" else m for m in ins.mods))
        return replace(new, text=render(new))


def _letters(k: int) -> str:
    """0 -> 'a', 25 -> 'z', 26 -> 'ba': a copy's number in letters."""
    out = ""
    while True:
        out = chr(ord("a") + k % 26) + out
        k //= 26
        if not k:
            return out


__all__ = ["inline_calls"]
