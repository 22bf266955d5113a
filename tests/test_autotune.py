"""config="auto" on a GPU without a tuned table (fa_hw.autotune), on the CPU with a fake timer: the
problem classes, the candidates, the timing loop, the on-disk cache (a second process reuses it
without timing; a damaged file is timed again and rewritten) and the table's precedence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fa_hw import autotune, tuned
from fa_hw.errors import FaHwError
from fa_sim.config import KernelConfig

NO_TABLE = ("NVIDIA GH200 480GB", "sm_90")  # an sm_90 GPU without a shipped table
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class FakeTimer:
    """Milliseconds from a function of the config; records every call."""

    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, config):
        self.calls.append(config)
        return self.ms(config)


def factory_of(timer, seen=None):
    def factory(cls, shape, pool):
        assert pool == tuned.autotune_candidates(cls.head_dim, cls.causal, cls.seqlen_k)
        if seen is not None:
            seen.append((cls, shape))
        return timer
    return factory


def never(cls, shape, pool):
    raise AssertionError(f"timed {cls.key} on {shape}: the choice should have come from a table or the cache")


def slowest_first(config):
    """Times under which the LAST candidate of (d=128, causal, Nk 4096) is fastest: the choice comes
    from the times, not the order."""
    pool = tuned.autotune_candidates(128, True, 4096)
    return 1.0 + 0.1 * (len(pool) - pool.index(config))


@pytest.mark.parametrize("shape", [(1, 1, 1, 64), (64, 4096, 4096, 128), (4, 1000, 1000, 64), (3, 100000, 5, 32),
                                   (1000, 129, 8192, 128), (7, 333, 70000, 64), (1, 65536, 65536, 128)])
def test_the_timed_shape_is_of_the_problems_class(shape):
    bh, nq, nk, d = shape
    for causal in (False, True):
        cls = autotune.ProblemClass.of(bh, nq, nk, d, causal)
        timed = autotune.timing_shape(bh, nq, nk, d)
        assert autotune.ProblemClass.of(*timed, causal) == cls
        assert timed[1:] == (nq, nk, d) and 1 <= timed[0] <= bh
        assert (timed[0] - 1) * -(-nq // 128) < autotune.MAX_TILES  # the fewest heads of the class: no more work
    for group in (2, 3, 8):  # grouped-query K/V: whole K/V heads in the timed launch, the same class
        if bh % group == 0:
            timed = autotune.timing_shape(bh, nq, nk, d, group)
            assert timed[0] % group == 0 and autotune.ProblemClass.of(*timed, True) == autotune.ProblemClass.of(
                bh, nq, nk, d, True)
    assert autotune.ProblemClass.of(64, 4096, 4096, 128, True).key == "d128-causal-q4096-k4096-t1024"
    plain = autotune.ProblemClass.of(64, 4096, 4096, 128, True, autotune.Features())
    assert plain.key == "d128-causal-q4096-k4096-t1024"  # no features: the key caches written before them
    assert autotune.ProblemClass.of(64, 4096, 4096, 128, False, autotune.Features(4, (0, 100), 0.0)).key == \
        "d128-full-q4096-k4096-t1024-g4-w0_128"
    assert autotune.ProblemClass.of(4, 1000, 1500, 64, False).key == "d64-full-q1024-k2048-t32"
    assert autotune.ProblemClass.of(4, 1000, 1500, 64, False) == autotune.ProblemClass.of(3, 700, 1025, 64, False)
    assert autotune.ProblemClass.of(4, 1000, 1500, 64, False) != autotune.ProblemClass.of(4, 1000, 2049, 64, False)
    with pytest.raises(ValueError, match="must be positive"):
        autotune.ProblemClass.of(0, 10, 10, 64, False)


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nk", [700, 3000, 9000])
def test_candidates_are_the_shipped_winners_and_their_neighbours(d, causal, nk):
    got = tuned.autotune_candidates(d, causal, nk)
    size = tuned.size_class(nk)
    tables = [tuned.Table.load(p) for p in sorted(tuned.TUNED_DIR.glob("*.json"))]
    assert len(tables) >= 2  # the H100's and the H200's
    nearest = [t.lookup(d, causal, size).config for t in tables]
    assert got[0] == nearest[0] and set(nearest) <= set(got)  # every table's winner of this size class first
    assert 3 <= len(got) <= tuned.MAX_AUTOTUNE_CANDIDATES and len(set(got)) == len(got)
    assert all(c.head_dim == d and (causal or not c.heavy_first) for c in got)
    first = got[0]
    assert any(c.kv_stages != first.kv_stages and c.block_m == first.block_m for c in got)  # its neighbour


def test_tune_takes_the_lowest_median_and_records_failures():
    a, b, c, e = (KernelConfig.from_tag(t) for t in ("m128n64d64w4-swizzled", "m128n128d64w4-swizzled",
                                                      "m64n64d64w4-swizzled", "m128n128d64w4-swizzled-s2"))
    runs = {a: iter([1.0, 5.0, 1.1]), b: iter([1.2, 1.2, 1.2]), e: iter([0.5, float("nan"), 0.5])}

    def ms(cfg):
        if cfg == c:
            raise RuntimeError("CUDA_ERROR_OUT_OF_RESOURCES")
        return next(runs[cfg])
    timer = FakeTimer(ms)
    got = autotune.tune([a, b, c, e], timer, rounds=3)
    assert got.config == a and got.times_ms == {a.tag: 1.1, b.tag: 1.2}  # medians; a's outlier 5.0 ignored
    assert "CUDA_ERROR_OUT_OF_RESOURCES" in got.failed[c.tag] and "nan ms" in got.failed[e.tag]
    assert timer.calls.count(c) == 1 and timer.calls.count(e) == 2 and timer.calls.count(a) == 3
    assert timer.calls[:4] == [a, b, c, e]  # round-robin
    with pytest.raises(FaHwError, match=r"no candidate config ran on this GPU: m128n64d64w4-swizzled: RuntimeError: x"):
        autotune.tune([a], FakeTimer(lambda cfg: (_ for _ in ()).throw(RuntimeError("x"))))
    with pytest.raises(ValueError, match="no candidate configs"):
        autotune.tune([], timer)


def test_a_gpu_with_a_table_uses_the_table(cache):
    choice = tuned.device_choice(128, True, 4096, 4096, 64, "NVIDIA H200", "sm_90", never, kernel="k")
    assert choice.config == tuned.table_for("NVIDIA H200").lookup(128, True, "medium").config
    assert choice.source == "h200.json (d=128, causal, medium)"
    assert not cache.exists()
    # the same GPU name on another arch: no table entry, so the autotuner times it
    seen = []
    other = tuned.device_choice(128, True, 4096, 4096, 64, "NVIDIA H200", "sm_100",
                                factory_of(FakeTimer(lambda c: 1.0), seen), kernel="k")
    assert "autotuned" in other.source and len(seen) == 1


def test_a_bf16_run_is_chosen_and_timed_in_bf16(cache):
    bf16 = autotune.Features(dtype="bf16")
    choice = tuned.device_choice(128, True, 4096, 4096, 64, "NVIDIA H200", "sm_90", never, kernel="k", features=bf16)
    assert choice.config == replace(tuned.table_for("NVIDIA H200").lookup(128, True, "medium").config, dtype="bf16")
    seen = []
    other = tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, factory_of(FakeTimer(slowest_first), seen),
                                kernel="k", features=bf16)
    assert other.config == replace(tuned.autotune_candidates(128, True, 4096)[-1], dtype="bf16")
    assert seen[0][0].key == "d128-causal-q4096-k4096-t1024-bf16"
    again = tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, never, kernel="k", features=bf16)
    assert again.config == other.config and "cached" in again.source  # its own class in the cache


def test_first_call_times_the_candidates_and_caches_the_choice(cache):
    seen, timer = [], FakeTimer(slowest_first)
    choice = tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, factory_of(timer, seen), kernel="k1")
    pool = tuned.autotune_candidates(128, True, 4096)
    assert choice.config == pool[-1]  # fastest by the timer, though the last candidate
    assert seen == [(autotune.ProblemClass.of(64, 4096, 4096, 128, True), (32, 4096, 4096, 128))]
    assert sorted(set(timer.calls), key=pool.index) == pool and len(timer.calls) == autotune.ROUNDS * len(pool)
    path = autotune.cache_path(*NO_TABLE)
    assert path == cache / "autotune" / "gh200_480gb-sm_90.json"
    data = json.loads(path.read_text())
    entry = data["entries"]["d128-causal-q4096-k4096-t1024"]
    assert data["gpu"] == NO_TABLE[0] and data["arch"] == "sm_90" and entry["kernel"] == "k1"
    assert KernelConfig.from_json(entry["config"]) == pool[-1] and set(entry["times_ms"]) == {c.tag for c in pool}
    assert entry["timed_shape"] == [32, 4096, 4096, 128]
    assert "not tuned yet" in choice.source and "timed %d candidates" % len(pool) in choice.source
    # the same class again (another shape of it): the cache, no timing
    again = tuned.device_choice(128, True, 3000, 3000, 40, *NO_TABLE, never, kernel="k1")
    assert again.config == choice.config and "cached in" in again.source
    # another class: timed, and the first class's entry stays
    tuned.device_choice(64, False, 1000, 1000, 8, *NO_TABLE, factory_of(FakeTimer(lambda c: 1.0)), kernel="k1")
    assert set(json.loads(path.read_text())["entries"]) == {"d128-causal-q4096-k4096-t1024", "d64-full-q1024-k1024-t64"}
    # an edit of the kernel (another fingerprint): timed again
    seen.clear()
    tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, factory_of(FakeTimer(lambda c: 1.0), seen), kernel="k2")
    assert len(seen) == 1


CHILD = """
import sys
from fa_hw import tuned
def never(cls, shape, pool):
    raise SystemExit("the second process timed " + cls.key)
c = tuned.device_choice(128, True, 4096, 4096, 64, "NVIDIA GH200 480GB", "sm_90", never, kernel="k1")
print(c.config.tag)
print(c.source)
"""


def test_a_second_process_reuses_the_choice_without_timing(cache):
    choice = tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, factory_of(FakeTimer(slowest_first)), kernel="k1")
    env = {**os.environ, "FLASHSIM_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    tag, source = run.stdout.split("\n")[:2]
    assert tag == choice.config.tag and "cached in" in source and "d128-causal-q4096-k4096-t1024" in source


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe\x00", b'{"format": 7, "entries": {}}', b"[1, 2]",
                                    b'{"format": 1, "entries": {"d128-causal-q4096-k4096-t1024": '
                                    b'{"kernel": "k1", "config": {"block_m": 3}}}}'])
def test_a_damaged_cache_is_timed_again_and_rewritten(cache, damage):
    path = autotune.cache_path(*NO_TABLE)
    path.parent.mkdir(parents=True)
    path.write_bytes(damage)
    seen = []
    choice = tuned.device_choice(128, True, 4096, 4096, 64, *NO_TABLE, factory_of(FakeTimer(slowest_first), seen),
                                 kernel="k1")
    assert len(seen) == 1 and choice.config == tuned.autotune_candidates(128, True, 4096)[-1]
    assert any(why in choice.source for why in ("cache file damaged", "cache file unreadable", "stale or malformed"))
    entries, why = autotune.read_cache(path)
    assert why == "" and KernelConfig.from_json(entries["d128-causal-q4096-k4096-t1024"]["config"]) == choice.config


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "file"))  # a root that cannot be a directory
    choice = tuned.device_choice(64, False, 1000, 1000, 8, *NO_TABLE, factory_of(FakeTimer(lambda c: 1.0)), kernel="k")
    assert "cache not writable" in choice.source and choice.config == tuned.autotune_candidates(64, False, 1000)[0]


def test_the_fingerprint_follows_the_kernel_source(monkeypatch):
    from fa_sim.contract import source

    first = autotune.fingerprint()
    assert first == autotune.fingerprint() and len(first) == 32
    real = source.seed_source()
    monkeypatch.setattr(source, "seed_source", lambda: source.KernelSource(real.name, real.origin, real.text + "\n//"))
    assert autotune.fingerprint() != first


def test_bad_head_dim_and_strings_are_refused_before_timing(cache):
    import numpy as np

    from fa_hw import tensors

    with pytest.raises(ValueError, match="config='auto' covers head_dim"):
        tuned.device_choice(48, False, 100, 100, 1, *NO_TABLE, never, kernel="k")
    # a string other than "auto" is a config tag, checked as simulate checks it, before any device call
    assert tuned.resolve("fastest", (1, 1, 8, 64), (1, 1, 8, 64), False, never) == "fastest"
    q = np.ones((1, 1, 8, 64), np.float16)
    with pytest.raises(ValueError, match="config must be None .the seed config., a KernelConfig or a config tag"):
        tensors.check(q, q, q, False, None, "fastest")
    assert tensors.check(q, q, q, False, None, " Auto ")[3]  # "auto" in any case, spaces around it


@pytest.fixture
def tune_hw(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    import tune_hw

    return tune_hw


def test_tune_hw_stops_on_another_gpu_before_any_work(tune_hw, monkeypatch, capsys):
    class Dev:
        name = "NVIDIA H200"

    monkeypatch.setattr(tune_hw, "device", lambda: Dev())
    monkeypatch.setattr(tune_hw, "warm_cache", lambda *a: pytest.fail("compiled on the wrong GPU"))
    assert tune_hw.main(["--gpu-name", "NVIDIA H100 80GB HBM3"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-name 'NVIDIA H100 80GB HBM3', but this GPU is 'NVIDIA H200': nothing timed" in err
    with pytest.raises(SystemExit):
        tune_hw.main([])  # --gpu-name is required
    assert "--gpu-name" in capsys.readouterr().err


def test_tune_hw_times_the_autotuners_candidates_and_reports_them(tune_hw):
    for d in (32, 64, 128):
        for causal in (False, True):
            timed = tune_hw.candidates(d, causal)
            assert set(tuned.candidates(d, causal)) <= set(timed) and len(set(timed)) == len(timed)
            for nk in (700, 3000, 9000):
                assert set(tuned.autotune_candidates(d, causal, nk)) <= set(timed)
    pool = [c.tag for c in tuned.autotune_candidates(128, True, 4096)]
    rows = [{"tag": t, "ms": 1.0 + i, "note": None} for i, t in enumerate(pool)]
    rows += [{"tag": "m64n64d128w4-swizzled-hf", "ms": 0.8, "note": None},
             {"tag": "m128n32d128w4-swizzled-s2-hf", "ms": 0.1, "note": "O differs from SDPA-flash: not chosen"}]
    lines = tune_hw.autotune_rows({((4, 16, 4096, 128), True): (None, rows)})
    assert lines[-1] == f"| (4, 16, 4096, 128) | True | m64n64d128w4-swizzled-hf | 0.800 | {pool[0]} | 1.000 | +25.0% |"


def test_forward_times_the_candidates_on_its_own_inputs(cache, monkeypatch):
    """fa_hw.tensors.check, to_device and choose_auto, without a GPU: the inputs are placed first,
    then the autotuner's timer gets their pointers (q, k, v, O, LSE) and the problem runs the chosen
    config; with issue 38's features, the class and the timer carry them."""
    import numpy as np

    from fa_hw import runtime, tensors

    class Buf:
        count = 0

        def __init__(self, *_):
            Buf.count += 1
            self.handle = 4096 * Buf.count

    class Dev:
        name = NO_TABLE[0]

    monkeypatch.setattr(runtime, "own_stream", lambda: "stream")
    monkeypatch.setattr(runtime, "upload", lambda host, stream: Buf())
    monkeypatch.setattr(runtime, "allocate", lambda nbytes, stream: Buf())
    monkeypatch.setattr(tuned, "device", lambda: Dev())
    monkeypatch.setattr(tuned, "device_arch", lambda: NO_TABLE[1])
    monkeypatch.setattr(autotune, "fingerprint", lambda: "k1")
    seen = []

    def factory(ptrs, stream, features):
        seen.append((ptrs, stream, features))
        return factory_of(FakeTimer(slowest_first), classes)
    classes = []
    monkeypatch.setattr(tensors, "device_timer_factory", factory)
    q = np.ones((2, 3, 4000, 128), np.float16)
    inputs, kind, prob, auto = tensors.check(q, q, q, True, None, "auto")
    assert auto and prob.config == KernelConfig(head_dim=128)  # the seed config until the GPU's choice
    dev = tensors.to_device(inputs, kind, prob)
    assert tensors.choose_auto(dev) is dev.problem
    assert dev.config == tuned.autotune_candidates(128, True, 4096)[-1] and dev.problem.causal
    assert seen == [((dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr), "stream", autotune.Features())]
    # grouped-query K/V (2 Q heads per K/V head), a window and softcap: a class of their own, timed with them
    k = np.ones((2, 2, 4000, 128), np.float16)
    q4 = np.ones((2, 4, 4000, 128), np.float16)
    dev = tensors.to_device(*tensors.check(q4, k, k, True, None, "auto", window=(300, 20), softcap=30.0)[:3])
    tensors.choose_auto(dev)
    assert seen[-1][2] == autotune.Features(2, (300, -1), 30.0)  # causal: the right side is the mask's
    assert dev.problem.heads_k == 2 and dev.problem.window == (300, 20) and dev.problem.softcap == 30.0
    assert classes[-1] == (autotune.ProblemClass.of(8, 4000, 4000, 128, True, seen[-1][2]), (8, 4000, 4000, 128))
    assert classes[-1][0].key == "d128-causal-q4096-k4096-t256-g2-w512_inf-softcap"


@pytest.mark.parametrize("missing, started", [(5, True), (2, True), (1, False), (0, False)])
def test_the_device_timer_compiles_only_what_the_cache_lacks(monkeypatch, missing, started):
    from fa_sim.contract import cubins

    pool = list(dict.fromkeys(tuned.autotune_candidates(128, True, 4096) + [KernelConfig(head_dim=128)]))
    assert len(pool) >= 5
    cached = len(pool) - missing
    have = set(pool[:cached])
    monkeypatch.setattr(cubins, "is_cached", lambda build: build.config in have)
    calls = []
    monkeypatch.setattr(cubins, "compile_many", lambda builds, workers: calls.append(([b.config for b in builds], workers)))
    timer = object.__new__(autotune.DeviceTimer)
    timer.causal, timer.arch, timer.features = True, "sm_90", autotune.Features()
    timer.compile(pool)
    assert calls == ([(pool[cached:], min(len(pool) - cached, os.cpu_count()))] if started else [])


def test_the_device_timer_times_a_median_on_the_capped_launch(monkeypatch):
    """DeviceTimer without a GPU: random inputs fill every buffer (no zeros), the launch is the timed
    shape as one batch of heads, and a batch's reps follow one launch's time."""
    import numpy as np

    from fa_hw import runtime
    from fa_sim.contract import KernelBuild

    memory, copies = {}, []

    class Buf:
        def __init__(self, nbytes):
            self.handle = 1 << 20 * (len(memory) + 1)
            memory[self.handle] = nbytes

    class Stream:
        handle = 7

        def sync(self):
            pass

    def copy(dptr, host, nbytes, stream):
        copies.append((dptr, nbytes))
        return (0,)

    import cuda.bindings.driver as driver

    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", copy)
    monkeypatch.setattr(runtime, "_driver_call", lambda result, what: result)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(runtime, "allocate", lambda nbytes, stream: Buf(nbytes))
    monkeypatch.setattr(autotune, "RANDOM_CHUNK", 1000)
    timer = autotune.DeviceTimer((3, 500, 700, 64), True, stream=Stream())
    q, k, v, o, lse = timer.ptrs
    assert [memory[p] for p in timer.ptrs] == [2 * 3 * 500 * 64, 2 * 3 * 700 * 64, 2 * 3 * 700 * 64,
                                              2 * 3 * 500 * 64, 4 * 3 * 500]
    for p in (q, k, v):  # filled end to end with the random chunk, in chunks of at most 1000 values
        spans = sorted((d - p, n) for d, n in copies if p <= d < p + memory[p])
        assert spans[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert spans[-1][0] + spans[-1][1] == memory[p] and max(n for _, n in spans) == 2000
    plans = []

    class Plan:
        @classmethod
        def make(cls, build, ptrs, problem):
            plans.append((build, ptrs, problem))
            return cls()

        def run(self, stream):
            return 4.0

        def time(self, stream, warmup, reps):
            plans.append((warmup, reps))
            return [3.0] * (reps - 1) + [100.0]
    monkeypatch.setattr(runtime, "LaunchPlan", Plan)
    cfg = KernelConfig.from_tag("m128n64d64w4-swizzled-s2-hf")
    assert timer(cfg) == 3.0
    (build, ptrs, problem), (warmup, reps) = plans
    assert build == KernelBuild(cfg, True, "sm_90") and ptrs == timer.ptrs
    assert (problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k, problem.causal) == (1, 3, 500, 700, True)
    assert problem.scale == 64 ** -0.5 and warmup == autotune.WARMUP and reps == int(autotune.BATCH_MS / 4.0)
    # grouped-query K/V, a window and softcap: K/V buffers of the K/V heads, the launch and build with them
    memory.clear()
    feats = autotune.Features(3, (40, -1), 20.0)
    timer = autotune.DeviceTimer((3, 500, 700, 64), True, stream=Stream(), features=feats)
    assert [memory[p] for p in timer.ptrs] == [2 * 3 * 500 * 64, 2 * 1 * 700 * 64, 2 * 1 * 700 * 64,
                                              2 * 3 * 500 * 64, 4 * 3 * 500]
    plans.clear()
    assert timer(cfg) == 3.0
    (build, ptrs, problem), _ = plans
    assert build == KernelBuild(cfg, True, "sm_90", kv_group=3, window=(40, -1), softcap=20.0)
    assert (problem.heads, problem.heads_k, problem.window, problem.softcap) == (3, 1, (40, -1), 20.0)
    assert build == KernelBuild.of(problem, "sm_90")
    # a bf16 run: the candidates are built and launched as bf16, on bf16 random inputs
    copies.clear()
    timer = autotune.DeviceTimer((3, 500, 700, 64), True, stream=Stream(), features=autotune.Features(dtype="bf16"))
    plans.clear()
    assert timer(cfg) == 3.0
    (build, ptrs, problem), _ = plans
    assert build == KernelBuild(replace(cfg, dtype="bf16"), True, "sm_90") and problem.config.dtype == "bf16"
