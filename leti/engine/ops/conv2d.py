"""Conv2D: NHWC input, HWIO weights, optional bias, any kernel/stride/padding/dilation, and an optional
residual (input 3, shaped like the output) added before the activation: a shortcut add fused into the
convolution by :func:`leti.engine.passes.fuse_residual_adds` (sessions whose backends all take it)."""

from __future__ import annotations

import numpy as np

from leti.engine.ops._common import OpDef, apply_activation, need_rank, pair, register, resolve_padding
from leti.engine.scheme import Scheme
from leti.engine.strassen import strassen_depth
from leti.engine.winograd import choose_tile, tile_cost
from leti.errors import ConversionError


def geometry(x_shape, w_shape, attrs):
    """(pads, (oh, ow), strides, dilations) of a conv or pool window over ``x_shape``."""
    strides, dil = pair(attrs.get("strides"), 1), pair(attrs.get("dilations"), 1)
    pads, out = resolve_padding(attrs.get("padding", "valid"), x_shape[1:3], w_shape[:2], strides, dil)
    return pads, out, strides, dil


def infer(shapes, attrs):
    x, w = shapes[0], shapes[1]
    need_rank(x, 4, "conv2d")
    if len(w) != 4:
        raise ConversionError(f"conv2d weights must be (kh, kw, c_in, c_out), got {list(w)}")
    if w[2] != x[3]:
        raise ConversionError(f"conv2d: input has {x[3]} channels, weights expect {w[2]}")
    if len(shapes) > 2 and tuple(shapes[2]) != (w[3],):
        raise ConversionError(f"conv2d: bias shape {list(shapes[2])} != ({w[3]},)")
    _, (oh, ow), _, _ = geometry(x, w, attrs)
    out = (x[0], oh, ow, w[3])
    if len(shapes) > 3 and tuple(shapes[3]) != out:
        raise ConversionError(f"conv2d: residual shape {list(shapes[3])} != output {list(out)}")
    return [out]


def pad_input(x: np.ndarray, pads, value=0.0) -> np.ndarray:
    t, b, l, r = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=value)


def reference(arrays, attrs):
    x, w = arrays[0].astype(np.float64), arrays[1].astype(np.float64)
    pads, (oh, ow), (sh, sw), (dh, dw) = geometry(x.shape, w.shape, attrs)
    xp = pad_input(x, pads)
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            patch = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw, :]
            out += patch @ w[i, j]
    if len(arrays) > 2:
        out += arrays[2]
    if len(arrays) > 3:
        out += arrays[3]
    return [apply_activation(out, attrs.get("activation", "none")).astype(arrays[0].dtype)]


def mul(in_shapes, out_shapes, attrs, scheme) -> float:
    """Multiplications of the scheme: Winograd and Strassen save some."""
    x, w = in_shapes[0], in_shapes[1]
    _, (oh, ow), _, _ = geometry(x, w, attrs)
    kh, kw, ic, oc = w
    direct = float(x[0]) * oh * ow * kh * kw * ic * oc
    if scheme.name == "winograd":
        n = int(scheme.params["n"])
        return float(x[0]) * tile_cost(n, kh, ic, oc) * (-(-oh // n)) * (-(-ow // n))
    if scheme.name == "strassen":
        return direct * (7 / 8) ** int(scheme.params.get("depth", 0))
    return direct


def choose_scheme(in_shapes, attrs, opts) -> Scheme:
    scheme = _choose_scheme(in_shapes, attrs, opts)
    scheme.forced = opts.conv_scheme is not None
    return scheme


def _choose_scheme(in_shapes, attrs, opts) -> Scheme:
    """MNN §3.2: a 1×1 stride-1 unpadded convolution is a matrix product — ``strassen`` with as many
    levels as MNN's inequality allows (above ``opts.strassen_min_dim``), else ``gemm``; a k×k (k > 1)
    stride-1 convolution takes Winograd F(n̂×n̂, k×k) with n̂ from
    :func:`leti.engine.winograd.choose_tile` (from ``opts.winograd_min_channels`` input channels, or
    ``opts.winograd_min_channels_large`` for a 5×5 or larger window), or
    ``im2col`` when n̂ = 1; strided, dilated or non-square convolutions use ``im2col``.
    ``opts.conv_scheme`` forces one scheme wherever it applies."""
    x_shape, w_shape = in_shapes[0], in_shapes[1]
    pads, (oh, ow), strides, dil = geometry(x_shape, w_shape, attrs)
    kh, kw, ic, oc = w_shape
    pointwise = (kh, kw) == (1, 1) and strides == (1, 1) and not any(pads)
    winogradable = kh == kw > 1 and strides == (1, 1) and dil == (1, 1)
    forced = opts.conv_scheme
    if pointwise and forced in (None, "gemm", "strassen"):
        rule = strassen_depth(x_shape[0] * oh * ow, oc, ic, min_dim=opts.strassen_min_dim if forced is None else 0)
        if forced == "gemm" or rule == 0:
            return Scheme("gemm")
        return Scheme("strassen", {"depth": rule if forced is None else min(rule, 2)})
    min_ic = opts.winograd_min_channels if kh <= 3 else opts.winograd_min_channels_large
    if winogradable and (forced == "winograd" or (forced is None and ic >= min_ic)):
        n = choose_tile(kh, ic, oc, oh, ow, opts.winograd_max_tile,
                        0 if forced == "winograd" else opts.winograd_min_tiles)
        if forced == "winograd" and n == 1:
            n = 2
        if n > 1:
            return Scheme("winograd", {"n": n})
    return Scheme("im2col")


EXAMPLES = (
    {"inputs": [(1, 6, 6, 16), (3, 3, 16, 8), (8,)], "const": (1, 2),
     "attrs": {"padding": "same", "activation": "relu"}},
    {"inputs": [(1, 5, 5, 4), (1, 1, 4, 6)], "const": (1,), "attrs": {}},
    {"inputs": [(2, 7, 7, 3), (3, 3, 3, 4), (4,)], "const": (1, 2),
     "attrs": {"strides": [2, 2], "padding": "same", "activation": "relu6"}},
)

OP = register(OpDef("conv2d", infer, reference, num_inputs=(2, 4),
                    summary="2-D convolution (NHWC, HWIO weights, bias, strides, dilations, padding, fused activation)",
                    mul=mul, schemes=("gemm", "strassen", "winograd", "im2col"), choose_scheme=choose_scheme,
                    examples=EXAMPLES))
