"""SPEC §6 in Triton device code, the stages both head widths share: the RMSNorm weight, the
RMSNorm, the cos/sin row of an entry and the RoPE of interleaved pairs (SPEC §12 runs the same
stages at width 128).

A token's normalized vector travels as a ``[ROWS, ROW_W]`` fp32 tensor whose row-major order is
channel order; the head decides the view (:mod:`.kv_entry`: ``[8, 64]``, :mod:`.indexer_entry`:
``[4, 32]``), which channels RoPE rotates, the quantization and the store.
"""


import triton
import triton.language as tl

from .exact_math import load_values, tree_sum_of_squares

ROPE_PAIRS = tl.constexpr(32)  # a cos_sin_cache row: cos[0:32] ‖ sin[0:32]


@triton.jit
def load_norm_weight(weight_ptr, ROWS: tl.constexpr, ROW_W: tl.constexpr, WEIGHT_BF16: tl.constexpr):
    """The RMSNorm weight as fp32 ``[ROWS, ROW_W]`` (row-major = channel order). ``weight_ptr``:
    fp32 [ROWS*ROW_W], or int16 of bf16 bit patterns (converted exactly: the pattern is the top
    half of the fp32)."""
    channels = tl.arange(0, ROWS)[:, None] * ROW_W + tl.arange(0, ROW_W)[None, :]
    return load_values(weight_ptr, channels, WEIGHT_BF16)


@triton.jit
def rms_norm(x, weight, eps, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr):
    """SPEC §6 (and §12 at width 128): ``y = (x * rr) * w`` with
    ``rr = 1 / sqrt(tree(x*x) * 2^-LOG2_WIDTH + eps)``.

    ``x``/``weight``: fp32 ``[rows, WIDTH / rows]``; the tree runs over the ``WIDTH = 2^LOG2_WIDTH``
    channels in channel order (flattening row-major is channel order); ``1 / WIDTH`` is exact;
    ``div_rn``/``sqrt_rn`` are the correctly rounded PTX ``div.rn``/``sqrt.rn``.
    """
    INV_WIDTH: tl.constexpr = 1.0 / WIDTH
    squares = tl.reshape(x * x, (WIDTH, ))
    mean_square = tree_sum_of_squares(squares, WIDTH, LOG2_WIDTH) * INV_WIDTH
    one = tl.full((), 1.0, tl.float32)
    rr = tl.div_rn(one, tl.sqrt_rn(mean_square + eps))
    return (x * rr) * weight


@triton.jit
def rope_row(position, RATIO: tl.constexpr):
    """SPEC §6: the ``cos_sin_cache`` row of the entry a boundary token at ``position`` closes,
    ``(p // r) * r`` (the group's first position)."""
    return (position // RATIO) * RATIO


@triton.jit
def apply_rope(y, cos_sin_row_ptr, FIRST_ROW: tl.constexpr, ROWS: tl.constexpr, ROW_W: tl.constexpr):
    """SPEC §6's RoPE of the 64 channels from row ``FIRST_ROW`` of the fp32 ``[ROWS, ROW_W]``
    tensor ``y`` (``spec.postprocess.apply_rope`` with ``start = FIRST_ROW * ROW_W``): every pair
    ``(a, b) = (y[g, 2j], y[g, 2j+1])`` becomes ``(a*cos - b*sin, a*sin + b*cos)``, each product
    rounded before the add/sub (no FMA: the kernel compiles without fp fusion).

    ``cos_sin_row_ptr``: fp32 [64], ``cos[0:32] ‖ sin[0:32]`` (:func:`rope_row`). All rows are
    rotated, those before ``FIRST_ROW`` with the first row's cos/sin (a by-product: the caller
    keeps the rows it needs). One RoPE row (the 512-wide head) loads the 32 cos/sin values once
    for every row.
    """
    a, b = tl.split(tl.reshape(y, (ROWS, ROW_W // 2, 2)))
    if ROWS - FIRST_ROW == 1:
        pair = tl.arange(0, ROPE_PAIRS)  # [32]: the same pairs in every row (broadcast)
    else:
        row = tl.arange(0, ROWS)[:, None]
        pair = tl.maximum(row - FIRST_ROW, 0) * (ROW_W // 2) + tl.arange(0, ROW_W // 2)[None, :]
    cos = tl.load(cos_sin_row_ptr + pair)
    sin = tl.load(cos_sin_row_ptr + ROPE_PAIRS + pair)
    out0 = a * cos - b * sin
    out1 = a * sin + b * cos
    return tl.reshape(tl.join(out0, out1), (ROWS, ROW_W))
