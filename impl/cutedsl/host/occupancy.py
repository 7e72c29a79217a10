"""How many thread-block clusters of a compiled kernel a device holds at once.

A persistent grid must not ask for more clusters than fit together: a cluster is placed whole
inside one GPC, so the count depends on how the device's SMs are grouped, not only on the SM
count (on the H200, 4 CTAs per SM give 62 eight-CTA clusters where 528 CTA slots would hold
66). The driver answers it (``cuOccupancyMaxActiveClusters``) for the kernel's own cubin,
registers, shared memory and cluster shape; the answer is cached per kernel and device. Where
the driver cannot answer, :func:`fallback_clusters` sizes the grid from the device's SM count
(``torch.cuda.get_device_properties``) and the kernel's own occupancy, never from one GPU's
numbers.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .buffers import device_index

log = logging.getLogger("dsv4_compressor")
_RESIDENT: dict = {}


def _checked(result):
    error = result[0]
    if int(error) != 0:
        raise RuntimeError(f"CUDA driver call failed: {error}")
    return result[1] if len(result) == 2 else result[1:]


def resident_clusters(compiled, device: torch.device, threads: int, smem_bytes: int, cluster_size: int) -> int | None:
    """Clusters of ``cluster_size`` CTAs of ``threads`` threads and ``smem_bytes`` of shared
    memory each that ``device`` runs at once, for the kernel in ``compiled`` (a CuTe DSL function
    compiled with ``--keep-cubin``); None when the driver cannot tell (no cubin, another device)."""
    key = (id(compiled), device)
    if key in _RESIDENT:
        return _RESIDENT[key]
    clusters = None
    cubin = getattr(getattr(compiled, "artifacts", None), "CUBIN", None)
    if device.type == "cuda" and cubin:
        try:
            clusters = _query(cubin, device, threads, smem_bytes, cluster_size)
        except RuntimeError as error:  # a driver without the query
            log.warning("cutedsl: no cluster occupancy from the driver (%s); sizing the grid from the SM count", error)
    _RESIDENT[key] = clusters
    return clusters


def _query(cubin: bytes, device: torch.device, threads: int, smem_bytes: int, cluster_size: int) -> int:
    from cuda.bindings import driver

    with _primary_context(driver, device):
        library = _checked(driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0))
        try:
            kernel = _checked(driver.cuLibraryEnumerateKernels(1, library))[0]
            function = _checked(driver.cuKernelGetFunction(kernel))
            attribute = driver.CUfunction_attribute
            _checked(driver.cuFuncSetAttribute(function, attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                               smem_bytes))
            _checked(driver.cuFuncSetAttribute(function, attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                               100))  # all of it shared memory, as the kernels launch
            config = _cluster_launch(driver, threads, smem_bytes, cluster_size)
            return int(_checked(driver.cuOccupancyMaxActiveClusters(function, config)))
        finally:  # the count is all that is kept: the query's copy of the module goes
            driver.cuLibraryUnload(library)


@contextlib.contextmanager
def _primary_context(driver, device: torch.device):
    """The device's primary context (the one torch's runtime uses) current on this thread for the
    query: in a fresh process torch creates it only at its first allocation or launch, and
    ``cuKernelGetFunction`` needs one."""
    torch.cuda.init()
    handle = _checked(driver.cuDeviceGet(device_index(device)))
    context = _checked(driver.cuDevicePrimaryCtxRetain(handle))
    try:
        _checked(driver.cuCtxPushCurrent(context))
        try:
            yield
        finally:
            driver.cuCtxPopCurrent()
    finally:
        driver.cuDevicePrimaryCtxRelease(handle)


def _cluster_launch(driver, threads: int, smem_bytes: int, cluster_size: int):
    """A launch configuration of clusters of ``cluster_size`` CTAs (a grid of 1024 of them)."""
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size * 1024, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem_bytes
    shape = driver.CUlaunchAttribute()
    shape.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    shape.value.clusterDim.x, shape.value.clusterDim.y, shape.value.clusterDim.z = cluster_size, 1, 1
    config.attrs = [shape]
    config.numAttrs = 1
    return config


def persistent_grid(compiled, config, request, facts) -> int:
    """Clusters of the pipelined kernel's persistent grid (``config``: its
    :class:`..config.FusedPipelinedConfig`) for a request (:class:`.paths.PathRequest`):
    as many as the device holds at once (:func:`resident_clusters`, for the compiled kernel; when
    the driver cannot tell, :func:`fallback_clusters` of the device's SM count), by
    :func:`pipelined_clusters`; ``facts``: the call's :class:`.buffers.LaunchFacts`."""
    from ..kernels.fused_pipelined import FusedPipelinedKernel

    kernel = FusedPipelinedKernel(config)
    resident = resident_clusters(compiled, facts.device, kernel.threads, kernel.smem_bytes, kernel.tiles)
    if resident is None and facts.sm_count is not None:
        resident = fallback_clusters(facts.sm_count, kernel.config.ctas_per_sm, kernel.tiles)
    return pipelined_clusters(request.num_tokens, resident, request.policy)


def fallback_clusters(sm_count: int, ctas_per_sm: int, cluster_size: int) -> int:
    """Clusters of ``cluster_size`` CTAs a device of ``sm_count`` SMs surely holds at once when the
    driver cannot tell, for a kernel of ``ctas_per_sm`` CTAs per SM (its ``.minnctapersm``): half
    its CTA slots, ``sm_count * ctas_per_sm // (2 * cluster_size)``, at least 1.

    Why half: a cluster lives inside one GPC, and how the SMs group into GPCs only the driver
    knows. A GPC of ``s`` slots holds ``floor(s / cluster_size)`` clusters, at least half of
    ``s / cluster_size`` once it holds one, so half the slots is what any grouping of GPCs that
    each hold a cluster holds. Every number comes from the device and the kernel; none is a
    particular GPU's."""
    for name, value in (("sm_count", sm_count), ("ctas_per_sm", ctas_per_sm), ("cluster_size", cluster_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return max(1, sm_count * ctas_per_sm // (2 * cluster_size))


def pipelined_clusters(num_tokens: int, resident: int | None, policy) -> int:
    """Clusters ``G`` of the pipelined kernel's persistent grid: as many as the device holds at
    once (``resident``: the driver's count or :func:`fallback_clusters`; None off a GPU: one per
    token), at most ``policy.pipelined_max_clusters`` and never more than ``T``. Clusters beyond
    the resident ones would walk their share only after others ended."""
    clusters = min(num_tokens, num_tokens if resident is None else resident)
    if policy.pipelined_max_clusters is not None:
        clusters = min(clusters, policy.pipelined_max_clusters)
    share = -(-num_tokens // max(1, clusters))  # tokens per cluster; no cluster without a token
    return max(1, -(-num_tokens // share))
