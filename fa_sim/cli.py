"""The `fa` command: one entry point, one module per subcommand (fa_sim/commands, fa_hw).

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. The CLI only parses and calls the library; library errors that describe bad
input (ValueError, and fa_hw's errors) become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, attribute) of every subcommand, in the order `fa --help` lists them.
SUBCOMMANDS = (
    "fa_sim.commands.sim",
    "fa_sim.commands.trace",
    "fa_sim.commands.banks",
    "fa_sim.commands.explain",
    "fa_hw.command",
    "fa_sim.commands.compare",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fa",
        description="flashsim: the FlashAttention-2 forward kernel, lane by lane on the CPU (fa_sim) and for real on the GPU (fa_hw).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module: let it surface
                raise
            continue
        module.register(sub)
    return parser


class _UsageError(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, _UsageError) as exc:
        print(f"fa {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # fa_hw errors carry their own message
        if type(exc).__module__.startswith("fa_hw"):
            print(f"fa {args.command}: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
