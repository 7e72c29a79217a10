"""The CuTe DSL kernels, one module per kernel, each named as its kernel in :mod:`..host.paths`.

A kernel composes device stages (:mod:`..stages`); it does not inherit from another kernel. Kernels
that take the same launch arguments share their host entry (:mod:`.entry`)."""
