"""The `fa` command: one entry point, one module per subcommand (fa_sim/commands).

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. The CLI only parses and calls the library. The commands that use the GPU
(`fa hw`, `fa compare`) import fa_hw when they run, so the CLI starts without it. What a user sees
when things go wrong, everywhere:

- bad input (a UsageError of fa_sim.commands, a ValueError of the library, a
  fa_sim.contract.ToolError: fa_hw's errors, a missing `hw` extra, NVRTC or nvdisasm failing):
  one line `fa CMD: error: ...` on stderr, exit status 2; argparse's own errors (an unknown option,
  a value that is not a number) are one line too, exit status 2; so is running out of memory on
  sizes the up-front checks let through, and an instruction the PTX engine does not execute
  (fa_sim.ptx.ops.Unsupported, named with its PTX and CUDA source lines);
- a kernel fault of a simulated kernel (fa_sim.errors.KernelFault: an illegal or misaligned
  address, a warp-collective instruction in a diverged warp): one line `fa CMD: kernel fault: ...`,
  exit status 1, as for a failed check;
- Ctrl-C: one line `fa CMD: interrupted`, exit status 130 (128 + SIGINT); outputs are written
  atomically (commands/outputs.py), so no partial file is left behind;
- a closed pipe (`fa explain | head -1`): silence, exit status 141 (128 + SIGPIPE), as a shell
  tool killed by SIGPIPE reports;
- standard output that cannot be written (`fa sim > /dev/full`: a full disk, an I/O error) or is
  closed (`fa explain >&-`, checked before any work): one line `fa CMD: error: cannot write the
  output: ...`, exit status 2, as for any run that produced no result (exit status 1 stays the
  verdict of a check that ran).

`args.explicit` holds the destinations the command line gave explicitly, so commands can refuse
options that do not apply (common.refuse).
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from .commands import UsageError, banks, compare, explain, hw, layout, sim, sweep, time, trace
from .contract.errors import ToolError
from .errors import KernelFault
from .parallel.errors import ParallelError
from .ptx.ops import Unsupported

# Every subcommand's module, in the order `fa --help` lists them.
SUBCOMMANDS = (sim, trace, banks, layout, explain, hw, compare, sweep, time)
#: Errors that are one line and exit 2: bad usage or input, an instruction the PTX engine does not
#: execute, a lost worker or cluster (the run is incomplete), and the toolchain's and fa_hw's errors
#: (compile, launch, no GPU, a missing hw extra).
KNOWN_ERRORS = (UsageError, ValueError, Unsupported, ParallelError, ToolError)
EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 130, 141


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and no abbreviated options, so adding an
    option never makes an abbreviation ambiguous."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments left over after a subcommand are that subcommand's error
        (`fa sim --cta 3` points to `fa sim --help`, and names the subcommands that take --cta)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = self._subcommands()
            parser = commands.get(getattr(namespace, "command", None), self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_taken_by(extras, commands)}")
        return namespace

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _taken_by(extras: list[str], commands: dict[str, argparse.ArgumentParser]) -> str:
    """'; --cta is an option of fa trace' for each unrecognized option another subcommand takes."""
    notes = []
    for option in dict.fromkeys(e.split("=", 1)[0] for e in extras if e.startswith("--")):
        owners = [f"fa {name}" for name, p in commands.items() if option in p._option_string_actions]
        if owners:
            notes.append(f"{option} is an option of {', '.join(owners)}")
    return "".join(f"; {n}" for n in notes)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fa",
        description="flashsim: the FlashAttention-2 forward kernel, lane by lane on the CPU (fa_sim) and for real on the GPU (fa_hw).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def _suppress_defaults(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _suppress_defaults(child)
        else:
            action.default = argparse.SUPPRESS


def explicit_options(argv: list[str]) -> frozenset[str]:
    """Destinations the command line sets: a second parse in which no option has a default."""
    parser = build_parser()
    _suppress_defaults(parser)
    return frozenset(vars(parser.parse_args(argv))) - {"command", "func"}


class OutputError(Exception):
    """Standard output could not be written (not a closed pipe: that is BrokenPipeError)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.strerror or str(cause))


class _CheckedStdout:
    """sys.stdout during a command: a failed write or flush is an OutputError, so it cannot be
    mistaken for an OSError of the command's own files; everything else is the stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._call(self._stream.write, text)

    def flush(self) -> None:
        self._call(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @staticmethod
    def _call(method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc) from None


def _silence_stdout() -> None:
    """After EPIPE or a failed write: point stdout at /dev/null so the interpreter's final flush
    of what is still buffered stays quiet."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # no file descriptor (captured in tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    stdout = sys.stdout
    if stdout is None:  # started with file descriptor 1 closed: nothing could be printed
        print(f"fa {command}: error: cannot write the output: standard output is closed", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout = _CheckedStdout(stdout)
    try:
        return _run(argv)
    except OutputError as exc:
        sys.stdout = stdout
        _silence_stdout()
        print(f"fa {command}: error: cannot write the output: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        sys.stdout = stdout


VALUE_MAY_START_WITH_DASH = ("--window",)  # LEFT,RIGHT with -1 for unbounded: '--window -1,0'


def _attach_dashed_values(argv: list[str]) -> list[str]:
    """'--window -1,0' as '--window=-1,0': argparse would take '-1,0' for an option (it knows only
    plain negative numbers), so a value that is not itself an option ('--...') is attached."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_MAY_START_WITH_DASH and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _run(argv: list[str]) -> int:
    """Parse and run; every known failure becomes one line on stderr and an exit status."""
    argv = _attach_dashed_values(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        args.explicit = explicit_options(argv)
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print(f"fa {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KernelFault as exc:  # the simulated kernel did something illegal: its bug, reported like a failed check
        print(f"fa {command}: kernel fault: {exc}", file=sys.stderr)
        return 1
    except KNOWN_ERRORS as exc:
        print(f"fa {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError as exc:  # sizes the up-front estimate let through
        print(f"fa {command}: error: out of memory ({exc or 'allocation failed'}); choose smaller sizes",
              file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
