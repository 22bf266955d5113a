"""README.md against the code: every `fa` command it shows parses, every output marked
`<!-- output: COMMAND -->` is what that command prints today (wall-clock times aside), its links
and the files it names exist, and it stands alone (nothing outside the repository).

    python -m pytest -q tests/test_readme.py      # a failure prints the command's output today
"""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest
from test_docs import ROOT, assert_prints, check_links, read_outputs

README = ROOT / "README.md"
TEXT = README.read_text()
NEEDS_NVRTC = ("--kernel", "--engine ptx", "--gpu-npz")  # the PTX engine, or replaying a recorded kernel


def bash_commands() -> list[str]:
    """The `fa ...` commands of the README's bash blocks (one per line or `&&` part, comments dropped),
    then those quoted inline."""
    out, block = [], False
    for line in TEXT.splitlines():
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if block:
            for part in line.split("#", 1)[0].split("&&"):
                part = part.strip()
                if part.startswith("fa "):
                    out.append(part)
    inline = (" ".join(c.split("|")[0].split()) for c in re.findall(r"`(fa [^`]+)`", TEXT))  # in tables and prose
    return out + [c for c in inline if c not in out]


def test_the_readme_shows_commands():
    assert len(bash_commands()) >= 15 and len(read_outputs(README)) >= 7


@pytest.mark.parametrize("command", bash_commands())
def test_every_command_parses(command):
    from fa_sim.cli import build_parser

    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's error exit
        pytest.fail(f"`{command}` does not parse (exit {exc.code})")


@pytest.mark.parametrize("command, lines", read_outputs(README), ids=lambda x: x if isinstance(x, str) else "")
def test_output_excerpts_are_real_output(command, lines, tmp_path, capsys, monkeypatch):
    if any(k in command for k in NEEDS_NVRTC) and importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("needs NVRTC (the hw extra)")
    assert_prints(command, lines, README.name, tmp_path, capsys, monkeypatch)


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the test command of the README's set-up, as a user would."""
    setup = re.search(r"```bash\n(.*?)```", TEXT, re.S)[1]
    (command,) = [line.split("#")[0].strip() for line in setup.splitlines() if "pytest" in line]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert ci == [command]


def test_links_and_named_files_exist():
    scripts = re.findall(r"python (experiments/\w+\.py)", TEXT)
    assert check_links(README) > 20 and scripts
    for ref in scripts:
        assert (ROOT / ref).exists(), f"README runs {ref}, which does not exist"


def test_the_readme_stands_alone():
    """Users have the repository only: no paths into the developers' notes, no issue numbers."""
    assert "shared/" not in TEXT and "../" not in TEXT
    assert not re.search(r"\bissue\s*#?\d", TEXT, re.IGNORECASE)
