"""SPEC §13's state formats in the CuTe DSL kernels, checked on CPU (no GPU needed).

- the configurations: :class:`StateFormat` validates its fields, the default format keeps the
  kernels' names, the save takes no ring, the cluster and handoff kernels refuse a non-default
  format and the pipelined kernel a bf16 one, a bf16 state keeps the C128 kv rows in registers;
- the PTX list holds every option of the save, C4, indexer and split compress kernels and every
  fp32 option of the pipelined kernel, and each such variant compiles for sm_90a and passes SPEC
  §2's PTX rules, with the instructions its format implies (a ring: a remainder per lookup; a bf16
  state: widening conversions on read, ``cvt.rn.bf16x2.f32`` on save; ``ape_at="compress"``: the
  save adds nothing, the pipelined kernel adds ``ape`` to each read-back score);
- dispatch: C4 and the indexer take every format, a formatted C128 call under ``auto`` takes
  ``fused_pipelined`` for an fp32 state and ``split_generic`` for a bf16 one, a forced path that
  cannot take the format is refused before any launch;
- the calls (TVM-FFI stubbed): the kernels get ``ape`` and ``ring_capacity`` after their other
  arguments exactly when the format is not the default; SPEC §9's refusals come before any launch.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor.impl import ptx_rules  # noqa: E402
from dsv4_compressor.impl.cutedsl import api  # noqa: E402
from dsv4_compressor.impl.cutedsl.config import (DEFAULT_STATE, C4Config, C128PoolConfig, EntryFormat,  # noqa: E402
                                                 FusedClusterConfig, FusedPipelinedConfig, IndexerConfig, SaveConfig,
                                                 StateFormat)
from dsv4_compressor.impl.cutedsl.host.paths import PATHS, choose  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY  # noqa: E402
from dsv4_compressor.impl.cutedsl.ptx import compile_variant, kernel_configs, streams_rows  # noqa: E402
from dsv4_compressor.spec import batch as spec_batch  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402
from ffi_stub import stubbed_calls  # noqa: E402

BF16_RING_APE = StateFormat("bfloat16", "compress", True)
ENTRY = EntryFormat("flashmla_fp8", 64, "bfloat16", 16)


# ---- configurations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, message", [("dtype", "float16", "state dtype"), ("ape_at", "pool", "ape_at"),
                                                    ("ring", 1, "ring")])
def test_state_format_rejects_bad_fields(field, value, message):
    with pytest.raises(ValueError, match=f"^{message}: expected"):
        StateFormat(**{field: value})


def test_the_default_format_keeps_the_kernel_names():
    assert DEFAULT_STATE.tag == "" and C4Config(4, ENTRY).tag == C4Config(4, ENTRY, state=StateFormat()).tag
    assert C4Config(4, ENTRY, state=BF16_RING_APE).tag.endswith("_sbf16_apec_ring")
    assert StateFormat("float32", "save", True).tag == "_sf32_ring"


def test_configs_refuse_formats_their_kernels_do_not_take():
    with pytest.raises(ValueError, match=r"^state\.ring: expected False"):
        SaveConfig(4, 4, True, state=StateFormat(ring=True))
    with pytest.raises(ValueError, match=r"^pool\.state: expected the default"):
        FusedClusterConfig(C128PoolConfig(8, 1, state=StateFormat(ape_at="compress")), ENTRY)
    with pytest.raises(ValueError, match="^kv_in_smem: expected False with a bf16 state"):
        C128PoolConfig(8, 1, kv_in_smem=True, state=StateFormat("bfloat16"))
    with pytest.raises(ValueError, match=r"^pool\.state: expected a float32 StateFormat"):
        FusedPipelinedConfig(C128PoolConfig(8, 8, state=StateFormat("bfloat16", ring=True)), ENTRY)
    every_fp32 = StateFormat("float32", "compress", True, True)
    staged = FusedPipelinedConfig(C128PoolConfig(8, 8, kv_in_smem=True, state=every_fp32), ENTRY)
    assert staged.state == every_fp32 and staged.tag.endswith("_sf32_apec_ring_step_flashmla_fp8_B64_wbf16_a16_occ3")
    with pytest.raises(ValueError, match="^state: expected a StateFormat"):
        IndexerConfig(4, 16, "indexer_fp8", False, 64, "bfloat16", state="bfloat16")


# ---- the PTX list ---------------------------------------------------------------------------------------
def _formatted_variants() -> list:
    out = []
    for kernel, config in kernel_configs():
        state = getattr(config, "state", None)
        if state is not None and not state.is_default:
            out.append((kernel, config))
    return out


def test_the_ptx_list_has_every_option_of_each_formatted_kernel():
    variants = _formatted_variants()
    by_kernel = {}
    for kernel, config in variants:
        by_kernel.setdefault((kernel, getattr(config, "ratio", None)), set()).add(config.state)
    options = {StateFormat("bfloat16"), StateFormat(ape_at="compress"), StateFormat(ring=True), BF16_RING_APE}
    for key in (("c4", None), ("split_pool", None), ("indexer", 4), ("indexer", 128)):
        assert options <= by_kernel[key], key
    assert {StateFormat("bfloat16"), StateFormat(ape_at="compress"),
            StateFormat("bfloat16", "compress")} <= by_kernel[("save", None)]
    fp32 = {StateFormat(ape_at="compress"), StateFormat(ring=True), StateFormat(rows_from_inputs=True),
            StateFormat(ring=True, rows_from_inputs=True), StateFormat("float32", "compress", True, True)}
    assert fp32 <= by_kernel[("fused_pipelined", None)]
    assert all(state.dtype == "float32" for state in by_kernel[("fused_pipelined", None)])
    assert not any(kernel in ("fused_cluster", "fused_handoff") for kernel, _ in variants)


def _body(ptx: str) -> str:
    return "\n".join(line.split("//")[0] for line in ptx.split(".entry", 1)[1].splitlines())


@pytest.fixture(scope="module")
def formatted_ptx():
    wanted = {("c4", 4, BF16_RING_APE), ("c4", 4, StateFormat(ring=True)), ("split_pool", 8, BF16_RING_APE),
              ("split_pool", 8, StateFormat(ape_at="compress")), ("indexer", 16, BF16_RING_APE),
              ("indexer", 8, StateFormat(ring=True)), ("save", 4, StateFormat("bfloat16", "compress")),
              ("save", 4, StateFormat("bfloat16")), ("save", 4, StateFormat(ape_at="compress")),
              ("fused_pipelined", 8, StateFormat(ring=True)), ("fused_pipelined", 8, StateFormat(ape_at="compress"))}
    out = []
    for kernel, config in _formatted_variants():
        if (kernel, config.block_size, config.state) in wanted and getattr(config, "pdl", True):
            out.append((kernel, config, compile_variant(kernel, config).__ptx__))
    assert len(out) >= len(wanted)
    return out


def test_formatted_variants_pass_the_ptx_rules(formatted_ptx):
    for kernel, config, ptx in formatted_ptx:
        report = ptx_rules.check_ptx("cutedsl", config.tag, ptx, require_target="sm_90a",
                                     require_vector_loads=streams_rows(kernel, config))
        assert report.ok, (config.tag, report.violations)
        assert "ld.local" not in ptx and "st.local" not in ptx, config.tag


def test_the_format_shows_in_the_ptx(formatted_ptx):
    for kernel, config, ptx in formatted_ptx:
        body = _body(ptx)
        state = config.state
        remainders = len(re.findall(r"\brem\.[su]64\b", body))
        if kernel != "save":
            assert (remainders > 0) == state.ring, config.tag  # q mod C per lookup, only in a ring
        widened = len(re.findall(r"cvt\.f32\.bf16", body))
        if kernel in ("c4", "split_pool") and state.dtype == "bfloat16":
            assert widened >= 16, config.tag  # 4 channels of kv and score, row by row
        if kernel == "fused_pipelined":  # ape_at="compress": one add a read-back score channel, 8 rows x 4
            default = replace(config, pool=replace(config.pool, state=DEFAULT_STATE))
            adds = [len(re.findall(r"\badd\.rn\.f32\b", _body(text)))
                    for text in (ptx, compile_variant(kernel, default).__ptx__)]
            assert adds[0] - adds[1] == 32 * (state.ape_at == "compress"), (config.tag, adds)
        if kernel == "save":
            rounded = len(re.findall(r"cvt\.rn\.bf16x2\.f32", body))
            assert (rounded > 0) == (state.dtype == "bfloat16"), config.tag
            assert ("add.rn.f32" in body) == (state.ape_at == "save"), config.tag


# ---- dispatch ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", [StateFormat("bfloat16"), StateFormat(ape_at="compress"), StateFormat(ring=True),
                                   StateFormat(ring=True, rows_from_inputs=True), BF16_RING_APE])
def test_a_formatted_c128_call_takes_a_path_that_takes_it(state):
    fp32 = state.dtype == "float32"
    for tokens in (1, 64, 100000):  # the persistent grid for an fp32 state whatever T, else the split path
        assert choose("auto", 128, 512, tokens, 8, DEFAULT_POLICY, state).name == (
            "fused_pipelined" if fp32 else "split_generic")
        assert choose("auto", 128, 512, tokens, 8, DEFAULT_POLICY).name != "split_generic"
    assert choose("split_block8", 128, 512, 1, 8, DEFAULT_POLICY, state).name == "split_block8"
    assert choose("auto", 4, 512, 1, 4, DEFAULT_POLICY, state).name == "c4"
    assert choose("auto", 128, 128, 1, 8, DEFAULT_POLICY, state).name == "indexer"
    refused = ("fused_cluster", "fused_handoff") if fp32 else ("fused_cluster", "fused_handoff", "fused_pipelined")
    for name in refused:
        assert not PATHS[name].takes(state)
        with pytest.raises(ValueError, match=f"^c128_path: expected a path that takes SPEC §13's state formats.*"
                                             f"got '{name}'"):
            choose(name, 128, 512, 1, 8, DEFAULT_POLICY, state)
    if fp32:
        assert choose("fused_pipelined", 128, 512, 1, 8, DEFAULT_POLICY, state).name == "fused_pipelined"


# ---- the calls, TVM-FFI stubbed ---------------------------------------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    return stubbed_calls(monkeypatch, api)[0]


def _call(ratio: int, *, bf16: bool, ape_at: str, ring: int | None, head: int = 512):
    """A small step's torch arguments (CPU tensors stand for CUDA ones under the stubs)."""
    rng = np.random.default_rng(7)
    bs = {4: 4, 128: 8}[ratio]
    requests = [Request(ratio * 3 - 1, 1), Request(0, ratio)]
    b = spec_batch.build_batch(requests, compress_ratio=ratio, block_size=bs, entries_per_page=2, rng=rng)
    if ring is not None:
        b = spec_batch.build_ring_batch(requests, compress_ratio=ratio, ring_capacity=ring, block_size=bs,
                                        entries_per_page=2, rng=rng)
    sw = (2 if ratio == 4 else 1) * head
    state = torch.zeros((b.num_state_blocks, bs, 2 * sw), dtype=torch.bfloat16 if bf16 else torch.float32)
    layout = "flashmla_fp8" if head == 512 else "indexer_fp8"
    entry = 584 if head == 512 else 132
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    args = [state, t(b.token_to_req_indices), t(b.positions), t(b.slot_mapping), t(b.block_table), bs,
            torch.ones(head, dtype=torch.bfloat16), 1e-6, torch.zeros((4096, 64)),
            torch.zeros((b.num_pages, 4, entry), dtype=torch.uint8), t(b.kv_slot_mapping)]  # 16-byte page strides
    kwargs = dict(compress_ratio=ratio, layout=layout, ape=torch.zeros((ratio, sw)) if ape_at == "compress" else None,
                  ape_at=ape_at, ring_capacity=ring)
    if ratio == 128 and head == 512:
        kwargs["workspace"] = torch.empty((len(b.positions), 512))
    return args, kwargs, b


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16, ape_at, ring", [(True, "save", False), (False, "compress", False),
                                                (False, "save", True), (True, "compress", True)])
def test_formatted_calls_launch_with_ape_and_ring_capacity(launches, ratio, head, bf16, ape_at, ring):
    capacity = {4: 8, 128: 128}[ratio] if ring else None
    args, kwargs, _ = _call(ratio, bf16=bf16, ape_at=ape_at, ring=capacity, head=head)
    api.compress_norm_rope_store(*args, **kwargs)
    kinds = [kind for kind, _, _ in launches]
    c128 = ["split_pool", "split_store"] if bf16 else ["fused_pipelined"]
    assert kinds == {(4, 512): ["c4"], (128, 512): c128}.get((ratio, head), ["indexer"])
    kind, config, call = launches[0]
    assert config.state == StateFormat("bfloat16" if bf16 else "float32", ape_at, ring)
    ape, ring_capacity, kv, score, query_start_loc = call[-5:]  # the last three: the step call's only
    assert ring_capacity == (capacity or 0)
    assert (ape is not None) == (ape_at == "compress")
    assert (kv, score, query_start_loc) == (None, None, None)


@pytest.mark.parametrize("ratio", [4, 128])
def test_default_calls_launch_as_before(launches, ratio):
    args, kwargs, _ = _call(ratio, bf16=False, ape_at="save", ring=None)
    api.compress_norm_rope_store(*args, **kwargs)
    kind, config, call = launches[0]
    if ratio == 4:  # nine tensors, eps and fp8_inv, then None for every SPEC §13 parameter of the entry
        assert kind == "c4" and config.state == DEFAULT_STATE and len(call) == 16 and call[11:] == (None,) * 5
    else:  # auto's fused paths, SPEC §3's state
        assert kind.startswith("fused") and config.pool.state == DEFAULT_STATE


def test_the_pipelined_kernel_of_the_default_state_takes_none_for_every_format_argument(launches):
    args, kwargs, _ = _call(128, bf16=False, ape_at="save", ring=None)
    api.compress_norm_rope_store(*args, **kwargs, c128_path="fused_pipelined")
    (kind, config, call), = launches
    # nine tensors, eps, fp8_inv and the grid, then None for every SPEC §13 parameter of its entry
    assert kind == "fused_pipelined" and config.state == DEFAULT_STATE and len(call) == 17
    assert call[12:] == (None,) * 5 and call[11] >= 1


def test_formatted_saves_take_no_ape_with_ape_at_compress(launches):
    kv_score = torch.zeros((3, 2048))
    state = torch.zeros((4, 4, 2048), dtype=torch.bfloat16)
    positions, slots = torch.tensor([0, 1, 2]), torch.tensor([0, 1, -1])
    api.save_partial_states(kv_score, None, positions, slots, state, 4, ape_at="compress", ring_capacity=8)
    (kind, config, call), = launches
    assert kind == "save" and config.state == StateFormat("bfloat16", "compress") and call[1] is None


@pytest.mark.parametrize("change, message", [
    (dict(ape=None, ape_at="compress"), "^ape: expected"),
    (dict(ape_at="later"), "^ape_at: expected"),
    (dict(ring_capacity=6), "^ring_capacity: expected"),
    (dict(c128_path="fused_cluster"), "^c128_path: expected a path that takes SPEC §13's state formats"),
])
def test_refusals_come_before_any_launch(launches, change, message):
    args, kwargs, _ = _call(128, bf16=True, ape_at="compress", ring=None)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        api.compress_norm_rope_store(*args, **kwargs)
    assert launches == []


# ---- bound layers (TVM-FFI stubbed) ----------------------------------------------------------------------
def _bind(args, kwargs):
    state, _, _, _, _, bs, weight, eps, cos_sin, k_cache, _ = args
    return api.bind(state, k_cache, weight, cos_sin, block_size=bs, compress_ratio=kwargs["compress_ratio"],
                    rms_norm_eps=eps, layout=kwargs["layout"], ape_at=kwargs["ape_at"],
                    ring_capacity=kwargs["ring_capacity"])


FORMATS = [(True, "save", False), (False, "compress", False), (False, "save", True), (True, "compress", True)]


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16, ape_at, ring", FORMATS)
def test_a_bound_layer_launches_what_the_unbound_call_does(launches, monkeypatch, ratio, head, bf16, ape_at, ring):
    monkeypatch.setattr(api, "_BOUND_LAUNCHES", {})
    args, kwargs, _ = _call(ratio, bf16=bf16, ape_at=ape_at, ring={4: 8, 128: 128}[ratio] if ring else None, head=head)
    workspace = kwargs.pop("workspace", None)
    api.compress_norm_rope_store(*args, **kwargs, workspace=workspace)
    unbound = list(launches)
    layer = _bind(args, kwargs)
    per_token = (args[1], args[2], args[3], args[4], args[10])
    for _ in range(3):  # validated, then (ape added at the save) the eager path
        layer.compress_norm_rope_store(*per_token, ape=kwargs["ape"], workspace=workspace)
    assert launches == unbound * 4
    if ape_at == "compress":  # the compress's ape is per call: a layer without it is refused by name
        with pytest.raises(ValueError, match="^ape: expected"):
            layer.compress_norm_rope_store(*per_token, workspace=workspace)
    else:
        assert layer._launches.get(len(args[2])) is not None


@pytest.mark.parametrize("bf16, ape_at, ring", FORMATS)
def test_a_bound_save_takes_the_layers_format(launches, monkeypatch, bf16, ape_at, ring):
    monkeypatch.setattr(api, "_BOUND_LAUNCHES", {})
    args, kwargs, _ = _call(4, bf16=bf16, ape_at=ape_at, ring=8 if ring else None)
    kv_score, ape = torch.zeros((len(args[2]), 2048)), torch.zeros((4, 1024))
    api.save_partial_states(kv_score, ape, args[2], args[3], args[0], 4, ape_at=ape_at, ring_capacity=8 if ring else None)
    unbound = list(launches)
    layer = _bind(args, kwargs)
    for _ in range(3):  # validated, then the eager path
        layer.save_partial_states(kv_score, ape, args[2], args[3])
    assert launches == unbound * 4
    kind, config, call = launches[0]
    assert kind == "save" and config.state == StateFormat("bfloat16" if bf16 else "float32", ape_at)
    assert (call[1] is None) == (ape_at == "compress")


@pytest.mark.parametrize("change, message", [(dict(ape_at="later"), "^ape_at: expected"),
                                             (dict(ring_capacity=6), "^ring_capacity: expected")])
def test_bind_refuses_a_bad_format_by_name(change, message):
    args, kwargs, _ = _call(4, bf16=True, ape_at="save", ring=None)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        _bind(args, kwargs)
