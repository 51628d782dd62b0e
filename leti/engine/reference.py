"""Run a graph with the plain reference implementation of every op (slow, exact, float64 inside).

This is the engine's ground truth, kept beside the fast backends as CompiledNN keeps its exact
reference: tests compare every scheme and every model against it, tensor by tensor.
"""

from __future__ import annotations

import numpy as np

from leti.engine import ops
from leti.engine.graph import Graph
from leti.errors import ConversionError


def run_reference(graph: Graph, feeds: dict[str, np.ndarray], keep_all: bool = False) -> dict[str, np.ndarray]:
    """Evaluate ``graph``; returns the outputs (or every tensor when ``keep_all``)."""
    values: dict[str, np.ndarray] = dict(graph.constants)
    for name in graph.inputs:
        if name not in feeds:
            raise ConversionError(f"missing input {name!r}")
        values[name] = np.asarray(feeds[name], dtype=graph.tensors[name].dtype)
    for n in graph.nodes:
        outs = ops.get(n.op).reference([values[t] for t in n.inputs], n.attrs)
        values.update(zip(n.outputs, outs))
    return values if keep_all else {t: values[t] for t in graph.outputs}
