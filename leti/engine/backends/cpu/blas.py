"""The BLAS the CPU backend's matrix products fall back to where LETI's own kernel (:mod:`.ckernels`)
cannot build, or with ``LETI_BLAS=mkl|openblas``: MKL when one is in reach, scipy's OpenBLAS
otherwise (MKL's SGEMM was 1.1–1.6× faster on MobileNet's 1×1 shapes; ``docs/engine.md``).

MKL comes from torch's CPU wheel (``libtorch_cpu.so`` exports the Fortran-style BLAS entry points),
loaded with llvmlite so numba kernels call ``sgemm_`` by symbol name and stay cacheable on disk.
Every call sets MKL's thread-local thread count to one first: the products run inside numba's
thread pool, one block per thread, and must not open an OpenMP team of their own.

``LETI_BLAS=openblas`` forces OpenBLAS, ``LETI_BLAS=mkl`` MKL; the tests run all three paths.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import types

from leti.engine.backends.cpu import ckernels

SYMBOLS = ("sgemm_", "mkl_set_num_threads_local_")

# Fortran calling convention: every argument by reference. Pointers are declared as intp: on the
# x86-64 and AArch64 calling conventions a pointer and a 64-bit integer travel the same way, and
# numba hands ``arr.ctypes.data`` over as an integer.
_ptr = types.intp
sgemm = types.ExternalFunction("sgemm_", types.void(*([_ptr] * 13)))
set_threads_local = types.ExternalFunction("mkl_set_num_threads_local_", types.int32(_ptr))

#: MKL reads the thread count through a pointer (the Fortran-style entry point is the exported one).
ONE_THREAD = np.ones(1, dtype=np.int32)


def _torch_mkl_path() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "lib" / "libtorch_cpu.so"
    return path if path.is_file() else None


@lru_cache(maxsize=1)
def mkl() -> Path | None:
    """The library MKL was loaded from, or None (no torch with MKL, not x86-64/AArch64 Linux, or ``LETI_BLAS=openblas``)."""
    if os.environ.get("LETI_BLAS", "").lower() == "openblas" or np.dtype(np.intp).itemsize != 8:
        return None
    path = _torch_mkl_path()
    if path is None:
        return None
    import ctypes

    import llvmlite.binding as llb

    try:
        lib = ctypes.CDLL(str(path))
        if not all(hasattr(lib, sym) for sym in SYMBOLS):
            return None
        llb.load_library_permanently(str(path))  # numba's JIT resolves the symbols from here
    except OSError:
        return None
    return path


def name() -> str:
    """What the CPU backend's GEMMs use now: ``leti`` (its own kernel, :mod:`.ckernels`), ``mkl`` or ``openblas``."""
    if ckernels.library() is not None:
        return "leti"
    return "mkl" if mkl() is not None else "openblas"
