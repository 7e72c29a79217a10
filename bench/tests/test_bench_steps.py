"""The step benchmarks without a GPU (SPEC §13's state formats, §14's V4.1): the serving shapes hold
the tokens and active tokens they are named for, the floor moves exactly a step's bytes, each timed
call writes the bytes of an independent one (the spec, or the state format's other calls) on its
input sets, the tables' ratios follow from the rows, the memory table agrees with the batch
builders, and the command line selects and refuses as documented (Triton interpreter on CPU)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from dsv4_compressor.bench import state_steps as S  # noqa: E402
from dsv4_compressor.bench import v41_steps as V  # noqa: E402
from dsv4_compressor.spec.pooling import active_tokens, is_boundary, window_positions  # noqa: E402


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# ---- cases ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, tokens, active", [("c128_prefill_step", 16384, 128), ("c4_prefill_step", 16384, 4096),
                                                  ("c128_decode_step", 64, 1), ("c128_decode_step", 512, 3)])
def test_serving_steps_hold_their_tokens_and_active_windows(name, tokens, active):
    for case in (c for c in S.serving_steps() if (c.name, c.token_num) == (name, tokens)):
        batch = case.batch(np.random.default_rng(1))
        closes = active_tokens(batch.positions, batch.slot_mapping, batch.kv_slot_mapping, case.ratio)
        assert (batch.num_tokens, int(closes.sum())) == (tokens, active), case
        if case.addressing == "ring":  # one ring per request; only each chunk's last C tokens saved
            assert batch.ring_capacity == S.RING_CAPACITY[case.ratio]
            for first, end in zip(batch.query_start_loc[:-1], batch.query_start_loc[1:]):
                saved = np.flatnonzero(batch.save_slot_mapping[first:end] >= 0)
                assert saved.tolist() == list(range(max(0, end - first - batch.ring_capacity), end - first))


def test_mixed_steps_are_a_4096_token_chunk_and_512_decode_tokens():
    for case in (c for c in S.serving_steps() if c.kind == "mixed"):
        batch = case.batch(np.random.default_rng(2))
        chunks = sorted(np.diff(batch.query_start_loc).tolist())
        assert chunks == [1] * 512 + [4096], case


def test_the_pair_is_refused_only_where_a_chunk_outgrows_its_ring():
    rng = np.random.default_rng(3)
    refused = {(c.name, c.token_num, c.addressing): bool(c.pair_refusal(c.batch(rng)))
               for c in S.serving_steps(state_dtypes=("fp32",))}
    assert refused == {key: key[2] == "ring" and key[0] != "c128_decode_step" for key in refused}


@pytest.mark.parametrize("ratio", [1, 2])
def test_v41_sweep_tokens_are_all_boundaries_and_steps_save_each_chunks_tail(ratio):
    rng = np.random.default_rng(4)
    sweep = V.sweeps((ratio,), (1024,), ("fp32",))[0]
    step, block_table, _ = sweep.step(rng)
    assert is_boundary(step.positions, ratio).all() and int(sweep.active(step).sum()) == 1024
    assert len(set(step.kv_slot_mapping.tolist())) == 1024  # distinct entries
    mixed = next(c for c in V.steps((ratio,), ("fp32",)) if c.kind == "mixed")
    step, block_table, _ = mixed.step(rng)
    assert block_table.shape[1] == 1 and len(set(block_table[:, 0].tolist())) == block_table.shape[0]
    assert int(step.save_slot_mapping.__ge__(0).sum()) == 512 + V.RING.ring_capacity  # each decode token + the tail


# ---- the floor -------------------------------------------------------------------------------------------
def _assert_sum_close(actual: float, expected: float, magnitude: float) -> None:
    """``actual`` (fp32 partial sums added in float64) is ``expected`` (the float64 sum) within the
    rounding of an fp32 sum: 2^-23 of ``magnitude``, the sum of the terms' absolute values (a
    tolerance relative to ``expected`` fails where the terms cancel)."""
    assert abs(actual - expected) <= 2.0 ** -23 * magnitude, (actual, expected, magnitude)


def _words(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)).cpu().numpy().copy()


@pytest.mark.parametrize("dtype, addressing", [("bf16", "ring"), ("fp32", "paged")])
def test_the_step_floor_reads_the_step_and_writes_its_saves_and_records(dtype, addressing):
    """Every program's sum is the float64 sum of what it must read, recomputed here through the
    spec's window rule; the saved rows hold the inputs (bf16: truncated); each active token's
    record bytes are written; nothing else changes."""
    case = S.StateCase("c4_mixed", 4, "mixed", 24, addressing, dtype, decode_tokens=8)
    prepared, _ = S.prepare_state(case, _device(), num_sets=1)
    s = prepared.sets[0]
    batch = case.batch(np.random.default_rng(0))  # the metadata prepare_state drew first
    state_before, cache_before = _words(s["state"]), _cache_bytes(s["k_cache"])
    from dsv4_compressor.bench.step_floor import floor_launcher

    plan = S._floor_plan(case, batch, (s["state"].stride(0), s["state"].stride(1)), s["k_cache"].stride(0))
    none = np.full_like(plan.saves, -1)
    reads_only = floor_launcher(replace(plan, saves=none, entries=none),
                                dict(kv=s["kv"], score=s["score"], state=s["state"], block_size=case.block_size,
                                     cache=torch.zeros(16, dtype=torch.uint8, device=_device())), _device())
    reads_only()  # a ring's saves may land on rows the windows read: the sums are checked without them
    assert np.array_equal(_words(s["state"]), state_before)
    values = lambda t: t.float().cpu().numpy().astype(np.float64)  # noqa: E731
    kv_score = values(s["kv_score"])
    state = values(s["state"]).reshape(s["state"].shape)
    config, bs = case.config, case.block_size
    expected, magnitude = kv_score.sum(), np.abs(kv_score).sum()  # every token's kv and score
    pos, valid = window_positions(batch.positions, config)
    for t in np.flatnonzero(batch.active):
        start = batch.positions[batch.query_start_loc[batch.token_to_req_indices[t]]]
        for i in np.flatnonzero(valid[t] & (pos[t] < start)):
            q = int(pos[t, i]) % (batch.ring_capacity or 1 << 62)
            row = state[batch.block_table[batch.token_to_req_indices[t], q // bs], q % bs]
            h = i // case.ratio
            read = np.concatenate([row[h * 512:(h + 1) * 512], row[config.state_width + h * 512:][:512]])
            expected, magnitude = expected + read.sum(), magnitude + np.abs(read).sum()
    assert len(plan.runs) > 0
    _assert_sum_close(reads_only.out.cpu().numpy().astype(np.float64).sum(), expected, magnitude)
    floor = s["floor"]
    floor()
    after = _words(s["state"]).reshape(s["state"].shape[0] * bs, -1)
    inputs = _words(s["kv_score"])
    if dtype == "bf16":
        inputs = (inputs >> 16).astype(np.int16)
    saved = batch.save_slot_mapping >= 0
    assert np.array_equal(after[batch.save_slot_mapping[saved]], inputs[saved])
    others = np.setdiff1d(np.arange(after.shape[0]), batch.save_slot_mapping[saved])
    assert np.array_equal(after[others], state_before.reshape(after.shape)[others])
    cache = _cache_bytes(s["k_cache"])
    written = np.flatnonzero(cache != cache_before)
    entry = s["k_cache"].shape[2]
    slots = batch.kv_slot_mapping[batch.active]
    starts = (slots // batch.entries_per_page) * s["k_cache"].stride(0) + (slots % batch.entries_per_page) * entry
    assert set(written.tolist()) <= {int(b) + j for b in starts for j in range(entry)}
    assert len(written) >= len(starts) * (entry - entry // 256 - 1)  # byte j holds j & 0xFF, zero at j = 0, 256, 512


def test_the_narrow_row_floor_reads_every_row_once_and_writes_each_record():
    """The index key's floor (128-wide rows: several tokens a program, unrolled, a partial last
    program): the programs' sums add up to every row's, each storing token's record bytes are written
    and nothing else is."""
    from dsv4_compressor.bench.step_floor import NARROW_TOKENS_PER_PROGRAM, FloorPlan, FloorShape, floor_launcher

    tokens = NARROW_TOKENS_PER_PROGRAM + 3
    k_pre = torch.randn((tokens, 128), device=_device(), generator=torch.Generator(_device()).manual_seed(0)).to(torch.bfloat16)
    entries = np.array([132 * i if i % 3 else -1 for i in range(tokens)], dtype=np.int64)
    cache = torch.zeros(132 * tokens, dtype=torch.uint8, device=_device())
    plan = FloorPlan(FloorShape(128, 128, True, False, False, 2, 132, False), np.full(tokens, -1), entries,
                     np.zeros(0, dtype=np.int64))
    launch = floor_launcher(plan, dict(kv=k_pre, cache=cache), _device())
    launch()
    _assert_sum_close(launch.out.cpu().numpy().astype(np.float64).sum(), k_pre.double().sum().item(),
                      k_pre.double().abs().sum().item())
    written = cache.cpu().numpy().reshape(tokens, 132)
    for i in range(tokens):
        expected = np.arange(132) & 0xFF if entries[i] >= 0 else np.zeros(132)
        assert np.array_equal(written[i], expected), i


def test_floor_bytes_count_inputs_saves_runs_and_records():
    from dsv4_compressor.bench.step_floor import FloorPlan, FloorShape

    shape = FloorShape(512, 512, True, True, False, 2, 584, True)
    plan = FloorPlan(shape, np.array([3, -1, 7]), np.array([-1, 0, 584]), np.zeros(5, dtype=np.int64))
    # 3 rows of bf16 kv + score read, 2 fp32 rows saved, 5 fp32 runs of kv + score, 2 records and bf16 latents
    assert plan.bytes_moved() == 3 * 2 * 512 * 2 + 2 * 2 * 512 * 4 + 5 * 2 * 512 * 4 + 2 * 584 + 2 * 1024
    with pytest.raises(ValueError, match="FloorShape.reads"):
        FloorShape(512, 512, True, True, False, 3, 584, True)


# ---- the timed calls write the bytes of an independent one ---------------------------------------------------
def _cache_bytes(k_cache: torch.Tensor) -> np.ndarray:
    return k_cache.as_strided((k_cache.shape[0] * k_cache.stride(0),), (1,)).cpu().numpy().copy()


@pytest.mark.parametrize("case", [
    S.StateCase("c4_mixed", 4, "mixed", 12, "ring", "bf16", decode_tokens=8),  # a 4-token chunk: fits the ring
    S.StateCase("c128_decode_step", 128, "decode_step", 8, "ring", "fp32", active=2),
    S.StateCase("c4_prefill_step", 4, "prefill", 16, "paged", "bf16"),
], ids=lambda c: f"{c.name}-{c.variant}")
def test_compress_and_save_and_the_pair_store_the_specs_records(case):
    """The step call and the two calls, each on its own input set, against SPEC §13.4's
    ``compress_and_save`` on NumPy copies of that set: the records the spec writes (the two calls
    save every token, so only the cache is theirs to share with the step)."""
    from dsv4_compressor import spec
    from dsv4_compressor.impl import triton as T

    for name in ("compress_and_save", "save+compress"):
        prepared, refusal = S.prepare_state(case, _device(), num_sets=1)
        assert not refusal
        s = prepared.sets[0]
        k = s["k_cache"]
        expected = _cache_bytes(k)
        spec.compress_and_save(
            *(_numpy(s[n]) for n in ("kv", "score", "ape", "positions", "token_to_req", "query_start_loc",
                                     "slot_mapping", "save_slot_mapping", "block_table")),
            case.block_size, _numpy(s["state"]), _numpy(s["weight"]), S.RMS_NORM_EPS, _numpy(s["cos_sin"]),
            np.lib.stride_tricks.as_strided(expected, k.shape, k.stride()), _numpy(s["kv_slot_mapping"]),
            compress_ratio=case.ratio, layout=case.layout, ring_capacity=case.ring_capacity)
        assert not np.array_equal(_cache_bytes(k), expected)  # the spec wrote records
        S.state_calls(case, T, refusal)[name](s)
        assert np.array_equal(_cache_bytes(k), expected), name


def _numpy(t):
    if t is None:
        return None
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16).copy()
    return t.cpu().numpy().copy()


@pytest.mark.parametrize("case", [V.V41Case("v41_r2_mixed", 2, "mixed", 24, "bf16", decode_tokens=8),
                                  V.V41Case("v41_r1_decode", 1, "decode", 3, "fp32")],
                         ids=lambda c: f"{c.name}-{c.variant}")
def test_the_v41_calls_write_the_specs_bytes(case):
    """``triton`` and ``triton-split`` on an input set against SPEC §14.7's NumPy operator on copies of it."""
    from dsv4_compressor.spec import v41_operator

    for name in ("triton", "triton-split"):
        prepared = V.prepare_v41(case, _device(), num_sets=1)
        s = prepared.sets[0]
        ring2 = case.ratio == 2
        state_np = _numpy(s["state"]) if ring2 else None
        cache_np = _cache_bytes(s["k_cache"])
        k = s["k_cache"]
        cache_view = np.lib.stride_tricks.as_strided(cache_np, k.shape, k.stride())
        latent_np = _numpy(s["latent"])
        state_args = ((_numpy(s["token_to_req"]), _numpy(s["query_start_loc"]), _numpy(s["slot_mapping"]),
                       _numpy(s["save_slot_mapping"]), _numpy(s["block_table"]), V.RING.block_size, state_np)
                      if ring2 else (None,) * 7)
        v41_operator.v41_compress_norm_rope_store(
            _numpy(s["kv"]), _numpy(s["score"]), _numpy(s["positions"]), *state_args, _numpy(s["weight"]),
            V.RMS_NORM_EPS, _numpy(s["cos_sin"]), cache_view, _numpy(s["kv_slot_mapping"]), latent_np,
            compress_ratio=case.ratio, layout=case.layout, ring_capacity=V.RING.ring_capacity if ring2 else None)
        V.v41_calls(case, [V.load_v41_impl(name)])[name](s)
        active = case.active(V.V41Case.step(case, np.random.default_rng(0))[0])
        assert np.array_equal(_cache_bytes(s["k_cache"]), cache_np), name
        assert np.array_equal(_numpy(s["latent"])[active], latent_np[active]), name
        if ring2:
            assert np.array_equal(_numpy(s["state"]), state_np), name


def test_the_v41_copies_repeat_their_step_on_other_state_rows_with_their_own_inputs():
    """``prepare_v41`` beyond its independent steps: set ``k`` and set ``k + INDEPENDENT_SETS`` run
    the same step (positions, requests, query starts, entries) on other state rows (another state
    tensor, or further blocks of the same one), with kv/score of their own."""
    from dsv4_compressor.bench.timing import INDEPENDENT_SETS

    case = V.V41Case("v41_r2_mixed", 2, "mixed", 24, "fp32", decode_tokens=8)
    sets = V.prepare_v41(case, _device(), num_sets=INDEPENDENT_SETS + 2).sets
    for first, copy in ((sets[0], sets[INDEPENDENT_SETS]), (sets[1], sets[INDEPENDENT_SETS + 1])):
        for name in ("positions", "token_to_req", "query_start_loc", "kv_slot_mapping"):
            assert np.array_equal(_numpy(first[name]), _numpy(copy[name])), name
        rows = lambda s: (s["state"].data_ptr(), _numpy(s["block_table"]).tobytes())  # noqa: E731
        assert rows(first) != rows(copy)
        assert not np.array_equal(_numpy(copy["kv"]), _numpy(first["kv"]))


def test_the_v41_index_key_call_writes_the_specs_bytes():
    from dsv4_compressor.spec import v41_operator

    case = V.index_key_sweeps((2,), (3,), ("indexer_mxfp4",))[0]
    prepared = V.prepare_v41(case, _device(), num_sets=1)
    s = prepared.sets[0]
    cache_np = _cache_bytes(s["k_cache"])
    k = s["k_cache"]
    v41_operator.v41_index_key_store(_numpy(s["k_pre"]), _numpy(s["positions"]), _numpy(s["kv_slot_mapping"]),
                                     _numpy(s["weight"]), V.RMS_NORM_EPS, _numpy(s["cos_sin"]),
                                     np.lib.stride_tricks.as_strided(cache_np, k.shape, k.stride()),
                                     compress_ratio=2, layout="indexer_mxfp4")
    V.v41_calls(case, [V.load_v41_impl("triton")])["triton"](s)
    assert np.count_nonzero(cache_np) and np.array_equal(_cache_bytes(s["k_cache"]), cache_np)


def test_a_module_attribute_with_check_data_makes_its_first_call_checked(monkeypatch):
    """``module:attribute`` of a class: instantiated; the first call on the checked object, the rest
    on a copy with ``check_data = False``; a refusal (NotImplementedError) reads "unsupported"."""
    import sys
    import types

    from dsv4_compressor.bench.step_runner import dry_run

    seen = []

    class Peer:
        check_data = True

        def v41_compress_norm_rope_store(self, kv, *args, **kwargs):
            seen.append(self.check_data)
            if kv.dtype == torch.bfloat16:
                raise NotImplementedError("bf16 kv")

    monkeypatch.setitem(sys.modules, "peer_for_test", types.SimpleNamespace(Peer=Peer))
    impl = V.load_v41_impl("peer_for_test:Peer")
    for dtype in ("fp32", "bf16"):
        case = V.V41Case("v41_r1_decode", 1, "decode", 3, dtype)
        rows = dry_run(V.prepare_v41(case, _device(), num_sets=3), V.v41_calls(case, [impl]))
        error = next(r.error for r in rows if r.implementation == "peer_for_test:Peer")
        assert (error == "") == (dtype == "fp32") and (dtype == "fp32" or error.startswith("unsupported: "))
    assert seen[:3] == [True, False, False]
    with pytest.raises(ValueError, match="--impl: expected triton, triton-split, cutedsl or module:attribute"):
        V.load_v41_impl("vllm")



def test_the_timed_calls_are_warmed_up_interleaved_per_trial_and_their_errors_reported(monkeypatch):
    """:func:`run_calls` (the shared :func:`.sweep.time_calls`, its timers stood in for): every call
    warmed up on every set, then each trial times every runnable call in turn, eager then graph; a
    string or a call that raises gets its error in both modes ("unsupported: ..." for a refusal) and
    is not timed; the medians and the bandwidth follow from the samples."""
    from dsv4_compressor.bench import sweep
    from dsv4_compressor.bench.step_runner import StepPrepared, run_calls
    from dsv4_compressor.bench.sweep import RowLabel

    log, made = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    durations = {"fast": [2.0, 4.0, 3.0], "slow": [8.0, 6.0, 10.0]}

    def time_eager(call, sets, iters):  # the first pass (the iteration count's) 1 µs, then durations in turn
        name = call.__name__
        passes = sum(1 for e in log if e[:2] == ("eager", name))
        log.append(("eager", name, iters))
        return (durations[name][passes - 1] if passes else 1.0), 0.5

    monkeypatch.setattr(sweep, "time_eager", time_eager)

    def capture_graph(call, sets, count):
        made.append(call.__name__)
        return call.__name__

    monkeypatch.setattr(sweep, "capture_graph", capture_graph)
    monkeypatch.setattr(sweep, "time_graph", lambda graph, count, replays: log.append(("graph", graph, replays)) or 1.0)

    def call(name):
        def timed(s):
            log.append(("call", name, s))
        timed.__name__ = name
        return timed

    def refusal(s):
        raise NotImplementedError("bf16 kv")

    def broken(s):
        raise RuntimeError("out of memory\nmore")

    calls = {"fast": call("fast"), "ring": "unsupported: a chunk longer than its ring", "refused": refusal,
             "broken": broken, "slow": call("slow")}
    label = RowLabel("c128_mixed", "step", 4608, 35, "ring fp32")
    rows = run_calls(StepPrepared(label, ["a", "b"], 4000), calls, ["eager", "graph"], copy_gbs=2.0, trials=3)
    assert [(r.implementation, r.mode) for r in rows] == [(n, m) for n in calls for m in ("eager", "graph")]
    errors = {r.implementation: r.error for r in rows}
    assert errors == {"fast": "", "ring": calls["ring"], "refused": "unsupported: NotImplementedError: bf16 kv",
                      "broken": "RuntimeError: out of memory", "slow": ""}
    assert made == ["fast", "slow"]
    warm_up = [e for e in log if e[0] == "call"]
    assert warm_up[:2] == [("call", "fast", "a"), ("call", "fast", "b")]
    trials = [e[:2] for e in log if e[0] != "call"][2:]  # after each call's one timed pass
    assert trials == [("eager", "fast"), ("graph", "fast"), ("eager", "slow"), ("graph", "slow")] * 3
    iterations = 2000  # a 1 µs pass: the most calls a trial makes
    assert {e[2] for e in log if e[0] == "eager"} == {2, iterations}
    assert {e[2] for e in log if e[0] == "graph"} == {iterations // 200}
    by = {(r.implementation, r.mode): r for r in rows}
    assert (by["fast", "eager"].median_us, by["fast", "eager"].low_us, by["fast", "eager"].high_us) == (3.0, 2.0, 4.0)
    assert (by["slow", "eager"].median_us, by["slow", "eager"].host_us) == (8.0, 0.5)
    assert by["slow", "graph"].median_us == 1.0 and by["slow", "graph"].host_us is None
    assert by["fast", "eager"].gbs == pytest.approx(4000 / 3e-6 / 1e9)
    assert by["fast", "eager"].pct_copy == pytest.approx(100 * 4000 / 3e-6 / 1e9 / 2.0)
    assert all(r.variant == "ring fp32" and r.active == 35 for r in rows)
    assert all(r.median_us is None for r in rows if r.error)


# ---- tables, memory, command line ------------------------------------------------------------------------------
def test_step_tables_state_speedups_and_floor_ratios_from_the_rows():
    from dsv4_compressor.bench.report import step_tables
    from dsv4_compressor.bench.sweep import Row

    def row(impl, us, error=""):
        return Row("c128_mixed", "step", 4608, 35, impl, "graph", us, us, us, None, 1000, 1.0, 2.0, error, "ring fp32")

    text = step_tables([row("compress_and_save", 12.0), row("save+compress", None, "unsupported: a chunk"),
                        row("floor", 8.0)], "save+compress", 4000.0)
    line = next(l for l in text.splitlines() if l.startswith("| 4608"))
    assert line.split(" | ")[3:6] == ["12.00", "unsupported", "8.00"]
    assert "1.50x" in line  # 12 / 8
    text = step_tables([row("compress_and_save", 12.0), row("save+compress", 18.0), row("floor", 8.0)], "save+compress",
                       4000.0)
    assert "1.50x" in next(l for l in text.splitlines() if l.startswith("| 4608")).split(" | ")[6]  # 18 / 12


def test_ring_memory_is_the_ring_builders_and_paged_memory_the_live_windows_blocks():
    from dsv4_compressor.bench.state_memory import formats, live_rows_paged
    from dsv4_compressor.spec import batch as B

    for f in formats():
        if f.ring_capacity is not None and f.ratio in (4, 128):
            batch = B.build_ring_batch([B.Request(3 * f.ring_capacity, 1)], compress_ratio=f.ratio,
                                       ring_capacity=f.ring_capacity, block_size=f.block_size, entries_per_page=4,
                                       rng=np.random.default_rng(0), spare_state_blocks=0)
            assert batch.num_state_blocks * f.block_size == f.ring_capacity, f
    for window, ratio, bs in ((128, 128, 8), (8, 4, 4), (8, 4, 16), (2, 2, 8), (2, 2, 2)):
        worst = 0  # brute force: at each position, the blocks of the rows a window still to be pooled reads
        for p in range(window, 4 * window * bs):
            boundaries = [q for q in range(p, p + ratio) if (q + 1) % ratio == 0]
            rows = {r for q in boundaries for r in range(q - window + 1, q + 1) if 0 <= r <= p}  # SPEC §5's rows
            worst = max(worst, len({r // bs for r in rows}) * bs)
        assert live_rows_paged(window, ratio, bs) == worst, (window, ratio, bs)


def test_the_command_line_refuses_before_any_gpu_work(capsys):
    from dsv4_compressor.bench import steps

    for argv, message in ((["state", "--cases", "sweeps"], "--cases expected"), (["v41", "--ratio", "4"], "--ratio"),
                          (["v41", "--sets", "0"], "--sets expected")):
        assert steps.main(argv) == 2 and message in capsys.readouterr().err
    assert steps.main(["memory"]) == 0 and "V4.1 ratio 2" in capsys.readouterr().out


def test_the_command_line_selects_its_cases():
    from dsv4_compressor.bench import steps

    args = steps.parser().parse_args(["state", "--cases", "serving", "--ratio", "4", "--addressing", "ring"])
    cases = steps.state_cases(args)
    assert {(c.name, c.addressing, c.state_dtype) for c in cases} == {
        (n, "ring", d) for n in ("c4_prefill_step", "c4_mixed") for d in ("fp32", "bf16")}
    args = steps.parser().parse_args(["v41", "--cases", "sweeps", "index-key", "--ratio", "2", "--sizes", "1", "8"])
    cases = steps.v41_cases(args)
    assert {(c.operation, c.token_num, c.variant) for c in cases} == {
        *(("compress", n, f"{d} kv/score") for n in (1, 8) for d in ("fp32", "bf16")),
        *(("index_key", n, layout) for n in (1, 8) for layout in ("indexer_fp8", "indexer_mxfp4"))}


def test_a_dry_run_calls_every_implementation(capsys):
    from dsv4_compressor.bench import steps

    assert steps.main(["v41", "--dry-run", "--cases", "index-key", "--ratio", "1", "--sizes", "2", "--layout",
                       "indexer_fp8"]) == 0
    out = capsys.readouterr().out
    assert "case v41_r1_index_key indexer_fp8: 2 tokens, 2 active" in out
    assert "v41_r1_index_key indexer_fp8 n=3 active=3 triton: ok" in out and "floor: ok" in out


def test_a_profile_run_makes_each_call_once_inside_the_range_after_warming_it_up(capsys):
    """``--profile``: every call that can run the step is warmed up on each input set, then called once
    on the last set inside the profiler's range (and nothing else is); a refusal is named, not called."""
    import contextlib

    from dsv4_compressor.bench import steps
    from dsv4_compressor.bench.step_runner import StepPrepared

    log, inside = [], []

    @contextlib.contextmanager
    def profiled():
        inside.append(True)
        yield
        inside.pop()

    def call(name):
        return lambda s: log.append((name, s, bool(inside)))

    def prepare(case, device, sets):
        assert (device, sets) == ("cpu", 2)
        return StepPrepared(None, ["set0", "set1"], 0), {"compress_and_save": call("step"),
                                                           "save+compress": "cannot", "floor": call("floor")}

    case = S.serving_steps(addressing=("ring",), state_dtypes=("fp32",))[0]
    assert steps.profile_run([case], prepare, device="cpu", profiled=profiled) == 0
    assert log == [("step", "set0", False), ("step", "set1", False), ("step", "set1", True),
                   ("floor", "set0", False), ("floor", "set1", False), ("floor", "set1", True)]
    assert "save+compress: skipped (cannot)" in capsys.readouterr().out
    assert steps.parser().parse_args(["state", "--profile"]).profile


def test_the_state_runner_takes_the_tuners_settings_by_name():
    """``--impl cutedsl-<setting>``: the tuner's variant (its forced path and policy); a name the tuner
    does not generate is refused, naming it."""
    pytest.importorskip("cutlass")
    from dsv4_compressor.bench.steps import _tuner_setting

    variant = _tuner_setting("cutedsl-split_generic+split_runs=64")
    assert variant.c128_path == "split_generic" and variant.policy.split_runs == 64
    with pytest.raises(ValueError, match="cutedsl-split_generic\\+no_such_field=1"):
        _tuner_setting("cutedsl-split_generic+no_such_field=1")
