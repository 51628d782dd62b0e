"""Weights laid out as LETI's C kernels (:mod:`.ckernels`) read them: packed 16-column panels, the depthwise
kernel's taps and packed blocks, zero-padded biases, all 64-byte aligned and, from :data:`POOL_MIN` bytes up, carved
from huge pages (:class:`_HugePagePool`)."""

from __future__ import annotations

import mmap
import threading

import numpy as np

#: a packed panel's columns (one zmm, two ymm)
NR = 16
#: packed arrays start on a cache line: a 512-bit load from a 32-byte boundary spans two lines
ALIGN = 64


class _HugePagePool:
    """Packed weights of at least :data:`POOL_MIN` bytes, carved from 2 MiB-aligned anonymous mappings advised
    ``MADV_HUGEPAGE`` (this host's transparent huge pages are ``madvise``-only).

    A network's weights are cold at every inference (last read one inference ago) and stream from memory: with 4 KiB
    pages every page is a TLB miss and the hardware prefetcher stops at each page's end. From huge pages, one thread:
    MobileNet v1 11.84 -> 11.59 ms, an NB101 network 8.48 -> 8.01, ResNet50 54.4 -> 54.0 (interleaved, medians of 12
    rounds; the batch-1 classifier 1024 x 1000 alone after a cache flush 0.22 -> 0.17-0.19 ms). Chunks of
    :data:`CHUNK` bytes are mapped as needed and handed out in order, so only a chunk's last, partly used huge page
    is waste; a chunk is unmapped once no array carved from it is left. Where mappings cannot be advised (not Linux),
    ``take`` returns None and the heap is used."""

    CHUNK = 32 << 20
    HUGE = 2 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._buf: np.ndarray | None = None
        self._used = 0

    def take(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of uint8, 64-byte aligned, or None."""
        need = -(-nbytes // 64) * 64
        with self._lock:
            if self._buf is None or self._used + need > self._buf.size:
                self._buf = self._map(max(self.CHUNK, -(-need // self.HUGE) * self.HUGE))
                self._used = 0
                if self._buf is None:
                    return None
            out = self._buf[self._used:self._used + nbytes]
            self._used += need
            return out

    def _map(self, size: int) -> np.ndarray | None:
        advise = getattr(mmap, "MADV_HUGEPAGE", None)
        if advise is None:
            return None
        try:
            m = mmap.mmap(-1, size + self.HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            raw = np.frombuffer(m, dtype=np.uint8)
            off = -raw.ctypes.data % self.HUGE
            m.madvise(advise, off, size)
        except (OSError, ValueError):
            return None
        return raw[off:off + size]


_pool = _HugePagePool()
#: packed arrays from this many bytes up come from huge pages (:class:`_HugePagePool`)
POOL_MIN = 256 << 10


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    if size * 4 >= POOL_MIN:
        buf = _pool.take(size * 4)
        if buf is not None:
            return buf.view(np.float32).reshape(shape)
    buf = np.empty(size + ALIGN // 4, dtype=np.float32)
    off = (-buf.ctypes.data % ALIGN) // 4
    return buf[off:off + size].reshape(shape)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy of ``a``, 64-byte aligned, from huge pages when large (weights a kernel streams)."""
    out = _aligned(tuple(a.shape))
    out[...] = a
    return out


def dw3x3_weights(w9: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The weights ``leti_dwconv3x3`` reads for a 3×3 depthwise convolution of ``c`` channels: ``w9`` (9 × c, the taps
    row by row), then the same packed per block of 32 channels (the last one shorter where ``c`` is not a multiple): the
    block's bias (zeros if ``None``), then its nine taps (``csrc/dwconv.c``, ``dw_pixels_packed``, which reads them
    where ``c`` is a multiple of 32). 19 c floats, 64-byte aligned."""
    w9 = np.asarray(w9, dtype=np.float32)
    c = w9.shape[1]
    out = _aligned((19 * c,))
    out[:9 * c] = w9.ravel()
    b = np.zeros(c, np.float32) if bias is None else np.asarray(bias, np.float32)
    for c0 in range(0, c, 32):
        bw = min(32, c - c0)
        block = out[9 * c + 10 * c0:9 * c + 10 * c0 + 10 * bw].reshape(10, bw)
        block[0], block[1:] = b[c0:c0 + bw], w9[:, c0:c0 + bw]
    return out


def pack(w: np.ndarray) -> np.ndarray:
    """Weights ``w`` (k × n) as the kernel reads them: ``(ceil(n/16), k, 16)``, zero-padded, 64-byte aligned.
    A stack of matrices ``(P, k, n)`` packs to ``(P, ceil(n/16), k, 16)`` (each one aligned too)."""
    w = np.asarray(w, dtype=np.float32)
    *lead, k, n = w.shape
    panels = -(-n // NR)
    padded = np.zeros((*lead, k, panels * NR), np.float32)
    padded[..., :n] = w
    out = _aligned((*lead, panels, k, NR))
    out[...] = np.moveaxis(padded.reshape(*lead, k, panels, NR), -2, -3)
    return out


def pad_bias(bias: np.ndarray, n: int) -> np.ndarray:
    """The bias zero-padded to whole panels (the kernel reads 16 at a time)."""
    out = np.zeros(-(-n // NR) * NR, np.float32)
    out[:n] = np.asarray(bias, dtype=np.float32).reshape(-1)[:n]
    return out
