"""Named CuTe DSL variants: one forced C128 path plus :data:`.api.TUNING` overrides each.

The conformance suite and the benchmarks take them by reference, so every kernel the
dispatcher might pick can be checked and timed on its own::

    python -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:cluster16
    python -m dsv4_compressor bench --impl cutedsl-cluster16

A variant applies its overrides only for the duration of each call (the launch plans are
keyed by ``TUNING``, so switching between variants never reuses the wrong kernel). Not
thread-safe: it is a measuring and testing aid, not an API for serving.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from . import api

SUPPORTED_DEVICES = api.SUPPORTED_DEVICES


@contextmanager
def tuning_overrides(overrides: dict):
    """Set fields of :data:`.api.TUNING` inside the block, restore them after it."""
    unknown = sorted(set(overrides) - set(api.TUNING.__dict__))
    if unknown:
        raise ValueError(f"tuning overrides: expected fields of Tuning ({sorted(api.TUNING.__dict__)}), got {unknown}")
    saved = {key: getattr(api.TUNING, key) for key in overrides}
    try:
        for key, value in overrides.items():
            setattr(api.TUNING, key, value)
        yield
    finally:
        for key, value in saved.items():
            setattr(api.TUNING, key, value)


@dataclass(frozen=True)
class Variant:
    """The two operations with a forced ``c128_path`` (C4 calls ignore it) and knob overrides."""

    name: str
    c128_path: str = "auto"
    overrides: dict = field(default_factory=dict)
    SUPPORTED_DEVICES = api.SUPPORTED_DEVICES

    def __post_init__(self):
        if self.c128_path not in api.C128_PATHS:
            raise ValueError(f"c128_path: expected one of {api.C128_PATHS}, got {self.c128_path!r}")

    @property
    def c128_compress_only(self) -> bool:
        """Whether the variant differs from the dispatcher only on C128 compress calls (all its
        overrides are ``c128_*`` knobs and C4 ignores ``c128_path``), so other cases need no row."""
        return all(key.startswith("c128_") for key in self.overrides)

    def compress_norm_rope_store(self, *args, **kwargs) -> None:
        kwargs.setdefault("c128_path", self.c128_path)
        if not self.overrides:
            return api.compress_norm_rope_store(*args, **kwargs)
        with tuning_overrides(self.overrides):
            api.compress_norm_rope_store(*args, **kwargs)

    def save_partial_states(self, *args, **kwargs) -> None:
        if not self.overrides:
            return api.save_partial_states(*args, **kwargs)
        with tuning_overrides(self.overrides):
            api.save_partial_states(*args, **kwargs)


fused_cluster = Variant("fused_cluster", "fused_cluster")  # cluster size by T (TUNING.c128_cluster16_max_tokens)
cluster8 = Variant("cluster8", "fused_cluster", {"c128_cluster_tile": 64})  # 8-CTA clusters, 64-channel tiles
cluster16 = Variant("cluster16", "fused_cluster", {"c128_cluster_tile": 32})  # 16-CTA clusters, 32-channel tiles
cluster16_w4 = Variant("cluster16_w4", "fused_cluster", {"c128_cluster_tile": 32, "c128_cluster_warps": 4})
cluster16_w16 = Variant("cluster16_w16", "fused_cluster", {"c128_cluster_tile": 32, "c128_cluster_warps": 16})
stream = Variant("stream", "fused_stream", {"c128_stream_tile": 64})  # persistent 8-CTA clusters, two-stage pipeline
stream16 = Variant("stream16", "fused_stream", {"c128_stream_tile": 32})  # persistent 16-CTA clusters (the default)
cluster_early = Variant("cluster_early", "fused_cluster", {"c128_cluster_kv_after_max": False})  # kv with the scores
split_block8 = Variant("split_block8", "split_block8")
# Block8 whenever the block size allows, generic otherwise, kv loads after the window max
block8_late = Variant("block8_late", "auto", {"c128_split_kv_after_max": True, "c128_fused_max_tokens": 0,
                                               "c128_chunked_handoff": False})
split_generic = Variant("split_generic", "split_generic")
handoff = Variant("handoff", "fused_handoff")  # 8 CTAs per token, no cluster; the last one finishes the token
handoff_nopdl = Variant("handoff_nopdl", "fused_handoff", {"pdl": False})
handoff_early = Variant("handoff_early", "fused_handoff", {"c128_handoff_kv_after_max": False})  # kv with the scores
handoff_chunk1 = Variant("handoff_chunk1", "fused_handoff", {"c128_handoff_waves": None})  # one token per CTA always
# auto, with metadata and block table read before griddepcontrol.wait (a contract on the previous kernel)
early_metadata = Variant("early_metadata", "auto", {"c128_early_metadata": True})
split_block8_early = Variant("split_block8_early", "split_block8", {"c128_early_metadata": True})
# without programmatic dependent launch (TUNING.pdl, the default since the third session): auto dispatch
# (also C4 and save), and the forced paths
nopdl = Variant("nopdl", "auto", {"pdl": False})
cluster8_nopdl = Variant("cluster8_nopdl", "fused_cluster", {"c128_cluster_tile": 64, "pdl": False})
cluster16_nopdl = Variant("cluster16_nopdl", "fused_cluster", {"c128_cluster_tile": 32, "pdl": False})
split_block8_nopdl = Variant("split_block8_nopdl", "split_block8", {"pdl": False})

VARIANTS = {v.name: v for v in (fused_cluster, cluster8, cluster16, cluster16_w4, cluster16_w16, cluster_early, stream,
                                 stream16, split_block8, block8_late, split_generic, nopdl, cluster8_nopdl, cluster16_nopdl,
                                 split_block8_nopdl, handoff, handoff_nopdl, handoff_early, handoff_chunk1,
                                 early_metadata, split_block8_early)}


@dataclass(frozen=True)
class IndexerVariant:
    """The two operations with :data:`.indexer_launch.INDEXER_TUNING` overrides (the indexer
    compressor's mapping knobs, SPEC §12), for timing them against each other::

        python -m dsv4_compressor bench --head 128 --impl cutedsl --impl cutedsl-indexer_c4_w1
    """

    name: str
    overrides: dict = field(default_factory=dict)
    SUPPORTED_DEVICES = api.SUPPORTED_DEVICES

    def compress_norm_rope_store(self, *args, **kwargs) -> None:
        from . import indexer_launch

        tuning = indexer_launch.INDEXER_TUNING
        unknown = sorted(set(self.overrides) - set(tuning.__dict__))
        if unknown:
            raise ValueError(f"indexer overrides: expected fields of IndexerTuning ({sorted(tuning.__dict__)}), got {unknown}")
        saved = {key: getattr(tuning, key) for key in self.overrides}
        try:
            for key, value in self.overrides.items():
                setattr(tuning, key, value)
            api.compress_norm_rope_store(*args, **kwargs)
        finally:
            for key, value in saved.items():
                setattr(tuning, key, value)

    def save_partial_states(self, *args, **kwargs) -> None:
        api.save_partial_states(*args, **kwargs)


indexer_c4_w1 = IndexerVariant("indexer_c4_w1", {"c4_warps": 1})  # one token (warp) per CTA
indexer_c4_w2 = IndexerVariant("indexer_c4_w2", {"c4_warps": 2})
indexer_c4_w8 = IndexerVariant("indexer_c4_w8", {"c4_warps": 8})
indexer_c128_w8 = IndexerVariant("indexer_c128_w8", {"c128_warps": 8})  # 16 rows per warp
indexer_nopdl = IndexerVariant("indexer_nopdl", {"pdl": False})
INDEXER_VARIANTS = {v.name: v for v in (indexer_c4_w1, indexer_c4_w2, indexer_c4_w8, indexer_c128_w8, indexer_nopdl)}
