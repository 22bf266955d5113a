"""Parse PTX text into a fa_sim.ptx.ir.Module: kernels with typed operands and source lines.

PTX ISA anchors: `#ptx-module-directives` (.version, .target, .address_size),
`#kernel-and-function-directives` (.entry, .func with return and parameter lists, .visible /
.weak / .extern), `#performance-tuning-directives` (.maxntid, .reqntid, .minnctapersm, .maxnreg,
.pragma, .noreturn), `#instruction-statements` (`label:`, guard `@p` / `@!p`, opcode with its
dot-suffixes, operands), `#control-flow-instructions-call`, and the debugging directives handled
in debuginfo.py. It reads everything NVRTC 13 emits for fa2_fwd.cu and for ordinary kernels
(including inline assembly's nested `{ }` scopes and call sequences); anything else raises
ParseError naming the PTX line and its text, never a silent skip.

Checked while parsing, so the engine may rely on it: every register is declared (or special),
every guard is a .pred register, every name resolves (a label, parameter, variable or function),
every `bra` target is a label of its function, and `call` has the normalized operands described
at ir.ParamList. Opcodes and modifiers are syntax here: which ones execute is the engine's
dispatch table's business (it names the ones it does not know).
"""

from __future__ import annotations

import re

from .debuginfo import LocTable, LocTracker, debug_strings, parse_file
from .decls import parse_params, parse_reg, parse_variable
from .ir import (SPECIAL_REGISTERS, Guard, Instruction, Kernel, Module, ParamList, Reg, Sym, Variable,
                 register_type)
from .lexer import ParseError, Piece, Unit, scan, strip_comments
from .operands import OperandParser

__all__ = ["ParseError", "parse"]

_INSTR = re.compile(r"(?:@(!?)\s*(%?[A-Za-z_$][\w$]*)\s+)?([A-Za-z_][\w]*(?:\.[\w]+)*)(?:\s+(.*))?", re.S)
_HEADER = re.compile(r"((?:\.(?:visible|weak|extern)\s+)*)\.(entry|func)\s*(?:\(([^()]*)\))?\s*"
                     r"([A-Za-z_$][\w$]*)\s*\(([^()]*)\)", re.S)
_DIRECTIVE = re.compile(r"\.(\w+)\s*(.*)", re.S)
_PRAGMA = re.compile(r'\.pragma\s+((?:"(?:[^"\\]|\\.)*"\s*,?\s*)+)', re.S)
_SECTION = re.compile(r"\.section\s+([\w.$]+)\s*\{(.*)\}", re.S)
_MNEMONICS: dict[str, tuple[str, tuple[str, ...]]] = {}  # 'add.s32' -> ('add', ('s32',))
_CLUSTER = ("explicitcluster", "reqnctapercluster", "maxclusterrank")
_PERF = {"maxntid": 3, "reqntid": 3, "minnctapersm": 1, "maxnreg": 1}  # directive -> most values


def parse(text: str) -> Module:
    """The Module of a PTX text (as NVRTC emits it)."""
    if not isinstance(text, str):
        raise ValueError(f"PTX must be text (str), not {type(text).__name__}")
    return _ModuleParser().run(text)


class _Function:
    """One .entry / .func while it is read: declarations, labels and raw instructions."""

    def __init__(self, header: str, line: int) -> None:
        m = _HEADER.fullmatch(header.strip())
        if m is None:
            raise ParseError(line, header, "a function header must be "
                                           "'[.visible|.weak|.extern] .entry|.func [(returns)] name(params)'")
        linkage, kind, rets, self.name, params = m.groups()
        if kind == "entry" and rets is not None:
            raise ParseError(line, header, "a kernel (.entry) has no return parameters")
        self.entry, self.line = kind == "entry", line
        self.linkage = linkage.split()[-1][1:] if linkage.strip() else ""
        self.params = parse_params(params, line)
        self.returns = parse_params(rets, line) if rets else ()
        self.perf: dict = {}
        self.pragmas: list[str] = []
        self.regs: dict[str, tuple[str, int]] = {}
        self.named: dict[str, str] = {}
        self.variables: dict[str, Variable] = {}
        self.labels: dict[str, int] = {}
        self.raw: list[tuple] = []  # (opcode, mods, operands, guard, text, line, raw loc)
        self.locs = LocTracker()
        self.operands = OperandParser(self.is_register)
        self.has_body = False

    # -- declarations ------------------------------------------------------------------------
    def is_register(self, name: str) -> bool:
        return name in SPECIAL_REGISTERS or register_type(self.regs, self.named, name) is not None

    def declare_regs(self, text: str, line: int) -> None:
        ptype, items = parse_reg(text, line)
        for name, count in items:
            table, value = (self.named, ptype) if count is None else (self.regs, (ptype, count))
            old = table.get(name)
            old_type = old if count is None else (old[0] if old else None)
            if old is not None and old_type != ptype:
                raise ParseError(line, text, f"register {name} declared again with another type "
                                             f"(.{old_type} before): scopes with clashing names are not supported")
            table[name] = value if count is None else (ptype, max(count, old[1] if old else 0))

    def declare_variable(self, text: str, line: int) -> None:
        for var in parse_variable(text, line):
            old = self.variables.get(var.name)
            if old is not None and var.space != "param" and old != var:
                raise ParseError(line, text, f"{var.name} declared twice differently in one function")
            if old is not None and (old.size, old.align) >= (var.size, var.align):
                continue
            if old is not None:  # call-sequence .param: one slot per name, the largest declaration
                var = Variable(var.name, "param", var.type, max(var.size, old.size), max(var.align, old.align))
            self.variables[var.name] = var

    def directive(self, text: str, line: int) -> None:
        """A line directive between the header and the body."""
        m = _DIRECTIVE.fullmatch(text.strip())
        name, args = m[1], m[2].strip()
        if name in _CLUSTER:
            raise ParseError(line, text, f".{name} is a cluster directive (sm_90); the simulator models SM80")
        if name == "noreturn" and not args:
            self.perf[name] = True
            return
        if name not in _PERF or not re.fullmatch(r"\d+(\s*,\s*\d+){0,%d}" % (_PERF[name] - 1), args):
            raise ParseError(line, text, f"unknown or malformed directive .{name} before a function body")
        values = [int(v) for v in re.findall(r"\d+", args)]
        self.perf[name] = tuple(values) if name in ("maxntid", "reqntid") else values[0]

    # -- statements ----------------------------------------------------------------------------
    def statement(self, text: str, line: int) -> None:
        text = text.strip()
        if not text:
            raise ParseError(line, ";", "empty statement inside a function body")
        if text[0] == ".":
            if text.startswith(".reg"):
                self.declare_regs(text, line)
            elif text.startswith(".pragma"):
                self.pragmas.extend(_pragmas(text, line))
            else:
                self.declare_variable(text, line)
            return
        self.instruction(text, line)

    def instruction(self, text: str, line: int) -> None:
        m = _INSTR.fullmatch(text)
        if m is None:
            raise ParseError(line, text, "not an instruction ('[@p] opcode.mods operands')")
        neg, guard_reg, mnemonic, rest = m.groups()
        guard = None
        if guard_reg is not None:
            guard = Guard(self.operands.parse(guard_reg, line, text), bool(neg))
            if not isinstance(guard.reg, Reg) or register_type(self.regs, self.named, guard_reg) != "pred":
                raise ParseError(line, text, f"guard {guard_reg} is not a .pred register")
        split = _MNEMONICS.get(mnemonic)
        if split is None:
            opcode, *mods = mnemonic.split(".")
            split = _MNEMONICS[mnemonic] = (opcode, tuple(mods))
        ops = self.operands.parse_all(rest, line, text) if rest else ()
        if split[0] == "call":
            ops = _call_operands(ops, line, text)
        body = text[m.start(3):] if guard is not None else text
        self.raw.append((*split, ops, guard, " ".join(body.split()) + ";", line, self.locs.current))

    def label(self, name: str, line: int) -> None:
        if name in self.labels:
            raise ParseError(line, name + ":", f"label {name} defined twice")
        self.labels[name] = len(self.raw)

    # -- the result ----------------------------------------------------------------------------
    def finish(self, locs: LocTable, names: set[str]) -> Kernel:
        instructions = tuple(Instruction(pc, op, mods, ops, guard, text, line,
                                         locs.resolve(raw, self.name))
                             for pc, (op, mods, ops, guard, text, line, raw) in enumerate(self.raw))
        known = names | self.labels.keys() | self.variables.keys() | \
            {p.name for p in self.params + self.returns}
        for name, (line, text) in self.operands.symbols.items():
            if name not in known:
                raise ParseError(line, text, f"{name} is not a label, parameter, variable or function")
        _check_branches(instructions, self.labels)
        return Kernel(self.name, self.params, dict(self.regs), tuple(self.variables.values()),
                      dict(self.labels), instructions, self.perf.get("maxntid"), self.perf.get("reqntid"),
                      self.perf.get("minnctapersm"), dict(self.named), self.returns, self.entry,
                      self.linkage, self.perf.get("maxnreg"), tuple(self.pragmas),
                      bool(self.perf.get("noreturn")))


def _pragmas(text: str, line: int) -> list[str]:
    m = _PRAGMA.fullmatch(text.strip())
    if m is None:
        raise ParseError(line, text, '.pragma takes one or more "strings"')
    return re.findall(r'"((?:[^"\\]|\\.)*)"', m[1])


def _call_operands(ops: tuple, line: int, text: str) -> tuple:
    """(returns, callee, arguments[, prototype]) with empty ParamLists where the call has none."""
    rest = list(ops)
    rets = rest.pop(0) if rest and isinstance(rest[0], ParamList) else ParamList(())
    if not rest or not isinstance(rest[0], (Sym, Reg)):
        raise ParseError(line, text, "call needs a callee: 'call [(ret),] func[, (args)][, prototype]'")
    callee = rest.pop(0)
    args = rest.pop(0) if rest and isinstance(rest[0], ParamList) else ParamList(())
    if len(rest) > 1 or (rest and not isinstance(rest[0], Sym)):
        raise ParseError(line, text, "call's operands must be '[(ret),] func[, (args)][, prototype]'")
    return (rets, callee, args, *rest)


def _check_branches(instructions: tuple, labels: dict) -> None:
    for ins in instructions:
        if ins.opcode == "bra":
            target = ins.operands[-1] if ins.operands else None
            if not (isinstance(target, Sym) and target.name in labels):
                name = getattr(target, "name", "(none)")
                raise ParseError(ins.ptx_line, ins.text, f"branch target {name} is not a label of this function")


class _ModuleParser:
    def __init__(self) -> None:
        self.head: dict[str, object] = {}
        self.variables: dict[str, Variable] = {}
        self.functions: list[_Function] = []
        self.files: dict[int, str] = {}
        self.strings: dict[str, str] = {}
        self.fn: _Function | None = None  # the function being read
        self.depth = 0  # open braces of its body

    def run(self, text: str) -> Module:
        for piece in scan(strip_comments(text)):
            self.piece(piece)
        if self.fn is not None:
            raise ParseError(self.fn.line, self.fn.name, "function body not closed by '}'")
        for key in ("version", "target", "address_size"):
            if key not in self.head:
                raise ParseError(1, text[:40], f"the module has no .{key} directive")
        return self.module(text)

    def module(self, text: str) -> Module:
        locs = LocTable(self.files, self.strings)
        names = set(self.variables) | {f.name for f in self.functions}
        kernels, funcs, defined = {}, {}, set()
        for fn in self.functions:  # a definition replaces its forward declaration
            table = kernels if fn.entry else funcs
            if fn.has_body and fn.name in defined:
                raise ParseError(fn.line, fn.name, f"function {fn.name} defined twice")
            if fn.has_body or fn.name not in table:
                table[fn.name] = fn.finish(locs, names)
            defined.update([fn.name] if fn.has_body else [])
        return Module(str(self.head["version"]), str(self.head["target"]), int(self.head["address_size"]),
                      tuple(self.variables.values()), kernels, dict(self.files), text, funcs)

    def piece(self, p: Piece) -> None:
        kind, text, line = p
        fn = self.fn
        if kind is Unit.LINE:
            return self.line_directive(text, line)
        if fn is not None and self.depth:
            return self.in_body(p)
        if fn is not None:  # between a header and its body
            if kind is Unit.OPEN:
                fn.has_body, self.depth = True, 1
                return
            if kind is Unit.STATEMENT and not text.strip():  # a declaration: no body
                self.fn = None
                return
            if kind is Unit.STATEMENT and text.strip().startswith(".pragma"):
                fn.pragmas.extend(_pragmas(text, line))
                return
            raise ParseError(line, text, f"expected the body of {fn.name} or ';'")
        if kind is Unit.HEADER:
            self.fn = _Function(text, line)
            self.functions.append(self.fn)
        elif kind is Unit.SECTION:
            self.section(text, line)
        elif kind is Unit.STATEMENT:
            for var in parse_variable(text.strip(), line):
                if var.name in self.variables:
                    raise ParseError(line, text, f"variable {var.name} declared twice")
                self.variables[var.name] = var
        else:
            raise ParseError(line, text, f"unexpected {kind.value!r} at module scope")

    def in_body(self, p: Piece) -> None:
        kind, text, line = p
        if kind is Unit.STATEMENT:
            self.fn.statement(text, line)
        elif kind is Unit.LABEL:
            self.fn.label(text, line)
        elif kind is Unit.OPEN:
            self.depth += 1
        elif kind is Unit.CLOSE:
            self.depth -= 1
            if not self.depth:
                self.fn = None
        else:
            raise ParseError(line, text, f"{kind.value} not allowed inside a function body")

    def line_directive(self, text: str, line: int) -> None:
        name = text.split(None, 1)[0][1:]
        if name == "loc":
            if self.fn is None or not self.depth:
                raise ParseError(line, text, ".loc outside a function body")
            self.fn.locs.directive(text.strip(), line)
        elif name == "file":
            fid, path = parse_file(text.strip(), line)
            self.files[fid] = path
        elif name in ("version", "target", "address_size"):
            if self.fn is not None or name in self.head:
                raise ParseError(line, text, f".{name} must appear once, at module scope")
            value = text.split(None, 1)[1].strip() if len(text.split(None, 1)) > 1 else ""
            if not value or (name != "target" and not re.fullmatch(r"\d+(\.\d+)?", value)):
                raise ParseError(line, text, f".{name} needs a value")
            self.head[name] = value
        elif self.fn is not None and not self.depth:
            self.fn.directive(text, line)
        else:
            raise ParseError(line, text, f".{name} is only allowed between a function header and its body")

    def section(self, text: str, line: int) -> None:
        m = _SECTION.fullmatch(text.strip())
        if m is None:
            raise ParseError(line, text, "a .section must be '.section name { ... }'")
        if m[1] == ".debug_str":
            self.strings.update(debug_strings(m[2], line))
        # other DWARF sections (.debug_info, .debug_abbrev, ... with -G) carry nothing the
        # simulator uses: skipped as a whole, by design
