"""`fa explain`: the spec's worked example as printed tables (figures 4-10, table 1; figure 12)."""

from __future__ import annotations

import json
import math
import re

import pytest

from fa_sim.cli import main


def run(capsys, *argv) -> str:
    assert main(["explain", *argv]) == 0
    return capsys.readouterr().out


def table_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the table printed under the first line starting with `title` (header skipped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip() or not line.startswith("  "):
            break
        rows.append(line.split())
    return rows


def test_two_round_example_text(capsys):
    out = run(capsys)
    assert table_rows(out, "S = Q K^T") == [["0", "0", "1", "2", "0"], ["1", "1", "0", "1", "2"]]  # figure 4
    assert table_rows(out, "P~(1) = 2^(S - m(1))") == [["0", "1/2", "1"], ["1", "1", "1/2"]]  # figure 5
    assert table_rows(out, "O(1) =") == [["0", "1/2", "1"], ["1", "1", "1/2"]]  # figure 6
    assert "(figure 5)" in out and "(table 1)" in out and "(figure 10)" in out
    # round 2's row state: m 1 -> 2, alpha 1/2, rowsums 5/4 and 3/2, l(2) = 2 and 9/4
    assert table_rows(out, "row state: m(2)") == [["0", "1", "2", "1/2", "5/4", "2"],
                                                   ["1", "1", "2", "1/2", "3/2", "9/4"]]
    assert table_rows(out, "P~(2) = 2^(S - m(2))") == [["0", "1", "1/4"], ["1", "1/2", "1"]]  # figure 7
    assert table_rows(out, "P~(2) V[2:4]") == [["0", "3/2", "1"], ["1", "5/2", "1/2"]]  # figure 8
    assert table_rows(out, "O(2) =") == [["0", "7/4", "3/2"], ["1", "3", "3/4"]]  # figure 9
    assert table_rows(out, "Final O") == [["0", "7/8", "3/4"], ["1", "4/3", "1/3"]]  # figure 10
    assert re.search(r"query 0: ln\(8\) = 2\.0794", out) and re.search(r"query 1: ln\(9\) = 2\.1972", out)


def test_causal_variant_text(capsys):
    out = run(capsys, "--causal")
    assert "(figure 12)" in out
    assert table_rows(out, "S = Q K^T, k > q set to -inf") == [
        ["0", "0", "-inf", "-inf", "-inf"], ["1", "1", "0", "-inf", "-inf"]]
    assert "Round 2" not in out and "1 K/V block(s) lie wholly in the future" in out
    assert table_rows(out, "Final O") == [["0", "1", "0"], ["1", "2/3", "1/3"]]
    assert "query 0: ln(1) = 0.000000" in out and "query 1: ln(3) = 1.0986" in out


def test_json(capsys):
    doc = json.loads(run(capsys, "--json"))
    assert doc["scale"] == "ln(2)" and doc["causal"] is False
    r1, r2 = doc["blocks"][0]["rounds"]
    assert r1["p"] == [["1/2", "1"], ["1", "1/2"]] and r1["l"] == ["3/2", "3/2"]
    assert r2["alpha"] == ["1/2", "1/2"] and r2["l"] == ["2", "9/4"]
    assert r2["o"] == [["7/4", "3/2"], ["3", "3/4"]]
    assert doc["o"] == [["7/8", "3/4"], ["4/3", "1/3"]]
    assert [x["ln"] for x in doc["lse"]] == ["8", "9"]
    assert [x["value"] for x in doc["lse"]] == pytest.approx([math.log(8), math.log(9)], rel=1e-15)
    causal = json.loads(run(capsys, "--causal", "--json"))
    assert causal["s_masked"][0] == ["0", "-inf", "-inf", "-inf"] and len(causal["blocks"][0]["rounds"]) == 1
    assert causal["o"] == [["1", "0"], ["2/3", "1/3"]]


def test_other_block_sizes_give_the_same_answer(capsys):
    """The online recurrence with one key per round: four rounds, the same O and LSE, no spec figure labels."""
    doc = json.loads(run(capsys, "--json", "--block-n", "1"))
    assert len(doc["blocks"][0]["rounds"]) == 4
    assert doc["o"] == [["7/8", "3/4"], ["4/3", "1/3"]]
    out = run(capsys, "--block-n", "1")
    assert "Round 4" in out and "figure 5" not in out


def test_bad_block_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--block-n", "0"])
    assert exc.value.code == 2
    assert "positive integer" in capsys.readouterr().err
