"""The conformance suite: point it at any compressor kernel and learn, byte by byte, whether
it writes what SPEC.md says.

- :mod:`.implementations`  the protocol, the built-ins and how third-party kernels load
- :mod:`.scenarios`        the named scenario catalogue (small and large) and random ones
- :mod:`.runner`           spec vs implementation, exact and tolerant (SPEC §10) verdicts
- :mod:`.errors`           SPEC §9 error cases: ValueError naming the argument, nothing written
- :mod:`.torch_reference`  an independent torch implementation, with deliberate mutations
- :mod:`.cli`              ``python -m dsv4_compressor conformance``
"""

from .implementations import ENTRY_POINT_GROUP, Implementation, LoadedImplementation, load_implementation
from .runner import Verdict, run_scenario
from .scenarios import CATALOGUE, Scenario, scenarios

__all__ = [
    "CATALOGUE", "ENTRY_POINT_GROUP", "Implementation", "LoadedImplementation", "Scenario", "Verdict",
    "load_implementation", "run_scenario", "scenarios",
]
