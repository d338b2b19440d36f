"""Array plumbing shared by the hanpu functions: numpy arrays and CPU torch tensors in, the same
kind out, never importing torch unless the caller already did.

Inputs are handed to the C++ engine as they are (nanobind reads numpy through the buffer protocol,
torch through DLPack): no copy, the caller's dtype and strides. The only copies made here are for
layouts the engine cannot address (numpy negative strides) and for None arguments FLA fills in.
"""

import math
import sys

import numpy as np

FLOAT_DTYPES = "float32, float16, bfloat16 or float64"


def _torch():
    """The torch module if the caller has imported it (we never import it ourselves)."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_numpy_bf16(dtype):
    """numpy has no bfloat16; ml_dtypes (used by JAX) adds one named 'bfloat16'. (dtype.name is
    slow to compute: it is asked last, for void-kind 2-byte dtypes only.)"""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def _numpy_float_ok(dtype):
    # kind/itemsize instead of comparing with np.float32 & co: those comparisons convert the type
    # to a dtype each time, and these checks run on every call (decode calls are small).
    return (dtype.kind == "f" and dtype.itemsize in (2, 4, 8)) or is_numpy_bf16(dtype)


def _numpy_int_ok(dtype):
    return dtype.kind == "i" and dtype.itemsize in (4, 8)


def dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def check_array(x, name, kind="float"):
    """Raises TypeError unless x is a numpy array or a torch tensor of an accepted dtype (kind
    'float' or 'int'); ValueError for a torch tensor not in host memory."""
    if is_torch(x):
        torch = _torch()
        if x.device.type != "cpu":
            raise ValueError(f"`{name}` is on device {x.device}; hanpu runs on the CPU (pass `{name}.cpu()`)")
        if kind == "float":
            ok = x.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        else:
            ok = x.dtype in (torch.int32, torch.int64)
    elif isinstance(x, np.ndarray):
        ok = _numpy_float_ok(x.dtype) if kind == "float" else _numpy_int_ok(x.dtype)
    else:
        raise TypeError(f"`{name}` must be a numpy array or a torch tensor, got {type(x).__name__}")
    if not ok:
        expected = FLOAT_DTYPES if kind == "float" else "int32 or int64"
        raise TypeError(f"`{name}` must have dtype {expected}, got {dtype_name(x)}")


def to_engine(x):
    """The object passed to the C++ module for array x (None stays None)."""
    if x is None:
        return None
    if is_torch(x):
        if x.requires_grad:
            x = x.detach()
        if x.dtype != _torch().bfloat16:
            # The numpy view of a CPU tensor (same memory) is read through the buffer protocol,
            # about 2.5 us cheaper per tensor than torch's Python-level __dlpack__: it matters for
            # decode calls, which pass ~11 small tensors. bfloat16 has no numpy dtype: DLPack.
            try:
                return x.numpy()
            except (RuntimeError, TypeError):  # conjugate/negative-bit views and the like
                return x
        return x
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    if is_numpy_bf16(x.dtype):
        return (x.view(np.uint16), "bf16")
    return x


# Outputs are allocated aligned: the engine writes o one row (V elements) per head per token, rows
# a page or more apart. numpy's allocations are 16-byte aligned, so every row straddles one more
# cache line than it needs; large ones also miss the TLB unless backed by huge pages, which numpy
# asks the kernel for (madvise) on big allocations but which only cover 2 MiB-aligned ranges.
# Measured on a 4096-token 16-head f32 GDN prefill: 55 ms with a plain np.empty o, 47 ms aligned.
_ALIGN_LINE = 64  # a cache line
_ALIGN_HUGE_PAGE = 2 << 20
_HUGE_PAGE_OUTPUT_BYTES = 4 << 20  # numpy's own threshold for asking for huge pages


def aligned_numpy_empty(shape, dtype):
    """np.empty(shape, dtype) starting on a cache line (a huge page when large)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    align = _ALIGN_HUGE_PAGE if nbytes >= _HUGE_PAGE_OUTPUT_BYTES else _ALIGN_LINE
    buf = np.empty(nbytes + align, np.uint8)
    offset = (-buf.ctypes.data) % align
    return buf[offset:offset + nbytes].view(dtype).reshape(shape)


def _torch_empty(shape, dtype):
    """torch.empty, except that large tensors share a huge-page-aligned numpy allocation (torch's
    allocations are 64-byte aligned but never backed by huge pages)."""
    torch = _torch()
    itemsize = getattr(dtype, "itemsize", None) or torch.empty(0, dtype=dtype).element_size()  # torch < 2.1
    if math.prod(shape) * itemsize >= _HUGE_PAGE_OUTPUT_BYTES:
        if dtype == torch.bfloat16:  # numpy has no bf16: the same bytes as uint16, viewed back
            return torch.from_numpy(aligned_numpy_empty(shape, np.uint16)).view(torch.bfloat16)
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64}.get(dtype)
        if np_dtype is not None:
            return torch.from_numpy(aligned_numpy_empty(shape, np_dtype))
    return torch.empty(shape, dtype=dtype, device="cpu")


def empty_like_kind(ref, shape, dtype_of=None, float32=False):
    """An uninitialised array of `ref`'s kind (numpy or torch) with dtype of `dtype_of` (or fp32)."""
    shape = tuple(shape)
    if is_torch(ref):
        return _torch_empty(shape, _torch().float32 if float32 else dtype_of.dtype)
    if float32:
        return aligned_numpy_empty(shape, np.float32)
    dtype = dtype_of.dtype
    if is_torch(dtype_of):  # numpy q with a torch v: follow the kind of q, keep the precision of v
        dtype = {"float32": np.float32, "float16": np.float16, "float64": np.float64}.get(dtype_name(dtype_of), np.float32)
    return aligned_numpy_empty(shape, dtype)


def full_like_kind(ref, shape, value):
    """An fp32 array of `ref`'s kind filled with value."""
    if is_torch(ref):
        return _torch().full(tuple(shape), value, dtype=_torch().float32)
    return np.full(tuple(shape), value, dtype=np.float32)


def swap_last(x):
    """A view with the last two dimensions swapped (no copy)."""
    if is_torch(x):
        return x.transpose(-1, -2)
    return np.swapaxes(x, -1, -2)


def as_cu_seqlens(cu_seqlens):
    """cu_seqlens as an int array (lists/tuples become int64 numpy arrays)."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, (list, tuple)):
        # np.asarray(..., dtype=np.int64) would truncate 1.5 to 1 silently: every entry must be an
        # integer already (bool is not an offset either).
        for i, x in enumerate(cu_seqlens):
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"`cu_seqlens[{i}]` is {x!r} ({type(x).__name__}), expected an integer offset")
        cu_seqlens = np.asarray(cu_seqlens, dtype=np.int64)
    check_array(cu_seqlens, "cu_seqlens", kind="int")
    if len(cu_seqlens.shape) != 1:
        raise ValueError(f"`cu_seqlens` must have shape [N+1], got {list(cu_seqlens.shape)}")
    return cu_seqlens
