"""Programmatic dependent launch (PDL, sm_90+): start a kernel while its predecessor finishes.

Without PDL a kernel's CTAs are launched only after the previous kernel in the stream has
completed and its memory has been flushed; at a few µs per call that launch gap is a large
part of the time. A kernel launched with PDL (``use_pdl=True``: CUDA's programmatic stream
serialization, kept as a programmatic edge when the stream is captured into a graph) may be
launched as soon as every CTA of the previous kernel has executed
``griddepcontrol.launch_dependents`` (or exited), so its CTAs are already resident when the
previous kernel ends.

Correctness rule (every kernel here keeps it): ``griddepcontrol.wait`` is the first
statement, before any global load or store. It returns once the prerequisite grids have
completed and their writes are visible, so a PDL launch reads exactly what a serialized
one would, whatever kernel precedes it (the state cache written by ``save_partial_states``,
metadata prepared by an engine's own kernels). Reading anything earlier would not be safe
in general: with a chain of PDL kernels even the grid before the previous one may still
run. Then the kernel triggers its own dependents at once: the next PDL kernel's CTAs are
launched only after *all* of this grid's CTAs have started, so they never take the place
of a CTA of this grid that is still waiting for a slot.

Opt-in exception (``Policy.early_metadata``, ``C128PoolConfig.early_metadata``): the
C128 split, cluster and handoff kernels may read the per-token metadata, the block table,
the norm weights and the cos/sin rows *before* the wait, and wait only right before their
first state-row load, so that these dependent loads overlap the previous kernel's tail
instead of preceding the state reads. This reads what a serialized launch would only if
the previous kernel in the stream writes none of them and itself waits for its own
predecessor before triggering (every kernel here does: ``save_partial_states`` before
``compress_norm_rope_store`` is the intended pair). Stores, atomics and every state read
still follow the wait (checked on the PTX in CI).

Without PDL (``pdl=False``) nothing is emitted; a kernel compiled with PDL but launched
after a non-PDL kernel simply finds its wait satisfied.
"""

from __future__ import annotations

import cutlass.cute as cute


def wait_for_prerequisite_grids(pdl: bool) -> None:
    """First statement of every kernel: with ``pdl``, ``griddepcontrol.wait`` then
    ``griddepcontrol.launch_dependents`` (see the module docstring); else nothing."""
    if pdl:
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
