"""Array plumbing shared by the hanpu functions: numpy arrays and CPU torch tensors in, the same
kind out, never importing torch unless the caller already did.

Inputs are handed to the C++ engine as they are (nanobind reads numpy through the buffer protocol,
torch through DLPack): no copy, the caller's dtype and strides. The only copies made here are for
layouts the engine cannot address (numpy negative strides) and for None arguments FLA fills in.
"""

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
    """numpy has no bfloat16; ml_dtypes (used by JAX) adds one named 'bfloat16'."""
    return dtype.name == "bfloat16" and dtype.itemsize == 2 and dtype.kind == "V"


def _numpy_float_ok(dtype):
    return dtype in (np.float32, np.float16, np.float64) or is_numpy_bf16(dtype)


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
        ok = _numpy_float_ok(x.dtype) if kind == "float" else x.dtype in (np.int32, np.int64)
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
        return x.detach() if x.requires_grad else x
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    if is_numpy_bf16(x.dtype):
        return (x.view(np.uint16), "bf16")
    return x


def empty_like_kind(ref, shape, dtype_of=None, float32=False):
    """An uninitialised array of `ref`'s kind (numpy or torch) with dtype of `dtype_of` (or fp32)."""
    if is_torch(ref):
        torch = _torch()
        dtype = torch.float32 if float32 else dtype_of.dtype
        return torch.empty(tuple(shape), dtype=dtype, device="cpu")
    if float32:
        return np.empty(tuple(shape), dtype=np.float32)
    dtype = dtype_of.dtype
    if is_torch(dtype_of):  # numpy q with a torch v: follow the kind of q, keep the precision of v
        dtype = {"float32": np.float32, "float16": np.float16, "float64": np.float64}.get(dtype_name(dtype_of), np.float32)
    return np.empty(tuple(shape), dtype=dtype)


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
        cu_seqlens = np.asarray(cu_seqlens, dtype=np.int64)
    check_array(cu_seqlens, "cu_seqlens", kind="int")
    if len(cu_seqlens.shape) != 1:
        raise ValueError(f"`cu_seqlens` must have shape [N+1], got {list(cu_seqlens.shape)}")
    return cu_seqlens
