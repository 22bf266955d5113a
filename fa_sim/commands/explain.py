"""`fa explain`: the spec's two-round worked example, round by round, in exact fractions.

Inputs Q, K, V of figures 1-3 with s = ln 2 (so exp(s x) = 2**x) and B_r = B_c = 2: scores
(figure 4), round 1 (figures 5-6, table 1), round 2 (alpha, figures 7-9), the final O (figure 10) and
LSE = ln 8, ln 9. `--causal` shows the causal variant (figure 12: the masked scores, one round, its
O and LSE). `--block-n` replays the same inputs with other K/V block sizes. Everything printed comes
from `fa_sim.reference.walkthrough`; `--json` prints the same content as one JSON object, fractions
as strings ("7/8", "-inf").

`--backward` works the same example backwards (FlashAttention-2's Algorithm 2, as fa2_bwd.cu
computes it: one K/V block at a time, dQ summed over the blocks) with the upstream gradient
dO = [[1, -1], [2, 1]] (SPEC_EXAMPLE.do): D = rowsum(dO o O), then per K/V block P = 2^S / (2^m l),
dV = P^T dO, dP = dO V^T, dS = P o (dP - D), dK = s dS^T Q and dQ's partial s dS K. With s = ln 2
every value but dK and dQ is rational; those two are s times a rational and are printed as
"ln2 * (fraction)". Everything comes from `fa_sim.reference.walkthrough_backward`.

`--dtype` is refused in one line: the walk-through (forward and backward) is exact, nothing in it
is rounded to fp16 or bf16; the kernels' rounding in either type is `fa sim [--backward] --dtype`'s.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction

from ..reference import NEG_INF, SPEC_EXAMPLE, BackwardWalkthrough, Round, Walkthrough
from . import UsageError

# Where each quantity appears in the spec (only for its block size, B_c = 2).
FIGURES = {
    (False, "s", None): "figure 4", (False, "p", 0): "figure 5", (False, "o", 0): "figure 6",
    (False, "state", 0): "table 1", (False, "p", 1): "figure 7", (False, "pv", 1): "figure 8",
    (False, "o", 1): "figure 9", (False, "final", None): "figure 10",
    (True, "s", None): "figure 12",
}


def fmt(x) -> str:
    """An exact value as the spec writes it: 7/8, 2, -inf."""
    if isinstance(x, float) and x == NEG_INF:
        return "-inf"
    return str(Fraction(x))


def _table(corner: str, cols, rows, cells) -> list[str]:
    grid = [[corner, *map(str, cols)]] + [[str(r), *map(fmt, row)] for r, row in zip(rows, cells)]
    widths = [max(len(line[c]) for line in grid) for c in range(len(grid[0]))]
    return ["  " + "  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in grid]


def _title(text: str, ref: str | None) -> str:
    return f"{text}  ({ref})" if ref else text


def _round_lines(r: Round, rows, dims, ref) -> list[str]:
    j, keys = r.t + 1, r.keys
    out = [f"Round {j} (t = {r.t}): keys {', '.join(map(str, keys))}", ""]
    out += [_title("  scores S" + (" after the causal mask" if r.s_masked != r.s else ""), None)]
    out += _table("q/k", keys, rows, r.s_masked) + [""]
    out += [_title(f"  row state: m({j}) = max(m({j - 1}), rowmax S), alpha = 2^(m({j - 1}) - m({j})), "
                   f"l({j}) = alpha*l({j - 1}) + rowsum P~", ref("state", r.t))]
    state = [(mp, m, a, s, l) for mp, m, a, s, l in zip(r.m_prev, r.m, r.alpha, r.rowsum, r.l)]
    out += _table("q", (f"m({j - 1})", f"m({j})", "alpha", "rowsum", f"l({j})"), rows, state)
    if r.t == 0:
        out += ["  (first round: alpha = 0, nothing to rescale)"]
    out += [""] + [_title(f"  P~({j}) = 2^(S - m({j}))", ref("p", r.t))] + _table("q/k", keys, rows, r.p)
    out += [""] + [_title(f"  P~({j}) V[{keys[0]}:{keys[-1] + 1}]", ref("pv", r.t))]
    out += _table("q/d", dims, rows, r.pv)
    out += [""] + [_title(f"  O({j}) = alpha*O({j - 1}) + P~({j}) V", ref("o", r.t))]
    return out + _table("q/d", dims, rows, r.o) + [""]


def render_text(w: Walkthrough) -> str:
    spec_blocks = w.block_n == SPEC_EXAMPLE.block_n
    ref = (lambda what, t=None: FIGURES.get((w.causal, what, t)) if spec_blocks else None)  # noqa: E731
    n_q, d = len(w.o), len(w.o[0])
    rows, dims = range(n_q), range(d)
    out = [f"The spec's worked example{' (causal, top-left: key k visible iff k <= q)' if w.causal else ''}: "
           f"s = {w.scale}, so exp(s*x) = {fmt(w.scale.arg)}^x; B_r = {w.block_m}, B_c = {w.block_n}", ""]
    out += [_title("Q", "figure 1")] + _table("q/d", dims, rows, SPEC_EXAMPLE.q) + [""]
    out += [_title("K", "figure 2")] + _table("k/d", dims, range(len(SPEC_EXAMPLE.k)), SPEC_EXAMPLE.k) + [""]
    out += [_title("V", "figure 3")] + _table("k/d", dims, range(len(SPEC_EXAMPLE.v)), SPEC_EXAMPLE.v) + [""]
    label = "S = Q K^T" + (", k > q set to -inf" if w.causal else "")
    out += [_title(label, ref("s"))] + _table("q/k", range(len(w.s[0])), rows, w.s_masked) + [""]
    for block in w.blocks:
        if len(w.blocks) > 1:
            out += [f"== query block rows {block.rows[0]}..{block.rows[-1]} ==", ""]
        out += [line for r in block.rounds for line in _round_lines(r, block.rows, dims, ref)]
    skipped = -(-len(w.s[0]) // w.block_n) - min(len(b.rounds) for b in w.blocks)
    if skipped:
        out += [f"(causal: {skipped} K/V block(s) lie wholly in the future and are skipped)", ""]
    out += [_title("Final O = O / l (each row divided by its l)", ref("final"))] + _table("q/d", dims, rows, w.o)
    out += ["", "LSE = s*m + ln(l):"] + [f"  query {i}: {x} = {float(x):.6f}" for i, x in enumerate(w.lse)]
    return "\n".join(out)


def render_backward(w: BackwardWalkthrough) -> str:
    """The backward walk-through: the forward's O and LSE, D, then one section per K/V block."""
    n_q, d = len(w.o), len(w.o[0])
    rows, dims = range(n_q), range(d)
    s = str(w.scale)
    out = [f"The spec's worked example backwards{' (causal, top-left)' if w.causal else ''}: s = {w.scale}, "
           f"so exp(s*x) = {fmt(w.scale.arg)}^x; one K/V block of B_c = {w.block_n} keys at a time "
           f"(fa2_bwd.cu: one CTA per K/V block)", ""]
    out += ["Forward: Q, K, V of figures 1-3; O (figure 10) and LSE"] + _table("q/d", dims, rows, w.o)
    out += [f"  LSE: {', '.join(str(x) for x in w.lse)}", ""]
    out += ["dO, the upstream gradient (chosen: small integers)"] + _table("q/d", dims, rows, w.do) + [""]
    out += ["D = rowsum(dO o O)"] + _table("q", ("D",), rows, [(x,) for x in w.d]) + [""]
    for j, blk in enumerate(w.blocks):
        keys = blk.keys
        out += [f"K/V block {j}: keys {', '.join(map(str, keys))}", ""]
        out += ["  S = Q K^T" + (", k > q set to -inf" if w.causal else "")] + _table("q/k", keys, rows, blk.s)
        out += ["", f"  P = exp(s S - LSE) = {fmt(w.scale.arg)}^S / e^LSE"]
        out += _table("q/k", keys, rows, blk.p)
        out += ["", "  dV = P^T dO  (this block's keys: final, no other block adds to them)"]
        out += _table("k/d", dims, keys, blk.dv)
        out += ["", "  dP = dO V^T"] + _table("q/k", keys, rows, blk.dp)
        out += ["", "  dS = P o (dP - D)"] + _table("q/k", keys, rows, blk.ds)
        out += ["", f"  dK = s dS^T Q, in units of s = {s}"] + _table("k/d", dims, keys, blk.dk_over_s)
        out += ["", f"  dQ partial = s dS K, in units of s"] + _table("q/d", dims, rows, blk.dq_over_s)
        out += ["", f"  dQ after blocks 0..{j} (partials added in block order), in units of s"]
        out += _table("q/d", dims, rows, blk.dq_sum_over_s) + [""]
    row_sums = [sum((sum(blk.ds[i]) for blk in w.blocks), Fraction(0)) for i in rows]
    out += [f"Check: each row of dS sums to {', '.join(map(fmt, row_sums))} (softmax's gradient: "
            f"sum_k P (dP - D) = D - D)", ""]
    out += [f"Gradients (dQ and dK in units of s = {s}; as numbers: multiply by {float(w.scale):.6f})"]
    out += ["dQ / s"] + _table("q/d", dims, rows, w.dq_over_s)
    out += ["dK / s"] + _table("k/d", dims, range(len(w.dv)), w.dk_over_s)
    out += ["dV"] + _table("k/d", dims, range(len(w.dv)), w.dv)
    return "\n".join(out)


def backward_json(w: BackwardWalkthrough) -> dict:
    return {
        "scale": str(w.scale), "causal": w.causal, "block_n": w.block_n,
        "q": _matrix(SPEC_EXAMPLE.q), "k": _matrix(SPEC_EXAMPLE.k), "v": _matrix(SPEC_EXAMPLE.v),
        "do": _matrix(w.do), "o": _matrix(w.o), "lse": [{"ln": fmt(x.arg), "value": float(x)} for x in w.lse],
        "d": [fmt(x) for x in w.d],
        "blocks": [{"keys": list(b.keys), "s": _matrix(b.s), "p": _matrix(b.p), "dv": _matrix(b.dv),
                    "dp": _matrix(b.dp), "ds": _matrix(b.ds), "dk_over_s": _matrix(b.dk_over_s),
                    "dq_partial_over_s": _matrix(b.dq_over_s), "dq_sum_over_s": _matrix(b.dq_sum_over_s)}
                   for b in w.blocks],
        "dq_over_s": _matrix(w.dq_over_s), "dk_over_s": _matrix(w.dk_over_s), "dv": _matrix(w.dv),
    }


def _matrix(m) -> list[list[str]]:
    return [[fmt(x) for x in row] for row in m]


def to_json(w: Walkthrough) -> dict:
    return {
        "scale": str(w.scale), "causal": w.causal, "block_m": w.block_m, "block_n": w.block_n,
        "q": _matrix(SPEC_EXAMPLE.q), "k": _matrix(SPEC_EXAMPLE.k), "v": _matrix(SPEC_EXAMPLE.v),
        "s": _matrix(w.s), "s_masked": _matrix(w.s_masked),
        "blocks": [{"rows": list(b.rows), "rounds": [{
            "round": r.t + 1, "keys": list(r.keys), "s": _matrix(r.s), "s_masked": _matrix(r.s_masked),
            "m_prev": [fmt(x) for x in r.m_prev], "m": [fmt(x) for x in r.m],
            "alpha": [fmt(x) for x in r.alpha], "p": _matrix(r.p), "rowsum": [fmt(x) for x in r.rowsum],
            "l": [fmt(x) for x in r.l], "pv": _matrix(r.pv), "o": _matrix(r.o)} for r in b.rounds]}
            for b in w.blocks],
        "o": _matrix(w.o),
        "lse": [{"ln": fmt(x.arg), "value": float(x)} for x in w.lse],
    }


def _positive(text: str) -> int:
    """argparse type of --block-n. Not a ValueError for a non-integer: argparse would print its
    generic "invalid _positive value" instead of our wording (fa_sim.commands.UsageError)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise UsageError(f"--block-n takes a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


EXACT = ("the walk-through is in exact fractions (s = ln 2 keeps every value rational; nothing is rounded to "
         "fp16 or bf16); the kernels' bf16 rounding: fa sim --dtype bf16, fa sim --backward --dtype bf16")


def run(args: argparse.Namespace) -> int:
    if args.dtype is not None:
        raise UsageError(f"--dtype does not apply to fa explain{' --backward' if args.backward else ''}: {EXACT}")
    if args.backward:
        wb = SPEC_EXAMPLE.walkthrough_backward(causal=args.causal, block_n=args.block_n)
        print(json.dumps(backward_json(wb)) if args.json else render_backward(wb))
        return 0
    w = SPEC_EXAMPLE.walkthrough(causal=args.causal, block_n=args.block_n)
    print(json.dumps(to_json(w)) if args.json else render_text(w))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="the spec's two-round worked example with exact fractions",
        description="Replay the spec's worked example (s = ln 2, figures 4-10, table 1) round by round "
                    "in exact fractions; --causal for figure 12.")
    p.add_argument("--causal", action="store_true", help="the causal variant (figure 12) (default off)")
    p.add_argument("--block-n", type=_positive, default=SPEC_EXAMPLE.block_n,
                   help=f"keys per K/V round (default {SPEC_EXAMPLE.block_n}, the spec's B_c; 1 or more)")
    p.add_argument("--backward", action="store_true",
                   help="the example backwards: D, P, dP, dS, dV, dK, dQ per K/V block with dO = [[1, -1], [2, 1]] "
                        "(default off)")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default=None,
                   help="refused, either value: the walk-through is exact, rounded to neither fp16 nor bf16 (fa sim "
                        "[--backward] --dtype runs the kernels' rounding) (default none; one of fp16, bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    p.set_defaults(func=run)
