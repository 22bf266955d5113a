"""Which cp.async instructions that mix copies and zero fills cost Nsight Compute's extra wavefronts?

On an H100, `fa compare --banks` of split-KV decoding (--batch 2 --heads 4 --heads-k 2 --seqlen 2
--seqlen-k 300 --cache-seqlens 255,33 --head-dim 128 --splits 3 --pack-gqa off --softcap 5 --dtype
bf16) counted 6,680 LDGSTS wavefronts where the simulator's rule (fa_sim.observers.banks.
mixed_zero_fill_wavefronts) gives 6,688: 16 mixed instructions at 2 extra each, where ncu's total
allows 12. The mixed instructions fall in four groups of four (the simulator names them: the
K tile of the 33-key sequence in the prologue, its V tile in round 0, the 255-key sequence's K
prefetch in round 0 and its V tile in round 1). The cases below take the groups apart (one
sequence at a time; fp16 without softcap; no GQA), so the rule can be read off the totals.

    python experiments/ldgsts_mixed_cases.py            # the simulator's counts and mixed groups (CPU)
    python experiments/ldgsts_mixed_cases.py --ncu      # beside Nsight Compute's (GPU, ncu)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

import numpy as np

BASE = ["--heads", "4", "--seqlen", "2", "--seqlen-k", "300", "--head-dim", "128", "--splits", "3",
        "--pack-gqa", "off"]
CASES = {
    "255,33 bf16 softcap (the H100's mismatch)": ["--batch", "2", "--heads-k", "2", "--cache-seqlens", "255,33",
                                                  "--softcap", "5", "--dtype", "bf16"],
    "33 alone (prologue K, round-0 V)": ["--batch", "1", "--heads-k", "2", "--cache-seqlens", "33", "--softcap", "5",
                                         "--dtype", "bf16"],
    "255 alone (round-0 K prefetch, round-1 V)": ["--batch", "1", "--heads-k", "2", "--cache-seqlens", "255",
                                                  "--softcap", "5", "--dtype", "bf16"],
    "255,33 fp16": ["--batch", "2", "--heads-k", "2", "--cache-seqlens", "255,33"],
    "255,33 fp16 no GQA": ["--batch", "2", "--cache-seqlens", "255,33"],
    "33 fp16 no GQA, one split": ["--batch", "1", "--cache-seqlens", "33", "--splits", "1"],
}


def _json(argv: list[str]) -> tuple[int, dict]:
    from fa_sim.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(argv)
    return status, json.loads(buf.getvalue() or "{}")


def mixed_groups(argv: list[str]) -> dict[str, int]:
    """(round, phase) -> mixed LDGSTS warp instructions, counted by the simulator's own rule."""
    import fa_sim.observers.banks as banks

    seen: dict[str, int] = {}
    orig = banks.BankCounter._ldgsts_cost

    def cost(self, event, c):
        mask = np.asarray(event.smem.mask, bool) & np.asarray(event.active, bool)[None]
        fetched = mask & np.asarray(event.gmem.mask, bool)
        n = int((fetched.any(-1) & (mask & ~fetched).any(-1)).sum())
        if n:
            key = f"round {event.round} {event.phase}"
            seen[key] = seen.get(key, 0) + n
        return orig(self, event, c)

    banks.BankCounter._ldgsts_cost = cost
    try:
        status, out = _json(["banks", *argv, "--json"])
    finally:
        banks.BankCounter._ldgsts_cost = orig
    if status != 0:
        raise SystemExit(f"fa banks {' '.join(argv)} failed")
    seen["wavefronts"] = out["classes"]["LDGSTS"]["wavefronts"]
    seen["ideal"] = out["classes"]["LDGSTS"]["ideal"]
    return seen


def options(name: str) -> list[str]:
    """The fa options of CASES[name] (its own --splits replaces the base's)."""
    extra = CASES[name]
    i = BASE.index("--splits")
    return (BASE[:i] + BASE[i + 2:] if "--splits" in extra else BASE) + extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ncu", action="store_true", help="profile each case with Nsight Compute (GPU)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = {}
    for name in CASES:
        opts = options(name)
        sim = mixed_groups(opts)
        row = {"options": opts, "sim": sim}
        if args.ncu:
            status, rep = _json(["compare", *opts, "--banks", "--json"])
            row["ncu"] = rep.get("banks", {}).get("classes", {}).get("LDGSTS", {}).get("ncu") if status == 0 else \
                {"error": rep}
        rows[name] = row
        ncu = row.get("ncu", {}) or {}
        print(f"{name:45s} sim {sim['wavefronts']:6d} (ideal {sim['ideal']}, mixed "
              + ", ".join(f"{k}: {v}" for k, v in sim.items() if k.startswith("round")) + ")"
              + (f"  ncu {ncu.get('wavefronts')}" if args.ncu else ""), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
