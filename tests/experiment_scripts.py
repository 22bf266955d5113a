"""Load a script of experiments/ as a module, for the tests of its CPU parts."""

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name: str):
    """experiments/<name>.py as the module `name`, registered in sys.modules (its dataclasses look
    their module up); experiments/ is on sys.path while it loads, since it imports its neighbours
    (timing_measure) as a script does."""
    path = EXPERIMENTS / f"{name}.py"
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(EXPERIMENTS))
    return mod
