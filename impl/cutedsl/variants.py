"""Named CuTe DSL variants: a forced C128 path, a :class:`.dispatch.Policy` and ``pdl`` each.

The conformance suite and the benchmarks take them by reference, so every kernel the
dispatcher might pick can be checked and timed on its own::

    python -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:cluster16
    python -m dsv4_compressor bench --impl cutedsl-cluster16

A variant passes its choices to every call (``c128_path=``, ``policy=``, ``pdl=``); nothing
global changes, so variants may be used from several threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import api
from .dispatch import C128_PATHS, DEFAULT_POLICY, PoolShape, Policy

SUPPORTED_DEVICES = api.SUPPORTED_DEVICES


@dataclass(frozen=True)
class Variant:
    """The operations with a forced ``c128_path`` (C4 calls ignore it), a policy and ``pdl``."""

    name: str
    c128_path: str = "auto"
    policy: Policy = DEFAULT_POLICY
    pdl: bool = True
    SUPPORTED_DEVICES = api.SUPPORTED_DEVICES

    def __post_init__(self):
        if self.c128_path not in C128_PATHS:
            raise ValueError(f"c128_path: expected one of {C128_PATHS}, got {self.c128_path!r}")
        if not isinstance(self.policy, Policy):
            raise ValueError(f"policy: expected a dispatch.Policy, got {type(self.policy).__name__}")

    @property
    def c128_compress_only(self) -> bool:
        """Whether the variant differs from the dispatcher only on C128 compress calls (C4
        ignores ``c128_path`` and every C128 policy field), so other cases need no row."""
        shapes, default = self.policy.shapes, DEFAULT_POLICY.shapes
        return self.pdl and shapes.c4_tokens_per_cta == default.c4_tokens_per_cta and \
            shapes.save_tokens_per_cta == default.save_tokens_per_cta

    def _choices(self, kwargs: dict) -> dict:
        return {"c128_path": self.c128_path, "policy": self.policy, "pdl": self.pdl, **kwargs}

    def compress_norm_rope_store(self, *args, **kwargs) -> None:
        api.compress_norm_rope_store(*args, **self._choices(kwargs))

    def save_and_compress_norm_rope_store(self, *args, **kwargs) -> None:
        api.save_and_compress_norm_rope_store(*args, **self._choices(kwargs))

    def save_partial_states(self, *args, **kwargs) -> None:
        api.save_partial_states(*args, **{"policy": self.policy, "pdl": self.pdl, **kwargs})


def _policy(**overrides) -> Policy:
    return DEFAULT_POLICY.with_overrides(**overrides)


_CLUSTER = DEFAULT_POLICY.shapes.cluster  # 8 warps, tile by T, kv in smem, kv after the max


def _cluster(**fields) -> Policy:
    return _policy(cluster=PoolShape(**{**_CLUSTER.__dict__, **fields}))


fused_cluster = Variant("fused_cluster", "fused_cluster")  # cluster size by T (Policy.cluster16_max_tokens)
cluster8 = Variant("cluster8", "fused_cluster", _cluster(tile=64))  # 8-CTA clusters, 64-channel tiles
cluster16 = Variant("cluster16", "fused_cluster", _cluster(tile=32))  # 16-CTA clusters, 32-channel tiles
cluster16_w4 = Variant("cluster16_w4", "fused_cluster", _cluster(tile=32, warps=4))
cluster16_w16 = Variant("cluster16_w16", "fused_cluster", _cluster(tile=32, warps=16))
cluster_early = Variant("cluster_early", "fused_cluster", _cluster(kv_after_max=False))  # kv with the scores
split_block8 = Variant("split_block8", "split_block8")
split_generic = Variant("split_generic", "split_generic")
handoff = Variant("handoff", "fused_handoff")  # 8 CTAs per token, no cluster; the last one finishes the token
handoff_nopdl = Variant("handoff_nopdl", "fused_handoff", pdl=False)
handoff_early = Variant("handoff_early", "fused_handoff", _policy(handoff_kv_after_max=False))  # kv with the scores
pipelined = Variant("pipelined", "fused_pipelined")  # persistent 8-CTA clusters, next token's rows in flight
pipelined_occ2 = Variant("pipelined_occ2", "fused_pipelined", _policy(pipelined_ctas_per_sm=2))  # 128 registers
pipelined_early = Variant("pipelined_early", "fused_pipelined", _policy(early_metadata=True))
# auto, with metadata and block table read before griddepcontrol.wait (a contract on the previous kernel)
early_metadata = Variant("early_metadata", "auto", _policy(early_metadata=True))
split_block8_early = Variant("split_block8_early", "split_block8", _policy(early_metadata=True))
# without programmatic dependent launch: auto dispatch (also C4 and save), and the forced paths
nopdl = Variant("nopdl", "auto", pdl=False)
cluster8_nopdl = Variant("cluster8_nopdl", "fused_cluster", _cluster(tile=64), pdl=False)
cluster16_nopdl = Variant("cluster16_nopdl", "fused_cluster", _cluster(tile=32), pdl=False)
split_block8_nopdl = Variant("split_block8_nopdl", "split_block8", pdl=False)

VARIANTS = {v.name: v for v in (fused_cluster, cluster8, cluster16, cluster16_w4, cluster16_w16, cluster_early,
                                 split_block8, split_generic, nopdl, cluster8_nopdl, cluster16_nopdl,
                                 split_block8_nopdl, handoff, handoff_nopdl, handoff_early,
                                 early_metadata, split_block8_early, pipelined, pipelined_occ2, pipelined_early)}


# the indexer compressor's mappings (SPEC §12), timed against each other on the indexer's compress cases:
#     python -m dsv4_compressor bench --head 128 --impl cutedsl --impl cutedsl-indexer_c4_w1
indexer_c4_w1 = Variant("indexer_c4_w1", policy=_policy(indexer_c4_warps=1))
indexer_c4_w2 = Variant("indexer_c4_w2", policy=_policy(indexer_c4_warps=2))
indexer_c4_w4 = Variant("indexer_c4_w4", policy=_policy(indexer_c4_warps=4))
indexer_c4_w8 = Variant("indexer_c4_w8", policy=_policy(indexer_c4_warps=8))
indexer_c128_w8 = Variant("indexer_c128_w8", policy=_policy(indexer_c128_warps=8))  # 16 rows per warp
indexer_nopdl = Variant("indexer_nopdl", pdl=False)
INDEXER_VARIANTS = {v.name: v for v in (indexer_c4_w1, indexer_c4_w2, indexer_c4_w4, indexer_c4_w8, indexer_c128_w8,
                                         indexer_nopdl)}
