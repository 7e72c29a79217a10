"""Named CuTe DSL variants: a forced C128 path, a :class:`.host.policy.Policy` and ``pdl`` each.

Every C128 path of the registry forced by its name, and the contracts the tests hold apart
(each cluster size, PDL off, early metadata; the indexer's one token per CTA). The conformance
suite and the benchmarks take them by reference, so every kernel the dispatcher might pick can
be checked and timed on its own::

    python -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:cluster16
    python -m dsv4_compressor bench --impl cutedsl-cluster16

Other shapes and thresholds are a search space of the benchmarks (``bench/cutedsl_tune.py``),
generated from the policy's fields (:mod:`.space`), not named here.

A variant passes its choices to every call (``c128_path=``, ``policy=``, ``pdl=``); nothing
global changes, so variants may be used from several threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import api
from .host.paths import C128_PATHS
from .host.policy import DEFAULT_POLICY, Policy, PoolShape

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

    def compress_and_save(self, *args, **kwargs) -> None:
        api.compress_and_save(*args, **{"policy": self.policy, "pdl": self.pdl, **kwargs})


def _policy(**overrides) -> Policy:
    return DEFAULT_POLICY.with_overrides(**overrides)


def _cluster(tile: int) -> Policy:
    return _policy(cluster=PoolShape(**{**DEFAULT_POLICY.shapes.cluster.__dict__, "tile": tile}))


# every C128 path by its name, forced: the product paths a caller may pick with ``c128_path=``
FORCED_PATHS = {name: Variant(name, name) for name in C128_PATHS if name != "auto"}
fused_cluster, fused_handoff, fused_pipelined = (FORCED_PATHS[n] for n in ("fused_cluster", "fused_handoff",
                                                                           "fused_pipelined"))
split_block8, split_generic = FORCED_PATHS["split_block8"], FORCED_PATHS["split_generic"]
# the contracts the tests hold apart: each cluster size alone, no PDL, metadata read before the wait
cluster8 = Variant("cluster8", "fused_cluster", _cluster(64))  # 8-CTA clusters, 64-channel tiles
cluster16 = Variant("cluster16", "fused_cluster", _cluster(32))  # 16-CTA clusters, 32-channel tiles
nopdl = Variant("nopdl", "auto", pdl=False)  # auto dispatch (also C4 and save) without programmatic dependent launch
early_metadata = Variant("early_metadata", "auto", _policy(early_metadata=True))
# the split kernels (and the step call's save) on runs of tokens found by a ballot from T = 2 on,
# not only on the large steps the default policy gives them
split_generic_runs = Variant("split_generic_runs", "split_generic", _policy(split_runs=1, step_save_runs=True))
split_block8_runs = Variant("split_block8_runs", "split_block8", _policy(split_runs=1, step_save_runs=True))

# each forced path without PDL, and with its metadata read before the wait: the launch contracts
# every path must keep (the sanitizers and the graph tests run them all)
NOPDL_PATHS = {f"{name}_nopdl": Variant(f"{name}_nopdl", name, pdl=False) for name in FORCED_PATHS}
EARLY_PATHS = {f"{name}_early": Variant(f"{name}_early", name, _policy(early_metadata=True)) for name in FORCED_PATHS}

VARIANTS = {v.name: v for v in (*FORCED_PATHS.values(), cluster8, cluster16, nopdl, early_metadata,
                                 split_generic_runs, split_block8_runs, *NOPDL_PATHS.values(),
                                 *EARLY_PATHS.values())}

# the indexer compressor (SPEC §12): one token per CTA (the default runs four), and no PDL
indexer_c4_w1 = Variant("indexer_c4_w1", policy=_policy(indexer_c4_warps=1))
indexer_nopdl = Variant("indexer_nopdl", pdl=False)
INDEXER_VARIANTS = {v.name: v for v in (indexer_c4_w1, indexer_nopdl)}


def __getattr__(name: str) -> Variant:
    """Every variant by its name, the generated ones too: ``--impl ...variants:split_block8_early``."""
    variant = VARIANTS.get(name) or INDEXER_VARIANTS.get(name)
    if variant is None:
        raise AttributeError(f"module {__name__!r} has no variant {name!r}")
    return variant
