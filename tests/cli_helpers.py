"""Running the `fa` command in-process for the CLI tests: its JSON report, and a refusal's one line."""

from __future__ import annotations

import contextlib
import io
import json

from fa_sim.cli import main


def cli_json(argv) -> tuple[int, dict]:
    """`fa <argv>` with --json among argv: its exit status and the parsed report."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return status, json.loads(out.getvalue())


def ok_json(argv) -> dict:
    """cli_json for a run that must succeed (exit status 0): the report."""
    status, report = cli_json(argv)
    assert status == 0, argv
    return report


def refused_line(argv, capsys) -> str:
    """A usage refusal: exit status 2 and exactly one line on stderr, returned."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err
