"""dsv4-compressor: DeepSeek V4's attention KV compressor, specified to the byte.

Sub-packages (each a top-level folder of the repository):

- ``dsv4_compressor.spec``        the executable NumPy specification (ground truth, NumPy only)
- ``dsv4_compressor.impl``        GPU kernels: ``impl.triton`` and ``impl.cutedsl``
- ``dsv4_compressor.conformance`` byte-for-byte checks of any implementation against the spec
- ``dsv4_compressor.bench``       H200 benchmarks (CUDA events, CUDA-graph replay)
- ``dsv4_compressor.docs``        the specification explained to implementers, with figures
"""

__version__ = "0.2.0"
