"""The subcommands of `fa` (fa_sim/cli.py): one module each, plus the arguments, inputs and
output paths they share (common.py, inputs.py, outputs.py) and the order of their checks, all
before any input is made (preflight.py)."""


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2 (fa_sim/cli.py).

    Deliberately not a ValueError: argparse turns a ValueError raised by a type function into its
    own generic message, while any other exception passes through with our wording."""
