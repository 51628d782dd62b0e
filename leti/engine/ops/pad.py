"""Constant padding: ``pads`` is ``[[before, after], ...]`` per axis."""

from __future__ import annotations

import numpy as np

from leti.engine.ops._common import OpDef
from leti.errors import ConversionError


def infer(shapes, attrs):
    pads = attrs["pads"]
    if len(pads) != len(shapes[0]) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ConversionError(f"pad: pads {pads} do not fit rank {len(shapes[0])} (need [[before, after], ...] >= 0)")
    return [tuple(d + a + b for d, (a, b) in zip(shapes[0], pads))]


def reference(arrays, attrs):
    return [np.pad(arrays[0], [tuple(p) for p in attrs["pads"]], constant_values=attrs.get("value", 0.0))]


OP = OpDef("pad", infer, reference, summary="constant padding")
