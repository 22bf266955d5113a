"""KernelConfig.to_json / from_json, and the config options generated from its fields: a field
added to KernelConfig is an option of every command, reaches the config, and round-trips."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fa_sim.cli import build_parser, main
from fa_sim.commands import common
from fa_sim.config import FIELD_CHOICES, FIELD_HELP, KernelConfig, SmemLayout


@given(st.sampled_from(KernelConfig.family()))
def test_round_trip_over_the_family(cfg):
    js = cfg.to_json()
    assert KernelConfig.from_json(js) == cfg
    assert KernelConfig.from_json(json.dumps(js)) == cfg  # through JSON text
    assert json.loads(json.dumps(js)) == js  # plain JSON values: the enum by its value
    assert js["smem"] == cfg.smem.value


def test_fields_and_defaults():
    assert KernelConfig().to_json() == {"block_m": 64, "block_n": 64, "head_dim": 64, "n_warps": 4,
                                        "smem": "swizzled", "softmax": "fmul_fsub", "kv_stages": 1,
                                        "q_in_regs": False, "heavy_first": False, "defer_pv": False,
                                        "pingpong": False, "lazy_sum": False, "min_blocks": 0, "poly_exp": 0,
                                        "dtype": "fp16"}
    assert KernelConfig.from_json({}) == KernelConfig()  # absent fields take their defaults
    assert KernelConfig.from_json({"smem": "padded"}).smem is SmemLayout.PADDED


@pytest.mark.parametrize("text, message", [
    ("{", "KernelConfig JSON is not valid JSON"),
    ("[64, 64]", "must be an object of fields, got list"),
    ('{"block_q": 64}', "unknown field(s) block_q; fields are block_m, block_n, head_dim, n_warps, smem"),
    ('{"smem": "diagonal"}', "smem layout 'diagonal' is not supported"),
    ('{"block_m": 64.0}', "field block_m must be an integer, got 64.0"),
    ('{"block_m": "64"}', "block_m='64' is not one of (64, 128, 256)"),
    ('{"block_m": 64, "n_warps": 8}', "block_m=64 is not a multiple of 16*n_warps=128"),
])
def test_bad_json_is_a_clear_value_error(text, message):
    with pytest.raises(ValueError) as exc:
        KernelConfig.from_json(text)
    assert message in str(exc.value)


def test_every_field_documents_itself():
    """Help for all; allowed values for the integer fields (enums list their members, bools are flags)."""
    for opt in common.config_options():
        assert opt.field.metadata.get(FIELD_HELP), opt.dest
        if opt.hint is int:
            assert opt.field.metadata.get(FIELD_CHOICES), opt.dest


def test_every_field_is_an_option_of_every_kernel_command():
    help_text = {name: build_parser()._subparsers._group_actions[0].choices[name].format_help()
                 for name in ("sim", "trace", "banks", "layout", "hw", "compare")}
    for opt in common.config_options():
        for name, text in help_text.items():
            assert opt.option in text, (name, opt.option)


@dataclasses.dataclass(frozen=True)
class WithOption(KernelConfig):
    """KernelConfig plus a kernel option, as a later field would add one."""

    exp_form: str = dataclasses.field(default="fma", metadata={FIELD_HELP: "how the exp2 argument is formed",
                                                               FIELD_CHOICES: ("fma", "fmul-fsub")})
    unroll: bool = dataclasses.field(default=False, metadata={FIELD_HELP: "unroll the K loop"})


def test_a_new_field_appears_everywhere(monkeypatch, capsys):
    """No edit of the commands: the option, its help, config_from_args and the JSON follow."""
    monkeypatch.setattr(common, "KernelConfig", WithOption)
    seen = {}

    def record(args):
        seen["config"] = common.config_from_args(args)
        return 0

    monkeypatch.setattr("fa_sim.commands.layout.run", record)
    assert main(["layout", "--exp-form", "fmul-fsub", "--unroll", "--block-n", "32"]) == 0
    cfg = seen["config"]
    assert (cfg.exp_form, cfg.unroll, cfg.block_n) == ("fmul-fsub", True, 32)
    assert WithOption.from_json(json.dumps(cfg.to_json())) == cfg
    assert "exp_form=fmul-fsub" in cfg.describe()
    assert main(["layout", "--exp-form", "taylor"]) == 2
    assert "--exp-form taylor: exp_form='taylor' is not one of (fma, fmul-fsub)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["layout", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "how the exp2 argument is formed (default fma; one of fma, fmul-fsub)" in out
    assert "--unroll, --no-unroll unroll the K loop (default off)" in out
    assert main(["layout", "--no-unroll"]) == 0 and seen["config"].unroll is False


def test_trace_archives_carry_the_config_as_json(tmp_path):
    from fa_sim.observers import runs, trace_io
    from fa_sim.observers.story import config_of
    from fa_sim.observers.trace import TraceFilter

    cfg = KernelConfig(block_m=128, n_warps=8, smem="padded")
    tr = runs.run_trace(cfg, TraceFilter(ctas=(0,), lanes=(0,), warps=(0,), rounds=(0,)), runs.Problem(seqlen=64))
    assert tr.launch["config"] == cfg.to_json()
    back = trace_io.load_trace(trace_io.save_trace(tr, tmp_path / "a"))
    assert config_of(back.launch) == cfg
