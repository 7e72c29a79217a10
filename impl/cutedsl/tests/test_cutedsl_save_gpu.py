"""GPU checks of the CuTe DSL ``save_partial_states`` (SPEC §4): the spec's bytes in a padded
state cache, padding untouched, with some tokens unsaved; ``misaligned``: every input a view
whose base and rows are not 16-byte aligned (the kernel's scalar-load variant). Each case is a
whole conformance step (:func:`cutedsl_steps.run_step`): the store that follows is judged too."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import Case, run_step  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("ratio, block_size, misaligned", [(4, 4, False), (128, 8, False), (4, 3, True), (128, 5, True)])
def test_save_partial_states_matches_spec(ratio, block_size, misaligned):
    case = Case(ratio, block_size, 4, unsaved_fraction=0.1, row_pad=8, block_pad_rows=2, strided_inputs=misaligned)
    run_step(case)
