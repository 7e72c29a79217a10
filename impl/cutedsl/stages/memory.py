"""Global-memory access through raw 64-bit byte addresses with known alignment.

Why raw addresses: the caches exceed 2^31 bytes and may have padded, size-1 or otherwise
unusual strides that SPEC §9 allows. Computing ``base + Int64 offset`` ourselves keeps every
offset 64-bit, and building the pointer with an explicit ``assumed_align`` tells the
compiler exactly the alignment the front end has checked, which is what lets a 4-float
access become one ``ld.global.v4.b32`` (and a bf16 quad one 8-byte store) without any
divisibility contract on the strides themselves (TVM-FFI would enforce those even on
size-1 dimensions, where SPEC lets strides be anything).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int16, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

GMEM = cute.AddressSpace.gmem


def gmem_tensor(dtype, byte_address, count: int, align: int) -> cute.Tensor:
    """A 1-D global tensor of ``count`` contiguous ``dtype`` elements at ``byte_address``."""
    ptr = cute.make_ptr(dtype, byte_address, GMEM, assumed_align=align)
    return cute.make_tensor(ptr, cute.make_layout(count))


def load_into(frag: cute.Tensor, byte_address, align: int) -> None:
    """Registers ``frag`` <- contiguous global memory (vectorized up to ``align`` bytes)."""
    cute.autovec_copy(gmem_tensor(frag.element_type, byte_address, cute.size(frag), align), frag)


def load_fragment(dtype, byte_address, count: int, align: int) -> cute.Tensor:
    """A new register fragment of ``count`` contiguous elements."""
    frag = cute.make_rmem_tensor((count,), dtype)
    load_into(frag, byte_address, align)
    return frag


def store_fragment(frag: cute.Tensor, byte_address, align: int) -> None:
    """``frag`` (registers) -> contiguous global memory at ``byte_address``."""
    cute.autovec_copy(frag, gmem_tensor(frag.element_type, byte_address, cute.size(frag), align))


def store_scalar(dtype, byte_address, value) -> None:
    """One element store (e.g. a UE8M0 scale byte)."""
    gmem_tensor(dtype, byte_address, 1, dtype.width // 8)[0] = value


def element_address(tensor: cute.Tensor, *indices) -> Int64:
    """Byte address of ``tensor[indices]`` from its (dynamic) strides, all in Int64."""
    offset = Int64(0)
    for mode, index in enumerate(indices):
        offset = offset + Int64(index) * Int64(tensor.stride[mode])
    return tensor.iterator.toint() + offset * (tensor.element_type.width // 8)


def load_scalar(tensor: cute.Tensor, *indices):
    """``tensor[indices]`` with 64-bit index arithmetic."""
    dtype = tensor.element_type
    return gmem_tensor(dtype, element_address(tensor, *indices), 1, dtype.width // 8)[0]


def row_address(mState: cute.Tensor, mBlockTable: cute.Tensor, req, pos, block_size: int, bounded: bool = False) -> Int64:
    """Byte address of the state row at position ``pos`` of request row ``req`` (one block-table
    read); the rows after it up to the end of its state block follow at the row stride.
    ``bounded``: the block-table entry is read only where the table has its column (a predicated
    load, no branch), and the address is meaningless elsewhere."""
    column = pos // block_size
    if bounded:
        held = Int64(column) < Int64(mBlockTable.shape[1])
        block = load_if(Int32, element_address(mBlockTable, req, column), 1, held)[0]
    else:
        block = load_scalar(mBlockTable, req, column)
    return element_address(mState, block, pos - column * block_size, 0)


def window_run_starts(mState: cute.Tensor, mBlockTable: cute.Tensor, req, first_pos, rows: int, rows_per_lookup: int,
                      block_size: int, ring_capacity=None, bounded: bool = False):
    """Byte addresses of the first row of each lookup run of the ``rows`` consecutive state rows
    from position ``first_pos`` of request row ``req``: one block-table read per ``rows_per_lookup``
    rows, a run that never crosses a state block. ``ring_capacity``: ``C`` of a ring (SPEC §13.3;
    each run looked up at its first position ``mod C``, ``C`` a multiple of the block size and so
    of the run), or ``None`` (paged). ``bounded``: some rows may lie past the table (SPEC §13.4's
    step reads them from its inputs), so each entry is read only where the table has its column
    (:func:`row_address`), which waits for nothing else. A generator: each read is traced where the
    caller takes it, next to the rows that use it."""
    for r in range(rows // rows_per_lookup):
        position = first_pos + r * rows_per_lookup
        if ring_capacity is not None:
            position = Int64(position) % Int64(ring_capacity)
        yield row_address(mState, mBlockTable, req, position, block_size, bounded)


def run_rows(start, row_stride_bytes, rows_per_lookup: int):
    """Byte addresses of a lookup run's rows: its first row ``start`` and the rows after it at the
    row stride (a generator, traced where the caller takes each row)."""
    for i in range(rows_per_lookup):
        yield start + row_stride_bytes * i


def window_row_addresses(mState: cute.Tensor, mBlockTable: cute.Tensor, req, first_pos, row_stride_bytes, rows: int,
                         rows_per_lookup: int, block_size: int, ring_capacity=None) -> list:
    """Byte addresses of the ``rows`` consecutive state rows from position ``first_pos`` of request
    row ``req`` (a Python list): the runs of :func:`window_run_starts`, row by row (``ring_capacity``
    as there)."""
    starts = window_run_starts(mState, mBlockTable, req, first_pos, rows, rows_per_lookup, block_size, ring_capacity)
    return [address for start in starts for address in run_rows(start, row_stride_bytes, rows_per_lookup)]


@dsl_user_op
def load_pair_from_l2(byte_address, *, loc=None, ip=None) -> cute.Tensor:
    """Two fp32 at an 8-byte aligned global address, read from L2 (``ld.global.cg.v2``),
    never from a possibly stale L1 line."""
    pair = llvm.inline_asm(
        llvm.StructType.get_literal([Float32.mlir_type, Float32.mlir_type]),
        [Int64(byte_address).ir_value(loc=loc, ip=ip)],
        "ld.global.cg.v2.f32 {$0, $1}, [$2];",
        "=f,=f,l",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    out = cute.make_rmem_tensor((2,), Float32)
    out[0] = Float32(llvm.extractvalue(Float32.mlir_type, pair, [0], loc=loc, ip=ip))
    out[1] = Float32(llvm.extractvalue(Float32.mlir_type, pair, [1], loc=loc, ip=ip))
    return out


_WORDS = {16: (Int16, "h"), 32: (Int32, "r"), 64: (Int64, "l")}  # element width -> integer type, constraint


@dsl_user_op
def load_if(dtype, byte_address, count: int, predicate, *, loc=None, ip=None) -> cute.Tensor:
    """A register fragment of ``count`` (1, 2 or 4) contiguous ``dtype`` elements (16, 32 or 64
    bits) at ``byte_address``, aligned to their total size, read only where ``predicate``
    (Boolean; the elements are undefined elsewhere): one predicated ``ld.global``, no branch. A
    branch around a load splits its round, and ptxas then waits for the round's earlier loads
    before the branch (a use of a loaded value inside it, or one hoisted above it)."""
    word, letter = _WORDS[dtype.width]
    vector = f".v{count}" if count > 1 else ""
    targets = ", ".join(f"${i}" for i in range(count))
    targets = f"{{{targets}}}" if count > 1 else targets
    text = (f"{{ .reg .pred p; setp.ne.b32 p, ${count + 1}, 0; "
            f"@p ld.global{vector}.b{dtype.width} {targets}, [${count}]; }}")
    result_type = word.mlir_type if count == 1 else llvm.StructType.get_literal([word.mlir_type] * count)
    flag = Int32(predicate)  # 0 or 1
    loaded = llvm.inline_asm(
        result_type,
        [Int64(byte_address).ir_value(loc=loc, ip=ip), flag.ir_value(loc=loc, ip=ip)],
        text,
        ",".join([f"={letter}"] * count + ["l", "r"]),
        has_side_effects=True,  # kept in program order by LLVM (not sunk into a branch); ptxas schedules it
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    frag = cute.make_rmem_tensor((count,), dtype)
    for i in range(count):
        bits = loaded if count == 1 else llvm.extractvalue(word.mlir_type, loaded, [i], loc=loc, ip=ip)
        if dtype.is_float:
            bits = llvm.bitcast(dtype.mlir_type, bits, loc=loc, ip=ip)
        frag[i] = dtype(bits)
    return frag


def load_elements_if(dtype, byte_address, count: int, aligned: bool, predicate) -> cute.Tensor:
    """``count`` contiguous ``dtype`` elements at ``byte_address``, read only where ``predicate``:
    one vector :func:`load_if` when ``aligned`` to their total size, else ``count`` scalar ones."""
    if aligned:
        return load_if(dtype, byte_address, count, predicate)
    out = cute.make_rmem_tensor((count,), dtype)
    for i in range(count):  # unrolled as it is traced
        out[i] = load_if(dtype, byte_address + i * (dtype.width // 8), 1, predicate)[0]
    return out
