"""docs/ptx_engine.md against the code: its instruction table is the PTX engine's dispatch table
(fa_sim.ptx.ops.TABLE by family module, fa_sim.ptx.engine.ENGINE_OPS by handler, and the control
opcodes the engine executes), every `<!-- output: COMMAND -->` excerpt appears verbatim in what
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
    """The control opcodes (engine.CONTROL) that Engine._control executes, found by running it on
    one instruction of each: the others raise Unsupported."""
    from fa_sim.ptx.engine import CONTROL, Engine, Group
    from fa_sim.ptx.ir import Sym
    from fa_sim.ptx.ops import Unsupported

    out = []
    for op in sorted(CONTROL):
        eng = SimpleNamespace(n=4, exited=np.zeros(4, bool), loop=None, kernel=SimpleNamespace(labels={"L": 0}))
        ins = SimpleNamespace(pc=1, opcode=op, guard=None, operands=(Sym("L"),))
        try:
            Engine._control(eng, ins, Group(None, 4))
        except Unsupported:
            continue
        out.append(op)
    return out


def dispatch_families() -> dict[str, list[str]]:
    """handler -> its opcodes, sorted: 'ops/integer.py' per register-only family module (an opcode
    routed by type, like add, is listed under each family that takes it), 'machine_ops.ld' per
    engine handler, 'engine._control' for branches and exits."""
    from fa_sim.ptx import engine, launch  # noqa: F401  (launch registers the machine_ops handlers)
    from fa_sim.ptx.ops import TABLE, load_families
    from fa_sim.ptx.ops.common import _COMPILERS, run

    load_families()
    out: dict[str, set] = defaultdict(set)
    for (op, _), compiler in _COMPILERS.items():
        out[f"ops/{compiler.__module__.rsplit('.', 1)[-1]}.py"].add(op)
    for op, handler in TABLE.items():
        if handler is not run:
            out[f"ops/{handler.__module__.rsplit('.', 1)[-1]}.py"].add(op)
    for op, handler in engine.ENGINE_OPS.items():
        out[f"{handler.__module__.rsplit('.', 1)[-1]}.{handler.__name__}"].add(op)
    out["engine._control"] = set(control_executed())
    return {k: sorted(v) for k, v in out.items()}


def test_the_instruction_table_is_the_dispatch_table():
    from fa_sim.ptx.engine import CONTROL, ENGINE_OPS
    from fa_sim.ptx.ops import TABLE

    families = dispatch_families()
    rows = read_tables(PTX_DOC)["ptx-dispatch"]
    seen: list[str] = []
    for row in rows:
        handlers = [h.strip() for h in row["handler"].split(",")]
        seen += handlers
        want = sorted({op for h in handlers for op in families.get(h, [f"<no handler {h}>"])})
        assert row["opcodes"].split(", ") == want, (row["family"], want)
    assert sorted(seen) == sorted(families), "every handler in exactly one row"
    listed = {op for row in rows for op in row["opcodes"].split(", ")}
    assert listed == set(TABLE) | set(ENGINE_OPS) | set(control_executed())
    refused = sorted(set(CONTROL) - set(control_executed()))
    assert refused == ["brx"] and "`brx`" in PTX_DOC.read_text()  # the doc names what it refuses


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
    for handler, ops in dispatch_families().items():
        print(f"{handler:<28} {', '.join(ops)}")
