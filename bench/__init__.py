"""Benchmarks on the GPU: the C128 and C4 decode-boundary sweeps, a mixed step and the save
pass; eager and CUDA-graph timings against the measured copy bandwidth.

- :mod:`.cases`   what is timed (built with the spec's batch builders) and the bytes it must move
- :mod:`.timing`  input sets rotated past L2, CUDA events, graph capture and replay
- :mod:`.sweep`   cases x implementations x modes, trials interleaved
- :mod:`.report`  Markdown tables, CSV/JSON, the log-log plot
- :mod:`.cli`     ``python -m dsv4_compressor bench``
- ``tests/``      the same cases under pytest-benchmark (``pytest bench``)
"""
