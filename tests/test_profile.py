"""fa_hw.profile: parsing Nsight Compute's raw CSV and setting it beside the simulator's counts
(CPU-only; the ncu run itself happens on the GPU machine, experiments/device_crosscheck.sh)."""

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
