"""Device stages of the CuTe DSL kernels, named as the spec's stages: window pooling, the finishing
stage (RMSNorm, RoPE, quantization, stores), the exchanges between the CTAs of a token, exact
arithmetic and memory helpers."""
