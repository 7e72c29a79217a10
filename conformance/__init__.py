"""The conformance suite: point it at any compressor kernel and learn, byte by byte, whether
it writes what SPEC.md says.

- :mod:`.implementations`  the protocol, the built-ins and how third-party kernels load
- :mod:`.capabilities`     what an implementation declares it handles (the unsupported verdict)
- :mod:`.scenarios`        the named scenario catalogue (small, medium, large; SPEC §12 and §13 too)
- :mod:`.ties`             inputs tuned onto rounding ties, so one-ulp slips change bytes
- :mod:`.speculative`      speculative decoding's verify groups and per-request step plans
- :mod:`.runner`           spec vs implementation, exact and tolerant (SPEC §10) verdicts
- :mod:`.arrays`           NumPy or torch arrays, one interface; :mod:`.step_call` a step's calls
- :mod:`.engine`           block pools, each request's blocks, a step's metadata from a plan
- :mod:`.sequences`        multi-step sequences (rollbacks), the caches carried from step to step
- :mod:`.invariance`       batch invariance: a token's bytes alone, with its request, in any batch
- :mod:`.buckets`          steps padded into buckets and the buffers a graph keeps
- :mod:`.graphs`           ``--graph`` / ``--padded``: replays in captured graphs per bucket
- :mod:`.soak_engine`      the soak's scheduler; :mod:`.soak` the soak; :mod:`.soak_cli` its command
- :mod:`.sanitize`         every kernel path under compute-sanitizer
- :mod:`.state_inputs`     SPEC §13 inputs: a bf16 state, the step call's projections, bf16 ties of score + ape
- :mod:`.state_calls`      SPEC §13's keywords of the two calls and the step call's arguments
- :mod:`.bounds`           the tolerant verdict's float64 evaluation and error bounds
- :mod:`.errors`           SPEC §9 error cases, run in a worker process that survives crashes
- :mod:`.error_checks`     what every error case checks with: its verdict, array operations, the named argument
- :mod:`.torch_reference`  an independent torch implementation, with deliberate mutations
- :mod:`.torch_calls`      the torch references' call descriptions and their SPEC §9 checks
- :mod:`.fast_math`        SPEC.md with fast-math arithmetic: what the tolerant verdict must pass
- :mod:`.v41_scenarios`    DeepSeek-V4.1's catalogue (SPEC §14); :mod:`.v41_values` its value profiles and ties
- :mod:`.v41_calls`        one V4.1 call on fresh buffers, in SPEC §14.7's argument order
- :mod:`.v41_runner`       spec vs implementation for V4.1: latent, state and cache, every byte
- :mod:`.v41_bounds`       the V4.1 tolerant verdict: bounds through intervals of bf16 values
- :mod:`.v41_variants`     the spec with named changes: SPEC §14.10's departures and the V4.1 mutants
- :mod:`.v41_departures`   naming the departure that explains an implementation's bytes
- :mod:`.v41_errors`       SPEC §14.8 error cases (run in :mod:`.errors`' worker)
- :mod:`.v41_torch_adapter` the spec's V4.1 operations behind torch tensors (the suite's torch plumbing)
- :mod:`.pytest_items`     the suite as pytest tests (``--dsv4-impl``)
- :mod:`.cli`              ``python -m dsv4_compressor conformance``
"""

from .capabilities import Capabilities, V41Capabilities
from .implementations import ENTRY_POINT_GROUP, Implementation, LoadedImplementation, load_implementation
from .runner import Verdict, run_scenario
from .scenarios import CATALOGUE, Scenario, scenarios

__all__ = [
    "CATALOGUE", "Capabilities", "V41Capabilities", "ENTRY_POINT_GROUP", "Implementation", "LoadedImplementation", "Scenario", "Verdict",
    "load_implementation", "run_scenario", "scenarios",
]
