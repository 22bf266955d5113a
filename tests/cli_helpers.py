"""Running the `fa` command in-process for the CLI tests: its JSON report, a refusal's one line, and the
simulator's backward result dressed as fa_hw.backward's."""

from __future__ import annotations

import contextlib
import dataclasses
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


@dataclasses.dataclass
class EngineHwBackward:
    """A simulator backward result standing in for fa_hw.backward's in the CLI tests: kernel_ms and
    registers (fa hw's table) zero, every other attribute the simulator's."""
    res: object
    kernel_ms: list
    registers: dict

    def __getattr__(self, name):
        return getattr(self.res, name)


def as_hw_backward(res) -> EngineHwBackward:
    """`res` (fa_sim.simulate_backward's) as fa_hw.backward's result: three kernels' zero times, zero registers."""
    from fa_sim.contract.backward import kernels_of

    return EngineHwBackward(res, [0.0] * 3, {n: 0 for n in kernels_of(res.deterministic)})


def stand_in_ncu(monkeypatch, measured_ms: float | None = None) -> list[dict]:
    """Nsight Compute (and, with `measured_ms`, the CUDA-event timing) stood in for in fa_hw.profile:
    profile_launch records the launch options it was asked to profile (a packed batch's offsets,
    split-KV's splits: fa_hw.profile.launch_options) and returns no counters; the SASS walked is an
    H100's (sm_90). Returns the list of recorded launch options, one dict per profiled launch."""
    import fa_hw.device
    from fa_hw import profile

    profiled: list[dict] = []

    def profile_launch(q, k, v, causal, scale, config, kernel, metrics=None, window=None, softcap=None, **launch):
        profiled.append(launch)
        return {}

    monkeypatch.setattr(profile, "profile_launch", profile_launch)
    monkeypatch.setattr(fa_hw.device, "device_arch", lambda: "sm_90")
    if measured_ms is not None:
        monkeypatch.setattr(profile, "measure_time", lambda *a, **kw: (measured_ms, (measured_ms,) * 3))
    return profiled


def banks_match_nsight_compute(options: list[str], launch: str) -> None:
    """GPU tests of `fa compare --banks` on a packed batch or split-KV decoding (skipped without a GPU
    or ncu): the report names the profiled launch (starts with `launch`), every class's instructions,
    wavefronts and conflicts equal Nsight Compute's, and the simulator's side is `fa banks`' count
    of the same launch."""
    import os
    import shutil

    import pytest

    import fa_hw

    if not fa_hw.has_gpu():
        pytest.skip("no NVIDIA GPU / driver here")
    if shutil.which("ncu") is None and not os.path.exists("/usr/local/cuda/bin/ncu"):
        pytest.skip("Nsight Compute (ncu) is not installed")
    status, report = cli_json(["compare", *options, "--banks", "--json"])
    assert status == 0 and report["ok"], report
    banks = report["banks"]
    assert banks["launch"].startswith(launch), banks["launch"]
    assert all(c["match"] for c in banks["classes"].values()), banks
    counted = ok_json(["banks", *options, "--json"])
    for name, cls in banks["classes"].items():
        assert cls["sim"]["wavefronts"] == counted["classes"][name]["wavefronts"], name


def sim_side_is_fa_banks(banks: dict, options: list[str]) -> None:
    """`fa compare --banks --json`'s simulator side (`banks`) is `fa banks`' count of the same run
    (`options`) in every class: the PTX's instructions, wavefronts and conflicts, plus the SASS's
    guard-off instructions in its issued count."""
    counted = ok_json(["banks", *options, "--json"])
    for name, cls in banks["classes"].items():
        sim, want = cls["sim"], counted["classes"][name]
        assert (sim["ptx_instructions"], sim["wavefronts"]) == (want["instructions"], want["wavefronts"]), name
        assert sim.get("conflicts") == want.get("conflicts"), name
        assert sim["instructions"] == sim["ptx_instructions"] + sim["sass_guard_off"], name
