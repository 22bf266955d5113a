"""The import structure of fa_sim and fa_hw, read from the source (ast): the kernel contract sits
below both backends, fa_sim reaches the GPU backend only in the commands that ask for the GPU,
fa_hw never imports the CLI, no import runs up the layers, the modules import each other
without cycles (counting every import: lazy ones and those for annotations only), and the PTX
engine's passes sit between the wave's state and the run loop."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("fa_sim", "fa_hw")
#: The only modules of fa_sim that import fa_hw: the commands the user runs to use the GPU, and
#: `fa time`, whose --config auto reads the GPU's measured tables (fa_hw.tuned, fa_hw.tuned_backward).
GPU_COMMANDS = {"fa_sim.commands.hw", "fa_sim.commands.compare", "fa_sim.commands.time",
                "fa_sim.commands.backward_gpu"}
#: What the kernel contract may import from fa_sim: the layers below it.
BELOW_CONTRACT = ("fa_sim.contract", "fa_sim.config", "fa_sim.cute", "fa_sim.isa", "fa_sim.checkpoints",
                  "fa_sim.cache", "fa_sim.messages")
#: The layers, bottom to top: a module imports its own layer and those below, never one above
#: (a module belongs to the layer of its longest matching prefix; a new module needs a layer here).
LAYERS = (
    ("hardware", ("fa_sim.isa", "fa_sim.tensorcore", "fa_sim.events", "fa_sim.errors", "fa_sim.messages", "fa_sim.cache", "fa_sim.cute",
                  "fa_sim.heap")),
    ("config", ("fa_sim.config", "fa_sim.layout", "fa_sim.checkpoints", "fa_sim.problem")),
    ("machine", ("fa_sim.machine", "fa_sim.memory", "fa_sim.hub", "fa_sim.smem_lanes", "fa_sim.gemm")),
    ("contract", ("fa_sim.contract",)),
    ("front ends", ("fa_sim.kernels", "fa_sim.ptx")),
    ("run", ("fa_sim.run",)),
    ("simulation", ("fa_sim", "fa_sim.simulate", "fa_sim.parallel", "fa_sim.observers", "fa_sim.crosscheck",
                    "fa_sim.reference", "fa_sim.accuracy", "fa_sim.estimate", "fa_sim.validate", "fa_sim.sweep",
                    "fa_sim.spec_maps", "fa_sim.layout_checks", "fa_sim.saved_run", "fa_sim.timing")),
    ("calibration", ("fa_sim.calibrate",)),
    ("GPU", ("fa_hw",)),
    ("CLI", ("fa_sim.commands", "fa_sim.cli")),
)


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of fa_sim/fa_hw in `module`;
    `from X import name` counts as X.name when that is a module, else X. Imports under
    `if TYPE_CHECKING:` (annotations only) are not imports of the running program."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []

    def resolve(name: str) -> str:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        return name

    def walk(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue  # names for annotations only: never imported when the program runs
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            else:
                walk(child, inside)
                continue
            out.extend((resolve(n), child.lineno, inside) for n in names if resolve(n) not in ("", module))

    walk(ast.parse(path.read_text()), False)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _every_import(module: str, source: str | None = None) -> set[str]:
    """Every module of fa_sim/fa_hw that `module` (or `source` as that module) imports anywhere - at
    the top, inside a function, under `if TYPE_CHECKING:` (a module typed against another depends
    on it: a lazy or annotation-only import hides a circle, it does not undo it). `from X import
    name` counts X and X.name. A package's __init__ is its face: importing it is no edge (its own
    imports count)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in MODULES and m != module and MODULES[m].name != "__init__.py"}


#: module -> the modules it imports, counting every import (`_every_import`): what the circles count.
HOUSE = {m: _every_import(m) for m in MODULES}


def test_fa_sim_imports_fa_hw_only_in_the_gpu_commands():
    found = {f"{m}:{line}" for m, imports in GRAPH.items() if m.startswith("fa_sim") and m not in GPU_COMMANDS
             for target, line, _ in imports if target.startswith("fa_hw")}
    assert not found
    assert all(inside for m in GPU_COMMANDS for target, _, inside in GRAPH[m] if target.startswith("fa_hw")), \
        "the GPU commands import fa_hw when they run, not when the CLI starts"


def test_fa_hw_never_imports_the_cli():
    found = {f"{m}:{line} {target}" for m, imports in GRAPH.items() if m.startswith("fa_hw")
             for target, line, _ in imports if target.startswith(("fa_sim.cli", "fa_sim.commands"))}
    assert not found


def test_the_contract_sits_below_both_front_ends():
    found = {f"{m}:{line} {target}" for m, imports in GRAPH.items() if m.startswith("fa_sim.contract")
             for target, line, _ in imports if not target.startswith(BELOW_CONTRACT)}
    assert not found


def _layer(module: str) -> int | None:
    found = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1] if found else None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) is None] == []


def test_no_import_runs_up_the_layers():
    up = [f"{m}:{line} imports {target} ({LAYERS[_layer(m)][0]} -> {LAYERS[_layer(target)][0]})"
          for m, imports in GRAPH.items() if _layer(m) is not None
          for target, line, _ in imports if _layer(target) is not None and _layer(target) > _layer(m)]
    assert up == []


def _cycles(graph: dict | None = None) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan), over every import (HOUSE;
    or `graph`, module -> its imported modules)."""
    graph = HOUSE if graph is None else graph
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                out.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(MODULES)))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_import_cycles():
    """0 circles in fa_sim and fa_hw, counting every import (lazy and annotation-only ones too)."""
    assert [sorted(c) for c in _cycles()] == []


def test_every_import_counts_lazy_and_annotation_only_ones():
    source = """from typing import TYPE_CHECKING
from .ir import Instruction
from . import regs
if TYPE_CHECKING:
    from .engine import Engine
def f():
    from .blocks import Loop
"""
    assert _every_import("fa_sim.ptx.waves", source) == {"fa_sim.ptx.ir", "fa_sim.ptx.regs", "fa_sim.ptx.engine",
                                                          "fa_sim.ptx.blocks"}  # not the face fa_sim.ptx
    graph = {"a.engine": {"a.pass"}, "a.pass": {"a.engine", "a.blocks"}, "a.blocks": set(), "a.top": {"a.engine"}}
    assert _cycles(graph) == [{"a.engine", "a.pass"}]
    assert _cycles({**graph, "a.pass": {"a.blocks"}}) == []
    # every import of the running program (GRAPH) but those of a package's face is one of HOUSE's
    missing = {f"{m} -> {t}" for m in GRAPH for t, _, _ in GRAPH[m]
               if MODULES[t].name != "__init__.py" and t not in HOUSE[m]}
    assert missing == set()


#: fa_sim.ptx's engine, bottom to top: a wave's state; the passes that take it (the opcode table and
#: its handlers, one instruction's dispatch, the compiled stretches, the splits and joins); the run
#: loop. A module of a floor imports its own floor and those below, never one above.
PTX_FLOORS = (
    ("state", ("fa_sim.ptx.state",)),
    ("passes", tuple(f"fa_sim.ptx.{m}" for m in (
        "shared_lanes", "machine_ops", "optable", "dispatch", "live", "invariant", "chain_regs", "chain_operands",
        "chains", "copies", "fused", "blocks", "waves"))),
    ("run loop", ("fa_sim.ptx.engine",)),
)


def test_the_ptx_passes_sit_between_the_wave_state_and_the_run_loop():
    floor = {m: i for i, (_, modules) in enumerate(PTX_FLOORS) for m in modules}
    assert set(floor) <= set(MODULES), "a module of PTX_FLOORS is gone"
    up = [f"{m} imports {t} ({PTX_FLOORS[floor[m]][0]} -> {PTX_FLOORS[floor[t]][0]})"
          for m in floor for t in sorted(HOUSE[m]) if floor.get(t, -1) > floor[m]]
    assert up == []
    # below the state: what it imports imports no floor (the state's own types come first)
    below = set()
    todo = [t for t in HOUSE["fa_sim.ptx.state"]]
    while todo:
        t = todo.pop()
        if t not in below:
            below.add(t)
            todo += HOUSE[t]
    assert not below & set(floor)
    # the run loop's only user in fa_sim.ptx is the launch; no pass imports the engine
    assert {m for m in MODULES if "fa_sim.ptx.engine" in HOUSE[m]} == {"fa_sim.ptx.launch"}
    assert all("fa_sim.ptx.state" in HOUSE[m] for m in PTX_FLOORS[1][1] if m not in (
        "fa_sim.ptx.optable", "fa_sim.ptx.live", "fa_sim.ptx.chain_regs")), "a pass that takes the wave types it"


def test_the_cli_starts_without_the_gpu_backend():
    code = ("import sys; import fa_sim.cli as cli; cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fa_hw', 'cuda')))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def summary() -> str:
    """The house in numbers: modules per layer, internal imports (and how many inside functions),
    circles, imports against the layers. `python tests/test_imports.py` prints it."""
    per = [0] * len(LAYERS)
    for m in MODULES:
        per[_layer(m)] += 1
    imports = [i for m in GRAPH for i in GRAPH[m]]
    up = sum(1 for m in GRAPH for t, _, _ in GRAPH[m] if _layer(t) > _layer(m))
    lines = [f"{len(MODULES)} modules, {len(imports)} internal imports "
             f"({sum(inside for _, _, inside in imports)} inside functions)"]
    lines += [f"  {name:<12} {per[i]:>3} modules" for i, (name, _) in reversed(list(enumerate(LAYERS)))]
    lines.append(f"circles (every import, lazy and annotation-only ones too): {len(_cycles())}"
                 + "".join(f"\n  {' <-> '.join(sorted(c))}" for c in _cycles()))
    lines.append(f"imports against the layers: {up}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
