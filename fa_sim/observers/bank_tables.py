"""Readable tables of BankReports (what `fa banks` prints).

The `confl` column is what Nsight Compute reports as bank conflicts (wavefronts - ideal of LDSM,
LDS, STS). LDGSTS (cp.async) shows `-` there: ncu counts no bank conflicts for it; its excess
wavefronts are printed on their own line, under that name.
"""

from __future__ import annotations

from ..events import ROUND_EPILOGUE
from .banks import CONFLICT_CLASSES, ROUND_NAMES, BankReport, Counts, SmemClass

HEAD = f"{'instr':>7} {'wavefr':>7} {'ideal':>6} {'confl':>6} {'wf/instr':>8}"


def _conflicts(c: Counts, cls: SmemClass | None) -> str:
    return "-" if cls is SmemClass.LDGSTS else str(c.conflicts)


def _cells(c: Counts, cls: SmemClass | None = None) -> str:
    per = f"{c.wavefronts / c.instructions:.2f}" if c.instructions else "-"
    return f"{c.instructions:>7} {c.wavefronts:>7} {c.ideal:>6} {_conflicts(c, cls):>6} {per:>8}"


def _class_label(cls: SmemClass) -> str:
    return f"{cls.value} (*)" if cls is SmemClass.LDGSTS else cls.value


FOOTNOTE = ("(*) LDGSTS (cp.async.cg): Nsight Compute counts no bank conflicts for it; its wavefronts follow how\n"
            "    32-byte source sectors land in 128-byte shared-memory lines (rule fitted on the H200,\n"
            "    banks.ldgsts_wavefronts), and their excess over one per phase is listed as excess wavefronts.")


def _excess(c: Counts) -> str:
    if not c.instructions:
        return "0"
    return (f"{c.conflicts} ({c.wavefronts / c.instructions:.2f} wavefronts per instruction, "
            f"ideal {c.ideal / c.instructions:.2f})")


def format_report(rep: BankReport, title: str = "", instructions: bool = True) -> str:
    """Per class, then per kernel phase and class, then (with `instructions`) per static instruction."""
    lines = [title] if title else []
    lines += [f"smem {rep.smem}", f"{'class':<12} {HEAD}"]
    by = rep.by_class()
    lines += [f"{_class_label(c):<12} {_cells(by[c], c)}" for c in SmemClass]
    lines.append(f"{'total':<12} {_cells(rep.total())}   (LDSM + LDS + STS)")
    lines.append(f"LDGSTS excess wavefronts (*): {_excess(by[SmemClass.LDGSTS])}")
    lines += ["", f"{'phase':<9} {'class':<7} {HEAD}"]
    grouped = rep.group("phase", "cls")
    for phase in rep.phases():
        for cls in SmemClass:
            if (phase, cls) in grouped:
                lines.append(f"{phase:<9} {cls.value:<7} {_cells(grouped[(phase, cls)], cls)}")
    lines += ["", f"{'round':<9} {'class':<7} {HEAD}"]
    for (rnd, cls), counts in sorted(rep.group("round", "cls").items(),
                                     key=lambda kv: (kv[0][0] == ROUND_EPILOGUE, kv[0][0], kv[0][1].value)):
        lines.append(f"{ROUND_NAMES.get(rnd, str(rnd)):<9} {cls.value:<7} {_cells(counts, cls)}")
    if not instructions:
        lines.append(FOOTNOTE)
        return "\n".join(lines)
    lines += ["", f"{'pc':>4} {'instruction':<34} {'class':<7} {HEAD}"]
    for (pc, cls, label), counts in sorted(rep.group("pc", "cls", "label").items(),
                                         key=lambda kv: kv[0][0]):
        lines.append(f"{pc:>4} {label[:34]:<34} {cls.value:<7} {_cells(counts, cls)}")
    lines.append(FOOTNOTE)
    return "\n".join(lines)


def format_compare(reports: dict[str, BankReport], title: str = "") -> str:
    """Layouts side by side: per class, instructions / wavefronts / ideal / conflicts."""
    names = list(reports)
    cell = f"{'instr':>6} {'wavefr':>7} {'ideal':>6} {'confl':>6}"
    lines = [title] if title else []
    lines.append(f"{'':<12} " + " | ".join(f"{n:^28}" for n in names))
    lines.append(f"{'class':<12} " + " | ".join(cell for _ in names))

    def row(label, get, cls=None):
        cs = [get(reports[n]) for n in names]
        return f"{label:<12} " + " | ".join(
            f"{c.instructions:>6} {c.wavefronts:>7} {c.ideal:>6} {_conflicts(c, cls):>6}" for c in cs)

    for cls in SmemClass:
        lines.append(row(_class_label(cls), lambda r, c=cls: r.by_class()[c], cls))
    lines.append(row("total", lambda r: r.total()))
    lines.append("")
    lines.append("conflicts per kernel phase (LDSM + LDS + STS):")
    phases = list(dict.fromkeys(p for n in names for p in reports[n].phases()))
    for phase in phases:
        vals = [sum((v for (p, c), v in reports[n].group("phase", "cls").items()
                     if p == phase and c in CONFLICT_CLASSES), Counts()) for n in names]
        if any(v.instructions for v in vals):
            lines.append(f"  {phase:<10} " + "  ".join(f"{n} {v.conflicts:>6}" for n, v in zip(names, vals)))
    lines.append("LDGSTS excess wavefronts (*):")
    lines += [f"  {n:<10} {_excess(reports[n].by_class()[SmemClass.LDGSTS])}" for n in names]
    lines.append(FOOTNOTE)
    return "\n".join(lines)
