"""Distributed shared memory of a thread-block cluster: a store into a peer CTA's shared memory,
and the per-token exchange of the C128 kernels on clusters built on it.

The C128 kernels on clusters (:mod:`..kernels.fused_cluster`, :mod:`..kernels.fused_pipelined`) give
every CTA of a token each tile's sum of squares this way (:class:`TileSumExchange`); the
cluster barrier that follows publishes the stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


@dsl_user_op
def store_to_peer_smem(value, smem_ptr, peer_rank, *, loc=None, ip=None) -> None:
    """``*smem_ptr = value`` in the shared memory of CTA ``peer_rank`` of this cluster.

    ``mapa.shared::cluster`` maps the local shared address to the peer's window of the
    cluster's distributed shared memory; ``st.shared::cluster`` writes it. Visibility to
    the peer comes from the following ``barrier.cluster.arrive`` (release semantics) and
    the peer's ``barrier.cluster.wait`` (acquire).
    """
    llvm.inline_asm(
        None,
        [smem_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(peer_rank).ir_value(loc=loc, ip=ip),
         Float32(value).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 remote_addr;\n\t"
        "mapa.shared::cluster.u32 remote_addr, $0, $1;\n\t"
        "st.shared::cluster.b32 [remote_addr], $2;\n\t}",
        "r,r,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dataclass(frozen=True)
class TileSumExchange:
    """One token's exchange between the ``tiles`` CTAs of a cluster (one CTA per channel tile):
    lane ``r < tiles`` of warp 0 stores its CTA's tile sum of squares into slot ``tile`` of
    ``tile_sums`` in CTA ``r``; with ``sends_partner_x`` (32-channel tiles, two per FP8 block)
    every lane of warp 0 also stores its ``x[0]`` into the partner tile's ``partner_x`` (for the
    block's amax). Then one cluster barrier: once it returns, every CTA holds every tile's sum.
    Every CTA of the cluster must call :meth:`exchange` (the barrier), after its own
    ``cluster_wait`` for the kernel-start arrive."""

    tiles: int  # CTAs of the cluster, one channel tile each
    sends_partner_x: bool  # 32-channel tiles: x[0] also goes to the partner tile

    @cute.jit
    def exchange(
        self,
        tile_sum: Float32,  # this CTA's tile sum of squares, meaningful in warp 0
        x: cute.Tensor,  # fp32 (tile // 32,): warp 0's pooled channels of this tile
        tile_sums: cute.Tensor,  # fp32 smem [tiles]: every tile's sum (out)
        partner_x: cute.Tensor,  # fp32 smem [32]: the partner tile's x[0] per lane (out), or None
        tile: Int32,  # this CTA's rank in the cluster
        lane: Int32,
        warp: Int32,
    ) -> None:
        if warp == 0:
            if lane < self.tiles:
                store_to_peer_smem(tile_sum, tile_sums.iterator + tile, lane)
            if cutlass.const_expr(self.sends_partner_x):
                store_to_peer_smem(x[0], partner_x.iterator + lane, tile ^ 1)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


__all__ = ["TileSumExchange", "store_to_peer_smem"]
