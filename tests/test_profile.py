"""fa_hw.profile: parsing Nsight Compute's raw CSV and setting it beside the simulator's counts
(CPU-only; the ncu run itself happens on the GPU machine, experiments/device_crosscheck.sh)."""

import re

import numpy as np
import pytest

from fa_hw.profile import METRICS, BankComparison, ProfileError, format_bank_comparison, parse_raw_csv
from fa_sim import KernelConfig
from fa_sim.observers.banks import Counts, SmemClass


def _csv(values: dict[str, str]) -> str:
    names = list(values)
    head = ['"ID"', '"Kernel Name"'] + [f'"{n}"' for n in names]
    units = ['""', '""'] + ['""' for _ in names]
    row = ['"0"', '"fa2_fwd_kernel"'] + [f'"{values[n]}"' for n in names]
    return "==PROF== Connected to process\n" + "\n".join(",".join(r) for r in (head, units, row)) + "\n"


SIM = {SmemClass.LDSM: Counts(4608, 147456, 18432), SmemClass.LDS: Counts(128, 512, 512),
       SmemClass.STS: Counts(512, 4096, 512), SmemClass.LDGSTS: Counts(1152, 4608, 4608)}
NCU = {  # the H200's counters for the plain layout (experiments/device_crosscheck.sh, run A)
    "smsp__inst_executed_op_ldsm.sum": "4,608",
    "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum": "147,456",
    "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum": "129,024",
    "smsp__sass_inst_executed_op_shared_ld.sum": "128",
    "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "512",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "129,024",
    "smsp__sass_inst_executed_op_shared_st.sum": "512",
    "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "4,096",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "3,584",
    "smsp__inst_executed_op_ldgsts.sum": "1,152",
}


def test_parse_raw_csv_reads_numbers_with_thousands_separators():
    got = parse_raw_csv(_csv(NCU))
    assert got["smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"] == 147456
    assert "Kernel Name" not in got


def test_parse_raw_csv_without_kernel_rows_is_an_error():
    with pytest.raises(ProfileError, match="no kernel rows"):
        parse_raw_csv("==PROF== nothing profiled\n")


def test_comparison_derives_lds_conflicts_and_flags_missing_metrics():
    cmp = BankComparison(KernelConfig(smem="plain"), SIM, parse_raw_csv(_csv(NCU)))
    assert cmp.ncu_counts(SmemClass.LDS)["conflicts"] == 0  # l1tex op_ld minus LDSM's
    assert cmp.matches(SmemClass.LDSM) and cmp.matches(SmemClass.LDS) and cmp.matches(SmemClass.STS)
    assert not cmp.matches(SmemClass.LDGSTS)  # its wavefront counters are absent from this CSV
    text = format_bank_comparison(cmp)
    assert "LDSM" in text and "129,024" in text


def test_every_class_has_instructions_wavefronts_and_conflicts():
    for cls in SmemClass:
        assert set(METRICS[cls]) == {"instructions", "wavefronts", "conflicts"}


def test_instructions_issued_with_a_false_guard_count_beside_the_run():
    """ncu counts a warp instruction issued with its guard false for every lane: the comparison
    adds the SASS walk's extra instructions (sass_extra) to the run's, and no wavefronts."""
    ncu = {**NCU, "smsp__inst_executed_op_ldgsts.sum": "1,216",
           "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts_cache_bypass.sum": "4,608"}
    plain = BankComparison(KernelConfig(smem="plain"), SIM, parse_raw_csv(_csv(ncu)))
    assert not plain.matches(SmemClass.LDGSTS)  # 1,152 run vs 1,216 issued
    cmp = BankComparison(KernelConfig(smem="plain"), SIM, parse_raw_csv(_csv(ncu)), {SmemClass.LDGSTS: 64})
    assert cmp.instructions(SmemClass.LDGSTS) == 1216 and cmp.matches(SmemClass.LDGSTS)
    js = cmp.to_json()["classes"]["LDGSTS"]["sim"]
    assert (js["instructions"], js["ptx_instructions"], js["sass_guard_off"], js["wavefronts"]) == (1216, 1152, 64, 4608)
    assert "LDGSTS +64" in format_bank_comparison(cmp)


# -- a packed batch and split-KV decoding ----------------------------------------------------------------
def test_ncu_selects_the_forward_kernel_by_its_exact_name(monkeypatch):
    """ncu profiles the first launch whose name matches fa2_fwd_kernel: a dense or packed run's one
    launch, split-KV's split launch, never fa2_combine_kernel (launched after it; the earlier
    "regex:fa2" filter matched both)."""
    from fa_hw import profile
    from fa_sim.contract import KERNEL_NAME
    from fa_sim.splitkv import COMBINE_KERNEL

    monkeypatch.setattr(profile, "ncu_path", lambda: "/opt/ncu")
    cmd = profile.ncu_command("in.npz", ["m1", "m2"])
    assert cmd[:6] == ["/opt/ncu", "--csv", "--page", "raw", "--metrics", "m1,m2"]
    pattern = cmd[cmd.index("--kernel-name") + 1]
    assert pattern == "regex:fa2_fwd_kernel" and KERNEL_NAME == "fa2_fwd_kernel"
    assert re.search(pattern[len("regex:"):], KERNEL_NAME) and not re.search(pattern[len("regex:"):], COMBINE_KERNEL)
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[-4:] == ["-m", "fa_hw.profile", "--target", "in.npz"]


def _launched(monkeypatch, tmp_path, **launch) -> dict:
    """profile_launch with ncu stood in for: the profiled process (_target) runs in-process on the
    file profile_launch wrote, fa_hw.forward recording its keyword arguments."""
    import subprocess

    from fa_hw import profile
    from fa_sim.reference import random_inputs

    calls = []

    def run(cmd, **kw):
        assert cmd[cmd.index("--kernel-name") + 1] == "regex:fa2_fwd_kernel"
        profile._target(cmd[-1])
        return subprocess.CompletedProcess(cmd, 0, _csv(NCU), "")

    monkeypatch.setattr(profile, "ncu_path", lambda: "ncu")
    monkeypatch.setattr(profile.subprocess, "run", run)
    monkeypatch.setattr(profile, "forward", lambda *a, **kw: calls.append(kw))
    q, k, v = random_inputs(2, 2, 3, 40, 32, 0, heads_k=1)
    got = profile.profile_launch(q, k, v, False, None, KernelConfig(head_dim=32), **launch)
    assert got["smsp__inst_executed_op_ldsm.sum"] == 4608
    (kw,) = calls
    return kw


def test_the_profiled_process_launches_split_kv(monkeypatch, tmp_path):
    kw = _launched(monkeypatch, tmp_path, splits=2, cache_seqlens=[40, 7], pack_gqa=False)
    assert kw["splits"] == 2 and list(kw["cache_seqlens"]) == [40, 7] and kw["pack_gqa"] is False
    assert "cu_seqlens_q" not in kw
    kw = _launched(monkeypatch, tmp_path, cache_seqlens=[40, 7])  # fa_hw.forward's default: one split
    assert kw["splits"] == 1 and "pack_gqa" not in kw


def test_the_profiled_process_launches_a_packed_batch(monkeypatch, tmp_path):
    kw = _launched(monkeypatch, tmp_path, cu_seqlens_q=[0, 1, 3], cu_seqlens_k=[0, 30, 40])
    assert list(kw["cu_seqlens_q"]) == [0, 1, 3] and list(kw["cu_seqlens_k"]) == [0, 30, 40]
    assert kw["cu_seqlens_q"].dtype == np.int32 and "splits" not in kw
    assert set(_launched(monkeypatch, tmp_path)) == {"causal", "scale", "config", "kernel", "window", "softcap"}


@pytest.mark.parametrize("launch, message", [
    (dict(cu_seqlens_q=[0, 3]), "needs both cu_seqlens_q and cu_seqlens_k"),
    (dict(cu_seqlens_q=[0, 3], cu_seqlens_k=[0, 3], splits=2), "takes no split-KV options"),
    (dict(splits="auto"), 'resolve "auto" first'),
])
def test_launch_options_refusals_are_one_line(launch, message):
    from fa_hw.profile import launch_options

    with pytest.raises(ValueError, match=message) as exc:
        launch_options(**launch)
    assert "\n" not in str(exc.value)


def test_launch_walk_is_the_dense_walk_of_fa_sim_timing_issued():
    """launch_sass_extra (the walk of any build's SASS, a packed or split launch's) gives a dense GQA
    launch the guard-off instructions fa_sim.timing.issued gives it: Q's interior copy arm issued
    with a false guard by the warps of the Q-tail CTAs (Nq 40 < block_m: both heads' CTAs, 4 warps
    each, a 64 x 32 Q tile being 2 cp.async of 16 bytes per thread), nothing else."""
    from fa_hw.profile import launch_sass_extra, sass_extra_instructions
    from fa_sim.contract import KernelBuild
    from fa_sim.observers.branches import BranchRecorder
    from fa_sim.problem import Problem
    from fa_sim.reference import random_inputs
    from fa_sim.simulate import simulate

    cfg = KernelConfig(head_dim=32)
    q, k, v = random_inputs(1, 2, 40, 40, 32, 0, heads_k=1)
    rec = BranchRecorder()
    res = simulate(q, k, v, config=cfg, observers=[rec], engine="ptx")
    build = KernelBuild.of(Problem(1, 2, 40, 40, False, 1.0, cfg, heads_k=1), "sm_80")
    walked = launch_sass_extra(build, rec.paths(), res.counts, "sm_90")
    assert walked == sass_extra_instructions(q, k, v, False, None, cfg, arch="sm_90")
    assert walked == {SmemClass.LDSM: 0, SmemClass.LDS: 0, SmemClass.STS: 0, SmemClass.LDGSTS: 2 * 4 * 2}
