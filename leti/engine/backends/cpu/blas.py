"""Which BLAS the CPU backend's matrix products use: MKL's packed GEMM when an MKL is in reach,
scipy's OpenBLAS otherwise.

Why MKL's *packed* API: a convolution's weights are constant, so they are packed once at resize
(``cblas_sgemm_pack``) into the layout MKL's microkernel reads, and every run only streams the
activations through ``cblas_sgemm_compute``; OpenBLAS re-packs the weights on every call. On
MobileNet v2's 1×1 shapes (one thread, bias + ReLU6 epilogue included, this project's 2-vCPU
Sapphire Rapids VM) the packed MKL products took 5.7 ms against OpenBLAS' 7.2 ms in total, 1.2–1.9×
faster on every shape but one (12544×16×96: 0.9×), most on the few-row products of the 7×7 stages
(``benchmarks/bench_cpu_gemm.py`` prints the comparison).

Where MKL comes from: torch's CPU wheel (a LETI dependency, for the GCN) links MKL into
``libtorch_cpu.so`` and exports its BLAS entry points. The library is loaded into the process with
llvmlite, so numba kernels call the functions by symbol name and stay cacheable on disk. Every
call sets MKL's thread-local thread count to one first: the products run inside numba's thread
pool, one block per thread, and must not open an OpenMP team of their own.

``LETI_BLAS=openblas`` forces the fallback; the tests run both paths.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import types

LAYOUT_ROW_MAJOR, NO_TRANS, PACKED, B_MATRIX = 101, 111, 151, 162
SYMBOLS = ("cblas_sgemm_pack", "cblas_sgemm_pack_get_size", "cblas_sgemm_compute", "mkl_set_num_threads_local_")

# Pointers are declared as intp: on the x86-64 and AArch64 calling conventions a pointer and a
# 64-bit integer travel the same way, and numba hands ``arr.ctypes.data`` over as an integer.
_i32, _ptr = types.int32, types.intp
sgemm_compute = types.ExternalFunction(
    "cblas_sgemm_compute",
    types.void(_i32, _i32, _i32, _i32, _i32, _i32, _ptr, _i32, _ptr, _i32, types.float32, _ptr, _i32))
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
def mkl() -> "_MKL | None":
    """The loaded MKL, or None (no torch with MKL, not x86-64/AArch64 Linux, or ``LETI_BLAS=openblas``)."""
    if os.environ.get("LETI_BLAS", "").lower() == "openblas" or np.dtype(np.intp).itemsize != 8:
        return None
    path = _torch_mkl_path()
    if path is None:
        return None
    import ctypes

    import llvmlite.binding as llb

    try:
        lib = ctypes.CDLL(str(path))
        if not all(hasattr(lib, s) for s in SYMBOLS):
            return None
        llb.load_library_permanently(str(path))  # numba's JIT resolves the symbols from here
    except OSError:
        return None
    return _MKL(lib)


class _MKL:
    def __init__(self, lib) -> None:
        import ctypes

        i32, vp = ctypes.c_int, ctypes.c_void_p
        self._size = lib.cblas_sgemm_pack_get_size
        self._size.argtypes, self._size.restype = [i32, i32, i32, i32], ctypes.c_size_t
        self._pack = lib.cblas_sgemm_pack
        self._pack.argtypes = [i32, i32, i32, i32, i32, i32, ctypes.c_float, vp, i32, vp]
        self._pack.restype = None

    def pack_b(self, w: np.ndarray) -> np.ndarray:
        """``w`` (k × n) in MKL's packed layout, as a float32 buffer for ``sgemm_compute``."""
        w = np.ascontiguousarray(w, dtype=np.float32)
        k, n = w.shape
        nbytes = int(self._size(B_MATRIX, 1, n, k))
        buf = np.empty(-(-nbytes // 4) + 16, dtype=np.float32)  # MKL writes at most nbytes
        self._pack(LAYOUT_ROW_MAJOR, B_MATRIX, NO_TRANS, 1, n, k, 1.0, w.ctypes.data, n, buf.ctypes.data)
        return buf


def name() -> str:
    """The BLAS the CPU backend's GEMMs use now: ``mkl-packed`` or ``openblas``."""
    return "mkl-packed" if mkl() is not None else "openblas"
