"""Edits of the kernels as a user writes them, timed (issue 35): a K/V loop NVVM unrolls by 2 ties
every SASS branch to a PTX branch, and `fa time --backward --kernel` takes a patch of fa2_bwd.cu
as `fa time --kernel` takes one of fa2_fwd.cu."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC (the hw extra)")

from fa_sim.cli import main  # noqa: E402
from fa_sim.config import KernelConfig  # noqa: E402
from fa_sim.contract import kernel_source  # noqa: E402
from fa_sim.contract.backward import BWD_PATH  # noqa: E402

LOOP = "  // phase: K load\n  for (int t = 0; t < n_block_max; ++t) {\n"


def _patch(tmp_path, seed_path, old: str, new: str, name: str):
    """A unified diff of one replacement in a seed file, as `diff -u` writes it."""
    import difflib

    seed = seed_path.read_text()
    assert seed.count(old) == 1
    text = seed.replace(old, new)
    diff = difflib.unified_diff(seed.splitlines(keepends=True), text.splitlines(keepends=True),
                                f"a/fa_hw/kernels/{seed_path.name}", f"b/fa_hw/kernels/{seed_path.name}")
    path = tmp_path / name
    path.write_text("".join(diff))
    return path


def test_a_kv_loop_unrolled_by_two_ties_every_sass_branch(tmp_path):
    """NVVM copies the K/V body; ptxas labels one copy's copy_tile branch with its cp.async's
    location: the PTX branch alignment leaves unpaired there decides it (timing.walk.tie)."""
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.timing.predict import kernel_model

    path = _patch(tmp_path, SEED_PATH, LOOP, LOOP.replace("  for", "#pragma unroll 2\n  for"), "unroll2.patch")
    model = kernel_model(KernelConfig(), False, "sm_90", str(path))
    walker = model.stream.walker
    conditional = [s for s, b in model.sass.blocks.items()
                   if b.last.conditional and len(b.succ) == 2 and b.func == model.sass.kernel]
    assert conditional and set(conditional) <= set(walker.ties)


def test_an_edit_the_probes_cannot_count_is_timed_as_any_launch(tmp_path):
    """The K/V loop unrolled by 2 runs half as many latch visits as the probes' schedule counts (a
    StreamMismatch): fa_sim.timing.predict times the edited launch through predict_launch instead of
    refusing it, says why, and the grid's instructions are the walks' (near the seed kernel's: the same
    work, one loop test per two rounds)."""
    from fa_sim import Problem
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.timing import predict

    path = _patch(tmp_path, SEED_PATH, LOOP, LOOP.replace("  for", "#pragma unroll 2\n  for"), "unroll2.patch")
    prob = Problem(1, 2, 512, 512, False, 1.0, KernelConfig())
    edited, seed = predict(prob, "h200", str(path), progress=False), predict(prob, "h200", progress=False)
    assert edited.notes["timed_as"] == "launch" and "K/V rounds per warp" in edited.notes["why"], edited.notes
    assert "timed_as" not in seed.notes
    assert 0.9 < edited.instructions / seed.instructions < 1.02, (edited.instructions, seed.instructions)
    assert 0.5 < edited.kernel_ms / seed.kernel_ms < 1.5


def test_a_branch_inside_a_noinline_function_is_refused_not_walked_past():
    """mask_scores made __noinline__ (experiments/variants/edits_fuzz/noinline_mask.patch): ptxas returns
    early from the SASS function (`@!P RET`), whose branches the engine's per-call-site copies cannot tie;
    the walk took such a branch as never taken before (a wrong path, silently), now a TieError names it.
    A called function without branches (noinline_quad_max) is walked into and timed."""
    from pathlib import Path

    from fa_sim import Problem
    from fa_sim.timing import predict
    from fa_sim.timing.walk import TieError

    fuzz = Path(__file__).resolve().parents[1] / "experiments" / "variants" / "edits_fuzz"
    prob = Problem(1, 2, 512, 512, True, 1.0, KernelConfig())
    with pytest.raises(TieError, match="a conditional branch inside the called function .*mask_scores.* is not modelled"):
        predict(prob, "h200", str(fuzz / "noinline_mask.patch"), progress=False)
    assert predict(prob, "h200", str(fuzz / "noinline_quad_max.patch"), progress=False).kernel_ms > 0


def test_fa_time_backward_takes_a_patch_of_fa2_bwd(tmp_path, capsys):
    line = "    if (!FA_DROP_BAR_DS) __syncthreads();"
    path = _patch(tmp_path, BWD_PATH, line, "    __syncthreads();  // an extra barrier\n" + line, "extra_bar.patch")
    argv = ["time", "--backward", "--seqlen", "128", "--heads", "1", "--head-dim", "32", "--kernel", str(path)]
    assert main(argv) == 0
    assert "predicted time" in capsys.readouterr().out
    bad = tmp_path / "bad.patch"
    bad.write_text(path.read_text().replace("BAR_DS", "BAR_XX", 1))
    assert main([*argv[:-1], str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.patch" in err and err.count("\n") == 1, err
    fwd = tmp_path / "fwd.patch"
    fwd.write_text(path.read_text().replace("fa2_bwd.cu", "fa2_fwd.cu"))
    assert main([*argv[:-1], str(fwd)]) == 2
    assert "fa2_bwd.cu" in capsys.readouterr().err


def test_a_variant_s_own_shared_variable_moves_the_tiles_without_a_false_hazard(tmp_path):
    """`__shared__ int counter;` with shared atomics in the epilogue: the dynamic tiles start 16 bytes
    in, the hazard checker's window holds them (no OOB_SHARED at sV's end) and O is the seed's."""
    import numpy as np

    from fa_sim import simulate
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.observers.hazards import HazardChecker

    line = "  store_o_smem(tCrO, sQ);  // sO reuses sQ"
    path = _patch(tmp_path, SEED_PATH, line, "  __shared__ int counter;\n  if (threadIdx.x == 0) counter = 0;\n"
                  "  __syncthreads();\n  if (lane == 0) atomicAdd(&counter, 1);\n" + line, "counter.patch")
    rng = np.random.default_rng(35)
    q, k, v = (rng.standard_normal((1, 1, 64, 64)).astype(np.float16) for _ in range(3))
    hazards = HazardChecker()
    res = simulate(q, k, v, kernel=str(path), observers=[hazards])
    assert not hazards.report().kinds()
    assert np.array_equal(res.o.view(np.uint16), simulate(q, k, v, engine="ptx").o.view(np.uint16))
