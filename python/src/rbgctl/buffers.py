"""Caller memory as memoryviews, without copies.

The client reads into and writes from whatever the caller holds:

* any object with the buffer protocol (``bytes``, ``bytearray``, ``memoryview``, ``mmap``, NumPy
  arrays, ``ctypes`` arrays);
* a raw pointer and size, as a ``(ptr, size)`` tuple of two ints (the caller keeps the memory
  alive and unmoved for the call);
* a tensor-like object with ``data_ptr()``, ``numel()`` and ``element_size()``, such as a CPU
  ``torch.Tensor`` (which has no buffer protocol of its own), contiguous;
* a list of any of these: one value made of several regions, written and read in order
  (scatter/gather, e.g. the K and V halves of one KV page).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import List

from .errors import RbgctlError


@lru_cache(maxsize=256)
def _array_type(size: int):
    return ctypes.c_ubyte * size


def pointer_view(ptr: int, size: int) -> memoryview:
    """A writable byte view of ``size`` bytes at address ``ptr``."""
    if size < 0:
        raise RbgctlError(f"negative size {size}")
    if size == 0:
        return memoryview(bytearray())
    if not ptr:
        raise RbgctlError("null pointer")
    return memoryview(_array_type(size).from_address(ptr)).cast("B")


def _is_pointer_pair(obj) -> bool:
    return (
        isinstance(obj, tuple)
        and len(obj) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in obj)
    )


def _tensor_view(t, writable: bool) -> memoryview:
    contiguous = getattr(t, "is_contiguous", None)
    if contiguous is not None and not contiguous():
        if writable:
            raise RbgctlError("a destination tensor must be contiguous")
        t = t.contiguous()
        # Keep the contiguous copy alive as long as the view: the view holds the ctypes array,
        # whose _owner attribute holds the tensor.
    device = getattr(t, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise RbgctlError(f"tensor on {device}: only host memory can be read or written")
    size = int(t.numel()) * int(t.element_size())
    view = pointer_view(int(t.data_ptr()), size)
    if size:
        view.obj._rbgctl_owner = t  # type: ignore[attr-defined]
    return view


def one_region(obj, writable: bool) -> memoryview:
    """One buffer as a flat byte memoryview."""
    if _is_pointer_pair(obj):
        return pointer_view(obj[0], obj[1])
    if isinstance(obj, memoryview):
        view = obj
    elif hasattr(obj, "data_ptr") and hasattr(obj, "numel"):
        return _tensor_view(obj, writable)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise RbgctlError(
                f"{type(obj).__name__} is not a buffer, a (ptr, size) pair or a tensor"
            ) from None
    if writable and view.readonly:
        raise RbgctlError(f"{type(obj).__name__} is read-only; a destination must be writable")
    if not view.c_contiguous:
        raise RbgctlError("buffer is not contiguous")
    return view.cast("B") if (view.format != "B" or view.ndim != 1) else view


def regions(obj, writable: bool) -> List[memoryview]:
    """A value as its list of regions (one, unless the caller passed a list)."""
    if isinstance(obj, list) or (isinstance(obj, tuple) and not _is_pointer_pair(obj)):
        return [one_region(x, writable) for x in obj]
    return [one_region(obj, writable)]


def total(views: List[memoryview]) -> int:
    return sum(v.nbytes for v in views)
