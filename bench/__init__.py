"""Benchmarks on the GPU: the C128 and C4 decode-boundary sweeps, a mixed step and the save
pass (and the same for the lightning indexer's compressor, ``--head 128``); eager and
CUDA-graph timings against the measured copy bandwidth.

- :mod:`.cases`   what is timed (built with the spec's batch builders) and the bytes it must move
- :mod:`.timing`  input sets rotated past L2, CUDA events, graph capture and replay
- :mod:`.sweep`   cases x implementations x modes, trials interleaved
- :mod:`.report`  Markdown tables, CSV/JSON, the log-log plot
- :mod:`.cli`     ``python -m dsv4_compressor bench``
- :mod:`.host_time`      the host time of one eager call, by part (runs on a CPU too)
- :mod:`.cutedsl_tune`   the CuTe DSL kernels' shapes and dispatch choices timed side by side
- :mod:`.triton_sweep`   the Triton kernels' knobs timed side by side
- :mod:`.probe`, :mod:`.floor_kernels`   launch and read floors, variants, ``ncu`` profiling
- :mod:`.steps`  ``python -m dsv4_compressor.bench.steps``: the step benchmarks of SPEC §13's state
  formats (:mod:`.state_steps`) and §14's V4.1 compressors (:mod:`.v41_steps`), timed side by side by
  :mod:`.step_runner` beside their floor (:mod:`.step_floor`); :mod:`.state_memory` the state
  memory per request and layer of each format (computed)
- ``tests/``      the same cases under pytest-benchmark (``pytest bench``)
"""
