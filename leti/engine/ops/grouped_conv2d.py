"""Grouped Conv2D (ResNeXt, RegNet, ShuffleNet): input channels split into ``groups`` equal parts,
each convolved with its own slice of the output channels.

A separate op rather than a ``groups`` attribute of ``conv2d``: every backend, pass and cost table
that knows ``conv2d`` assumes dense weights ``(kh, kw, c_in, c_out)``, so a grouped convolution
must not be taken for one silently. Weights are ``(kh, kw, c_in / groups, c_out)``; output channels
``[g·c_out/groups, (g+1)·c_out/groups)`` read input channels ``[g·c_in/groups, (g+1)·c_in/groups)``
(TFLite's and ONNX's convention). A depthwise convolution is the case ``groups == c_in``.
"""

from __future__ import annotations

import numpy as np

from leti.engine.ops import conv2d as dense
from leti.engine.ops._common import OpDef, need_rank, register
from leti.errors import ConversionError


def groups_of(x_shape, w_shape, attrs) -> int:
    g = int(attrs.get("groups", 1))
    if g < 1 or x_shape[3] != w_shape[2] * g or w_shape[3] % g:
        raise ConversionError(f"grouped_conv2d: {x_shape[3]} input channels, weights {list(w_shape)} "
                              f"do not split into {g} groups")
    return g


def infer(shapes, attrs):
    x, w = shapes[0], shapes[1]
    need_rank(x, 4, "grouped_conv2d")
    if len(w) != 4:
        raise ConversionError(f"grouped_conv2d weights must be (kh, kw, c_in/groups, c_out), got {list(w)}")
    groups_of(x, w, attrs)
    if len(shapes) > 2 and tuple(shapes[2]) != (w[3],):
        raise ConversionError(f"grouped_conv2d: bias shape {list(shapes[2])} != ({w[3]},)")
    _, (oh, ow), _, _ = dense.geometry(x, w, attrs)
    return [(x[0], oh, ow, w[3])]


def split(arrays, attrs):
    """Per group: the input channel slice, the weight slice, the bias slice (or None)."""
    x, w = arrays[0], arrays[1]
    g = groups_of(x.shape, w.shape, attrs)
    ci, co = w.shape[2], w.shape[3] // g
    b = arrays[2] if len(arrays) > 2 else None
    return [(x[..., k * ci:(k + 1) * ci], w[..., k * co:(k + 1) * co], None if b is None else b[k * co:(k + 1) * co])
            for k in range(g)]


def reference(arrays, attrs):
    inner = {k: v for k, v in attrs.items() if k != "groups"}
    outs = [dense.reference([xi, wi] + ([] if bi is None else [bi]), inner)[0] for xi, wi, bi in split(arrays, attrs)]
    return [np.concatenate(outs, axis=3)]


def mul(in_shapes, out_shapes, attrs, scheme) -> float:
    x, w = in_shapes[0], in_shapes[1]
    _, (oh, ow), _, _ = dense.geometry(x, w, attrs)
    kh, kw, icg, oc = w
    return float(x[0]) * oh * ow * kh * kw * icg * oc


EXAMPLES = (
    {"inputs": [(1, 6, 6, 8), (3, 3, 2, 8), (8,)], "const": (1, 2),
     "attrs": {"groups": 4, "padding": "same", "activation": "relu"}},
    {"inputs": [(1, 5, 5, 6), (1, 1, 3, 4)], "const": (1,), "attrs": {"groups": 2}},
    {"inputs": [(2, 7, 7, 4), (3, 3, 2, 6), (6,)], "const": (1, 2),
     "attrs": {"groups": 2, "strides": [2, 2], "padding": "same", "activation": "relu6"}},
    # groups of 8 output channels (half a 16-wide weight panel) and of 24 (one and a half), as in RegNets
    {"inputs": [(1, 9, 9, 32), (3, 3, 8, 32), (32,)], "const": (1, 2),
     "attrs": {"groups": 4, "padding": "same", "activation": "relu"}},
    {"inputs": [(1, 8, 7, 48), (3, 3, 24, 48)], "const": (1,), "attrs": {"groups": 2, "strides": [2, 2]}},
    # a dilated window (the CPU backend's per-group path)
    {"inputs": [(1, 9, 9, 8), (3, 3, 4, 8), (8,)], "const": (1, 2),
     "attrs": {"groups": 2, "dilations": [2, 2], "padding": "same"}},
)

OP = register(OpDef("grouped_conv2d", infer, reference, num_inputs=(2, 3),
                    summary="grouped 2-D convolution (NHWC, weights (kh, kw, c_in/groups, c_out), groups)",
                    mul=mul, schemes=("im2col",), examples=EXAMPLES))
