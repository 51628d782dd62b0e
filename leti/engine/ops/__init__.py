"""The engine's operators: one module per op (shape inference + plain NumPy reference), and the
registry that finds them by name.

A module contributes every :class:`OpDef` it defines at top level; :func:`get` raises a
:class:`ConversionError` that lists what exists when an op is unknown.
"""

from __future__ import annotations

import importlib

from leti.engine.ops._common import ACTIVATIONS, OpDef
from leti.errors import ConversionError

MODULES = ("conv2d", "depthwise_conv2d", "fully_connected", "pool", "add", "add_n", "mul", "concat", "slice",
           "mean", "reshape", "pad", "softmax", "activation", "batch_norm", "lstm")


def _build() -> dict[str, OpDef]:
    reg: dict[str, OpDef] = {}
    for mod in MODULES:
        m = importlib.import_module(f"{__name__}.{mod}")
        for v in vars(m).values():
            if isinstance(v, OpDef):
                reg[v.name] = v
    return reg


REGISTRY: dict[str, OpDef] = _build()


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConversionError(f"unsupported op {name!r}; the engine knows: {', '.join(sorted(REGISTRY))}") from None


def infer_shapes(graph, input_shapes: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Shapes of every tensor, propagated from the inputs (and ``input_shapes`` overrides)."""
    shapes = {t: graph.tensors[t].shape for t in graph.inputs}
    shapes.update({k: tuple(v) for k, v in (input_shapes or {}).items()})
    shapes.update({k: tuple(v.shape) for k, v in graph.constants.items()})
    for n in graph.nodes:
        op = get(n.op)
        op.check_arity(len(n.inputs), n.name)
        try:
            outs = op.infer([shapes[t] for t in n.inputs], n.attrs)
        except ConversionError as exc:
            raise ConversionError(f"node {n.name!r}: {exc}") from None
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConversionError(f"node {n.name!r} ({n.op}): bad attributes ({exc!r})") from None
        if len(outs) != len(n.outputs):
            raise ConversionError(f"node {n.name!r}: op {n.op} makes {len(outs)} outputs, node lists {len(n.outputs)}")
        shapes.update(zip(n.outputs, outs))
    return shapes


__all__ = ["ACTIVATIONS", "MODULES", "REGISTRY", "OpDef", "get", "infer_shapes"]
