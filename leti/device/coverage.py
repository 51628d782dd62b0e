"""How much of a model a delegate runs: the numbers ``benchmark_model`` prints, found for an in-process interpreter.

TFLite replaces each *partition* of nodes a delegate accepts by one ``DELEGATE`` node and logs
``Replacing N out of M node(s) with delegate (NAME) node, yielding P partitions for the whole graph.``
The Python interpreter of ai-edge-litert does not print that line, but its node list shows the result:
the original nodes, then one ``DELEGATE`` node per partition whose inputs and outputs are the
partition's. A partition is convex, so its nodes are those reached walking back from its outputs to
its inputs; every other original node falls back to the CPU's built-in kernels.

:class:`Coverage` is what devices attach to a batch (``delegate``, ``delegated_nodes``,
``total_nodes``, ``partitions``); :func:`interpreter_coverage` computes it, :func:`replacing_line`
prints it the way TFLite does (the loopback phone's runner uses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


@dataclass(frozen=True)
class Coverage:
    """``delegated_nodes`` of ``total_nodes`` run by ``delegate`` in ``partitions`` partitions."""

    delegate: str
    delegated_nodes: int
    total_nodes: int
    partitions: int

    @property
    def cpu_nodes(self) -> int:
        return self.total_nodes - self.delegated_nodes

    @property
    def full(self) -> bool:
        return self.total_nodes > 0 and self.delegated_nodes == self.total_nodes


def interpreter_coverage(interp, delegate: str = "TfLiteXNNPackDelegate") -> Coverage:
    """The delegate coverage of an allocated ai-edge-litert ``Interpreter`` (nodes of the main graph)."""
    original, partitions, taken = _delegated(interp._get_ops_details())
    return Coverage(delegate, len(taken), len(original), len(partitions))


class FallbackNode(NamedTuple):
    """A node no delegate took: its TFLite op name and the names of the tensors it writes and reads."""

    op: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]


def fallback_nodes(interp) -> list[FallbackNode]:
    """The nodes of an allocated ``Interpreter``'s main graph that no delegate took, in order. The tensor names are what
    :func:`leti.predict.kernels.split.split_graph` matches its kernels against (LETI's TFLite importer keeps TFLite's
    tensor names)."""
    original, _, taken = _delegated(interp._get_ops_details())
    names = {int(d["index"]): str(d["name"]) for d in interp.get_tensor_details()}
    named = lambda ts: tuple(names.get(int(t), "") for t in ts if int(t) >= 0)  # noqa: E731
    return [FallbackNode(n["op_name"], named(n["outputs"]), named(n["inputs"]))
            for i, n in enumerate(original) if i not in taken]


def xnnpack_fallback_nodes(source: str | Path | bytes) -> list[FallbackNode] | None:
    """:func:`fallback_nodes` of a ``.tflite`` file (or its bytes) loaded with TFLite's default XNNPACK delegate, one
    thread (None when the interpreter cannot load it)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    where = {"model_content": bytes(source)} if isinstance(source, (bytes, bytearray, memoryview)) \
        else {"model_path": str(source)}
    try:
        interp = Interpreter(**where, num_threads=1, experimental_op_resolver_type=OpResolverType.AUTO)
        interp.allocate_tensors()
    except (ValueError, RuntimeError):
        return None
    return fallback_nodes(interp)


def _delegated(nodes: list[dict]) -> tuple[list[dict], list[dict], set[int]]:
    """The original nodes, the ``DELEGATE`` nodes and the indices (into the original ones) the delegates took."""
    original = [n for n in nodes if n["op_name"] != "DELEGATE"]
    partitions = [n for n in nodes if n["op_name"] == "DELEGATE"]
    producer = {}
    for i, n in enumerate(original):
        for t in n["outputs"]:
            producer[int(t)] = i
    taken: set[int] = set()
    for d in partitions:
        stop = {int(t) for t in d["inputs"]}
        todo = [int(t) for t in d["outputs"]]
        seen: set[int] = set()
        while todo:
            t = todo.pop()
            if t in seen or t in stop or t not in producer:
                continue
            seen.add(t)
            k = producer[t]
            if k not in taken:
                taken.add(k)
                todo.extend(int(x) for x in original[k]["inputs"] if int(x) >= 0)
    return original, partitions, taken


def replacing_line(c: Coverage) -> str:
    """TFLite's own log line for a delegate that took part of the graph."""
    return (f"Replacing {c.delegated_nodes} out of {c.total_nodes} node(s) with delegate ({c.delegate}) node, "
            f"yielding {c.partitions} partitions for the whole graph.")
