"""The CuTe DSL implementation's host side: the kernel-path registry, the dispatch policy, the argument
record and plan keys, launch plans, scratch buffers, the compile cache. Nothing here runs on the GPU."""
