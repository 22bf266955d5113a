"""Figures of the observers (matplotlib, PNG/SVG): bank conflicts per class and layout, the
bank x wavefront picture of one instruction, the swizzle map, and CuTe print_latex-style
ownership grids (which thread holds which element).

Bank rules: docs/hardware_facts.md (see banks.py). Ownership maps: lanemaps.py.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..config import KernelConfig  # noqa: E402
from ..events import Op  # noqa: E402
from .banks import CONFLICT_CLASSES, N_BANKS, BankReport, phase_words, word_wavefront  # noqa: E402

# CuTe's print_latex palette (8 colours, by thread mod 8), lightened for text on top.
PALETTE = np.array([[175, 175, 255], [175, 255, 175], [255, 255, 175], [255, 175, 175],
                    [210, 210, 255], [210, 255, 210], [255, 255, 210], [255, 210, 210]]) / 255.0


def save(fig, path: str | Path, formats=("png",), dpi: int = 100) -> list[Path]:
    """Save `fig` as path.<fmt> for each format; returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        p = path.with_suffix("." + fmt)
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        out.append(p)
    plt.close(fig)
    return out


def conflicts_by_class(reports: dict[str, BankReport]):
    """Grouped bars: conflicts (wavefronts - ideal) per class, one bar per smem layout."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    classes = [c.value for c in CONFLICT_CLASSES]
    width = 0.8 / max(len(reports), 1)
    for i, (name, rep) in enumerate(reports.items()):
        by = rep.by_class()
        vals = [by[c].conflicts for c in CONFLICT_CLASSES]
        bars = ax.bar(np.arange(len(classes)) + i * width, vals, width, label=name)
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks(np.arange(len(classes)) + width * (len(reports) - 1) / 2, classes)
    ax.set_ylabel("bank conflicts (wavefronts - ideal)")
    ax.set_title("Shared-memory bank conflicts per instruction class (ncu rules)", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def bank_picture(ax_row, addr: np.ndarray, mask: np.ndarray, op: Op, width: int, title: str) -> int:
    """Draw one warp instruction: per phase, banks (x) by wavefront (y), each cell the lanes that
    read that 4-byte word. addr, mask: [32]. Returns the instruction's wavefronts."""
    words = phase_words(np.asarray(addr, np.int64), np.asarray(mask, bool), op, width)  # [phases, n]
    wave = word_wavefront(words)
    k = max(width // 4, 1)
    lanes = np.repeat(np.arange(32).reshape(words.shape[0], -1), k, axis=1)
    depth = int(wave.max()) + 1
    total = 0
    for p, ax in enumerate(ax_row):
        grid = np.full((depth, N_BANKS), np.nan)
        cells: dict = {}
        for wd, wf, ln in zip(words[p], wave[p], lanes[p]):
            if wd >= 0:
                grid[wf, wd % N_BANKS] = ln % 8
                cells.setdefault((int(wf), int(wd % N_BANKS)), set()).add(int(ln))
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=10, aspect="auto", origin="upper")
        labels: dict = {}  # one label per (wavefront, lanes) over the banks they cover
        for (wf, b), ls in cells.items():
            labels.setdefault((wf, tuple(sorted(ls))), []).append(b)
        for (wf, ls), banks in labels.items():
            ax.text(np.mean(banks), wf, "L" + ",".join(map(str, ls)), ha="center", va="center", fontsize=6)
        n = int(wave[p].max()) + 1
        total += n
        ax.set_title(f"{title}: phase {p}, {n} wavefront{'s' * (n > 1)}", fontsize=7)
        ax.set_xticks(range(0, N_BANKS, 4))
        ax.set_yticks(range(depth))
        ax.tick_params(labelsize=6)
        ax.set_xlabel("bank", fontsize=6)
    ax_row[0].set_ylabel("wavefront", fontsize=6)
    return total


def bank_pictures(cases: list[tuple[str, np.ndarray, np.ndarray, Op, int]]):
    """One row of phase panels per (title, addr[32], mask[32], op, width) case."""
    n_ph = max(len(phase_words(np.zeros(32, np.int64), np.ones(32, bool), op, w)) for _, _, _, op, w in cases)
    depth = [int(word_wavefront(phase_words(np.asarray(a, np.int64), m, op, w)).max()) + 1 for _, a, m, op, w in cases]
    fig, axes = plt.subplots(len(cases), n_ph, figsize=(3.2 * n_ph, 0.5 + sum(0.32 * d + 0.6 for d in depth)),
                             squeeze=False, gridspec_kw={"height_ratios": [d + 1.5 for d in depth]})
    for row, (title, a, m, op, w) in zip(axes, cases):
        bank_picture(row, a, m, op, w, title)
    fig.tight_layout()
    return fig


def swizzle_maps(configs: list[KernelConfig], rows: int = 16):
    """Per layout: for each (row, 16-byte chunk) of a tile, the group of 4 banks it lands in.
    Swizzle<3,3,3> makes every 8 rows a Latin square (spec table 11); plain stacks a column."""
    fig, axes = plt.subplots(1, len(configs), figsize=(2.6 * len(configs), 0.25 * rows + 1.2), squeeze=False)
    for ax, cfg in zip(axes[0], configs):
        r = np.arange(rows)[:, None]
        chunk = np.arange(cfg.head_dim // 8)[None, :]
        byte = 2 * cfg.smem_offset(r, 8 * chunk)
        group = (byte // 16) % 8
        ax.imshow(group, cmap="tab10", vmin=0, vmax=10, aspect="auto")
        for (i, j), g in np.ndenumerate(group):
            ax.text(j, i, str(g), ha="center", va="center", fontsize=6)
        ax.set_title(f"{cfg.smem.value}: bank group\n(banks 4g..4g+3)", fontsize=8)
        ax.set_xlabel("logical 16-byte chunk (cols 8c..8c+7)", fontsize=7)
        ax.set_ylabel("tile row", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.tight_layout()
    return fig


def ownership(owner: np.ndarray, value: np.ndarray, title: str, value_name: str = "V",
              row0: int = 0, col0: int = 0, cell: float = 0.42, color_by: np.ndarray | None = None):
    """CuTe print_latex-style grid: each cell 'T<thread>' over '<value_name><slot>', coloured by
    thread mod 8 (or by `color_by`). owner/value: [rows, cols] ints (-1 = nobody)."""
    rows, cols = owner.shape
    fig, ax = plt.subplots(figsize=(cell * cols + 0.8, cell * rows + 0.8))
    key = owner if color_by is None else color_by
    rgb = PALETTE[np.where(key >= 0, key, 0) % 8]
    rgb[owner < 0] = 1.0
    ax.imshow(rgb, aspect="equal")
    fs = max(3.5, min(7.0, 16 * cell))
    for (i, j), t in np.ndenumerate(owner):
        if t >= 0:
            label = f"T{t}" if value is None else f"T{t}\n{value_name}{value[i, j]}"
            ax.text(j, i, label, ha="center", va="center", fontsize=fs, linespacing=0.9)
    ax.set_xticks(range(cols), [str(col0 + c) for c in range(cols)], fontsize=5)
    ax.set_yticks(range(rows), [str(row0 + r) for r in range(rows)], fontsize=5)
    ax.set_xticks(np.arange(-0.5, cols), minor=True)
    ax.set_yticks(np.arange(-0.5, rows), minor=True)
    ax.grid(which="minor", color="k", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.set_title(title, fontsize=8)
    return fig
