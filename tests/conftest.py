"""Suite-wide pytest hooks: the NVRTC work of tests marked `nvrtc_ahead(kind, build_of)` starts
on the spare cores when the session starts (tests/nvrtc_ahead.py), so that filling a cold cache
overlaps the tests that need no compiler instead of adding to them. Under pytest-xdist (`-n auto`,
the README's command) the workers already use every core: none of them compiles ahead, and the
tests marked `slow` (single tests of a minute or more) are taken first, so that none of them is
what one worker still runs while the others have nothing left.

`build_of` maps the test's parameters (by name) to the KernelBuild it compiles; `kind` is
nvrtc_ahead.Kind.CUBIN or .PTX. The marker changes no test: each still compiles its own build
through the cache and checks what it checked.

Tests marked `gpu_alone` time the GPU (measured beside predicted): under xdist they take an exclusive
lock that every other `gpu` test takes shared (fcntl.flock on one file), so no other worker's
kernels run on the GPU while they measure; they wait until the GPU is free of the others.
"""

from __future__ import annotations

import contextlib
import fcntl

import pytest

import nvrtc_ahead

_ahead = None


def pytest_configure(config):
    config.addinivalue_line("markers", "nvrtc_ahead(kind, build_of): the test compiles build_of(**params) "
                                       "through the cache; the suite compiles it ahead on a spare core")
    config.addinivalue_line("markers", "gpu_alone: the test times the GPU: under xdist no other gpu test runs "
                                       "beside it (tests/conftest.py)")


def _key(item):
    """(kind, KernelBuild) of a test marked nvrtc_ahead, else None."""
    marker = item.get_closest_marker("nvrtc_ahead")
    if marker is None or not hasattr(item, "callspec"):
        return None
    kind, build_of = marker.args
    return kind, build_of(**item.callspec.params)


@pytest.hookimpl(trylast=True)  # after any deselection: the items that will run, in their order
def pytest_collection_modifyitems(session, config, items):
    global _ahead
    if config.option.collectonly:
        return
    if hasattr(config, "workerinput"):  # an xdist worker: no spare core; every worker orders alike
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: else as collected
        return
    try:
        import cuda.bindings.nvrtc  # noqa: F401 - without the hw extra these tests skip
    except ImportError:
        return
    _ahead = nvrtc_ahead.start([key for item in items if (key := _key(item)) is not None])


def pytest_runtest_setup(item):
    if _ahead is not None and (key := _key(item)) is not None:
        _ahead.claim(key)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """gpu tests under xdist: `gpu_alone` ones hold the GPU lock exclusively, the others shared."""
    if not hasattr(item.config, "workerinput") or item.get_closest_marker("gpu") is None:
        yield
        return
    path = item.config.rootpath / ".pytest_cache" / "gpu.lock"
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as lock, contextlib.ExitStack() as unlock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("gpu_alone") else fcntl.LOCK_SH)
        unlock.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        yield


def pytest_sessionfinish(session, exitstatus):
    if _ahead is not None:
        _ahead.stop()
