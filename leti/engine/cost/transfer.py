"""Transfer cost between memory domains: ``latency + nbytes / bandwidth``.

Parameters per ordered domain pair come from a measurement (:func:`measure_transfer`: two copy
sizes through the backends' own ``copy_in``, least squares over repeated copies) or from fixed
fallbacks: host↔CUDA 10 µs and 12 GB/s (pageable memory over PCIe), any other pair of distinct
domains 2 µs and 10 GB/s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

FALLBACK = {("host", "cuda"): (0.010, 12e9), ("cuda", "host"): (0.010, 12e9)}
DEFAULT = (0.002, 10e9)


@dataclass
class TransferModel:
    #: (src, dst) -> (latency ms, bandwidth bytes/s)
    params: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def get(self, src: str, dst: str) -> tuple[float, float]:
        return self.params.get((src, dst)) or FALLBACK.get((src, dst)) or DEFAULT

    def cost(self, nbytes: int, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        lat, bw = self.get(src, dst)
        return lat + 1e3 * float(nbytes) / bw

    def to_json(self) -> dict:
        return {f"{a}>{b}": list(v) for (a, b), v in self.params.items()}

    @classmethod
    def from_json(cls, d: dict) -> TransferModel:
        return cls({tuple(k.split(">", 1)): (float(v[0]), float(v[1])) for k, v in d.items()})


def _time_copy(dst_backend, src_backend, src, dst, repeats: int) -> float:
    dst_backend.copy_in(src, src_backend, dst)  # warm
    src_backend.synchronize()
    dst_backend.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst_backend.copy_in(src, src_backend, dst)
        dst_backend.synchronize()
        src_backend.synchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def measure_transfer(src_backend, dst_backend, sizes=(4096, 16 << 20, 128 << 20),
                     repeats: int = 10) -> tuple[float, float]:
    """(latency ms, bandwidth B/s) of copies from ``src_backend``'s memory to ``dst_backend``'s.

    Host memory is page-locked where the device backend offers it, as in a session's host arena.
    """
    from leti.engine.backends.base import pinned_allocator

    pinned = pinned_allocator((src_backend, dst_backend))

    def buffer(backend, n):
        raw = pinned(n) if pinned is not None and backend.memory_domain == "host" else backend.acquire(n)
        return backend.view(raw, 0, (n // 4,), "float32")

    ms = []
    for n in sizes:
        a = buffer(src_backend, n)
        b = buffer(dst_backend, n)
        ms.append(_time_copy(dst_backend, src_backend, a, b, repeats))
    # bandwidth from the two largest copies (large copies reach the bus's steady rate), latency from the smallest
    slope = (ms[-1] - ms[-2]) / (sizes[-1] - sizes[-2])  # ms per byte
    bw = 1e3 / slope if slope > 0 else 1e12
    lat = max(ms[0] - sizes[0] * max(slope, 0.0), 1e-4)
    return float(lat), float(bw)
