"""Pre-inference decisions that do not depend on a backend: the computation scheme of every op.

Each op chooses its own (:attr:`leti.engine.ops.OpDef.choose_scheme`; the convolution's rule,
MNN §3.2, lives in :mod:`leti.engine.ops.conv2d`); this module holds the options those rules read.
"""

from __future__ import annotations

from dataclasses import dataclass

from leti.engine import ops
from leti.engine.graph import Node
from leti.engine.scheme import Scheme
from leti.errors import ConversionError

#: The convolution's schemes (what ``conv_scheme`` may force).
CONV_SCHEMES = ops.get("conv2d").schemes


@dataclass
class ScheduleOptions:
    """``winograd_max_tile`` bounds n̂ (float32 accuracy, and speed: with LETI's own GEMM F(4×4) beat
    F(6×6) and F(5×5) on every measured map, e.g. 56×56×64 1.79 vs 1.87 ms, 14×14×256 1.67 vs 1.67);
    ``winograd_min_tiles`` is the fewest tiles per image a chosen n̂ may leave (see
    :func:`leti.engine.winograd.choose_tile`; 64 while the products ran on MKL, 16 since LETI's GEMM
    runs few-row products near peak: 7×7×512 and 8×8×512 by F(2×2) 2.98 and 3.55 ms against im2col's
    3.82 and 5.73, 16×16×256 by F(4×4) 2.10 against F(2×2)'s 2.85; one thread, ``docs/engine.md``) and
    ``winograd_min_channels`` the fewest input channels for a 3×3 Winograd (with ic = 3, a stem, the α²
    products have K = 3 and the transforms outweigh them: im2col is 3× faster; with ic = 16 still 1.3-1.7×
    faster — 3×3, 16 → 16/32 channels on 32×32 and 64×64: 0.14 vs 0.22, 0.19 vs 0.25, 0.52 vs 0.88 ms, one
    thread —, while from 32 channels on Winograd wins: 32×32×32 0.28 vs 0.32 ms) and
    ``winograd_min_channels_large`` for a 5×5 or larger window, where Winograd saves more multiplications:
    at 16 channels the two are within ±12 % either way (5×5 and 7×7 on 16-64 pixel maps), from 20 Winograd
    wins (5×5 and 7×7, 20 channels on 32×32: 0.54 vs 0.58 and 0.84 vs 1.10 ms; 7×7, 28 channels on 48×48: 1.8
    vs 5.4 ms); both are
    ignored when Winograd is forced; ``strassen_min_dim`` is the smallest
    half-dimension a Strassen level may produce (0 = MNN's inequality alone); ``conv_scheme``
    forces one scheme wherever it applies (for tests and benchmarks)."""

    winograd_max_tile: int = 4
    winograd_min_tiles: int = 16
    winograd_min_channels: int = 32
    winograd_min_channels_large: int = 20
    strassen_min_dim: int = 1024
    conv_scheme: str | None = None

    def __post_init__(self) -> None:
        if self.conv_scheme is not None and self.conv_scheme not in CONV_SCHEMES:
            raise ConversionError(f"unknown conv scheme {self.conv_scheme!r}; known: {', '.join(CONV_SCHEMES)}")
        if self.winograd_max_tile < 1:
            raise ConversionError("winograd_max_tile must be >= 1")


def choose_scheme(node: Node, in_shapes, opts: ScheduleOptions) -> Scheme:
    """The scheme of ``node``, as its op chooses it."""
    return ops.get(node.op).scheme(in_shapes, node.attrs, opts)
