"""Distributed shared memory of a thread-block cluster: a store into a peer CTA's shared memory.

The C128 kernels on clusters (:mod:`.fused_c128_cluster`, :mod:`.fused_c128_pipelined`) give
every CTA of a token each tile's sum of squares this way; the cluster barrier that follows
publishes the stores.
"""

from __future__ import annotations

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


__all__ = ["store_to_peer_smem"]
