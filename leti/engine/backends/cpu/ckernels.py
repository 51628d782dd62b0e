"""LETI's own C kernels for the CPU backend, built with the machine's C compiler at first use:

* ``leti_sgemm`` (``csrc/gemm.c``): AVX2 + FMA SGEMM (AVX-512 tiles where the CPU has them), weights packed once,
  bias and activation fused into the micro-kernel's store;
* ``leti_dwconv3x3`` (``csrc/dwconv.c``): 3×3 depthwise convolution with the taps held in registers
  along each output row;
* ``leti_run_program`` (``csrc/program.c``): a run of calls of these kernels as one call, in one OpenMP parallel
  region with a barrier between steps (:mod:`.native`);
* ``leti_conv_window`` (``csrc/gemm.c``): a sliding-window convolution over few input channels (a stem)
  as an implicit GEMM on the same packed weights, reading patches from a zero-padded copy of the input
  (``leti_pad_nhwc``) instead of building a column matrix; with ``groups`` > 1, a grouped convolution (RegNet,
  ResNeXt): each group reads its channel slice of the padded input in place, every group of an output row in turn.
  Where the CPU has AVX-512, ``csrc/window512.c`` runs it in 12-pixel × 32-column tiles, and groups of 8 output
  channels two per vector; elsewhere ``csrc/window_edges.c`` runs groups of at most 8 outputs reading the input in
  place, the taps on padding skipped (no padded copy).

On a core that issues 512-bit FMAs as two 256-bit halves (a Zen 4), the AVX-512 code is kept only where it wins there:
products with a half-full last panel or few inner products, groups of at most 8 outputs and stride-1 depthwise
convolutions run the AVX2 code (:func:`set_narrow512`; ``docs/engine.md``, session 50).

Why not a BLAS: the engine's weights are constants and its shapes static, so B can be packed once at
resize instead of on every call, and the epilogue can run while the output block is still in
registers. On this project's Zen 3 host (one thread) that made 22 MobileNet, ResNet and NB101 products
1.05–1.64× faster than MKL's SGEMM (16.4 vs 20.5 ms summed), and it spares loading MKL (~90 MiB) at
all (``benchmarks/bench_cpu_gemm.py``, ``docs/engine.md``).

The shared library (every ``csrc/*.c`` in one, sharing ``csrc/simd.h``) lands in ``$LETI_CACHE_DIR`` (default ``~/.cache/leti``),
named by a hash of the sources and the flags, written under a temporary name and renamed, so concurrent first uses (test
workers) never see half a file. It is loaded into numba's JIT with llvmlite, like MKL in
:mod:`.blas`: numba kernels call its functions by symbol and stay cacheable on disk.

Unavailable (``library()`` is None, :attr:`reason` says why) off x86-64 Linux, without AVX2/FMA,
without a C compiler, or with ``LETI_BLAS=mkl`` / ``LETI_BLAS=openblas``; the engine then uses a BLAS.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from numba import types

# the weight layouts the kernels read, importable from here too (ckernels.pack, ckernels.pad_bias, ...)
from leti.engine.backends.cpu.packed import (ALIGN, NR, POOL_MIN, _HugePagePool, aligned_copy,  # noqa: F401
                                             dw3x3_weights, pack, pad_bias)

SOURCES = tuple(sorted((Path(__file__).with_name("csrc")).glob("*.c")))
#: what the build depends on: the sources and the header they share
DEPENDS = tuple(sorted((Path(__file__).with_name("csrc")).glob("*.[ch]")))
SYMBOLS = ("leti_sgemm", "leti_dwconv3x3", "leti_conv_window", "leti_pad_nhwc", "leti_run_program",
           "leti_program_threads_supported", "leti_set_avx512", "leti_set_pair512", "leti_set_weights_split",
           "leti_set_full_k", "leti_set_window_units", "leti_set_pair_panels",
           "leti_set_wide_tail", "leti_conv_window_inplace", "leti_set_step_clock",
           "leti_set_panel_rows", "leti_set_fuse_band_kb", "leti_set_dw_packed", "leti_set_pair_rows",
           "leti_set_kc512", "leti_set_step_waits", "leti_set_quad512", "leti_set_edge_windows",
           "leti_set_narrow512", "leti_product512", "leti_window512")
FLAGS = ("-O3", "-mavx2", "-mfma", "-std=gnu11", "-shared", "-fPIC")
#: added when the compiler has it: a program of steps (``csrc/program.c``) then runs on numba's OpenMP threads
OPENMP = ("-fopenmp",)
#: the micro-kernel's block: MR rows of a by NR packed columns of B (:mod:`.packed`)
MR = 6

_p = types.intp
#: ``leti_sgemm(m, n, k, a, lda, b_packed, y, ldy, bias_or_0, residual_or_0, act)``; pointers travel as integers
sgemm = types.ExternalFunction("leti_sgemm", types.void(*([_p] * 11)))
#: ``leti_dwconv3x3(x, y, w, bias_or_0, h, wd, c, oh, ow, sh, sw, dh, dw, pt, pl, act, r0, r1)``, ``w`` as
#: :func:`dw3x3_weights` lays it out
dwconv3x3 = types.ExternalFunction("leti_dwconv3x3", types.void(*([_p] * 18)))
#: ``leti_conv_window(xp, wp, ci, groups, kh, kw, sh, sw, b_packed, co, y, ow, bias_or_0, residual_or_0, act, r0, r1)``
conv_window = types.ExternalFunction("leti_conv_window", types.void(*([_p] * 17)))
#: ``leti_conv_window_inplace(x, h, wd, ci, groups, kh, kw, sh, sw, pt, pl, b_packed, co, y, ow, bias_or_0, residual_or_0,
#: act, u0, u1)``: the window over the unpadded input, units u = (output row, group) (``csrc/gemm.c``)
conv_window_inplace = types.ExternalFunction("leti_conv_window_inplace", types.void(*([_p] * 20)))
#: ``leti_pad_nhwc(x, h, wd, c, xp, hp, wp, pt, pl, r0, r1)``
pad_nhwc = types.ExternalFunction("leti_pad_nhwc", types.void(*([_p] * 11)))

reason = ""


def cache_dir() -> Path:
    root = os.environ.get("LETI_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "leti")
    return Path(root)


def _cpu_supported() -> str:
    """'' when this CPU runs the kernel, else why not."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not x86-64 Linux ({platform.system()} {platform.machine()})"
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError as e:
        return f"cannot read /proc/cpuinfo ({e})"
    missing = [f for f in ("avx2", "fma") if f not in flags.split()]
    return f"CPU lacks {', '.join(missing)}" if missing else ""


def _build(out: Path) -> str:
    """Compile the library to ``out``; '' on success, else why not."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc) on PATH"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, *OPENMP, "-o", tmp, *map(str, SOURCES)], capture_output=True, text=True)
        if r.returncode != 0:  # no OpenMP: programs run on one thread
            r = subprocess.run([cc, *FLAGS, "-o", tmp, *map(str, SOURCES)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"{cc} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
        os.replace(tmp, out)
        return ""
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@lru_cache(maxsize=None)
def setter(symbol: str, args: int = 1):
    """One of the library's ``int64_t leti_set_*(int64_t)`` switches as a ctypes function (a negative argument only
    asks), or another of its functions of ``args`` int64 arguments returning an int64; None where the library is
    unavailable; AttributeError where it has no such symbol."""
    import ctypes

    path = library()
    if path is None:
        return None
    f = getattr(ctypes.CDLL(str(path)), symbol)
    f.restype, f.argtypes = ctypes.c_int64, [ctypes.c_int64] * args
    return f


def _setting(symbol: str, value: int) -> int:
    """Call one of the library's switches (:func:`setter`); 0 where the library is unavailable."""
    f = setter(symbol)
    return 0 if f is None else int(f(value))


def _flag(symbol: str, on: bool | None) -> bool:
    """Turn one of the library's on/off switches on or off, or only ask (``None``); whether it is on."""
    return bool(_setting(symbol, -1 if on is None else int(bool(on))))


def set_avx512(on: bool | None) -> bool:
    """Ask for the products' AVX-512 micro-kernel (``csrc/gemm.c``; the default where the CPU has avx512f, off with
    ``LETI_AVX512=0`` before the first product) or for the AVX2 one; ``None`` only asks. Returns whether AVX-512 is
    used."""
    return _flag("leti_set_avx512", on)


def set_narrow512(on: bool | None) -> bool:
    """Ask for the choices of a core that runs 512-bit FMAs as two 256-bit halves (a Zen 4, detected by default; off
    elsewhere or with ``LETI_NARROW512=0``): products with a half-full last panel or fewer than 128 inner products,
    groups of at most 8 outputs and stride-1 depthwise convolutions on the AVX2 code (``csrc/gemm.c``, ``product512``;
    ``csrc/dwconv.c``, ``dw_packed16``); ``None`` only asks. Returns whether they are asked for (they change nothing
    where the AVX-512 code is off)."""
    return _flag("leti_set_narrow512", on)


def takes_avx512(rows: int, cols: int, depth: int) -> bool:
    """Whether a product of ``rows`` × ``depth`` by ``depth`` × ``cols`` runs on the AVX-512 tiles under the current
    settings (:func:`set_avx512`, :func:`set_narrow512`); False without the library."""
    f = setter("leti_product512", 3)
    return f is not None and bool(f(rows, cols, depth))


def window_takes_avx512(cols: int) -> bool:
    """Whether a window of ``cols`` outputs a group runs on the AVX-512 windows under the current settings."""
    return bool(_setting("leti_window512", cols))


def set_pair512(on: bool | None) -> bool:
    """Ask for the AVX-512 products' paired-panel tiles (32 columns per tile, ``csrc/gemm.c``; the default, off with
    ``LETI_GEMM_PAIR=0``) or for one panel per tile; ``None`` only asks. Returns whether pairs are used."""
    return _flag("leti_set_pair512", on)


def set_full_k(on: bool | None) -> bool:
    """Ask for the AVX2 products' whole-k row blocks (``csrc/gemm.c``, ``sgemm_full_k``; the default, off with
    ``LETI_GEMM_FULLK=0``) or for the k-blocked order; ``None`` only asks. Returns whether they are used."""
    return _flag("leti_set_full_k", on)


def set_pair_panels(on: bool | None) -> bool:
    """Ask for the AVX2 products and windows to take two full panels per tile (``csrc/gemm.c`` ``micro_pair``, the
    default) or one (``micro``); ``None`` only asks. Returns whether pairs are used."""
    return _flag("leti_set_pair_panels", on)


def set_wide_tail(on: bool | None) -> bool:
    """Ask for the last full panel and an 8-column one after it (n = 24, 56, 152) to run in the AVX2 4 x 24 tiles
    (``csrc/gemm.c`` ``micro_24``, the default) or in one-panel and 12-row half-panel tiles; ``None`` only asks."""
    return _flag("leti_set_wide_tail", on)


def set_edge_windows(on: bool | None) -> bool:
    """Ask for the AVX2 grouped windows of at most 8 columns a group to read their input in place, taps on padding
    skipped (``csrc/window_edges.c``, the default), or through padded copies of the rows under them; ``None`` only
    asks. The outputs are the same bit for bit."""
    return _flag("leti_set_edge_windows", on)


def set_window_units(on: bool | None) -> bool:
    """Ask for a native program's grouped windows on two or more threads split by rows x groups (``csrc/program.c``;
    the default on AVX2 hosts) or by output rows; ``None`` only asks. Returns whether units are used."""
    return _flag("leti_set_window_units", on)


def set_steal_chunks(k: int | None) -> int:
    """Parts per thread of each native-program step on two or more threads (``csrc/program.c``: a thread runs its
    own parts, then the parts the others have not started; 1: fixed parts); ``None`` only asks."""
    return int(_setting("leti_set_steal_chunks", -1 if k is None else int(k)))


def set_panel_rows(mode: int | bool | None) -> int:
    """How a native program's products split by weight panels on two or more threads cut each thread's share of the
    panels for stealing (``csrc/program.c``): 1 (True) into chunks of rows, 0 (False) the panels into chunks, 2 (the
    default) rows where the share fits half the core's L2; ``None`` only asks. Returns the mode in force."""
    return _setting("leti_set_panel_rows", -1 if mode is None else int(mode))


def set_fuse_band_kb(kb: int | None) -> int:
    """KiB of product rows per band of a native program's 1×1 convolution fused with the 3×3 depthwise convolution
    that reads it (``csrc/program.c``, ``STEP_GEMM_DWCONV``; 0: the product whole, then the depthwise convolution);
    ``None`` only asks. Returns the value in force."""
    return int(_setting("leti_set_fuse_band_kb", -1 if kb is None else int(kb)))


def set_dw_packed(on: bool | None) -> bool:
    """Ask for the 3×3 depthwise kernel's pixel-at-a-time path over packed weights (``csrc/dwconv.c``: AVX-512, whole
    32-channel blocks, from 256 channels at stride 1 and 128 at stride 2; the default) or for the strips over the taps
    as laid out; ``None`` only asks."""
    return _flag("leti_set_dw_packed", on)


def set_pair_rows(on: bool | None) -> bool:
    """Ask for the AVX-512 products' lean row loop (``csrc/gemm.c``, ``pair_rows512``: a k block's row tiles after its
    first two with their flags as constants; the default) or for the general loop for every tile; ``None`` only asks.
    The two give the same sums bit for bit."""
    return _flag("leti_set_pair_rows", on)


def set_kc512(kc: int | None) -> int:
    """The AVX-512 products' k block (``csrc/gemm.c``; default 512); ``None`` only asks. Returns the value in force."""
    return int(_setting("leti_set_kc512", -1 if kc is None else int(kc)))


def set_quad512(on: bool | None) -> bool:
    """Ask for the AVX-512 products of at most 96 inner products in tiles of 6 rows × 64 columns (``csrc/gemm.c``,
    ``quads512``; the default) or in the 12 × 32 tiles of the rest; ``None`` only asks. The same sums bit for bit."""
    return _flag("leti_set_quad512", on)


def set_step_waits(on: bool | None) -> bool:
    """Ask for a native program's steps to wait for the step before by counting its finished chunks (``csrc/program.c``:
    a thread that took every chunk goes on while another is descheduled; the default) or at an OpenMP barrier after
    every step; ``None`` only asks. The outputs are the same bit for bit."""
    return _flag("leti_set_step_waits", on)


def set_weights_split(percent: int | None) -> int:
    """How large (in percent of its input and output together) a native program's product with more columns than
    rows must have its weights to split its weight panels over the threads instead of its rows (``csrc/program.c``;
    default 120); ``None`` only asks. Returns the value in force (0 where the library is unavailable)."""
    return int(_setting("leti_set_weights_split", -1 if percent is None else int(percent)))


@lru_cache(maxsize=1)
def library() -> Path | None:
    """The built library, loaded for numba's JIT, or None (see :data:`reason`)."""
    global reason
    if os.environ.get("LETI_BLAS", "").lower() in ("mkl", "openblas"):
        reason = f"LETI_BLAS={os.environ['LETI_BLAS']}"
        return None
    reason = _cpu_supported()
    if reason:
        return None
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in DEPENDS) + " ".join(FLAGS + OPENMP).encode()).hexdigest()[:16]
    path = cache_dir() / f"leti_kernels-{digest}.so"
    if not path.is_file():
        reason = _build(path)
        if reason:
            return None
    import ctypes

    import llvmlite.binding as llb

    try:
        lib = ctypes.CDLL(str(path))
        missing = [sym for sym in SYMBOLS if not hasattr(lib, sym)]
        if missing:
            reason = f"{path} lacks {', '.join(missing)}"
            return None
        llb.load_library_permanently(str(path))
    except OSError as e:
        reason = f"cannot load {path}: {e}"
        return None
    return path


@lru_cache(maxsize=1)
def program_runner():
    """``leti_run_program(records, n, threads)`` through ctypes (:mod:`.native`), or None without the library."""
    path = library()
    if path is None:
        return None
    import ctypes

    lib = ctypes.CDLL(str(path))
    fn = lib.leti_run_program
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    fn.restype = None
    return fn, bool(lib.leti_program_threads_supported())


@lru_cache(maxsize=1)
def step_clock_setter():
    """``leti_set_step_clock(clock)`` through ctypes (``csrc/program.c``: a program run writes each step's end time into
    ``clock``, an int64 array's address, or nothing once set to None), or None without the library."""
    path = library()
    if path is None:
        return None
    import ctypes

    fn = ctypes.CDLL(str(path)).leti_set_step_clock
    fn.argtypes, fn.restype = (ctypes.c_void_p,), ctypes.c_int64
    return fn

