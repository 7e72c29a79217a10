import torch
torch.cuda.init(); torch.zeros(1, device="cuda")
import cuda.bindings.driver as driver
from cutlass.utils import HardwareInfo
h = HardwareInfo()
def check(r):
    err, *rest = r
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
k = h.kernel
for threads, smem in ((256, 138 * 1024), (256, 70 * 1024), (256, 36 * 1024), (256, 20 * 1024), (128, 36 * 1024)):
    out = {}
    for c in (8, 16):
        cfg = driver.CUlaunchConfig(); cfg.blockDimX = threads; cfg.blockDimY = 1; cfg.blockDimZ = 1
        cfg.sharedMemBytes = smem; cfg.numAttrs = 1
        a = driver.CUlaunchAttribute(); a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        v = driver.CUlaunchAttributeValue(); v.clusterDim.x = c; v.clusterDim.y = 1; v.clusterDim.z = 1; a.value = v
        cfg.attrs = [a]; cfg.gridDimX = c; cfg.gridDimY = 1; cfg.gridDimZ = 1
        out[c] = check(driver.cuOccupancyMaxActiveClusters(k, cfg))
    print(f"threads {threads} smem {smem // 1024} KiB: max active clusters {out}", flush=True)
