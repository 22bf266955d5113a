"""The Ctrl-C tests' children: SIGINT back to its default disposition before exec.

POSIX has a shell without job control start a background command (`pytest ... &` in a script, a
CI runner's step) with SIGINT ignored, and children inherit an ignored signal; Python then
installs no KeyboardInterrupt handler and a SIGINT the test sends, as a terminal's Ctrl-C
would, is lost. `Popen(..., preexec_fn=sigint_default)` gives the child a terminal's state.
"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
