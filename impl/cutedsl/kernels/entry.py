"""The host entries the kernels share: an argument list written once for several kernels.

A kernel class takes an entry as its ``__call__`` (``__call__ = pooling_entry``), so
``cute.compile(kernel, ...)`` compiles the entry with the kernel as ``self``; the entry hands the
arguments to the kernel's own ``launch``, which names its grid, block, cluster and launch options.
The entry runs only while the compiler traces it: the compiled function takes the same positional
arguments, and a call does no more Python work, than a ``__call__`` written out in the kernel.

- :func:`pooling_entry`: the pooling-only kernels (:class:`.c4.C4PoolKernel`,
  :class:`.split_pool.SplitPoolKernel`), which write the fp32 ``x`` of active tokens. The optional
  tensors after the stream are SPEC §13's, given only to a kernel compiled for a state format that
  reads them (``None`` otherwise): ``ape`` (fp32 ``[r, SW]``, or ``None`` with ``ape_at="save"``)
  and ``ring_capacity`` (``C``; any value for a paged state), and with ``rows_from_inputs``
  (SPEC §13.4) ``kv`` and ``score`` (fp32 ``[T, SW]``, 16-byte aligned rows) and
  ``query_start_loc`` (int32 ``[num_reqs + 1]``), ``ape`` then always given. ``SW`` is the state
  width: 1024 for C4, 512 for C128.
- :func:`fused_entry`: the single-launch C128 kernels of SPEC §3's state only
  (:class:`.fused_cluster.FusedClusterKernel`, :class:`.fused_handoff.FusedHandoffKernel`): the
  nine tensors every one of them starts with, then the kernel's own arguments, in the order its
  ``launch`` names them (each takes ``eps`` and ``fp8_inv``, one ``mX`` and ``mCounters`` before
  them, and the stream last). They carry no default: a default would be a parameter of the compiled
  function. The compiled function names them by position (``_vararg_10``, ...) in its argument
  errors. The pipelined kernel, which takes SPEC §13's formats, writes its own entry (as C4's fused
  kernel does): its format arguments follow the stream, ``None`` where unused.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute


@cute.jit
def pooling_entry(
    self,  # the kernel: launch(arguments, num_tokens, stream)
    mState: cute.Tensor,  # fp32 or bf16 (config.state) [num_blocks, bs, 2*SW]
    mTokenReq: cute.Tensor,  # int32 [T]
    mPos: cute.Tensor,  # int64 [T]
    mSlot: cute.Tensor,  # int64 [T]
    mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
    mKvSlot: cute.Tensor,  # int64 [T]
    mOut: cute.Tensor,  # fp32 [S >= T, 512] scratch, rows 16-byte aligned
    stream: cuda.CUstream,
    mApe: cute.Tensor = None,  # SPEC §13.2: fp32 [r, SW] (ape_at="compress"), else None
    ring_capacity=None,  # Int32 C (SPEC §13.3), a non-default state format only
    mKv: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, SW], else None
    mScore: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, SW], else None
    mQsl: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): int32 [num_reqs + 1], else None
):
    """Launch a pooling-only kernel on ``stream`` over the ``T`` tokens of ``mPos``."""
    self.launch((mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot, mOut, mApe, ring_capacity, mKv, mScore, mQsl),
                mPos.shape[0], stream)


@cute.jit
def fused_entry(
    self,  # the kernel: launch(tables, num_tokens, *arguments)
    mState: cute.Tensor,  # fp32 [num_blocks, bs, 1024]
    mTokenReq: cute.Tensor,  # int32 [T]
    mPos: cute.Tensor,  # int64 [T]
    mSlot: cute.Tensor,  # int64 [T]
    mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
    mWeight: cute.Tensor,  # fp32 or bf16 [512]
    mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
    mCache: cute.Tensor,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8: e4m3 [P, B, 512]
    mKvSlot: cute.Tensor,  # int64 [T]
    *arguments,  # the kernel's own, as its launch names them, the stream last
):
    """Launch a single-launch C128 kernel over the ``T`` tokens of ``mPos``."""
    self.launch((mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot), mPos.shape[0],
                *arguments)


__all__ = ["fused_entry", "pooling_entry"]
