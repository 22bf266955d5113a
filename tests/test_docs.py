"""docs/ against the code. Every table marked `<!-- table: NAME -->` in docs/kernel.md and
docs/hardware_facts.md is recomputed from fa_sim / fa_hw and compared cell by cell (hardware_facts.md here,
kernel.md in test_docs_kernel.py), every `<!-- output: COMMAND -->` excerpt must appear verbatim in
that command's output, and every internal link must resolve. A table added to the docs without a
check fails `test_every_marked_table_is_checked`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fa_sim.config import KernelConfig
from fa_sim.events import Op
from fa_sim.isa.ldmatrix import ldmatrix_index, source_lane_and_col
from fa_sim.isa.mma import a_coords, b_coords, c_coords

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
KERNEL, FACTS = DOCS / "kernel.md", DOCS / "hardware_facts.md"
SEED = KernelConfig()
TAG = re.compile(r"m(\d+)n(\d+)d(\d+)w(\d+)(?:-(\w+))?$")


# == reading the Markdown =============================================================================
def _cells(line: str) -> list[str]:
    return [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]


def read_tables(path: Path) -> dict[str, list[dict[str, str]]]:
    """{name: rows as {header: cell}} for every table preceded by `<!-- table: name -->`."""
    lines, out = path.read_text().splitlines(), {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- table: ([\w-]+) -->", line.strip())
        if not m:
            continue
        header, body = _cells(lines[i + 1]), []
        for row in lines[i + 3:]:
            if not row.startswith("|"):
                break
            body.append(dict(zip(header, _cells(row), strict=True)))
        out[m.group(1)] = body
    return out


def read_outputs(path: Path) -> list[tuple[str, list[str]]]:
    """(command, lines) of every fenced block preceded by `<!-- output: command -->`."""
    lines, out = path.read_text().splitlines(), []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- output: (.+) -->", line.strip())
        if m:
            assert lines[i + 1].startswith("```"), f"output marker at line {i + 1} is not before a code block"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            out.append((m.group(1), lines[i + 2:end]))
    return out


def ints(cell: str) -> list[int]:
    """'0, 1, 8' / '0..15' / '0..15, 64..79' / 'none' -> the integers, in order."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in cell.split(","))):
        if part == "none":
            continue
        lo, _, hi = part.partition("..")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def pairs(cell: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"\((-?\d+),\s*(-?\d+)\)", cell)]


def dims(cell: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", cell))


def config_of(tag: str) -> KernelConfig:
    m, n, d, w, smem = TAG.fullmatch(tag).groups()
    return KernelConfig(block_m=int(m), block_n=int(n), head_dim=int(d), n_warps=int(w), smem=smem or "swizzled")


KT, FT = read_tables(KERNEL), read_tables(FACTS)


def test_every_marked_table_is_checked():
    checked_kernel = {
        "example-inputs", "warps", "warps-m128", "lanes", "tiledmma-levels", "tiledmma-family", "causal-rounds",
        "diag-lanes", "quads", "lane-keys", "quad-max", "softmax-steps", "quad-sum", "pv-lane0",
        "swizzle-offsets", "ldsm-banks", "swizzle-family", "smem-budget", "copy-threads",
        "copy-family", "fragments", "ldsm-lanes", "per-round-counts"}
    checked_facts = {"mma-lane5", "ldmatrix-addresses", "ldmatrix-lane5", "bank-phases", "ncu-metrics",
                     "ldgsts-probe"}
    assert set(KT) == checked_kernel and set(FT) == checked_facts
    assert all(KT.values()) and all(FT.values())


# == command output excerpts ============================================================================
# Files the docs' commands make before using them: path -> its text from fa2_fwd.cu.
MADE_BY_THE_READER = {"/tmp/no_bar.cu": lambda cu: "#define FA_DROP_BAR_QK 1\n" + cu}
WALL_TIME = re.compile(r"(wall time\s+)\d+\.\d+ s$")


def _normal(lines: list[str]) -> list[str]:
    """Trailing blanks dropped, wall-clock times masked: what an excerpt must match."""
    return [WALL_TIME.sub(r"\1<t> s", line.rstrip()) for line in lines]


def assert_prints(command: str, lines: list[str], doc: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Run `command` as the doc shows it (`fa ...`, or `python SCRIPT.py` calling its main()) from the
    repository root and require `lines` among its output, contiguous; files the doc has the reader
    make first (MADE_BY_THE_READER) are made in tmp_path."""
    import importlib.util
    import shlex

    from fa_sim.cli import main
    from fa_sim.contract import SEED_PATH

    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)
    for i, arg in enumerate(argv):
        if arg in MADE_BY_THE_READER:
            made = tmp_path / arg.rsplit("/", 1)[-1]
            made.write_text(MADE_BY_THE_READER[arg](SEED_PATH.read_text()))
            argv[i] = str(made)
    if argv[0] == "fa":
        main(argv[1:])
    else:
        assert argv[0] == "python" and len(argv) == 2, command
        spec = importlib.util.spec_from_file_location("doc_example", ROOT / argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main()
    out, want = _normal(capsys.readouterr().out.splitlines()), _normal(lines)
    n = len(want)
    assert any(out[i:i + n] == want for i in range(len(out) - n + 1)), (
        f"`{command}` no longer prints the excerpt of {doc}; it prints:\n" + "\n".join(out))


# == links ============================================================================================
def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


NAMED_FILE = re.compile(r"`((?:fa_sim|fa_hw|experiments|tests|docs|traces)/[\w/.-]+\.(?:py|cu|md|json|npz|txt|sh))`")


def check_links(path: Path) -> int:
    """Every relative link of the Markdown file `path` and every repository file it names in
    backticks exists, and every #anchor is a heading of it; returns how many files it names."""
    text = path.read_text()
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith("http"):
            continue
        file, _, anchor = target.partition("#")
        if file:
            assert (path.parent / file).exists(), f"{path.name}: link to missing {file}"
        elif anchor:
            assert anchor in anchors, f"{path.name}: no heading for #{anchor}"
    named = NAMED_FILE.findall(text)
    for ref in named:
        assert (ROOT / ref).exists(), f"{path.name}: {ref} does not exist"
    return len(named)


@pytest.mark.parametrize("path", [KERNEL, FACTS, DOCS / "README.md"], ids=lambda p: p.name)
def test_links_resolve(path):
    check_links(path)


# == hardware_facts.md ==================================================================================
def test_mma_fragment_of_lane_5():
    coords = {"A": a_coords(), "B": b_coords(), "C": c_coords()}
    for row in FT["mma-lane5"]:
        i = int(row["element"][1:])
        r, c = coords[row["operand"]]
        assert pairs(row["(row, col)"]) == [(int(r[5, i]), int(c[5, i]))]


def test_ldmatrix_address_lanes_and_delivery():
    rng = np.random.default_rng(0)
    for row in FT["ldmatrix-addresses"]:
        num = int(row["matrices"])
        assert row[".num"] == f".x{num}" and int(row["registers per lane"]) == num
        used = ints(row["lanes that give row addresses"])
        addr = 16 * rng.permutation(1024)[:32]
        base = ldmatrix_index(addr, num, False).halves
        assert base.shape[-2] == num
        for lane in range(32):
            moved = addr.copy()
            moved[lane] += 16 * 2048
            assert np.array_equal(ldmatrix_index(moved, num, False).halves, base) == (lane not in used)
    for row in FT["ldmatrix-lane5"]:
        src_row, col = source_lane_and_col(row["form"] == "with .trans")
        got = [(int(src_row[5, j]), int(col[5, j])) for j in (0, 1)]
        assert got == pairs(row["low half: (row, col)"]) + pairs(row["high half: (row, col)"])


def test_bank_phases():
    from fa_sim.observers.banks import lanes_per_phase

    widths = {"4 bytes": (Op.STS, 4), "8 bytes": (Op.LDS, 8), "16 bytes": (Op.LDS, 16), "ldmatrix": (Op.LDSM, 16)}
    for row in FT["bank-phases"]:
        op, width = next(v for k, v in widths.items() if row["access"].startswith(k))
        lpp = lanes_per_phase(op, width)
        assert int(row["lanes per phase"].split()[0]) == lpp
        phases = row["phases per warp instruction"]
        assert phases == ("N" if op is Op.LDSM else str(32 // lpp))


def test_ncu_metrics_are_the_ones_profiled():
    from fa_hw.profile import METRICS
    from fa_sim.observers.banks import SmemClass

    for row in FT["ncu-metrics"]:
        spec = METRICS[SmemClass(row["class"])]
        for col in ("instructions", "wavefronts", "conflicts"):
            want = spec[col]
            assert row[col] == (" − ".join(want) if isinstance(want, tuple) else want), (row["class"], col)


def test_ldgsts_probe_table():
    from fa_sim.observers.banks import ldgsts_wavefronts

    data = json.loads((ROOT / "tests" / "data" / "h200" / "ldgsts_probe.json").read_text())
    metric = "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum"
    conflicts = "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts_cache_bypass.sum"
    assert all(v[conflicts] == 0 for v in data["ncu"].values())  # ncu never calls them conflicts
    src = 16 * np.arange(32)
    for row in FT["ldgsts-probe"]:
        name = row["pattern (lane l's destination offset)"]
        o = np.asarray(data["patterns"][name])
        rule = int(ldgsts_wavefronts(np.where(o >= 0, o, 0)[None], src[None], (o >= 0)[None]).sum())
        assert (int(row["ncu wavefronts (H200)"]), int(row["rule"])) == (int(data["ncu"][name][metric]), rule), name


def test_padded_seed_costs_10_5_ldgsts_wavefronts_per_instruction():
    from fa_sim import simulate
    from fa_sim.observers.banks import BankCounter, SmemClass
    from fa_sim.reference import random_inputs

    counter = BankCounter()
    simulate(*random_inputs(1, 1, 128, 128, 64, 0), config=KernelConfig(smem="padded"), observers=[counter])
    ldgsts = counter.report().by_class()[SmemClass.LDGSTS]
    assert ldgsts.wavefronts / ldgsts.instructions == 10.5
    assert "10.5 wavefronts per instruction instead of 4" in " ".join(FACTS.read_text().split())
