"""The host side of the C128 split path: its two launchers, their run lengths and the ``pooled``
scratch between them, behind the fused kernel's own argument list so that a compress and a step
call launch either path the same way."""

from __future__ import annotations

import torch

from .finish import layout_code
from .config import (MAX_TOKEN_RUN, POOL_PROGRAMS_PER_SM, STORE_PROGRAMS_PER_SM, SplitConfig, launch_options,
                     token_run)
from .launch import Launcher
from .rows import RowFormat
from .split_pool import split_pool_kernel
from .split_store import split_store_kernel


def sm_count(device: torch.device) -> int | None:
    """The SM count of a CUDA ``device`` (None for another device: the interpreter's CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_constants(head_dim: int, block_size: int, entry: tuple, rows: RowFormat, config: SplitConfig) -> tuple:
    """``(pool, store)``: the constexpr arguments of the two kernels for one static configuration (the
    launch plans and the PTX variants alike); ``entry``: ``(layout, hadamard, weight_bf16)``."""
    layout, hadamard, weight_bf16 = entry
    plan = config.plan()
    pool = dict(HEAD=head_dim, RATIO=128, BLOCK_SIZE=block_size, ROW_FORMAT=rows, BLOCK_C=config.block_c,
                MAX_RUN=MAX_TOKEN_RUN, LANE_BITS=plan.lane_bits, WARP_BITS=plan.warp_bits, REG_BITS=plan.reg_bits)
    store = dict(HEAD=head_dim, RATIO=128, LAYOUT=layout_code(head_dim, layout), HADAMARD=hadamard,
                 WEIGHT_BF16=weight_bf16, MAX_RUN=MAX_TOKEN_RUN)
    return pool, store


class SplitLaunch:
    """The split path of one launch plan: the pool kernel on ``(ceil(T / pool_run), HEAD / block_c)``,
    then the store kernel on ``ceil(T / store_run)``, on the current stream, ``pooled`` (fp32
    ``[T, HEAD]``) allocated per call from the caching allocator (inside a CUDA graph's capture,
    from its pool). Called with the fused kernel's runtime arguments."""

    def __init__(self, num_tokens: int, head_dim: int, config: SplitConfig, constants: tuple[dict, dict],
                 device: torch.device):
        pool_constants, store_constants = constants
        sms = sm_count(device)
        tiles = head_dim // config.block_c
        self.num_tokens, self.head_dim = num_tokens, head_dim
        self.pool_run = token_run(num_tokens, tiles, sms, POOL_PROGRAMS_PER_SM, config.pool_run)
        self.store_run = token_run(num_tokens, 1, sms, STORE_PROGRAMS_PER_SM, config.store_run)
        self.pool = Launcher(split_pool_kernel, (-(-num_tokens // self.pool_run), tiles),
                             {**pool_constants, **launch_options(config.num_warps, None), "enable_fp_fusion": False})
        self.store = Launcher(split_store_kernel, (-(-num_tokens // self.store_run),),
                              {**store_constants, **launch_options(config.store_warps, None), "enable_fp_fusion": False})

    def __call__(self, state, state_s0, state_s1, tokens, block_table, table_s0, weight, eps, cos_sin, cos_s0,
                 cache_u8, cache_i16, page_stride, entry_stride, entries, scale, ape, chunk) -> None:
        pooled = torch.empty((self.num_tokens, self.head_dim), dtype=torch.float32, device=state.device)
        self.pool(state, state_s0, state_s1, tokens, self.num_tokens, self.pool_run, block_table, table_s0, pooled,
                  ape, chunk)
        self.store(tokens, self.num_tokens, self.store_run, pooled, weight, eps, cos_sin, cos_s0, cache_u8, cache_i16,
                   page_stride, entry_stride, entries, scale)
