"""fa_sim.layout_checks and `fa layout`: every config of the family passes every check, and each
check fails - `fa layout` exits 1 naming it - when the map it verifies is broken on purpose."""

import json

import numpy as np
import pytest

from fa_sim.machine import SmemLanes

from fa_sim import cute, isa
from fa_sim import layout as L
from fa_sim import layout_checks as LC
from fa_sim.cli import main
from fa_sim.config import KernelConfig
from fa_sim.kernels import Problem, fa2_fwd
from fa_sim.kernels import plan as kplan
from fa_sim.observers import lanemaps

NAMES = ["copy", "smem", "ldmatrix", "mma", "p-as-a", "masks", "quad", "o-staging", "online-softmax"]


def test_every_config_of_the_family_passes():
    for cfg in KernelConfig.family():
        results = LC.run_checks(cfg)
        assert [r.name for r in results] == NAMES
        bad = [(r.name, r.failures) for r in results if not r.ok]
        assert not bad, (cfg.tag, bad)
        assert all(r.elements > 0 for r in results)


def test_element_counts_of_the_seed():
    """What each line claims to cover: 64x64 tiles, 128 threads (spec tables 2, 3, 12)."""
    got = {r.name: r.elements for r in LC.run_checks(KernelConfig())}
    assert got["copy"] == got["smem"] == 3 * 64 * 64  # sQ, sK, sV halves
    assert got["ldmatrix"] == 128 * (32 + 128 + 128)  # tCrQ 32, tCrK 128, tCrV 128 halves per thread
    assert got["p-as-a"] == got["quad"] // 4 == 64 * 64
    assert got["o-staging"] == 64 * 64


def test_fa_layout_prints_one_line_per_check(capsys):
    assert main(["layout"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fa layout: m64n64d64w4-swizzled")
    assert [ln.split()[1] for ln in lines[1:-1]] == NAMES
    assert all(ln.split()[0] == "ok" for ln in lines[1:-1])
    assert lines[-1] == "all 9 checks passed"
    assert "12,288 halves" in lines[1]


def test_fa_layout_json(capsys):
    assert main(["layout", "--block-m", "128", "--warps", "8", "--head-dim", "32", "--smem", "padded", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["ok"] and js["tag"] == "m128n64d32w8-padded" and js["config"]["n_warps"] == 8
    assert [c["name"] for c in js["checks"]] == NAMES and all(c["ok"] and not c["failures"] for c in js["checks"])


class _Shifted:
    """A TvMap whose rows are off by one (for breaking the copy map)."""

    def __init__(self, tv):
        self.tv = tv

    def __call__(self, thread, value):
        r, c = self.tv(thread, value)
        return r ^ 1, c


def _swap_pairs(original):
    def gemm_a(m, plan, tCrP, tCrO, after):  # P's two f16x2 words of each row half exchanged
        return original(m, plan, np.ascontiguousarray(tCrP[..., ::-1]), tCrO, after)
    return gemm_a


def _skip_last_round(original):
    return lambda self, m_block: np.maximum(original(self, m_block) - 1, 1)


def _sts_o_off_by_a_word(original):
    def lanes(config):
        x = original(config)
        return kplan.TileLanes(SmemLanes(x.smem.width, x.smem.addr + 4), x.row, x.col)
    return lanes


def _ldsm_k_rows_swapped(original):
    def ldsm_k(config, h):  # lanes l and l ^ 1 exchange the rows they address
        p = original(config, h)
        swap = np.arange(32) ^ 1
        return kplan.TileLanes(SmemLanes(16, p.smem.addr[:, swap]), p.row[:, swap], p.col[:, swap])
    return ldsm_k


BREAKS = {  # check that must fail: (object, attribute, replacement built from the original)
    "copy": (L, "copy_tv", lambda f: lambda cfg, rows: _Shifted(f(cfg, rows))),
    "smem": (L.Swizzle, "__call__", lambda f: lambda self, p: cute._leaf(p)),  # CuTe without its swizzle
    "ldmatrix": (kplan, "ldsm_k", _ldsm_k_rows_swapped),
    "mma": (lanemaps, "mma_c", lambda f: lambda lane, i: (lambda r, c: (r, c ^ 1))(*f(lane, i))),
    "p-as-a": (fa2_fwd, "gemm_A_in_regs", _swap_pairs),
    "masks": (Problem, "n_block_max", _skip_last_round),
    "quad": (isa.shfl, "shfl_source", lambda f: lambda mode, b, c=0x1F: f(mode, b ^ 4 if np.ndim(b) == 0 and b == 1
                                                                          else b, c)),
    "o-staging": (kplan, "sts_o_lanes", _sts_o_off_by_a_word),
}


@pytest.fixture
def fresh_plan():
    kplan.kernel_plan.cache_clear()
    yield
    kplan.kernel_plan.cache_clear()


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_broken_map_fails_its_check_and_fa_layout_exits_1(name, monkeypatch, capsys, fresh_plan):
    obj, attr, make = BREAKS[name]
    monkeypatch.setattr(obj, attr, make(getattr(obj, attr)))
    assert main(["layout"]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.split()[1:2] == [name])
    assert line.split()[0] == "FAILED", out
    assert "checks FAILED" in out.splitlines()[-1] and name in out.splitlines()[-1]


def test_a_wrong_direct_result_fails_the_online_softmax_check(monkeypatch):
    assert LC.check_online_softmax(KernelConfig()).ok
    monkeypatch.setattr(LC, "attention_exact", lambda *a, **k: (((0, 0), (0, 0)), ()))
    result = LC.check_online_softmax(KernelConfig())
    assert not result.ok and "O or LSE differs from the direct computation" in result.failures[0]


def test_failures_name_the_first_element_that_disagrees(monkeypatch, fresh_plan):
    monkeypatch.setattr(lanemaps, "mma_c", BREAKS["mma"][2](lanemaps.mma_c))
    result = LC.check_mma(KernelConfig())
    assert result.failures == ("QK accumulators: plan vs closed form: 4096 of 4096 differ; first at warp 0, lane 0, "
                               "nj 0, mi 0, v 0: (0, 0) instead of (0, 1)",
                               "PV accumulators: plan vs closed form: 4096 of 4096 differ; first at warp 0, lane 0, "
                               "nj 0, mi 0, v 0: (0, 0) instead of (0, 1)")


def test_a_check_that_cannot_run_has_failed(monkeypatch):
    def misaligned(cfg):
        raise ValueError("16-byte shared-memory accesses need 16-byte aligned addresses")

    monkeypatch.setitem(LC.CHECKS, "copy", misaligned)
    result = LC.run_checks(KernelConfig())[0]
    assert not result.ok and result.failures == ("raised ValueError: 16-byte shared-memory accesses need 16-byte "
                                                 "aligned addresses",)


def test_fa_layout_plot_writes_the_figures(tmp_path, monkeypatch, capsys):
    from fa_sim.commands import layout

    monkeypatch.setattr(layout, "CROP", 8)  # small grids: the same drawing, faster
    assert main(["layout", "--head-dim", "32", "--plot", str(tmp_path / "figs")]) == 0
    err = capsys.readouterr().err
    written = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert written == sorted(f"{f}.png" for f in layout.FIGURES)
    assert all(f"wrote {tmp_path / 'figs' / n}" in err for n in written)
    assert main(["layout", "--plot", str(tmp_path / "figs")]) == 2  # refuses to overwrite without --force
