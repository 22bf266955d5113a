"""experiments/device_round36.sh: every step its header documents is a case of its step loop, and
every case is documented (a step lost in an edit runs nothing and says nothing)."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "device_round36.sh"


def test_every_documented_step_has_a_case_and_every_case_is_documented():
    text = SCRIPT.read_text()
    header = text.split("\nset -u", 1)[0]
    documented = set(re.findall(r"^#   ([a-z]+)\s", header, flags=re.M))
    cases = set(re.findall(r"^  ([a-z]+)\) log ", text, flags=re.M))
    assert len(cases) >= 15
    assert documented == cases, (f"documented but no case: {sorted(documented - cases)}; "
                                 f"a case but not documented: {sorted(cases - documented)}")
