"""docs/ptx_engine.md against the code: its instruction table is the PTX engine's opcode table
(fa_sim.ptx.optable.OPCODES by family: handlers, SASS classes, opcodes; of the control opcodes
those the engine executes), every `<!-- output: COMMAND -->` excerpt appears verbatim in what
that command prints today, and its links resolve.

    python tests/test_docs_ptx.py     # prints the table's rows from the code (to update the doc)
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from test_docs import DOCS, ROOT, assert_prints, check_links, read_outputs, read_tables

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

PTX_DOC = DOCS / "ptx_engine.md"


# == the dispatch table ===============================================================================
def control_executed() -> list[str]:
    """The control opcodes (the table's CONTROL family) that Engine._control executes, found by
    running it on one instruction of each: the others raise Unsupported."""
    from fa_sim.ptx.engine import Engine, Group
    from fa_sim.ptx.ir import Sym
    from fa_sim.ptx.ops import Unsupported
    from fa_sim.ptx.optable import CONTROL

    out = []
    for op in sorted(CONTROL):
        eng = SimpleNamespace(n=4, exited=np.zeros(4, bool), loop=None, kernel=SimpleNamespace(labels={"L": 0}),
                              branch_listeners=())
        ins = SimpleNamespace(pc=1, opcode=op, guard=None, operands=(Sym("L"),))
        try:
            Engine._control(eng, ins, Group(None, 4))
        except Unsupported:
            continue
        out.append(op)
    return out


def dispatch_families() -> dict[str, dict[str, list[str]]]:
    """family title -> its handlers, SASS classes and opcodes, read from the opcode table
    (fa_sim.ptx.optable.OPCODES): 'ops/integer.py' for the compilers of a register-only family
    (an opcode routed by type, like add, is listed under each family that takes it),
    'machine_ops.ld' per machine handler, 'engine._control' for the branches and exits it executes."""
    from fa_sim.ptx.optable import OPCODES, Unit

    executed = set(control_executed())
    out: dict = defaultdict(lambda: defaultdict(set))
    for row in OPCODES.values():
        for impl in row.impls:
            if impl.family.unit is Unit.CONTROL and row.name not in executed:
                continue
            handler = {Unit.LANES: lambda h: f"ops/{h.__module__.rsplit('.', 1)[-1]}.py",
                       Unit.MACHINE: lambda h: f"machine_ops.{h.__name__}",
                       Unit.CONTROL: lambda h: "engine._control"}[impl.family.unit](impl.handler)
            fam = out[impl.family.title]
            fam["handler"].add(handler)
            fam["sass"] |= {c.value for c in row.classes}
            fam["opcodes"].add(row.name)
    return {title: {k: sorted(v) for k, v in cols.items()} for title, cols in out.items()}


def test_the_instruction_table_is_the_dispatch_table():
    from fa_sim.ptx.optable import CONTROL, OPCODES, Family

    families = dispatch_families()
    assert set(families) == {f.title for f in Family}
    rows = read_tables(PTX_DOC)["ptx-dispatch"]
    assert sorted(row["family"] for row in rows) == sorted(families), "every family in exactly one row"
    for row in rows:
        want = families[row["family"]]
        assert sorted(h.strip() for h in row["handler"].split(",")) == want["handler"], row["family"]
        assert row["SASS class"].split(", ") == want["sass"], row["family"]
        assert row["opcodes"].split(", ") == want["opcodes"], row["family"]
    listed = {op for row in rows for op in row["opcodes"].split(", ")}
    refused = sorted(set(CONTROL) - set(control_executed()))
    assert listed == set(OPCODES) - set(refused)
    assert refused == ["brx"] and "`brx`" in PTX_DOC.read_text()  # the doc names what it refuses


def test_the_engine_dispatches_through_the_table(monkeypatch):
    """An opcode the table does not have is Unsupported with its PTX and source line, and the
    engine runs the handler the table names (a row replaced in the table is what runs)."""
    from fa_sim.ptx import launch, optable  # launch: the function
    from fa_sim.ptx.ops import Unsupported

    ptx = PTX_KERNEL.replace("OP", "nanosleep.u32 %r1;")
    with pytest.raises(Unsupported, match=r"opcode nanosleep in `nanosleep.u32 %r1;` at PTX line \d+"):
        launch(ptx, 1, 32)
    ran = []
    row = optable.OPCODES["membar"]
    swapped = dict(optable.OPCODES, membar=optable.OpDef("membar", (optable.Impl(
        optable.Family.SYNC, lambda eng, group, ins: ran.append((ins.opcode, group.n))),), row.sass))
    monkeypatch.setattr(optable, "OPCODES", swapped)
    launch(PTX_KERNEL.replace("OP", "membar.cta;"), 1, 32)
    assert ran == [("membar", 32)]


PTX_KERNEL = """
.version 7.8
.target sm_80
.address_size 64

.visible .entry k()
{
    .reg .b32 %r<2>;
    mov.u32 %r1, 1;
    OP
    ret;
}
"""


def test_every_marked_table_is_checked():
    assert set(read_tables(PTX_DOC)) == {"ptx-dispatch"}


# == command output ===================================================================================
@pytest.mark.parametrize("command, lines", read_outputs(PTX_DOC), ids=lambda x: x if isinstance(x, str) else "")
def test_output_excerpts_are_real_output(command, lines, tmp_path, capsys, monkeypatch):
    assert_prints(command, lines, PTX_DOC.name, tmp_path, capsys, monkeypatch)


# == links and measured claims ==========================================================================
def test_links_resolve():
    check_links(PTX_DOC)
    assert "ptx_engine.md" in (DOCS / "README.md").read_text()


def test_the_agreement_suite_is_what_the_doc_says():
    """The doc's description of tests/test_ptx_kernel.py: 78 configs, the four (Nq, Nk) shapes."""
    import fa_sim

    spec = importlib.util.spec_from_file_location("ptx_kernel_tests", ROOT / "tests" / "test_ptx_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = " ".join(PTX_DOC.read_text().split())
    assert f"all {len(fa_sim.KernelConfig.family())} configurations" in text
    shapes = ", ".join(f"({a}, {b})" for a, b in module.SHAPES)
    assert f"(Nq, Nk) in {shapes}" in text


if __name__ == "__main__":  # fa_sim comes from the installed checkout (pip install -e), as test_docs imports it
    from fa_sim.ptx.optable import Family

    families = dispatch_families()
    for title, cols in ((f.title, families[f.title]) for f in Family):
        handlers = ", ".join(f"`{h}`" for h in cols["handler"])
        print(f"| {title} | {handlers} | {', '.join(cols['sass'])} | {', '.join(cols['opcodes'])} |")
