"""``save_partial_states`` (Triton) against the NumPy spec, byte for byte over the whole state
cache allocation (padded rows and blocks hold NaN canaries that must survive)."""

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.impl import triton as triton_impl
from dsv4_compressor.impl.triton import SaveConfig
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_test_scenarios import first_difference

from dsv4_compressor.conformance.buffers import Buffer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(ratio, block_size, seed, *, row_pad=0, block_pad_rows=0, num_padding=0, unsaved_fraction=0.0, requests=None,
          head_dim=512):
    rng = np.random.default_rng(seed)
    requests = requests or [Request(3, 9), Request(4 * ratio - 1, 1), Request(ratio + 2, 2)]
    b = spec_batch.build_batch(requests, compress_ratio=ratio, block_size=block_size, entries_per_page=2, rng=rng,
                               num_padding=num_padding, padding_at_end=False, unsaved_fraction=unsaved_fraction)
    state = spec_batch.random_state_cache(b.num_state_blocks, block_size, ratio, rng, row_pad=row_pad,
                                          block_pad_rows=block_pad_rows, head_dim=head_dim)
    kv_score = spec_batch.random_kv_score(b.num_tokens, ratio, rng, head_dim=head_dim)
    ape = spec_batch.random_ape(ratio, rng, head_dim=head_dim)
    return b, state, kv_score, ape


def _run(b, state, kv_score, ape, config=None):
    spec_owner, spec_state = Buffer.of(state).numpy_copy()
    spec.save_partial_states(kv_score, ape, b.positions, b.slot_mapping, spec_state, b.block_size)
    raw, state_t = Buffer.of(state).torch_copy(DEVICE)
    triton_impl.save_partial_states(
        torch.from_numpy(kv_score).to(DEVICE), torch.from_numpy(ape).to(DEVICE), torch.from_numpy(b.positions).to(DEVICE),
        torch.from_numpy(b.slot_mapping).to(DEVICE), state_t, b.block_size, config=config,
    )
    return spec_owner, raw.cpu().numpy()


CASES = {
    "c4_bs4_padded_rows_and_blocks": dict(ratio=4, block_size=4, row_pad=4, block_pad_rows=1, num_padding=3),
    "c4_bs16_unsaved_tokens": dict(ratio=4, block_size=16, unsaved_fraction=0.3, num_padding=1),
    "c128_bs8": dict(ratio=128, block_size=8, row_pad=8, num_padding=2),
    "c128_bs4_block_padding": dict(ratio=128, block_size=4, block_pad_rows=3, num_padding=1),
    # the indexer's state rows (SPEC §12): 512 floats for C4, 256 for C128
    "indexer_c4_bs16": dict(ratio=4, block_size=16, row_pad=4, num_padding=2, head_dim=128),
    "indexer_c4_bs5_block_padding": dict(ratio=4, block_size=5, block_pad_rows=1, unsaved_fraction=0.3, head_dim=128),
    "indexer_c128_bs8": dict(ratio=128, block_size=8, row_pad=8, num_padding=2, head_dim=128),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("config", [None, SaveConfig(block=128, num_warps=1)], ids=["default", "block128_w1"])
def test_bytes_identical_to_spec(name, config):
    b, state, kv_score, ape = _case(seed=len(name), **CASES[name])
    assert np.any(b.slot_mapping < 0) and np.any(b.slot_mapping >= 0)
    expected, got = _run(b, state, kv_score, ape, config)
    assert np.array_equal(expected, got), first_difference(expected, got)


def test_nothing_written_for_padding_only_batches():
    b, state, kv_score, ape = _case(4, 4, 5)
    b.slot_mapping[:] = -1
    expected, got = _run(b, state, kv_score, ape)
    assert np.array_equal(expected, got) and np.array_equal(got, Buffer.of(state).owner)


@pytest.mark.parametrize("mutation, message", [
    (lambda a: a.update(kv_score=a["kv_score"].double()), "kv_score"),
    (lambda a: a.update(ape=a["ape"][:, :100]), "ape"),
    (lambda a: a.update(positions=a["positions"].int()), "positions"),
    (lambda a: a.update(slot_mapping=a["slot_mapping"][1:]), "slot_mapping"),
    (lambda a: a.update(block_size=0), "block_size"),
    (lambda a: a.update(state_cache=torch.zeros(a["state_cache"].shape[0], 4, 2050, device=DEVICE)[:, :, :2048]), "state_cache"),
], ids=["kv_score_dtype", "ape_width", "positions_dtype", "slot_mapping_length", "block_size", "state_stride"])
def test_invalid_arguments_raise_before_writing(mutation, message):
    b, state, kv_score, ape = _case(4, 4, 6)
    _, state_t = Buffer.of(state).torch_copy(DEVICE)
    args = dict(kv_score=torch.from_numpy(kv_score).to(DEVICE), ape=torch.from_numpy(ape).to(DEVICE),
                positions=torch.from_numpy(b.positions).to(DEVICE), slot_mapping=torch.from_numpy(b.slot_mapping).to(DEVICE),
                state_cache=state_t, block_size=b.block_size)
    mutation(args)
    before = args["state_cache"].clone()
    with pytest.raises(ValueError, match=message):
        triton_impl.save_partial_states(*args.values())
    assert torch.equal(args["state_cache"].view(torch.int32), before.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("ratio, block_size", [(4, 4), (128, 8)])
def test_gpu_large_batch(ratio, block_size):
    rng = np.random.default_rng(ratio)
    requests = spec_batch.mixed_requests(rng, ratio, num_decode=2000, prefill_tokens=(700, 1500))
    b, state, kv_score, ape = _case(ratio, block_size, 9, requests=requests, row_pad=4, num_padding=17)
    expected, got = _run(b, state, kv_score, ape)
    assert np.array_equal(expected, got), first_difference(expected, got)
