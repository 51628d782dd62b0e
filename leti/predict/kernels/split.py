"""Kernel detection: any model, as the kernels a runtime runs it as (rows of LETI's kernel table).

Why per runtime: which ops run as one kernel is the runtime's choice, not the model's. The TFLite converter
already folds batch norms and fuses ReLU/ReLU6 into the op before them (LETI's importers keep that as the
node's ``activation``); XNNPACK on a CPU then runs one kernel per remaining op, while the TFLite GPU delegate
also links element-wise followers (an add, a hard-swish) into the convolution before them; LETI's engine
merges chains of adds. :class:`FusionRules` says, for one runtime, which follower op types merge into which
kernel types; :data:`DEFAULT_RULES` are the rules known a priori, and measuring a device
(``leti kernels build``: time A, B and A→B) replaces them with the rules observed there. A predictor keeps the
rules it was built with, so a model is split the way the device it describes runs it.

The split itself works on LETI's one graph representation (the engine IR, whatever the model file was),
after the graph rewrites every runtime makes (constant and batch-norm folding, ReLU fusion, dead code).
Views and shape-only ops (reshape) are not kernels; their cost, if any, is in the model overhead term.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from leti.errors import ConversionError

#: engine op -> kernel type (ops not listed keep their own name as their type)
KERNEL_OF_OP = {
    "conv2d": "conv2d", "depthwise_conv2d": "depthwise_conv2d", "grouped_conv2d": "grouped_conv2d",
    "fully_connected": "dense", "mean": "mean", "concat": "concat", "max_pool2d": "max_pool",
    "avg_pool2d": "avg_pool", "add": "add", "add_n": "add", "mul": "mul", "hard_swish": "hard_swish",
    "sigmoid": "sigmoid", "hard_sigmoid": "hard_sigmoid", "relu": "relu", "relu6": "relu",
}
#: ops whose following ReLU the TFLite converter leaves a separate op (measured: CONCATENATION + RELU),
#: though the engine's activation pass fuses it
APART_IN_TFLITE = frozenset({"concat"})
#: ops that move no data at run time (a view of their input)
FREE_OPS = frozenset({"reshape"})
#: activations a main op may carry in its ``activation`` attribute (what the converter fused)
_NO_ACTIVATION = ("", "none", None)


@dataclass
class FusionRules:
    """``fuse[kernel_type]`` lists the follower kernel types a runtime runs inside a kernel of that type
    (when the follower is the only reader of the kernel's output)."""

    runtime: str
    fuse: dict[str, list[str]] = field(default_factory=dict)
    source: str = "default"  # "default" (known a priori) or "measured" (detected on the device)

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "fuse": {k: list(v) for k, v in sorted(self.fuse.items())},
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> FusionRules:
        return cls(str(d["runtime"]), {str(k): [str(x) for x in v] for k, v in dict(d.get("fuse", {})).items()},
                   str(d.get("source", "default")))

    def fuses(self, main: str, follower: str) -> bool:
        return follower in self.fuse.get(main, ())


_ELEMENTWISE_FOLLOWERS = ["add", "mul", "hard_swish", "sigmoid", "relu"]
#: rules known before measuring: XNNPACK runs each TFLite op as a kernel (the converter's fusions are in
#: the graph already); the GPU delegate links element-wise followers into convolutions (QED's
#: ``..._linked_:_add`` kernel names); LETI's engine fuses what its passes fuse (in the graph already).
DEFAULT_RULES: dict[str, FusionRules] = {
    "tflite-xnnpack": FusionRules("tflite-xnnpack"),
    "tflite-gpu": FusionRules("tflite-gpu", {t: list(_ELEMENTWISE_FOLLOWERS) for t in
                                             ("conv2d", "depthwise_conv2d", "grouped_conv2d", "dense", "add")}),
    "leti-engine-cpu": FusionRules("leti-engine-cpu"),
    "leti-engine-cuda": FusionRules("leti-engine-cuda"),
}


def rules_for(runtime: str) -> FusionRules:
    """The a-priori rules of a runtime (no fusion beyond the graph's own for one LETI does not know)."""
    known = DEFAULT_RULES.get(runtime)
    return FusionRules(runtime, dict(known.fuse)) if known else FusionRules(runtime)


#: follower kernel types that LETI's engine fuses by a graph pass, under the pass's own conditions, not by a rule:
#: an add into the convolution before it (``passes.fuse_residual_adds``: only a convolution without an activation of
#: its own, whose output the add alone reads). A measured rule ``conv2d: add`` (the detection's pair is such a
#: convolution) would fuse every add after a convolution: NB101 cells sum convolutions that end in a ReLU, and the
#: engine runs those adds as steps of their own (18 in a 16-channel NB101 network, which the split fused into their
#: convolutions and the predictor priced at nothing: those networks 10-14 % under, session 33)
ENGINE_PASS_FUSED = {"conv2d": frozenset({"add"})}


def _is_engine(runtime: str) -> bool:
    return runtime.startswith("leti-engine")


def runtime_graph(graph, runtime: str = "tflite-xnnpack"):
    """The graph after the rewrites the runtime (or the TFLite converter before it) makes."""
    from leti.engine import passes

    steps = [passes.fold_constants, passes.fold_batch_norm, passes.fuse_activations]
    if _is_engine(runtime):  # the engine's own passes (Session: its backends all take residuals)
        steps = [passes.depthwise_from_grouped, *steps, passes.merge_adds, passes.fuse_residual_adds]
    steps.append(passes.remove_dead)
    for step in steps:
        graph, _ = step(graph)
    return graph


def _hw_c(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(h, w, c) of an activation: NHWC, or a (batch, features) / (batch, seq, features) tensor."""
    s = tuple(int(x) for x in shape)
    if len(s) == 4:
        return s[1], s[2], s[3]
    if len(s) == 3:
        return 1, s[1], s[2]
    if len(s) == 2:
        return 1, 1, s[1]
    return 1, 1, int(np.prod(s)) if s else 1


def _node_row(g, node, constants: set[str]) -> dict:
    a = node.attrs
    live = [t for t in node.inputs if t not in constants]
    # a convolution reads its input 0 (a fused residual, input 3, is read too but is not its input map)
    conv = node.op in ("conv2d", "depthwise_conv2d", "grouped_conv2d")
    residual = node.op == "conv2d" and len(node.inputs) > 3
    main_in = node.inputs[0] if conv else max(live or node.inputs[:1], key=lambda t: int(np.prod(g.tensors[t].shape)))
    ih, iw, ic = _hw_c(g.tensors[main_in].shape)
    oh, ow, oc = _hw_c(g.tensors[node.outputs[0]].shape)
    kh = kw = stride = groups = 1
    op = node.op
    if conv:
        wshape = g.tensors[node.inputs[1]].shape
        kh, kw = int(wshape[0]), int(wshape[1])
        stride = int((a.get("strides") or [1])[0])
        groups = ic if op == "depthwise_conv2d" else int(a.get("groups", 1)) if op == "grouped_conv2d" else 1
    elif op in ("max_pool2d", "avg_pool2d"):
        k = a.get("kernel") or [1, 1]
        kh, kw = (int(k[0]), int(k[-1])) if isinstance(k, (list, tuple)) else (int(k), int(k))
        s = a.get("strides") or [1]
        stride = int(s[0]) if isinstance(s, (list, tuple)) else int(s)
    elif op == "mean":
        kh, kw = ih, iw
    elif op == "transpose":
        from leti.engine.ops.transpose import perm_of

        shape = tuple(int(x) for x in g.tensors[main_in].shape)
        if len(shape) == 5 and perm_of(shape, a) == [0, 1, 2, 4, 3]:
            # a channel shuffle of an (h, w, groups, c/groups) view: described on the (h, w, c) map it shuffles
            ih, iw, ic = shape[1], shape[2], shape[3] * shape[4]
            oh, ow, oc = ih, iw, ic
        # what sets its cost beyond the bytes: the length of the innermost output axis (the read stride)
        groups = int(g.tensors[node.outputs[0]].shape[-1])
    act = a.get("activation")
    fused = "" if act in _NO_ACTIVATION else ("relu" if act in ("relu", "relu6") else str(act))
    if residual:  # described as the split describes a convolution with its add fused by a rule (_emit)
        fused = "+".join(p for p in ("add", fused) if p)
    return {"kernel_type": KERNEL_OF_OP.get(op, op), "input_h": ih, "input_w": iw, "input_c": ic,
            "output_h": oh, "output_w": ow, "output_c": oc, "kernel_h": kh, "kernel_w": kw, "stride": stride,
            "groups": groups, "n_inputs": max(len(live) - int(residual), 1),
            "fused": fused,
            # what the kernel reads: every live input as it is (a broadcast operand is small, not a copy)
            "_in_el": sum(int(np.prod(g.tensors[t].shape)) for t in live) if live else ih * iw * ic,
            "_in": live, "_out": node.outputs[0], "_op": op}


def _emit(g, rules: FusionRules, rows: list[dict], owner: dict, readers: dict, row: dict) -> None:
    """Add ``row`` as a kernel, or fuse it into the kernel that wrote one of its live inputs when the runtime
    fuses the pair and the follower is that tensor's only reader. Any input, not only the first: a ResNet
    block's ``add(shortcut, conv)`` fuses into the convolution as ``add(conv, shortcut)`` does (LETI's engine
    takes the residual from either side; before this the split kept 12 of ResNet50's 16 adds as kernels of
    their own, which the engine never runs). An input after the first fuses only when it is shaped like the
    follower's output (not a squeeze-excite scale broadcast over a map)."""
    src = None
    for i, t in enumerate(row["_in"]):
        k = owner.get(t)
        if k is not None and rules.fuses(rows[k]["kernel_type"], row["kernel_type"]) \
                and readers.get(t, 0) == 1 and rows[k]["_out"] == t \
                and (i == 0 or g.tensors[t].shape == g.tensors[row["_out"]].shape):  # not a broadcast operand
            src = k
            if t != row["_in"][0]:  # the fused input first: what the kernel wrote is never read again
                row["_in"] = [t] + [u for u in row["_in"] if u != t]
            break
    if src is not None:
        main = rows[src]
        main["fused"] = "+".join(p for p in (main["fused"], row["kernel_type"], row["fused"]) if p)
        main["output_h"], main["output_w"], main["output_c"] = row["output_h"], row["output_w"], row["output_c"]
        main["_out"] = row["_out"]
        # the follower's other operands are read too; the tensor it took from the main op never is
        main["_in_el"] += row["_in_el"] - int(np.prod(g.tensors[row["_in"][0]].shape))
        owner[row["_out"]] = src
        return
    owner[row["_out"]] = len(rows)
    rows.append(row)


def _outside(rows: list[dict], nodes: list) -> list[int]:
    """1 for the kernels a node of ``nodes`` (:class:`~leti.device.coverage.FallbackNode`) runs: the kernel writes one
    of its tensors (the importer renames a repeated TFLite name ``name#i``), or, for an op the converter left apart
    from its activation (``name:pre``: the runtime graph named the pair after the activation), reads its inputs."""
    written = {t for n in nodes for t in n.outputs}
    read = {frozenset(n.inputs) for n in nodes}
    flags = []
    for r in rows:
        out = r["_out"]
        if out.endswith(":pre"):
            flags.append(int(frozenset(r["_in"]) in read))
        else:
            flags.append(int(out in written or out.split("#")[0] in written))
    return flags


def split_graph(graph, rules: FusionRules | str = "tflite-xnnpack", model: str = "model",
                precision: str = "float", device: str = "", outside: Iterable | None = None) -> pd.DataFrame:
    """The kernels ``graph`` runs as under ``rules`` (a :class:`FusionRules` or a runtime name), in
    execution order, as a LETI kernel table (no ``latency_ms``). ``outside``: the nodes the
    runtime's delegate leaves to TFLite's own kernels (:func:`leti.device.coverage.xnnpack_fallback_nodes`); given,
    the table has ``outside_delegate`` (1 on the kernels such a node runs), what the overhead prices the switches
    between the delegate's partitions by (:data:`~leti.predict.kernels.overhead.OUTSIDE`)."""
    from leti.predict.kernels.schema import BYTES_PER_ELEMENT, normalize

    if isinstance(rules, str):
        rules = rules_for(rules)
    g = runtime_graph(graph, rules.runtime)
    if _is_engine(rules.runtime):  # what the engine's passes fused is in g; no rule fuses it again
        rules = FusionRules(rules.runtime, {k: [f for f in v if f not in ENGINE_PASS_FUSED.get(k, ())]
                                            for k, v in rules.fuse.items()}, rules.source)
    constants = set(g.constants)
    rows: list[dict] = []
    owner: dict[str, int] = {}  # tensor -> row that writes it
    readers: dict[str, int] = {}
    for n in g.nodes:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    for t in g.outputs:
        readers[t] = readers.get(t, 0) + 1
    for n in g.nodes:
        if n.op in FREE_OPS:
            if n.inputs and n.inputs[0] in owner:
                owner[n.outputs[0]] = owner[n.inputs[0]]
            continue
        row = _node_row(g, n, constants)
        if rules.runtime.startswith("tflite") and row["_op"] in APART_IN_TFLITE and row["fused"]:
            # the TFLite converter leaves this activation a separate op (the engine's pass fused it)
            act = {**row, "kernel_type": row["fused"], "input_c": row["output_c"], "n_inputs": 1, "fused": "",
                   "_in": [row["_out"] + ":pre"], "_op": row["fused"],
                   "_in_el": row["output_h"] * row["output_w"] * row["output_c"]}
            row = {**row, "fused": "", "_out": row["_out"] + ":pre"}
            readers[row["_out"]] = 1
            g.tensors[row["_out"]] = g.tensors[act["_out"]]
            _emit(g, rules, rows, owner, readers, row)
            row = act
        _emit(g, rules, rows, owner, readers, row)
    if not rows:
        raise ConversionError(f"{model}: the model has no kernels to predict (only views of its input)")
    df = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    df.insert(0, "model", model)
    df.insert(1, "kernel_index", np.arange(len(df)))
    df["device"], df["runtime"], df["precision"] = device, rules.runtime, precision
    df["bytes_in"] = [float(r["_in_el"]) * BYTES_PER_ELEMENT.get(precision.lower(), 4) for r in rows]
    if outside is not None:
        df["outside_delegate"] = _outside(rows, list(outside))
    return normalize(df, model)


def delegate_outside(model, runtime: str) -> list | None:
    """The nodes the runtime's delegate leaves to TFLite's own kernels, for ``split_model``'s ``outside``: for a
    ``.tflite`` file on ``tflite-xnnpack``, :func:`~leti.device.coverage.xnnpack_fallback_nodes` (an interpreter
    loaded once, ~10 ms); None (not checked) for other runtimes and models."""
    from pathlib import Path

    if runtime != "tflite-xnnpack" or not isinstance(model, (str, Path)) or not str(model).endswith(".tflite"):
        return None
    from leti.device.coverage import xnnpack_fallback_nodes

    return xnnpack_fallback_nodes(model)


def split_model(model, rules: FusionRules | str = "tflite-xnnpack", name: str | None = None,
                device: str = "", outside: Iterable | None = None) -> pd.DataFrame:
    """:func:`split_graph` of a model given as a path (``.tflite``, ``.keras``, ``.onnx``, ``.leti``), a Keras
    model or an engine :class:`~leti.engine.graph.Graph`. Quantized models are refused by the importer."""
    from pathlib import Path

    from leti.engine.convert import load_model
    from leti.engine.graph import Graph

    if isinstance(model, Graph):
        graph, label = model, name or "model"
    else:
        graph = load_model(model)
        label = name or (Path(model).stem if isinstance(model, (str, Path)) else getattr(model, "name", "model"))
    return split_graph(graph, rules, model=label, device=device, outside=outside)
