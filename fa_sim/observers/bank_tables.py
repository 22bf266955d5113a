"""Readable tables of BankReports (what `fa banks` prints)."""

from __future__ import annotations

from ..events import ROUND_EPILOGUE
from .banks import CONFLICT_CLASSES, ROUND_NAMES, BankReport, Counts, SmemClass

HEAD = f"{'instr':>7} {'wavefr':>7} {'ideal':>6} {'confl':>6} {'wf/instr':>8}"


def _cells(c: Counts) -> str:
    per = f"{c.wavefronts / c.instructions:.2f}" if c.instructions else "-"
    return f"{c.instructions:>7} {c.wavefronts:>7} {c.ideal:>6} {c.conflicts:>6} {per:>8}"


def _class_label(cls: SmemClass) -> str:
    return f"{cls.value} (*)" if cls is SmemClass.LDGSTS else cls.value


FOOTNOTE = ("(*) LDGSTS (cp.async.cg): wavefronts by the rule Nsight Compute applies to them (fitted on "
            "the H200, banks.ldgsts_wavefronts); ncu does not call the excess bank conflicts.")


def format_report(rep: BankReport, title: str = "") -> str:
    """Per class, then per kernel phase and class, then per static instruction."""
    lines = [title] if title else []
    lines += [f"smem {rep.smem}", f"{'class':<12} {HEAD}"]
    by = rep.by_class()
    lines += [f"{_class_label(c):<12} {_cells(by[c])}" for c in SmemClass]
    lines.append(f"{'total':<12} {_cells(rep.total())}   (LDSM + LDS + STS)")
    lines += ["", f"{'phase':<9} {'class':<7} {HEAD}"]
    grouped = rep.group("phase", "cls")
    for phase in rep.phases():
        for cls in SmemClass:
            if (phase, cls) in grouped:
                lines.append(f"{phase:<9} {cls.value:<7} {_cells(grouped[(phase, cls)])}")
    lines += ["", f"{'round':<9} {'class':<7} {HEAD}"]
    for (rnd, cls), counts in sorted(rep.group("round", "cls").items(),
                                     key=lambda kv: (kv[0][0] == ROUND_EPILOGUE, kv[0][0], kv[0][1].value)):
        lines.append(f"{ROUND_NAMES.get(rnd, str(rnd)):<9} {cls.value:<7} {_cells(counts)}")
    lines += ["", f"{'pc':>4} {'instruction':<34} {'class':<7} {HEAD}"]
    for (pc, cls, label), counts in sorted(rep.group("pc", "cls", "label").items(),
                                         key=lambda kv: kv[0][0]):
        lines.append(f"{pc:>4} {label[:34]:<34} {cls.value:<7} {_cells(counts)}")
    lines.append(FOOTNOTE)
    return "\n".join(lines)


def format_compare(reports: dict[str, BankReport], title: str = "") -> str:
    """Layouts side by side: per class, instructions / wavefronts / ideal / conflicts."""
    names = list(reports)
    cell = f"{'instr':>6} {'wavefr':>7} {'ideal':>6} {'confl':>6}"
    lines = [title] if title else []
    lines.append(f"{'':<12} " + " | ".join(f"{n:^28}" for n in names))
    lines.append(f"{'class':<12} " + " | ".join(cell for _ in names))

    def row(label, get):
        cs = [get(reports[n]) for n in names]
        return f"{label:<12} " + " | ".join(
            f"{c.instructions:>6} {c.wavefronts:>7} {c.ideal:>6} {c.conflicts:>6}" for c in cs)

    for cls in SmemClass:
        lines.append(row(_class_label(cls), lambda r, c=cls: r.by_class()[c]))
    lines.append(row("total", lambda r: r.total()))
    lines.append("")
    lines.append("conflicts per kernel phase (LDSM + LDS + STS):")
    phases = list(dict.fromkeys(p for n in names for p in reports[n].phases()))
    for phase in phases:
        vals = [sum((v for (p, c), v in reports[n].group("phase", "cls").items()
                     if p == phase and c in CONFLICT_CLASSES), Counts()) for n in names]
        if any(v.instructions for v in vals):
            lines.append(f"  {phase:<10} " + "  ".join(f"{n} {v.conflicts:>6}" for n, v in zip(names, vals)))
    lines.append(FOOTNOTE)
    return "\n".join(lines)
