"""Graph rewrites run once before planning (CompiledNN's "merge at load time").

Each pass takes a :class:`Graph`, rewrites a copy and returns ``(graph, count)`` — the number of
rewrites made, which :func:`optimize` reports. All passes keep the node list in execution order and
never change what the graph computes beyond floating-point reassociation (BN folding).

* :func:`depthwise_from_grouped` — a grouped convolution with one input channel per group becomes the
  depthwise convolution it is;
* :func:`fold_constants` — evaluate nodes whose inputs are all constants;
* :func:`fold_batch_norm` — merge a batch norm into the conv / depthwise conv / dense before it;
* :func:`fuse_activations` — merge a ReLU/ReLU6 into the op before it (``activation`` attribute);
* :func:`merge_adds` — turn chains of two-input adds into one ``add_n`` (one pass over memory);
* :func:`remove_dead` — drop nodes, tensors and constants no output depends on.

:func:`fuse_residual_adds` (a shortcut add into the convolution before it) is not in the pipeline: a
:class:`~leti.engine.session.Session` applies it when every backend it has takes a residual input.

In-place execution (an element-wise op writing over an input that has no later reader) is decided
by the memory planner from :func:`inplace_candidates`, since it depends on the final order.
"""

from __future__ import annotations

import numpy as np

from leti.engine import ops
from leti.engine.graph import Graph, Node
from leti.engine.ops.batch_norm import scale_shift

FOLDS_BN = ("conv2d", "depthwise_conv2d", "fully_connected")
FUSES_ACTIVATION = ("conv2d", "depthwise_conv2d", "fully_connected", "add", "add_n", "mul", "max_pool2d",
                    "avg_pool2d", "concat")


def _sole_reader(g: Graph, tensor: str, consumers) -> bool:
    return len(consumers.get(tensor, [])) == 1 and tensor not in g.outputs and tensor not in g.inputs


def _rename_output(g: Graph, node: Node, old: str, new: str) -> None:
    """``node`` now writes ``new`` instead of ``old`` (``old`` disappears)."""
    node.outputs = [new if t == old else t for t in node.outputs]
    g.tensors.pop(old, None)


def depthwise_from_grouped(g: Graph) -> tuple[Graph, int]:
    """``grouped_conv2d`` with ``groups`` equal to its input channels (one channel a group; ConvNeXt writes its
    7×7 depthwise convolutions so) → ``depthwise_conv2d`` with ``multiplier`` = output channels per group: the
    same arithmetic (output ``c·m + j`` reads input ``c`` in both), run by the depthwise kernels instead of a GEMM
    tile with one live column in eight, and open to batch-norm folding and activation fusion."""
    g = g.copy()
    count = 0
    for n in g.nodes:
        if n.op != "grouped_conv2d" or not g.is_constant(n.inputs[1]):
            continue
        w = g.constants[n.inputs[1]]
        groups = int(n.attrs.get("groups", 1))
        if w.ndim != 4 or w.shape[2] != 1 or groups != g.tensors[n.inputs[0]].shape[3] or w.shape[3] % groups:
            continue
        name = f"{n.name}/weights_depthwise"
        g.add_constant(name, np.ascontiguousarray(w.reshape(w.shape[0], w.shape[1], w.shape[3])))
        n.op, n.inputs = "depthwise_conv2d", [n.inputs[0], name, *n.inputs[2:]]
        n.attrs = {k: v for k, v in n.attrs.items() if k != "groups"}
        if w.shape[3] // groups > 1:
            n.attrs["multiplier"] = w.shape[3] // groups
        count += 1
    return g, count


def fold_constants(g: Graph) -> tuple[Graph, int]:
    g = g.copy()
    keep, count = [], 0
    for n in g.nodes:
        if n.inputs and all(g.is_constant(t) for t in n.inputs):
            outs = ops.get(n.op).reference([g.constants[t] for t in n.inputs], n.attrs)
            for t, v in zip(n.outputs, outs):
                g.constants[t] = np.ascontiguousarray(v, dtype=g.tensors[t].dtype)
            count += 1
        else:
            keep.append(n)
    g.nodes = keep
    return g, count


def fold_batch_norm(g: Graph) -> tuple[Graph, int]:
    g = g.copy()
    prod, cons = g.producers(), g.consumers()
    drop, count = set(), 0
    for n in g.nodes:
        if n.op != "batch_norm" or not all(g.is_constant(t) for t in n.inputs[1:]):
            continue
        p = prod.get(n.inputs[0])
        if (p is None or p.op not in FOLDS_BN or p.attrs.get("activation", "none") != "none"
                or not g.is_constant(p.inputs[1]) or not _sole_reader(g, n.inputs[0], cons)):
            continue
        scale, shift = scale_shift(*(g.constants[t] for t in n.inputs[1:]), float(n.attrs.get("epsilon", 1e-3)))
        # HWIO, depthwise (kh, kw, c*m) and dense (k_in, n_out) all keep the output channel last
        w = g.constants[p.inputs[1]].astype(np.float64) * scale
        bias = g.constants[p.inputs[2]].astype(np.float64) if len(p.inputs) > 2 else 0.0
        bias = bias * scale + shift
        wname, bname = f"{p.name}/weights_bnfold", f"{p.name}/bias_bnfold"
        g.add_constant(wname, w.astype(np.float32))
        g.add_constant(bname, bias.astype(np.float32))
        p.inputs = [p.inputs[0], wname, bname]
        _rename_output(g, p, n.inputs[0], n.outputs[0])
        drop.add(id(n))
        count += 1
    g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g, count


def fuse_activations(g: Graph) -> tuple[Graph, int]:
    g = g.copy()
    prod, cons = g.producers(), g.consumers()
    drop, count = set(), 0
    for n in g.nodes:
        if n.op not in ("relu", "relu6"):
            continue
        p = prod.get(n.inputs[0])
        if p is None or p.op not in FUSES_ACTIVATION or p.attrs.get("activation", "none") != "none":
            continue
        if not _sole_reader(g, n.inputs[0], cons):
            continue
        p.attrs["activation"] = n.op
        _rename_output(g, p, n.inputs[0], n.outputs[0])
        drop.add(id(n))
        count += 1
    g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g, count


def _rewrite_until_fixed(g: Graph, rewrite) -> tuple[Graph, int]:
    """Apply ``rewrite(g, node, producers, consumers) -> bool`` (True: it rewrote ``g``) to a copy of ``g``,
    node by node and again from the start after every rewrite, until no node changes; returns the graph
    and the number of rewrites."""
    g = g.copy()
    count = 0
    while True:
        prod, cons = g.producers(), g.consumers()
        if not any(rewrite(g, n, prod, cons) for n in g.nodes):
            return g, count
        count += 1


def _merge_add(g: Graph, n: Node, prod, cons) -> bool:
    if n.op not in ("add", "add_n"):
        return False
    out_shape = g.tensors[n.outputs[0]].shape
    new_inputs, merged = [], None
    for t in n.inputs:
        p = prod.get(t)
        if (not merged and p is not None and p.op in ("add", "add_n")
                and p.attrs.get("activation", "none") == "none" and _sole_reader(g, t, cons)
                and all(g.tensors[i].shape == out_shape for i in p.inputs)
                and all(g.tensors[i].shape == out_shape for i in n.inputs)):
            new_inputs += p.inputs
            merged = p
            g.tensors.pop(t)
        else:
            new_inputs.append(t)
    if merged:
        n.op, n.inputs = "add_n", new_inputs
        g.nodes = [m for m in g.nodes if m is not merged]
    return merged is not None


def merge_adds(g: Graph) -> tuple[Graph, int]:
    return _rewrite_until_fixed(g, _merge_add)


def remove_dead(g: Graph) -> tuple[Graph, int]:
    g = g.copy()
    needed = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if any(t in needed for t in n.outputs):
            keep.append(n)
            needed.update(n.inputs)
    removed = len(g.nodes) - len(keep)
    g.nodes = keep[::-1]
    needed.update(g.inputs)
    for t in [t for t in g.tensors if t not in needed]:
        del g.tensors[t]
        g.constants.pop(t, None)
    return g, removed


def _fuse_residual_add(g: Graph, n: Node, prod, cons) -> bool:
    if n.op != "add" or len(n.inputs) != 2:
        return False
    out_shape = g.tensors[n.outputs[0]].shape
    for k, t in enumerate(n.inputs):
        p, other = prod.get(t), n.inputs[1 - k]
        if (p is None or p.op != "conv2d" or len(p.inputs) > 3 or p.attrs.get("activation", "none") != "none"
                or not _sole_reader(g, t, cons) or other == t or g.is_constant(other)
                or g.tensors[other].shape != out_shape or g.tensors[t].shape != out_shape
                or g.tensors[other].dtype != g.tensors[t].dtype):
            continue
        if len(p.inputs) == 2:
            oc = g.tensors[p.inputs[1]].shape[3]
            p.inputs.append(g.add_constant(f"{p.name}/zero_bias", np.zeros(oc, np.float32)))
        p.inputs.append(other)
        p.attrs["activation"] = n.attrs.get("activation", "none")
        g.nodes.remove(p)  # the conv now runs where the add ran: after ``other`` is computed
        g.nodes.insert(g.nodes.index(n), p)
        _rename_output(g, p, t, n.outputs[0])
        g.nodes.remove(n)
        return True
    return False


def fuse_residual_adds(g: Graph) -> tuple[Graph, int]:
    """``add(conv2d(...), r)`` → ``conv2d(..., bias, r)`` with the add's activation: the shortcut of a
    ResNet block added in the convolution's epilogue instead of a separate pass over memory (the CPU
    backend's GEMM adds it in registers). Only a convolution without an activation of its own, whose
    output the add alone reads, with ``r`` shaped like that output; a convolution without a bias gets
    a zero bias (input 2) so the residual is input 3."""
    return _rewrite_until_fixed(g, _fuse_residual_add)


PIPELINE = (("depthwise_from_grouped", depthwise_from_grouped), ("fold_constants", fold_constants),
            ("fold_batch_norm", fold_batch_norm),
            ("fuse_activations", fuse_activations), ("merge_adds", merge_adds), ("remove_dead", remove_dead))


def optimize(g: Graph) -> tuple[Graph, dict[str, int]]:
    """Run every pass once, in order; returns the new graph and rewrites per pass."""
    report = {}
    for name, fn in PIPELINE:
        g, report[name] = fn(g)
    return g, report


def inplace_candidates(g: Graph) -> dict[str, tuple[int, ...]]:
    """For each node, the inputs whose buffer its output may take over (same shape and dtype, not a
    constant, not read again by the node at another position: ``add_n(a, b, a)`` written into ``a``'s buffer would
    read the partial sum as its third term); the planner grants it only when that node is the input's last reader."""
    out = {}
    for n in g.nodes:
        cand = tuple(i for i in ops.get(n.op).inplace
                     if i < len(n.inputs) and not g.is_constant(n.inputs[i]) and n.inputs.count(n.inputs[i]) == 1
                     and g.tensors[n.inputs[i]].shape == g.tensors[n.outputs[0]].shape
                     and g.tensors[n.inputs[i]].dtype == g.tensors[n.outputs[0]].dtype)
        if cand:
            out[n.name] = cand
    return out
