"""The bytes glibc's malloc has handed out and not had back, for memory
tests and benches/python/key_memory.py. What reconq's Rust side holds is
malloc's; Python's small objects live in arenas Python maps itself,
outside this count."""

from __future__ import annotations

import ctypes
from typing import Optional


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def malloc_in_use() -> Optional[int]:
    """In use in malloc's heaps plus its mmapped blocks (`mallinfo2`);
    `None` without glibc 2.33 or later."""
    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd
