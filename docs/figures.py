"""The SVG figures of ``docs/``: ``python -m dsv4_compressor figures [--out-dir DIR] [--check]``.

Every figure is built by string concatenation from the numbers of SPEC.md (read from
:mod:`dsv4_compressor.spec.constants`), with no plotting library: this module needs only the
Python standard library, so the docs can be regenerated anywhere. The output is
deterministic (fixed number formatting, no timestamps), so ``docs/test_docs.py`` can check
that the committed SVGs are exactly what this script writes.

Figures:

- ``pipeline.svg``      the data flow from projections to cache bytes
- ``state_cache.svg``   a state-cache block: rows of ``kv | score`` and padded strides
- ``c4_window.svg``     C4's overlapped windows, the halves, the first window's invalid rows
- ``c128_window.svg``   C128's 128 rows through the block table, and the Block8 reduction
- ``flashmla_page.svg`` a ``flashmla_fp8`` page byte by byte (B = 4)
- ``indexer_pages.svg`` the indexer's ``indexer_fp8`` and ``indexer_mxfp4`` pages (B = 4, SPEC §12)
- ``state_formats.svg`` where a window's rows come from in ``compress_and_save`` (SPEC §13.4): the
  state (a ring of C rows) before the chunk, the call's own inputs from it on, and the tail saved after
- ``v41_pipeline.svg``  DeepSeek-V4.1's data flow with its bf16 rounding points (SPEC §14)
- ``v41_records.svg``   the ``v41_mxfp8`` and ``v41_nvfp4`` records and an interleaved page (SPEC §14.5)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

try:  # the SPEC constants, when the package is importable (it always is via ``-m``)
    from ..spec.constants import DATA_RECORD_BYTES, ENTRY_BYTES, HEAD_DIM, NOPE_DIM, NUM_QUANT_BLOCKS, QUANT_BLOCK, SCALE_RECORD_BYTES
    from ..spec.entry_layout import INDEXER_FP8, INDEXER_MXFP4
    INDEXER_RECORDS = {layout.name: (layout.data_bytes, layout.scale_bytes) for layout in (INDEXER_FP8, INDEXER_MXFP4)}
except ImportError:  # pragma: no cover - run as a plain script
    HEAD_DIM, NOPE_DIM, QUANT_BLOCK, NUM_QUANT_BLOCKS = 512, 448, 64, 7
    DATA_RECORD_BYTES, SCALE_RECORD_BYTES, ENTRY_BYTES = 576, 8, 584
    INDEXER_RECORDS = {"indexer_fp8": (128, 4), "indexer_mxfp4": (64, 4)}

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "figures"

# ---- palette: one meaning per colour across all figures ----------------------------------
KV = "#4E79A7"  # kv projections (blue)
KV_LIGHT = "#C9D8EA"
SCORE = "#F28E2B"  # scores, ape added (orange)
SCORE_LIGHT = "#FBD9B5"
H0 = "#76B7B2"  # C4 half 0: the first 512 channels (used as group c-1 of entry c)
H0_LIGHT = "#D3EAE8"
H1 = "#E17C9A"  # C4 half 1: the second 512 channels (used as group c of entry c)
H1_LIGHT = "#F6D5DF"
NOPE = "#59A14F"  # NoPE E4M3 bytes (green)
NOPE_LIGHT = "#CFE6CB"
ROPE = "#9C6FB0"  # RoPE bf16 values (purple)
ROPE_LIGHT = "#E3D5EA"
SCALE = "#EDC948"  # UE8M0 scale bytes (yellow)
SCALE_LIGHT = "#F8EBB8"
PAD = "#BAB0AC"  # the scale record's pad byte 0 (grey)
BLOCK = "#9C755F"  # block tables, physical blocks (brown)
BLOCK_LIGHT = "#E8DCD3"
SAVE = "#EAF1F8"  # boxes of save_partial_states
COMPRESS = "#F3EEF7"  # boxes of compress_norm_rope_store
INK = "#222222"
MUTED = "#666666"
LINE = "#444444"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"


# ---- a tiny SVG writer -------------------------------------------------------------------
def _n(value: float) -> str:
    """A fixed, platform-independent number format (at most 2 decimals, no trailing zeros)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


class Svg:
    """Accumulates SVG elements; :meth:`render` returns the document as text."""

    def __init__(self, width: float, height: float, title: str):
        self.width, self.height, self.title = width, height, title
        self.body: list[str] = []

    def rect(self, x, y, w, h, fill="none", stroke=LINE, sw=1.0, dash=None, rx=0, opacity=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' rx="{_n(rx)}"' if rx else ""
        extra += f' fill-opacity="{_n(opacity)}"' if opacity is not None else ""
        self.body.append(
            f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{_n(sw)}"{extra}/>'
        )

    def line(self, x1, y1, x2, y2, stroke=LINE, sw=1.0, dash=None, arrow=False):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += ' marker-end="url(#arrow)"' if arrow else ""
        self.body.append(
            f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{stroke}" stroke-width="{_n(sw)}"{extra}/>'
        )

    def path(self, d, fill="none", stroke=LINE, sw=1.0, dash=None, arrow=False, opacity=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += ' marker-end="url(#arrow)"' if arrow else ""
        extra += f' fill-opacity="{_n(opacity)}"' if opacity is not None else ""
        self.body.append(f'<path d="{d}" fill="{fill}" stroke="{stroke}" stroke-width="{_n(sw)}"{extra}/>')

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill=INK, mono=False, italic=False):
        while "  " in s:  # SVG collapses runs of spaces: keep them as no-break spaces
            s = s.replace("  ", " \u00a0")
        family = MONO if mono else FONT
        extra = ' font-weight="bold"' if weight == "bold" else ""
        extra += ' font-style="italic"' if italic else ""
        self.body.append(
            f'<text x="{_n(x)}" y="{_n(y)}" font-family="{family}" font-size="{_n(size)}" '
            f'text-anchor="{anchor}" fill="{fill}"{extra}>{_esc(s)}</text>'
        )

    def hatched(self, x, y, w, h, color=PAD, stroke=LINE, sw=1.0, dash=None):
        """A rectangle filled with the diagonal hatch (memory that is not part of the data)."""
        pattern = "hatch-red" if color == "red" else "hatch"
        self.rect(x, y, w, h, fill="#FFFFFF", stroke="none", sw=0)
        self.rect(x, y, w, h, fill=f"url(#{pattern})", stroke=stroke, sw=sw, dash=dash)

    def brace(self, x1, x2, y, label, size=11, below=True, fill=INK):
        """A square bracket under (or over) ``[x1, x2]`` with a centred label."""
        d = 6 if below else -6
        self.path(f"M{_n(x1)},{_n(y)} L{_n(x1)},{_n(y + d)} L{_n(x2)},{_n(y + d)} L{_n(x2)},{_n(y)}", sw=1)
        ty = y + d + (13 if below else -5)
        self.text((x1 + x2) / 2, ty, label, size=size, anchor="middle", fill=fill)

    def heading(self, title, size=17, subtitle=None):
        """The figure's bold title centred at the top, and the ``subtitle`` (muted) below it."""
        self.text(self.width / 2, 30, title, size=size, anchor="middle", weight="bold")
        if subtitle is not None:
            self.text(self.width / 2, 50, subtitle, size=12, anchor="middle", fill=MUTED)

    def lines(self, x, y, lines, step, **style):
        """Lines of text from ``y`` down, ``step`` apart (``style``: :meth:`text`'s keywords)."""
        for index, line in enumerate(lines):
            self.text(x, y + step * index, line, **style)

    def box(self, x, y, w, h, title, lines, fill, size=11.5):
        """A rounded box: a bold title, then ``lines`` of monospace text (``size``), centred."""
        self.rect(x, y, w, h, fill=fill, stroke=LINE, rx=6)
        self.text(x + w / 2, y + 19, title, size=13, anchor="middle", weight="bold")
        self.lines(x + w / 2, y + 38, lines, 16, size=size, anchor="middle", mono=True)

    def column(self, x, w, boxes, sw=1.4):
        """A column of :meth:`box` es, ``boxes`` given as ``(y, h, title, lines, fill)`` from the top,
        and an arrow (``sw`` wide) down the middle from each box to the next."""
        for y, h, title, lines, fill in boxes:
            self.box(x, y, w, h, title, lines, fill)
        for (y, h, *_), (next_y, *_) in zip(boxes, boxes[1:]):
            self.line(x + w / 2, y + h, x + w / 2, next_y - 2, arrow=True, sw=sw)

    def legend(self, x, y, items, cols=1, col_width=220, size=11):
        """Swatches with labels; ``items`` are ``(fill, label)`` with fill ``'hatch'`` for hatched."""
        for index, (fill, label) in enumerate(items):
            cx = x + (index % cols) * col_width
            cy = y + (index // cols) * 20
            if fill == "hatch":
                self.hatched(cx, cy - 10, 18, 12)
            elif fill == "hatch-red":
                self.hatched(cx, cy - 10, 18, 12, color="red", dash="3,2")
            else:
                self.rect(cx, cy - 10, 18, 12, fill=fill)
            self.text(cx + 25, cy, label, size=size)

    def render(self) -> str:
        head = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(self.width)}" height="{_n(self.height)}" '
            f'viewBox="0 0 {_n(self.width)} {_n(self.height)}">\n'
            f"<title>{_esc(self.title)}</title>\n"
            "<defs>\n"
            '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#F4F4F4"/><line x1="0" y1="0" x2="0" y2="6" stroke="#B5B5B5" stroke-width="2"/></pattern>\n'
            '<pattern id="hatch-red" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#FFF5F5"/><line x1="0" y1="0" x2="0" y2="6" stroke="#E8A0A0" stroke-width="2"/></pattern>\n'
            '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{LINE}"/></marker>\n'
            "</defs>\n"
            f'<rect x="0" y="0" width="{_n(self.width)}" height="{_n(self.height)}" fill="#FFFFFF"/>\n'
        )
        return head + "\n".join(self.body) + "\n</svg>\n"


# ---- figure 1: the data flow ---------------------------------------------------------------
def pipeline() -> str:
    svg = Svg(980, 800, "DeepSeek V4 KV compressor: data flow from projections to cache bytes")
    svg.heading("From projections to cache bytes", 18,
                "one call of save_partial_states, then one of compress_norm_rope_store, per layer and step")

    box = svg.box
    cx, w = 490, 620
    x = cx - w / 2
    svg.column(x, w, [
        (66, 62, "inputs of this step (T tokens)",
         ["kv_score[T, 2·SW] fp32 = kv ‖ score,   ape[r, SW] fp32", "positions, slot_mapping (state slot, −1 = padding)"],
         "#FFFFFF"),
        (150, 62, "save_partial_states (§4)",
         ["slot ≥ 0:  S = state_cache[slot // bs, slot % bs]", "S[0:SW] = kv (copied);  S[SW:2SW] = add(score, ape[p mod r])"],
         SAVE),
        (234, 62, "activity rule (§5)   — inactive tokens write nothing",
         ["slot_mapping[t] ≥ 0  and  (p + 1) mod r = 0  and  kv_slot_mapping[t] ≥ 0",
          "an active (boundary) token produces entry p // r"], COMPRESS),
        (318, 62, "window gather through block_table (§5)",
         ["row i = 0..W−1: pos = p − W + 1 + i (valid iff pos ≥ 0)",
          "S_i = state_cache[block_table[q, pos // bs], pos % bs], half h = i // r"], COMPRESS),
        (402, 62, "per-channel softmax pooling (§5)   → x fp32[512]",
         ["M = max s_i;  e_i = exp2s(mul(sub(s_i, M), L));  u_i = mul(kv_i, e_i)",
          "x = div(tree(u_0..u_W−1), tree(e_0..e_W−1))   (invalid rows: +0)"], COMPRESS),
        (486, 62, "RMSNorm (§6)   → y fp32[512]",
         ["rr = div(1, sqrt(add(mul(tree(x·x), 2^−9), eps)))",
          "y = mul(mul(x, rr), w)"], COMPRESS),
    ])
    # the two branches
    lx, rx, bw = 60, 510, 410
    svg.path(f"M{_n(cx)},548 L{_n(cx)},560 L{_n(lx + bw / 2)},560 L{_n(lx + bw / 2)},572", arrow=True, sw=1.4)
    svg.path(f"M{_n(cx)},560 L{_n(rx + bw / 2)},560 L{_n(rx + bw / 2)},572", arrow=True, sw=1.4)
    svg.rect(lx, 574, bw, 80, fill=NOPE_LIGHT, stroke=LINE, rx=6)
    svg.text(lx + bw / 2, 593, "NoPE: y[0:448], 7 blocks of 64", size=13, anchor="middle", weight="bold")
    svg.lines(lx + bw / 2, 612, ["q = bf16(y);  amax = max |q| per block",
                                 "k = smallest int with max(amax, 1e−4) ≤ 448·2^k",
                                 "scale byte 127 + k;  byte = e4m3(q · 2^−k)"], 16, size=11.5, anchor="middle", mono=True)
    svg.rect(rx, 574, bw, 80, fill=ROPE_LIGHT, stroke=LINE, rx=6)
    svg.text(rx + bw / 2, 593, "RoPE: y[448:512], unrounded fp32", size=13, anchor="middle", weight="bold")
    svg.lines(rx + bw / 2, 612, ["(a, b) = (y[448+2j], y[449+2j]), cp = (p // r)·r",
                                 "o0 = a·cos − b·sin,  o1 = a·sin + b·cos",
                                 "(co, si from cos_sin_cache[cp]);  bf16(o0), bf16(o1)"], 16, size=11.5, anchor="middle",
              mono=True)
    svg.line(lx + bw / 2, 654, lx + bw / 2, 676, arrow=True, sw=1.4)
    svg.line(rx + bw / 2, 654, rx + bw / 2, 676, arrow=True, sw=1.4)
    box(lx, 678, rx + bw - lx, 62, "store at kv_slot_mapping[t]: page = slot // B, o = slot % B (§7)",
        ["flashmla_fp8: 576-byte data record + 8-byte scale record;  bf16: 512 × bf16",
         "fp8_per_tensor: 512 × e4m3(mul(z, div(1, fp8_scale)));  no other byte is written"], COMPRESS)
    svg.legend(lx, 776, [(SAVE, "save_partial_states: writes state_cache only"),
                         (COMPRESS, "compress_norm_rope_store: reads state_cache, writes k_cache")],
               cols=2, col_width=360, size=11.5)
    return svg.render()


# ---- figure 2: the state cache --------------------------------------------------------------
def state_cache() -> str:
    svg = Svg(1000, 590, "State cache: rows of kv then score, padded strides")
    svg.heading("State cache (C4: SW = 1024, bs = 4), fp32 [num_state_blocks, bs, 2·SW]", 17,
                "strides (s0, s1, 1) in elements; here s1 = 2176 (row padding 128) and s0 = 5·s1 (one padding row per block)")
    x0, scale = 150, 0.3  # px per float
    width, s1 = 2048, 2176
    row_h, gap = 22, 4
    y = 124
    quarters = ((0, "kv[0:512]", KV_LIGHT, 0, "copied"), (512, "kv[512:1024]", KV_LIGHT, 1, "copied"),
                (1024, "score[0:512]", SCORE_LIGHT, 0, "+ ape[p mod r]"), (1536, "score[512:1024]", SCORE_LIGHT, 1, "+ ape[p mod r]"))
    for start, label, _, half, _ in quarters:
        svg.text(x0 + (start + 256) * scale, y - 22, label, size=11, anchor="middle", mono=True)
        svg.text(x0 + (start + 256) * scale, y - 8, f"half {half}", size=10, anchor="middle",
                 fill=H0 if half == 0 else H1, weight="bold")
    for tick in (0, 512, 1024, 1536, 2048, 2176):
        svg.text(x0 + tick * scale, y - 38, str(tick), size=10, anchor="middle", fill=MUTED)
        svg.line(x0 + tick * scale, y - 34, x0 + tick * scale, y - 30, stroke=MUTED)
    rows = [(block, offset) for block in (0, 1) for offset in range(5)]

    def row_y(index, block):
        return y + index * (row_h + gap) + block * 14

    for index, (block, offset) in enumerate(rows):
        ry = row_y(index, block)
        if offset == 4:
            svg.hatched(x0, ry, s1 * scale, row_h)
            svg.text(x0 - 8, ry + 15, "pad row", size=10.5, anchor="end", fill=MUTED)
            continue
        for start, _, fill, half, note in quarters:
            svg.rect(x0 + start * scale, ry, 512 * scale, row_h, fill=fill, stroke=LINE, sw=0.6)
            svg.rect(x0 + start * scale, ry, 512 * scale, 4, fill=H0 if half == 0 else H1, stroke="none", sw=0)
            svg.text(x0 + (start + 256) * scale, ry + 16, note, size=10.5, anchor="middle", fill=MUTED)
        svg.rect(x0, ry, width * scale, row_h, fill="none", stroke=LINE, sw=1)
        svg.hatched(x0 + width * scale, ry, (s1 - width) * scale, row_h)
        svg.text(x0 - 8, ry + 15, f"b={block}, o={offset} (slot {block * 4 + offset})", size=10.5, anchor="end", mono=True)
    # stride arrows
    ax = x0 + s1 * scale + 24
    svg.path(f"M{_n(ax)},{_n(y)} L{_n(ax)},{_n(y + row_h + gap)}", arrow=True, sw=1.2)
    svg.line(ax - 5, y, ax + 5, y)
    svg.text(ax + 8, y + 14, "s1 ≥ 2·SW,", size=11)
    svg.text(ax + 8, y + 28, "multiple of 4", size=10, fill=MUTED)
    blk1 = row_y(5, 1)
    svg.path(f"M{_n(ax + 90)},{_n(y)} L{_n(ax + 90)},{_n(blk1)}", arrow=True, sw=1.2)
    svg.line(ax + 85, y, ax + 95, y)
    svg.text(ax + 98, y + 66, "s0 ≥ bs·s1,", size=11)
    svg.text(ax + 98, y + 80, "multiple of 4", size=10, fill=MUTED)
    svg.brace(x0 + width * scale, x0 + s1 * scale, row_y(9, 1) + row_h + 4, "row padding", size=10)
    base = row_y(9, 1) + row_h + 56
    svg.text(40, base, "&S[b, o, d] = base + 4·(b·s0 + o·s1 + d) bytes;  base 16-byte aligned, last stride 1", size=12.5, mono=True)
    svg.text(40, base + 20, "position p of request q:  slot = block_table[q, p // bs]·bs + p % bs;  b = slot // bs, o = slot % bs",
             size=12.5, mono=True)
    svg.text(40, base + 42, "C128 (SW = 512): the same row with kv[0:512] ‖ score[0:512] (a single half); production bs = 8.",
             size=12.5)
    svg.text(40, base + 62, "Padding (hatched) is never read or written; compress_norm_rope_store never writes the state cache.",
             size=12.5)
    svg.legend(40, base + 94, [(KV_LIGHT, "kv (copied from kv_score)"), (SCORE_LIGHT, "score, ape added"),
                               ("hatch", "padding, never touched"), (H0, "C4 half 0 (channels 0..511)"),
                               (H1, "C4 half 1 (channels 512..1023)")],
               cols=3, col_width=300, size=11)
    return svg.render()


# ---- figure 3: C4 windows -----------------------------------------------------------------
def c4_window() -> str:
    svg = Svg(1000, 620, "C4: overlapped windows of 8 rows")
    svg.heading("C4 (r = 4, W = 8): entry c pools half 0 of group c−1 and half 1 of group c")
    x0, cw = 190, 38
    first, last = -4, 15

    def cx(p):
        return x0 + (p - first) * cw

    def marker(x, y):
        svg.path(f"M{_n(x - 6)},{_n(y)} L{_n(x + 6)},{_n(y)} L{_n(x)},{_n(y + 9)} z", fill=INK, stroke="none", sw=0)

    ty = 92  # token boxes
    svg.text(x0 - 12, ty - 22, "position p", size=11, anchor="end", fill=MUTED)
    svg.text(x0 - 12, ty + 14, "half 0", size=11, anchor="end", fill=H0, weight="bold")
    svg.text(x0 - 12, ty + 34, "half 1", size=11, anchor="end", fill=H1, weight="bold")
    for p in range(first, last + 1):
        x = cx(p)
        svg.text(x + cw / 2, ty - 22, str(p).replace("-", "−"), size=11, anchor="middle", fill=MUTED if p < 0 else INK)
        if p < 0:
            svg.hatched(x + 2, ty, cw - 4, 40, color="red", dash="3,2")
            continue
        svg.rect(x + 2, ty, cw - 4, 20, fill=H0_LIGHT)
        svg.rect(x + 2, ty + 20, cw - 4, 20, fill=H1_LIGHT)
        if (p + 1) % 4 == 0:
            marker(x + cw / 2, ty - 14)
    svg.text(x0 - 12, ty + 60, "group", size=11, anchor="end", fill=MUTED)
    svg.text(x0 - 12, ty + 74, "state block (bs = 4)", size=10, anchor="end", fill=MUTED)
    for g in range(4):
        svg.brace(cx(4 * g) + 2, cx(4 * g + 4) - 2, ty + 46, f"group {g}", size=11)
        svg.text((cx(4 * g) + cx(4 * g + 4)) / 2, ty + 74, f"block_table[q, {g}]", size=9.5, anchor="middle", mono=True, fill=MUTED)
    svg.brace(cx(-4) + 2, cx(0) - 2, ty + 46, "pos < 0", size=10.5, fill=MUTED)

    ly = 212
    for c in range(4):
        y = ly + c * 46
        p = 4 * c + 3
        svg.text(x0 - 12, y + 17, f"entry {c} (p = {p})", size=12, anchor="end", weight="bold")
        svg.line(cx(p) + cw / 2, ty + 80, cx(p) + cw / 2, y, stroke=LINE, sw=0.6, dash="2,3")
        for i in range(8):
            pos = p - 7 + i
            x = cx(pos)
            if pos < 0:
                svg.hatched(x + 2, y, cw - 4, 24, color="red", dash="3,2")
                svg.text(x + cw / 2, y + 16, "+0", size=11, anchor="middle", fill="#B03030", weight="bold")
                continue
            fill = H0_LIGHT if i < 4 else H1_LIGHT
            stroke = H0 if i < 4 else H1
            svg.rect(x + 2, y, cw - 4, 24, fill=fill, stroke=stroke, sw=1.5)
            svg.text(x + cw / 2, y + 16, f"i={i}", size=10, anchor="middle")
    svg.text(cx(-4), ly + 4 * 46 + 6,
             "entry 0: rows 0..3 are invalid (positions −4..−1): they read nothing and add e = u = +0 to both trees",
             size=11.5, fill="#B03030")

    # the state row and the half rule
    ry = ly + 4 * 46 + 42
    svg.text(x0 - 12, ry + 17, "state row S_i", size=12, anchor="end", weight="bold")
    seg = 120
    for index, (label, fill, half) in enumerate((("kv[0:512]", KV_LIGHT, 0), ("kv[512:1024]", KV_LIGHT, 1),
                                                 ("score[0:512]", SCORE_LIGHT, 0), ("score[512:1024]", SCORE_LIGHT, 1))):
        x = x0 + index * seg
        svg.rect(x, ry, seg, 24, fill=fill)
        svg.rect(x, ry, seg, 5, fill=H0 if half == 0 else H1, stroke="none", sw=0)
        svg.text(x + seg / 2, ry + 18, label, size=10.5, anchor="middle", mono=True)
        svg.text(x, ry + 38, str(index * 512), size=10, anchor="middle", fill=MUTED)
    svg.text(x0 + 4 * seg, ry + 38, "2048", size=10, anchor="middle", fill=MUTED)
    svg.text(x0 + 4 * seg + 16, ry + 10, "half 0 = columns [0:512] and [1024:1536]", size=11, fill=H0, weight="bold")
    svg.text(x0 + 4 * seg + 16, ry + 26, "half 1 = columns [512:1024] and [1536:2048]", size=11, fill=H1, weight="bold")
    fy = ry + 68
    svg.lines(40, fy, [
        "row i of the entry of boundary token p:  pos_i = p − 7 + i,  valid iff pos_i ≥ 0,  half h = i // 4",
        "kv_i[c] = S_i[512·h + c],  s_i[c] = S_i[1024 + 512·h + c]   (c = 0..511, channels independent)",
        "x[c] = div(tree(u_0..u_7), tree(e_0..e_7)), trees over the rows in row order;  RoPE row cp = (p // 4)·4",
    ], 20, size=12, mono=True)
    ly2 = fy + 78
    svg.legend(40, ly2, [(H0_LIGHT, "half 0 of the row's token"), (H1_LIGHT, "half 1 of the row's token"),
                         ("hatch-red", "invalid row: e = u = +0")], cols=4, col_width=225, size=11)
    marker(40 + 3 * 225 + 9, ly2 - 9)
    svg.text(40 + 3 * 225 + 25, ly2, "boundary token", size=11)
    return svg.render()


# ---- figure 4: C128 windows ---------------------------------------------------------------
PHYSICAL_IDS = (13, 2, 19, 7, 0, 16, 10, 4, 21, 9, 14, 1, 18, 6, 11, 22)  # block_table[q, 16c + j], shuffled
LANES_A = "#F2F2F2"
LANES_B = "#D9D9D9"
XOR = "#2F6690"


def c128_window() -> str:
    svg = Svg(1060, 625, "C128: 128 window rows through the block table")
    svg.heading("C128 (r = 128, W = 128, bs = 8): the window is 16 state blocks found through block_table")
    x0, bw = 150, 46
    right = x0 + 16 * bw + 10
    y = 78
    svg.text(x0 - 10, y + 17, "window rows", size=11.5, anchor="end", weight="bold")
    for j in range(16):
        x = x0 + j * bw
        svg.rect(x + 1, y, bw - 2, 26, fill=KV_LIGHT)
        for r in range(1, 8):
            svg.line(x + 1 + r * (bw - 2) / 8, y, x + 1 + r * (bw - 2) / 8, y + 26, stroke="#8FA9C8", sw=0.5)
        svg.text(x + bw / 2, y - 6, f"{8 * j}..{8 * j + 7}", size=9, anchor="middle", fill=MUTED)
    svg.text(right, y + 11, "rows i = 0..127", size=11)
    svg.text(right, y + 25, "pos = 128c + i", size=11, mono=True)
    ty = y + 58
    svg.text(x0 - 10, ty + 17, "block_table[q, ·]", size=11.5, anchor="end", weight="bold", mono=True)
    for j in range(16):
        x = x0 + j * bw
        svg.line(x + bw / 2, y + 26, x + bw / 2, ty, arrow=True, sw=1)
        svg.rect(x + 1, ty, bw - 2, 26, fill=BLOCK_LIGHT, stroke=BLOCK)
        svg.text(x + bw / 2, ty + 17, str(PHYSICAL_IDS[j]), size=12, anchor="middle", weight="bold")
        svg.text(x + bw / 2, ty + 40, f"16c+{j}", size=8.5, anchor="middle", fill=MUTED, mono=True)
    svg.text(right, ty + 11, "column = pos // 8", size=11, mono=True)
    svg.text(right, ty + 25, "row = pos % 8", size=11, mono=True)
    # physical blocks
    py = ty + 130
    pw = 16 * bw / 23
    svg.text(x0 - 10, py + 17, "state_cache", size=11.5, anchor="end", weight="bold", mono=True)
    used = set(PHYSICAL_IDS)
    for b in range(23):
        x = x0 + b * pw
        if b in used:
            svg.rect(x + 1, py, pw - 2, 26, fill=KV_LIGHT)
        else:
            svg.hatched(x + 1, py, pw - 2, 26)
        svg.text(x + pw / 2, py + 40, str(b), size=9.5, anchor="middle", fill=MUTED)
    for j, b in enumerate(PHYSICAL_IDS):
        svg.line(x0 + j * bw + bw / 2, ty + 46, x0 + b * pw + pw / 2, py, stroke=BLOCK, sw=0.9, arrow=True)
    svg.text(right, py + 11, "physical blocks", size=11)
    svg.text(right, py + 25, "(hatched: not this window's)", size=10, fill=MUTED)

    # Block8 mapping and the reduction tree
    ry = py + 92
    svg.text(530, ry, "Block8 mapping (a hint): 8 warps × 2 blocks give tree(u_0..u_127) in row order", size=14,
             anchor="middle", weight="bold")
    ry += 18
    svg.text(x0 - 10, ry + 16, "lanes", size=11.5, anchor="end", weight="bold")
    for j in range(16):
        x = x0 + j * bw
        svg.rect(x + 1, ry, bw - 2, 24, fill=LANES_A if j % 2 == 0 else LANES_B)
        svg.text(x + bw / 2, ry + 16, "0–15" if j % 2 == 0 else "16–31", size=10, anchor="middle")
    for w in range(8):
        svg.brace(x0 + 2 * w * bw + 3, x0 + (2 * w + 2) * bw - 3, ry + 28, f"warp {w}", size=10.5)
    svg.text(right, ry + 11, "lanes 0–15: block 2w", size=11)
    svg.text(right, ry + 25, "lanes 16–31: block 2w+1", size=11)

    leaf_y = ry + 70
    level_gap = 30
    nodes = [x0 + j * bw + bw / 2 for j in range(16)]
    for x in nodes:
        svg.rect(x - 4, leaf_y - 4, 8, 8, fill=KV, stroke="none", sw=0)
    level = 0
    while len(nodes) > 1:
        parent_y = leaf_y + (level + 1) * level_gap
        colour = XOR if level == 0 else BLOCK
        parents = []
        for k in range(0, len(nodes), 2):
            px = (nodes[k] + nodes[k + 1]) / 2
            for child in (nodes[k], nodes[k + 1]):
                svg.line(child, leaf_y + level * level_gap, px, parent_y, stroke=colour, sw=1.4)
            svg.rect(px - 4, parent_y - 4, 8, 8, fill=colour, stroke="none", sw=0)
            parents.append(px)
        nodes = parents
        level += 1
    svg.text(right, leaf_y + 4, "per-lane tree of 8 rows", size=11, fill=KV, weight="bold")
    svg.text(right, leaf_y + 18, "(levels 1–3, registers)", size=10, fill=MUTED)
    svg.text(right, leaf_y + level_gap + 8, "shfl.bfly xor 16 (level 4)", size=11, fill=XOR, weight="bold")
    svg.text(right, leaf_y + 2.5 * level_gap + 4, "cross-warp tree", size=11, fill=BLOCK, weight="bold")
    svg.text(right, leaf_y + 2.5 * level_gap + 18, "(levels 5–7, 8 warps, smem)", size=10, fill=MUTED)
    svg.text(right, leaf_y + 4 * level_gap + 4, "= tree(u_0..u_127)", size=11, mono=True)
    svg.text(x0, leaf_y + 4 * level_gap + 38,
             "The same for tree(e_0..e_127). Each lane also owns 4 consecutive channels: 16 lanes × 4 = one 64-channel tile.",
             size=11, fill=MUTED)
    return svg.render()


# ---- figure 5: a FlashMLA page --------------------------------------------------------------
def flashmla_page(entries: int = 4) -> str:
    page_bytes = entries * ENTRY_BYTES
    stride = -(-page_bytes // DATA_RECORD_BYTES) * DATA_RECORD_BYTES  # the engines' round_up(B*584, 576)
    scale_start = entries * DATA_RECORD_BYTES
    zoom = 1  # the entry whose records are drawn large
    svg = Svg(1000, 600, f"flashmla_fp8 page layout, B = {entries}")
    svg.heading(f"flashmla_fp8 page (B = {entries}): {entries} data records, {entries} scale records, padding to the page stride",
                16.5, f"page p starts at byte p·stride0; stride0 ≥ B·584 = {page_bytes} and a multiple of 16; "
                f"engines use round_up(B·584, 576) = {stride}")
    x0, width = 60, 880
    k = width / stride
    sx = x0 + scale_start * k
    y = 206  # the page bar

    # zoom 1 (above the page): the scale records
    zy2 = 96
    cell = width / (entries * SCALE_RECORD_BYTES)
    svg.path(f"M{_n(x0)},{_n(zy2 + 34)} L{_n(x0 + width)},{_n(zy2 + 34)} "
             f"L{_n(sx + entries * SCALE_RECORD_BYTES * k)},{_n(y)} L{_n(sx)},{_n(y)} z",
             fill=SCALE, stroke="none", sw=0, opacity=0.18)
    svg.text(x0, zy2 - 12, "scale records at page byte B·576 + o·8: 7 UE8M0 bytes (blocks 0..6, byte = 127 + k), then one byte 0",
             size=12, weight="bold")
    for o in range(entries):
        for b in range(SCALE_RECORD_BYTES):
            x = x0 + (o * SCALE_RECORD_BYTES + b) * cell
            if b < NUM_QUANT_BLOCKS:
                svg.rect(x, zy2, cell, 34, fill=SCALE if o == zoom else SCALE_LIGHT)
                svg.text(x + cell / 2, zy2 + 21, f"g{b}", size=10.5, anchor="middle")
            else:
                svg.rect(x, zy2, cell, 34, fill=PAD)
                svg.text(x + cell / 2, zy2 + 21, "0", size=11, anchor="middle", weight="bold")
        xo = x0 + o * SCALE_RECORD_BYTES * cell
        svg.rect(xo, zy2, SCALE_RECORD_BYTES * cell, 34, fill="none", stroke=INK, sw=1.6)
        svg.text(xo, zy2 + 48, str(scale_start + o * SCALE_RECORD_BYTES), size=10.5, anchor="middle")
        svg.text(xo + SCALE_RECORD_BYTES * cell / 2, zy2 + 48, f"entry o = {o}", size=11, anchor="middle")
    svg.text(x0 + width, zy2 + 48, str(page_bytes), size=10.5, anchor="middle")

    # the page
    for o in range(entries):
        x = x0 + o * DATA_RECORD_BYTES * k
        svg.rect(x, y, NOPE_DIM * k, 34, fill=NOPE if o == zoom else NOPE_LIGHT, stroke=LINE)
        svg.rect(x + NOPE_DIM * k, y, (DATA_RECORD_BYTES - NOPE_DIM) * k, 34, fill=ROPE if o == zoom else ROPE_LIGHT, stroke=LINE)
        svg.rect(x, y, DATA_RECORD_BYTES * k, 34, fill="none", stroke=INK, sw=1.6)
        svg.text(x + NOPE_DIM * k / 2, y + 22, f"data o = {o}", size=11.5, anchor="middle")
    svg.rect(sx, y, entries * SCALE_RECORD_BYTES * k, 34, fill=SCALE, stroke=INK, sw=1.2)
    svg.hatched(x0 + page_bytes * k, y, (stride - page_bytes) * k, 34)
    svg.rect(x0, y, width, 34, fill="none", stroke=INK, sw=1.6)
    svg.text(x0 + (page_bytes + stride) / 2 * k, y + 22, "never written", size=11, anchor="middle", fill=MUTED)
    for tick in [o * DATA_RECORD_BYTES for o in range(entries)] + [stride]:
        svg.line(x0 + tick * k, y + 34, x0 + tick * k, y + 40, stroke=INK)
        svg.text(x0 + tick * k, y + 52, str(tick), size=10.5, anchor="middle")
    svg.line(sx, y + 34, sx, y + 58, stroke=INK)
    svg.text(sx - 3, y + 68, f"{scale_start} = B·576", size=10.5, anchor="end")
    svg.line(x0 + page_bytes * k, y + 34, x0 + page_bytes * k, y + 58, stroke=INK)
    svg.text(x0 + page_bytes * k + 3, y + 68, f"{page_bytes} = B·584", size=10.5, anchor="start")
    svg.text(x0 - 6, y + 22, "page", size=11, anchor="end", weight="bold")

    # zoom 2 (below the page): one data record
    zy = 342
    rec = zoom * DATA_RECORD_BYTES
    kz = width / DATA_RECORD_BYTES
    svg.path(f"M{_n(x0 + rec * k)},{_n(y + 34)} L{_n(x0 + (rec + DATA_RECORD_BYTES) * k)},{_n(y + 34)} "
             f"L{_n(x0 + width)},{_n(zy)} L{_n(x0)},{_n(zy)} z", fill=NOPE, stroke="none", sw=0, opacity=0.12)
    svg.text(x0, zy - 12, f"data record o = {zoom} at page byte o·576 = {rec}: 448 E4M3 bytes (channels 0..447), then 64 bf16 RoPE values",
             size=12, weight="bold")
    for g in range(NUM_QUANT_BLOCKS):
        x = x0 + g * QUANT_BLOCK * kz
        svg.rect(x, zy, QUANT_BLOCK * kz, 40, fill=NOPE_LIGHT)
        svg.text(x + QUANT_BLOCK * kz / 2, zy + 17, f"block {g}", size=11, anchor="middle", weight="bold")
        svg.text(x + QUANT_BLOCK * kz / 2, zy + 32, f"ch {QUANT_BLOCK * g}..{QUANT_BLOCK * g + 63}", size=10, anchor="middle")
        svg.text(x, zy + 54, f"+{QUANT_BLOCK * g}", size=10, anchor="middle", fill=MUTED)
    rx = x0 + NOPE_DIM * kz
    svg.rect(rx, zy, (DATA_RECORD_BYTES - NOPE_DIM) * kz, 40, fill=ROPE_LIGHT)
    svg.text(rx + 64 * kz, zy + 17, "RoPE: 64 × bf16, LE", size=11, anchor="middle", weight="bold")
    svg.text(rx + 64 * kz, zy + 32, "o0, o1 of pairs j = 0..31", size=10, anchor="middle")
    svg.text(rx, zy + 54, f"+{NOPE_DIM}", size=10, anchor="middle", fill=MUTED)
    svg.text(x0 + width, zy + 54, f"+{DATA_RECORD_BYTES}", size=10, anchor="middle", fill=MUTED)
    svg.rect(x0, zy, width, 40, fill="none", stroke=INK, sw=1.6)

    fy = 440
    svg.lines(x0, fy, [
        "entry slot s: page = s // B, o = s % B. NoPE byte d at page·stride0 + o·576 + d;",
        "RoPE channel 448+m (bf16) at page·stride0 + o·576 + 448 + 2m; scale byte g at page·stride0 + B·576 + o·8 + g",
        "value of NoPE channel d (for readers) = e4m3_to_float(byte[d]) · 2^(scale_byte[d // 64] − 127)",
        f"bytes from B·584 = {page_bytes} up to the page stride, and entries that no active token addresses, are never written",
    ], 19, size=11.5, mono=True)
    svg.legend(x0, fy + 100, [(NOPE_LIGHT, "NoPE: E4M3FN bytes"), (ROPE_LIGHT, "RoPE: bf16 little-endian"),
                              (SCALE_LIGHT, "UE8M0 scale bytes"), (PAD, "pad byte, always 0"),
                              ("hatch", "page padding, never written"), (SCALE, "entry o = 1: its records, drawn large")],
               cols=3, col_width=290, size=11)
    return svg.render()


def _indexer_page(svg: Svg, layout: str, y: float, entries: int, zoom: int) -> None:
    """One indexer page bar at height ``y`` with its data record ``zoom`` and scale records drawn large."""
    data, scale = INDEXER_RECORDS[layout]
    page_bytes = entries * (data + scale)
    stride = -(-page_bytes // 16) * 16 + 16  # >= B·E, a multiple of 16 (here with 16 bytes of padding)
    x0, width = 60, 880
    k = width / stride
    fp8 = layout == "indexer_fp8"
    svg.text(x0, y - 84, f"{layout} (E = {data + scale}): B data records of {data} bytes, then B scale records of {scale} bytes;"
             f" stride0 ≥ B·{data + scale} = {page_bytes}, a multiple of 16", size=13, weight="bold")
    # zoom of one data record and its scale record (above the bar)
    zy = y - 66
    zw = width * 0.72
    groups = 1 if fp8 else 4
    for g in range(groups):
        gx = x0 + g * zw / groups
        svg.rect(gx, zy, zw / groups, 30, fill=NOPE_LIGHT)
        label = ("128 E4M3 bytes: channels 0..127, one block" if fp8
                 else f"ch {32 * g}..{32 * g + 31} → bytes {16 * g}..{16 * g + 15}")
        svg.text(gx + zw / groups / 2, zy + 19, label, size=10.5, anchor="middle")
    svg.rect(x0, zy, zw, 30, fill="none", stroke=INK, sw=1.6)
    sx = x0 + zw + 20
    sw = width - zw - 20
    if fp8:
        svg.rect(sx, zy, sw, 30, fill=SCALE_LIGHT)
        svg.text(sx + sw / 2, zy + 19, "binary32 2^k, little-endian", size=10.5, anchor="middle")
    else:
        for g in range(4):
            svg.rect(sx + g * sw / 4, zy, sw / 4, 30, fill=SCALE_LIGHT)
            svg.text(sx + (g + 0.5) * sw / 4, zy + 19, f"g{g}", size=10.5, anchor="middle")
    svg.rect(sx, zy, sw, 30, fill="none", stroke=INK, sw=1.6)
    # the page bar
    for o in range(entries):
        x = x0 + o * data * k
        svg.rect(x, y, data * k, 30, fill=NOPE if o == zoom else NOPE_LIGHT, stroke=INK, sw=1.2)
        svg.text(x + data * k / 2, y + 19, f"data o = {o}", size=11, anchor="middle")
    scale_start = entries * data
    for o in range(entries):
        x = x0 + (scale_start + o * scale) * k
        svg.rect(x, y, scale * k, 30, fill=SCALE if o == zoom else SCALE_LIGHT, stroke=INK, sw=1.2)
    svg.hatched(x0 + page_bytes * k, y, (stride - page_bytes) * k, 30)
    svg.rect(x0, y, width, 30, fill="none", stroke=INK, sw=1.6)
    svg.path(f"M{_n(x0 + zoom * data * k)},{_n(y)} L{_n(x0)},{_n(zy + 30)} L{_n(x0 + zw)},{_n(zy + 30)} "
             f"L{_n(x0 + (zoom + 1) * data * k)},{_n(y)} z", fill=NOPE, stroke="none", sw=0, opacity=0.15)
    zs = x0 + (scale_start + zoom * scale) * k
    svg.path(f"M{_n(zs)},{_n(y)} L{_n(sx)},{_n(zy + 30)} L{_n(sx + sw)},{_n(zy + 30)} L{_n(zs + scale * k)},{_n(y)} z",
             fill=SCALE, stroke="none", sw=0, opacity=0.25)
    for tick, anchor in ((0, "middle"), (zoom * data, "middle"), (scale_start, "end"), (page_bytes, "start")):
        svg.line(x0 + tick * k, y + 30, x0 + tick * k, y + 36, stroke=INK)
        label = {scale_start: f"{tick} = B·{data}", page_bytes: f"{tick} = B·{data + scale}"}.get(tick, str(tick))
        svg.text(x0 + tick * k + (-2 if anchor == "end" else 2 if anchor == "start" and tick else 0), y + 48, label,
                 size=10.5, anchor=anchor)
    svg.line(x0 + stride * k, y + 30, x0 + stride * k, y + 52, stroke=INK)
    svg.text(x0 + stride * k, y + 63, f"stride0 = {stride}", size=10.5, anchor="end")
    svg.text(x0 - 6, y + 19, "page", size=11, anchor="end", weight="bold")


def indexer_pages(entries: int = 4) -> str:
    svg = Svg(1000, 480, f"indexer_fp8 and indexer_mxfp4 page layouts, B = {entries}")
    svg.heading(f"The indexer's cache pages (head width 128, SPEC §12), B = {entries}; entry o = 1 drawn large", 16.5)
    _indexer_page(svg, "indexer_fp8", 160, entries, 1)
    _indexer_page(svg, "indexer_mxfp4", 320, entries, 1)
    fy = 405
    svg.lines(60, fy, [
        "slot s: page = s // B, o = s % B; data record at page·stride0 + o·D, scale record at page·stride0 + B·D + o·4",
        "mxfp4 data byte j = code[2j] | code[2j+1] << 4 (E2M1 codes: sign bit 3, grid 0, .5, 1, 1.5, 2, 3, 4, 6)",
    ], 19, size=11.5, mono=True)
    svg.legend(60, fy + 55, [(NOPE_LIGHT, "data: E4M3 / packed E2M1 codes"), (SCALE_LIGHT, "scale: fp32 2^k / UE8M0 bytes"),
                             ("hatch", "page padding, never written")], cols=3, col_width=290, size=11)
    return svg.render()


# ---- figure 7: SPEC §13, where a window's rows come from --------------------------------------
def state_formats(ratio: int = 4, window: int = 8, capacity: int = 12, block: int = 4, first: int = 14, tokens: int = 16) -> str:
    """C4, a ring of ``capacity`` rows in blocks of ``block``, one request's chunk of ``tokens`` tokens from ``first``."""
    last = first + tokens - 1
    svg = Svg(1000, 610, "SPEC 13.4: where the rows of a window come from")
    svg.heading(f"compress_and_save (SPEC §13.4): C4, a ring of C = {capacity} rows, one request's chunk of {tokens} tokens",
                16.5)
    lo = first - capacity
    x0, cw = 175, 29

    def cx(p):
        return x0 + (p - lo) * cw

    ty = 92
    svg.text(x0 - 12, ty - 20, "position q", size=11, anchor="end", fill=MUTED)
    svg.text(x0 - 12, ty + 15, "rows the call reads", size=11, anchor="end", weight="bold")
    for p in range(lo, last + 1):
        x = cx(p)
        svg.text(x + cw / 2, ty - 20, str(p), size=10.5, anchor="middle")
        in_chunk = p >= first
        svg.rect(x + 1.5, ty, cw - 3, 22, fill=KV_LIGHT if in_chunk else BLOCK_LIGHT, stroke=KV if in_chunk else BLOCK)
        svg.text(x + cw / 2, ty + 15, f"u{p - first}" if in_chunk else f"s{p % capacity}", size=9.5, anchor="middle", mono=True)
        if (p + 1) % ratio == 0:
            svg.path(f"M{_n(x + cw / 2 - 5)},{_n(ty - 14)} L{_n(x + cw / 2 + 5)},{_n(ty - 14)} L{_n(x + cw / 2)},{_n(ty - 6)} z",
                     fill=INK, stroke="none", sw=0)
    svg.brace(cx(lo) + 2, cx(first) - 2, ty + 28, f"the state: the ring holds positions {lo}..{first - 1} (slot s = q mod {capacity})", size=10.5)
    svg.brace(cx(first) + 2, cx(last + 1) - 2, ty + 28,
              f"this call's kv/score: token u = query_start_loc[req] + (q − P0)", size=10.5)
    px = cx(first)
    svg.line(px, ty - 34, px, ty + 26, stroke="#B03030", sw=1.5, dash="4,3")
    svg.text(px, ty - 38, f"P0 = positions[query_start_loc[req]] = {first}", size=11, anchor="middle", fill="#B03030", weight="bold")

    wy = ty + 80
    boundaries = [p for p in range(first, last + 1) if (p + 1) % ratio == 0]
    for row, p in enumerate(boundaries):
        y = wy + row * 34
        svg.text(x0 - 12, y + 15, f"entry {p // ratio} (p = {p})", size=11.5, anchor="end", weight="bold")
        for i in range(window):
            q = p - window + 1 + i
            in_chunk = q >= first
            svg.rect(cx(q) + 1.5, y, cw - 3, 22, fill=KV_LIGHT if in_chunk else BLOCK_LIGHT, stroke=KV if in_chunk else BLOCK, sw=1.5)
            svg.text(cx(q) + cw / 2, y + 15, f"i{i}", size=9.5, anchor="middle", mono=True)
        from_state = sum(1 for i in range(window) if p - window + 1 + i < first)
        note = f"{from_state} ring + {window - from_state} input rows" if from_state else f"{window} input rows"
        svg.text(cx(p - window + 1) - 8, y + 15, note, size=10.5, anchor="end", fill=MUTED)

    # the ring before and after the call
    ry = wy + len(boundaries) * 34 + 48
    svg.text(60, ry - 14, f"The ring: the first C / bs = {capacity // block} blocks of the request's block-table row (bs = {block})",
             size=12.5, weight="bold")
    rx, rw = 300, 44
    for b in range(capacity // block):
        svg.text(rx + (b * block + block / 2) * rw, ry + 4, f"block_table[req, {b}]", size=10, anchor="middle", mono=True, fill=MUTED)
    tail = range(last - capacity + 1, last + 1)
    for line, (label, fill, stroke, held) in enumerate((
        ("before the call (the compress reads it)", BLOCK_LIGHT, BLOCK, {q % capacity: q for q in range(lo, first)}),
        (f"after the save of the tail (positions {tail[0]}..{tail[-1]})", SAVE, KV, {q % capacity: q for q in tail}),
    )):
        y = ry + 12 + line * 32
        svg.text(rx - 10, y + 16, label, size=11, anchor="end")
        for slot in range(capacity):
            svg.rect(rx + slot * rw + 1, y, rw - 2, 24, fill=fill, stroke=stroke)
            svg.text(rx + slot * rw + rw / 2, y + 16, f"q={held[slot]}", size=9.5, anchor="middle", mono=True)
        for b in range(1, capacity // block):
            svg.line(rx + b * block * rw, y - 2, rx + b * block * rw, y + 26, stroke=INK, sw=2)
    for slot in range(capacity):
        svg.text(rx + slot * rw + rw / 2, ry + 90, f"s{slot}", size=9.5, anchor="middle", mono=True, fill=MUTED)

    fy = ry + 122
    svg.lines(40, fy, [
        "q < P0: S = state_cache[block_table[req, (q mod C) // bs], (q mod C) mod bs]   (paged: q in place of q mod C)",
        "q ≥ P0: kv_i = R(kv[u]), s_i = R(add(score[u], ape[q mod r]))  (ape_at save) or add(R(score[u]), ape[q mod r])",
        "        (ape_at compress): the row as the save would store it, read back as pooling reads it; R = bf16 or identity",
        f"then the save: the tail, the last C tokens of the chunk ({tail[0]}..{tail[-1]}); {first}..{tail[0] - 1} have"
        f" save_slot_mapping = −1",
    ], 19, size=11.5, mono=True)
    svg.legend(40, fy + 98, [(BLOCK_LIGHT, "a row from the state (here the ring)"), (KV_LIGHT, "a row from this call's kv/score"),
                              (SAVE, "a ring row written by this call's save")], cols=3, col_width=300, size=11)
    return svg.render()


# ---- figures 8 and 9: DeepSeek-V4.1 (SPEC §14) --------------------------------------------------
ROUND = "#D1495B"  # a bf16 rounding point (red)
ROUND_LIGHT = "#F7D6DB"
LATENT = "#EDE7D9"  # the bf16 latent, an interface between calls (sand)


def _bf16_badge(svg: Svg, x: float, y: float, label: str = "bf16") -> None:
    """A red badge centred at ``(x, y)``: a value is rounded to bf16 (nearest, ties to even) here."""
    w = 9 + 6.6 * len(label)
    svg.rect(x - w / 2, y - 9, w, 18, fill=ROUND, stroke=ROUND, rx=9)
    svg.text(x, y + 4, label, size=10.5, anchor="middle", weight="bold", fill="#FFFFFF")


def v41_pipeline() -> str:
    svg = Svg(1000, 930, "DeepSeek-V4.1 compressors: data flow and bf16 rounding points")
    svg.heading("DeepSeek-V4.1 (SPEC §14): from projections to cache bytes, ratios 1 and 2", 18,
                "every red badge is a bf16 rounding (nearest, ties to even); everything between badges is §2's binary32")

    box = svg.box
    lx, lw = 40, 600  # the main column
    cx = lx + lw / 2
    svg.column(lx, lw, [
        (66, 62, "inputs (T tokens)",
         ["kv[T, 512], score[T, 512] (ratio 2): fp32, or bf16 read exactly",
          "ratio 2: state rows kv ‖ raw score (fp32 or bf16; paged or a ring)"], "#FFFFFF"),
        (150, 78, "window (ratio 2: positions p − 1, p; ratio 1: x = kv[t])",
         ["row q ≥ P0 (in the chunk): R(kv[u]), R(score[u]), u = qsl[req] + q − P0",
          "row q < P0: the state row (paged, or the ring slot q mod C)",
          "R = bf16 with a bf16 state, else the identity"], COMPRESS),
        (250, 78, "softmax, then sum (ratio 2)   → x fp32[512]",
         ["M = max(s0, s1);  e_i = exp2s(mul(sub(s_i, M), L))",
          "den = add(e0, e1);  w_i = div(e_i, den)",
          "x = add(mul(kv0, w0), mul(kv1, w1))   (weights first, then the sum)"], COMPRESS),
        (364, 62, "RMSNorm of x' = bf16(x)   → y fp32[512]",
         ["rr = div(1, sqrt(add(mul(tree(x'·x'), 2^−9), eps)))",
          "y = mul(mul(x', rr), w)"], COMPRESS),
        (462, 62, "latent ℓ = bf16(y)   → latent[t, 0:512] (bf16)",
         ["an interface: v41_rope_quant_store reads it, and the indexer's",
          "wk projection makes k_pre = wk(latent) from it"], LATENT),
        (560, 78, "RoPE at cp = (p // r)·r   → rotated entry z (512 × bf16)",
         ["z[d] = latent[d] for d < 448: copied bit for bit (−0 stays −0)",
          "a = latent[448+2j], b = latent[449+2j]: o0 = a·co − b·si",
          "o1 = a·si + b·co;  z[448+2j] = bf16(o0), z[449+2j] = bf16(o1)"], COMPRESS),
    ])
    _bf16_badge(svg, cx + 120, 346, "x' = bf16(x)")
    _bf16_badge(svg, cx + 120, 444, "ℓ = bf16(y)")
    _bf16_badge(svg, lx + lw - 26, 625, "bf16")
    _bf16_badge(svg, lx + lw - 20, 212, "R")

    # the records
    ry = 676
    svg.line(cx, 638, cx, ry - 2, arrow=True, sw=1.4)
    rw = (lw - 20) / 3
    records = [
        ("v41_nvfp4 (288 B)", ["32 tiles of 16:", "σ = e4m3(div(a, 6))", "code = e2m1(div(z, σ))"]),
        ("v41_mxfp8 (528 B)", ["16 blocks of 32:", "k: a ≤ 448·2^k", "byte = e4m3(z·2^−k)"]),
        ("§7 records of z", ["flashmla_fp8, bf16,", "fp8_per_tensor: NoPE", "= z[0:448], RoPE z[448:]"]),
    ]
    for index, (title, lines) in enumerate(records):
        x = lx + index * (rw + 10)
        svg.rect(x, ry, rw, 90, fill=NOPE_LIGHT if index < 2 else ROPE_LIGHT, stroke=LINE, rx=6)
        svg.text(x + rw / 2, ry + 19, title, size=12.5, anchor="middle", weight="bold")
        for k, line in enumerate(lines):
            svg.text(x + rw / 2, ry + 40 + 16 * k, line, size=11, anchor="middle", mono=True)
    svg.text(lx, ry + 112, "one record per boundary token with kv_slot_mapping ≥ 0, at page = slot // B, o = slot % B;",
             size=11.5)
    svg.text(lx, ry + 130, "the V4.1 records are interleaved (a token's scales follow its own data); no other byte is written",
             size=11.5)

    # the save (ratio 2), after the compress
    sx, sw_ = 680, 280
    box(sx, 250, sw_, 78, "save (ratio 2), after",
        ["save_slot_mapping[t] ≥ 0:", "R(kv[t]), R(score[t])", "(raw score, no ape)"], SAVE)
    svg.path(f"M{_n(lx + lw)},289 L{_n(sx - 2)},289", arrow=True, sw=1.2, dash="5,3")
    svg.text(sx + sw_ / 2, 346, "a ring keeps each chunk's", size=11, anchor="middle", fill=MUTED)
    svg.text(sx + sw_ / 2, 361, "last C tokens (its tail)", size=11, anchor="middle", fill=MUTED)
    _bf16_badge(svg, sx + sw_ - 30, 312, "R")

    # the index key, from the latent
    kx, kw = 680, 280
    svg.rect(kx, 462, kw, 176, fill="#FFFFFF", stroke=LINE, rx=6)
    svg.text(kx + kw / 2, 481, "index key (§14.6)", size=13, anchor="middle", weight="bold")
    svg.lines(kx + 14, 500, ["k_pre = wk(latent), bf16[128]", "(a bf16 GEMM, outside)", "norm over 128 → κ",
                             "RoPE on 64..127 at cp", "z = κ[0:64] ‖ (o0, o1)", "no Hadamard rotation",
                             "→ indexer_fp8 or _mxfp4"], 19, size=11, mono=True)
    svg.path(f"M{_n(lx + lw)},493 L{_n(kx - 2)},493", arrow=True, sw=1.2)
    _bf16_badge(svg, kx + kw - 58, 534, "κ = bf16")
    _bf16_badge(svg, kx + kw - 58, 572, "bf16 (o0, o1)")

    svg.legend(lx, 850, [(COMPRESS, "compress, norm, RoPE, records"), (SAVE, "ratio 2's save (the state)"),
                         (LATENT, "the bf16 latent (an output)"), (ROUND, "a bf16 rounding")],
               cols=4, col_width=230, size=11)
    svg.text(lx, 905, "Against V4 (§5–§7): no ape, a window of r = 1 or 2 rows, the weights normalized before the sum, and the",
             size=11, fill=MUTED)
    svg.text(lx, 921, "bf16 roundings of x, y and the RoPE outputs, which the model was trained with.", size=11, fill=MUTED)
    return svg.render()


def _record_bar(svg: Svg, y: float, title: str, data_bytes: int, groups: int, scale_bytes: int, data_label: str,
                scale_cell: str) -> None:
    """One interleaved record as a bar of ``groups`` data groups then the scale bytes, and a zoom of the scale bytes."""
    x0, width = 60, 880
    entry = data_bytes + scale_bytes
    k = width / entry
    svg.text(x0, y - 14, title, size=13, weight="bold")
    per = data_bytes / groups
    for g in range(groups):
        svg.rect(x0 + g * per * k, y, per * k, 34, fill=NOPE_LIGHT if g % 2 == 0 else NOPE, stroke=LINE, sw=0.5)
    sx = x0 + data_bytes * k
    svg.rect(sx, y, scale_bytes * k, 34, fill=SCALE, stroke=LINE, sw=0.5)
    svg.rect(x0, y, width, 34, fill="none", stroke=INK, sw=1.6)
    for tick, anchor in ((0, "middle"), (entry, "end")):
        svg.line(x0 + tick * k, y + 34, x0 + tick * k, y + 40, stroke=INK)
        svg.text(x0 + tick * k + (-3 if anchor == "end" else 0), y + 52, f"+{tick}", size=10.5, anchor=anchor)
    svg.text(x0 + data_bytes * k / 2, y + 52, data_label, size=11, anchor="middle")
    # the scale bytes, drawn large
    zy = y + 78
    svg.path(f"M{_n(sx)},{_n(y + 34)} L{_n(sx + scale_bytes * k)},{_n(y + 34)} L{_n(x0 + width)},{_n(zy)} L{_n(x0)},{_n(zy)} z",
             fill=SCALE, stroke="none", sw=0, opacity=0.2)
    cell = width / scale_bytes
    for g in range(scale_bytes):
        svg.rect(x0 + g * cell, zy, cell, 26, fill=SCALE_LIGHT if g % 2 == 0 else SCALE, stroke=LINE, sw=0.5)
        svg.text(x0 + (g + 0.5) * cell, zy + 17, scale_cell.format(byte=data_bytes + g, g=g), size=10 if scale_bytes <= 16 else 8.5,
                 anchor="middle")
    svg.rect(x0, zy, width, 26, fill="none", stroke=INK, sw=1.4)


def v41_records(entries: int = 4) -> str:
    svg = Svg(1000, 640, "v41_mxfp8 and v41_nvfp4 records, and an interleaved page")
    svg.heading("DeepSeek-V4.1's records (SPEC §14.5): each token's scales follow its own data", 17,
                "entry o of page p starts at byte p·stride0 + o·E; stride0 ≥ B·E and a multiple of 16")
    _record_bar(svg, 96, "v41_mxfp8 (E = 528): data byte d = e4m3(z[d]·2^−k_g), then scale byte g = 127 + k_g (UE8M0)",
                512, 16, 16, "16 blocks g of 32 channels: bytes 32g .. 32g + 31", "+{byte}: g{g}")
    _record_bar(svg, 256, "v41_nvfp4 (E = 288): byte j = code[2j] | code[2j+1] << 4, then scale byte g = the E4M3 code of σ_g",
                256, 32, 32, "32 tiles g of 16 channels: bytes 8g .. 8g + 7", "{byte}")
    svg.text(60, 392, "zoomed: the 16 UE8M0 bytes of blocks g at +512 + g, and the 32 E4M3 bytes of σ_g at +256 + g",
             size=11, fill=MUTED)
    # an interleaved page against a split one
    y = 446
    x0, width = 60, 880
    svg.text(x0, y - 14, f"a page of B = {entries} v41_nvfp4 entries: data, scales, data, scales, …", size=13, weight="bold")
    k = width / (entries * 288 + 32)
    for o in range(entries):
        x = x0 + o * 288 * k
        svg.rect(x, y, 256 * k, 30, fill=NOPE_LIGHT, stroke=LINE)
        svg.rect(x + 256 * k, y, 32 * k, 30, fill=SCALE, stroke=LINE)
        svg.text(x + 128 * k, y + 19, f"data o = {o}", size=11, anchor="middle")
        svg.text(x, y + 44, f"+{o * 288}", size=10, anchor="middle", fill=MUTED)
    svg.hatched(x0 + entries * 288 * k, y, 32 * k, 30)
    svg.rect(x0, y, width, 30, fill="none", stroke=INK, sw=1.6)
    y2 = y + 84
    svg.text(x0, y2 - 14, "for comparison, §7/§12's split pages: all B data records, then all B scale records", size=13,
             weight="bold")
    for o in range(entries):
        svg.rect(x0 + o * 256 * k, y2, 256 * k, 30, fill=NOPE_LIGHT, stroke=LINE)
        svg.text(x0 + (o * 256 + 128) * k, y2 + 19, f"data o = {o}", size=11, anchor="middle")
        svg.rect(x0 + (entries * 256 + o * 32) * k, y2, 32 * k, 30, fill=SCALE, stroke=LINE)
    svg.hatched(x0 + entries * 288 * k, y2, 32 * k, 30)
    svg.rect(x0, y2, width, 30, fill="none", stroke=INK, sw=1.6)
    svg.legend(x0, 618, [(NOPE_LIGHT, "data: E4M3 bytes / packed E2M1 codes"), (SCALE, "scales: UE8M0 / E4M3 bytes"),
                         ("hatch", "page padding, never written")], cols=3, col_width=300, size=11)
    return svg.render()

FIGURES: dict[str, Callable[[], str]] = {
    "pipeline.svg": pipeline,
    "state_cache.svg": state_cache,
    "c4_window.svg": c4_window,
    "c128_window.svg": c128_window,
    "flashmla_page.svg": flashmla_page,
    "indexer_pages.svg": indexer_pages,
    "state_formats.svg": state_formats,
    "v41_pipeline.svg": v41_pipeline,
    "v41_records.svg": v41_records,
}


def render_all() -> dict[str, str]:
    """Every figure's SVG text, by file name."""
    return {name: build() for name, build in FIGURES.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help=f"where to write the SVG files (default: {DEFAULT_OUT_DIR})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if any file in --out-dir differs from what would be written")


def run(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    stale = []
    for name, text in render_all().items():
        path = out_dir / name
        data = text.encode("utf-8")
        if getattr(args, "check", False):
            if not path.is_file() or path.read_bytes() != data:
                stale.append(name)
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    if stale:
        print("out of date: " + ", ".join(stale) + " (run: python -m dsv4_compressor figures)")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
