"""Conv2D: NHWC input, HWIO weights, optional bias, any kernel/stride/padding/dilation."""

from __future__ import annotations

import numpy as np

from leti.engine.ops._common import OpDef, apply_activation, need_rank, pair, resolve_padding
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
    return [(x[0], oh, ow, w[3])]


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
    return [apply_activation(out, attrs.get("activation", "none")).astype(arrays[0].dtype)]


OP = OpDef("conv2d", infer, reference, num_inputs=(2, 3),
           summary="2-D convolution (NHWC, HWIO weights, bias, strides, dilations, padding, fused activation)")
