"""Pre-inference decisions that do not depend on a backend: the computation scheme of every op.

Convolution (MNN §3.2): a 1×1 stride-1 unpadded convolution is a matrix product — ``strassen``
with as many levels as MNN's inequality allows (above ``strassen_min_dim``), else ``gemm``; a k×k
(k > 1) stride-1 convolution takes Winograd F(n̂×n̂, k×k) with n̂ from
:func:`leti.engine.winograd.choose_tile` (MNN's Eq. 2, restricted to tile sizes that leave at least
``winograd_min_tiles`` tiles, and only from ``winograd_min_channels`` input channels: two limits
measured on the CPU backend that Eq. 2 does not see), or the sliding window (``im2col``) when
n̂ = 1; strided, dilated or non-square convolutions use ``im2col``. Everything else is ``direct``.
"""

from __future__ import annotations

from dataclasses import dataclass

from leti.engine.backends.base import Scheme
from leti.engine.graph import Node
from leti.engine.ops.conv2d import geometry
from leti.engine.strassen import strassen_depth
from leti.engine.winograd import choose_tile
from leti.errors import ConversionError

CONV_SCHEMES = ("gemm", "strassen", "winograd", "im2col")


@dataclass
class ScheduleOptions:
    """``winograd_max_tile`` bounds n̂ (float32 accuracy); ``winograd_min_tiles`` is the fewest
    tiles per image a chosen n̂ may leave (see :func:`leti.engine.winograd.choose_tile`) and
    ``winograd_min_channels`` the fewest input channels for Winograd at all (with ic = 3, a stem,
    the α² products have K = 3 and the transforms outweigh them: im2col is 3× faster); both are
    ignored when Winograd is forced; ``strassen_min_dim`` is the smallest
    half-dimension a Strassen level may produce (0 = MNN's inequality alone); ``conv_scheme``
    forces one scheme wherever it applies (for tests and benchmarks)."""

    winograd_max_tile: int = 6
    winograd_min_tiles: int = 64
    winograd_min_channels: int = 16
    strassen_min_dim: int = 1024
    conv_scheme: str | None = None

    def __post_init__(self) -> None:
        if self.conv_scheme is not None and self.conv_scheme not in CONV_SCHEMES:
            raise ConversionError(f"unknown conv scheme {self.conv_scheme!r}; known: {', '.join(CONV_SCHEMES)}")
        if self.winograd_max_tile < 1:
            raise ConversionError("winograd_max_tile must be >= 1")


def conv_scheme(node: Node, x_shape, w_shape, opts: ScheduleOptions) -> Scheme:
    pads, (oh, ow), strides, dil = geometry(x_shape, w_shape, node.attrs)
    kh, kw, ic, oc = w_shape
    pointwise = (kh, kw) == (1, 1) and strides == (1, 1) and not any(pads)
    winogradable = kh == kw > 1 and strides == (1, 1) and dil == (1, 1)
    forced = opts.conv_scheme
    if pointwise and forced in (None, "gemm", "strassen"):
        rule = strassen_depth(x_shape[0] * oh * ow, oc, ic, min_dim=opts.strassen_min_dim if forced is None else 0)
        if forced == "gemm" or rule == 0:
            return Scheme("gemm")
        return Scheme("strassen", {"depth": rule if forced is None else min(rule, 2)})
    if winogradable and (forced == "winograd" or (forced is None and ic >= opts.winograd_min_channels)):
        n = choose_tile(kh, ic, oc, oh, ow, opts.winograd_max_tile,
                        0 if forced == "winograd" else opts.winograd_min_tiles)
        if forced == "winograd" and n == 1:
            n = 2
        if n > 1:
            return Scheme("winograd", {"n": n})
    return Scheme("im2col")


def choose_scheme(node: Node, in_shapes, opts: ScheduleOptions) -> Scheme:
    if node.op == "conv2d":
        return conv_scheme(node, in_shapes[0], in_shapes[1], opts)
    if node.op in ("fully_connected",):
        return Scheme("gemm")
    return Scheme("direct")
