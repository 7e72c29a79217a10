"""Speculative decoding's scenarios and multi-step sequences, and the batch-invariance verdict:
the spec, the independent torch implementation and the Triton kernels (under the interpreter
without a GPU) pass them; implementations that depend on the batch, or write what they must
not, fail with the step, token and region named."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dsv4_compressor.conformance.engine import BlockLists, BlockPool, Geometry, step_metadata
from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.invariance import InvarianceConfig, partitionings, run_invariance
from dsv4_compressor.conformance.runner import run_scenario
from dsv4_compressor.conformance.scenarios import scenarios
from dsv4_compressor.conformance.sequences import SEQUENCES, run_sequence, sequence_steps
from dsv4_compressor.conformance.speculative import GROUP_SIZES, verify_steps
from dsv4_compressor.conformance.torch_reference import MUTANTS

sys.path.insert(0, str(Path(__file__).parent))
import example_kernels  # noqa: E402

IMPLEMENTATIONS = ("spec", "torch", "triton")


def test_verify_groups_hold_the_boundary_at_every_offset():
    for group in GROUP_SIZES:
        batch = scenarios([f"verify_c4_group{group}"])[0].build().batch
        offsets = set()
        for request in batch.requests:
            if request.num_tokens == group:
                closing = [p for p in range(request.context_len, request.context_len + group) if (p + 1) % 4 == 0]
                offsets |= {p - request.context_len for p in closing}
        assert offsets >= set(range(min(group, 4))), (group, offsets)
    assert {f"verify_c128_group{g}" for g in GROUP_SIZES} <= {s.name for s in scenarios(["verify_*"])}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["verify_mixed_c4", "verify_mixed_c128", "verify_indexer_c4_mxfp4_hadamard",
                                  "verify_indexer_c128_fp8"])
def test_verify_groups_pass_exact(impl, name):
    verdict = run_scenario(load_implementation(impl), scenarios([name])[0])
    assert verdict.status == "pass", verdict.first_difference


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("sequence", SEQUENCES, ids=lambda s: s.name)
def test_rollback_sequences_pass_exact(impl, sequence):
    verdict = run_sequence(load_implementation(impl), sequence)
    assert verdict.status == "pass", verdict.first_difference


def test_rollback_sequences_run_positions_again():
    for sequence in SEQUENCES:
        steps = sequence_steps(sequence)
        seen, again = set(), 0
        for inputs in steps:
            b = inputs.batch
            real = b.slot_mapping >= 0
            here = set(zip(b.token_to_req_indices[real].tolist(), b.positions[real].tolist()))
            again += len(here & seen)
            seen |= here
        assert again > 0, sequence.name  # rows (and entries) written before are written again
        tables = {inputs.batch.block_table.tobytes() for inputs in steps}
        assert len(tables) == 1  # one block table for the whole sequence


def test_a_sequence_names_the_step_that_differs():
    verdict = run_sequence(LoadedImplementation("pad_byte_ff", MUTANTS.pad_byte_ff, ("cpu",)),
                           next(s for s in SEQUENCES if s.name == "rollback_c4_verify8"))
    assert verdict.status == "fail" and verdict.first_difference.startswith("step 0 ")
    assert "region pad" in verdict.first_difference


def test_the_fast_math_reference_passes_a_sequence_tolerant():
    fast = load_implementation("fast-math")
    sequence = next(s for s in SEQUENCES if s.name == "rollback_c4_verify8")
    assert run_sequence(fast, sequence).status == "fail"  # exact: one-ulp slips show
    tolerant = run_sequence(fast, sequence, tolerant=True)
    assert tolerant.status == "pass" and all("within" in kind for kind in tolerant.counts), tolerant.counts


def test_step_metadata_follows_the_slot_rules():
    rng = np.random.default_rng(0)
    pools = BlockPool(64, rng), BlockPool(8, rng)
    owners = [BlockLists(), BlockLists()]
    batch = step_metadata([(1, 5, 4), (0, 0, 2)], owners, Geometry(4, 4, 16), *pools, padded_tokens=9, table_shape=(3, 5))
    assert batch.positions.tolist() == [5, 6, 7, 8, 0, 1, 0, 0, 0]
    assert batch.token_to_req_indices.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    for t in range(6):
        owner, p = owners[batch.token_to_req_indices[t]], batch.positions[t]
        assert batch.slot_mapping[t] == owner.state_blocks[p // 4] * 4 + p % 4
        assert (batch.kv_slot_mapping[t] >= 0) == ((p + 1) % 4 == 0)
    assert batch.kv_slot_mapping[2] == owners[1].pages[0] * 16 + 1  # position 7 closes entry 1
    assert (batch.slot_mapping[6:] == -1).all() and (batch.kv_slot_mapping[6:] == -1).all()
    assert batch.block_table.shape == (3, 5) and batch.block_table[1, :3].tolist() == owners[1].state_blocks
    with pytest.raises(ValueError, match="padded_tokens"):
        step_metadata([(0, 0, 4)], owners, Geometry(4, 4, 16), *pools, padded_tokens=3)
    with pytest.raises(ValueError, match="advances"):
        verify_steps(0, 4, (5,))


def test_ring_slots_wrap_after_capacity_rows():
    rng = np.random.default_rng(1)
    ring = Geometry(4, 4, 16, ring_capacity=8)
    owner = BlockLists()
    batch = step_metadata([(0, 5, 8)], [owner], ring, BlockPool(16, rng), BlockPool(4, rng))
    assert len(owner.state_blocks) == 2  # C / bs blocks, whatever the positions
    rows = [p % 8 for p in range(5, 13)]
    assert batch.slot_mapping.tolist() == [owner.state_blocks[q // 4] * 4 + q % 4 for q in rows]
    with pytest.raises(ValueError, match="ring_capacity"):
        Geometry(4, 4, 16, ring_capacity=6)


# ---- batch invariance ---------------------------------------------------------------------------
def test_partitionings_split_every_token_once():
    batch = scenarios(["verify_mixed_c4"])[0].build().batch
    found = partitionings(batch, InvarianceConfig(random_partitions=2), np.random.default_rng(3))
    assert [p.name for p in found] == ["alone", "by request", "random", "random"]
    for partitioning in found:
        tokens = np.concatenate(partitioning.parts)
        assert sorted(tokens.tolist()) == list(range(batch.num_tokens)) and len(partitioning.parts) > 1
    alone = found[0].parts
    assert all(p.size == 1 for p in alone[:-1]) and all(batch.active[p[0]] for p in alone[:-1])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["verify_mixed_c4", "c128_mixed_padding", "indexer_c4_mxfp4_hadamard", "c4_negative_slots"])
def test_exact_implementations_are_batch_invariant(impl, name):
    verdict = run_invariance(load_implementation(impl), scenarios([name])[0])
    assert verdict.status == "pass", verdict.detail
    assert verdict.calls > 6


def test_a_batch_variant_kernel_fails_invariance_and_passes_tolerant():
    variant = LoadedImplementation("batch_variant", example_kernels.BatchVariant(), ("cpu",))
    scenario = scenarios(["c4_ulp_ties"])[0]
    verdict = run_invariance(variant, scenario)
    assert verdict.status == "fail", verdict.detail
    assert verdict.detail.startswith("alone") and "in the whole step" in verdict.detail and "in its own call" in verdict.detail
    assert run_scenario(variant, scenario, tolerant=True).status == "pass"  # within the bounds all the same
