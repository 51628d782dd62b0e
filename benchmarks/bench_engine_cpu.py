"""Engine CPU latency side by side with TFLite (XNNPACK), ONNX Runtime, MNN, OpenVINO and ncnn on the same models.

Every model is built in Keras (a NB101 cell or network from ``leti.models.keras_builder``, or a Keras
MobileNet), converted to TFLite, and the *same* ``.tflite`` is converted to the engine. The peers
that read ONNX (ONNX Runtime, OpenVINO, MNN through its ``mnnconvert`` and ncnn through ``pnnx``) get
an ONNX export of the engine's optimised graph (written by :func:`to_onnx` below: BN already folded,
activations fused, so every framework runs the same arithmetic with the same weights). The ONNX model
takes the NHWC input and transposes it itself, so layout work is inside every peer's timing (ncnn too:
``pnnx`` keeps the transposes as ``Permute`` layers; ``fp16=0`` keeps its weights FP32). All outputs are checked
against TFLite (``rel.err``, the largest over the engines) before timing.

Columns: median ms per run of each peer, of the engine (schemes chosen by pre-inference), of the engine with its
products on the AVX2 micro-kernel only (``avx2``: an ablation on a host with avx512f, where the engine's products use
AVX-512 by default; elsewhere the column is left out; ``--ablation 1panel``: the AVX-512 tiles of one 16-column panel
in place of the default two; ``--ablation kblocked``, on a host without avx512f: the AVX2 products in the k-blocked
order in place of whole-k row blocks; ``--ablation 1panel2``, without avx512f: the AVX2 tiles of one 16-column panel in
place of the default pairs of full panels; ``--ablation h12``: a last panel and a half one in one-panel and 12-row
tiles in place of the default 4 x 24; ``--ablation fixed``: every thread its fixed part of each step, no chunks
taken from a slower thread — the same as the engine at one thread),
of the engine forced to the im2col scheme (an ablation: the engine's own kernels, only the k×k stride-1
convs change scheme) and of plain NumPy (:func:`numpy_runner`: pad + window view copied into the
im2col matrix + ``np.matmul`` per conv, NumPy sums for depthwise convs and pools); ``best`` is the
fastest peer (by its median), ``x best`` = engine / best peer, ``x im2col`` and ``x numpy`` = engine / those
baselines, each the median over rounds of the two times of one round (since session 28; the ratio of the two medians
before, which kept the host's drift between rounds), ``90% int.`` a distribution-free interval of that median
(:func:`median_interval`: with 11 rounds the 3rd to the 9th of the sorted per-round ratios),
``rel.err`` the engine's largest relative error against TFLite (a peer off by more than 1e-3 is
dropped and named at the end).
The machine is shared: engines are interleaved (``--rounds`` rounds, each engine timed ``--runs``
times per round in a shuffled order, each block after a pause that lasts until no thread of the process spins, so
that no other engine's spinning workers are still on the cores (``quiesce``), and untimed runs for 30 ms, so that
this engine's threads are back up to speed (``warm``)) and the figure is the median of the round medians; the
load average is printed before and after.

    .venv/bin/python benchmarks/bench_engine_cpu.py [--networks 2] [--runs 5] [--rounds 11] [--mobilenet] [--resnet50]
        [--regnet]

The line before the last names the configurations behind beyond the rounds' scatter (interval above 1.00; the
worst ratio is the largest of many noisy medians and reads high on a shared host even at parity). The last line names
the worst case: ``engine/best-peer worst ratio: X.XX (MODEL, N threads)``.

A peer that is not installed prints ``n/a`` (the reason is printed once).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fma_peak import measure as fma_measure  # noqa: E402

from leti.engine import passes
from leti.engine.convert.from_tflite import from_tflite
from leti.engine.graph import Graph
from leti.engine.ops.conv2d import geometry
from leti.engine.ops.pool import window
from leti.engine.session import Session
from leti.spaces.nb101_network import NetworkConfig
from leti.spaces.enumeration import enumerate_space

PEERS = ("tflite", "onnxruntime", "mnn", "openvino", "ncnn")


# ---- ONNX export of an engine graph (NCHW inside, NHWC at the boundary) -------------------------
def to_onnx(g: Graph) -> bytes:
    """The engine graph as an ONNX model (opset 13) computing the same function on NHWC inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, post = [], [], []
    rank = {t: len(info.shape) for t, info in g.tensors.items()}
    shape = {t: tuple(info.shape) for t, info in g.tensors.items()}

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def act(out, a, node_name):
        """The name the op itself writes; its fused activation goes to ``post`` (appended after it)."""
        post.clear()
        if a in (None, "none"):
            return out
        pre = out + "/pre"
        if a == "relu":
            post.append(helper.make_node("Relu", [pre], [out], name=node_name + "/act"))
        elif a == "relu6":
            post.append(helper.make_node("Clip", [pre, const(pre + "/lo", np.float32(0)),
                                                  const(pre + "/hi", np.float32(6))], [out], name=node_name + "/act"))
        else:
            raise ValueError(f"to_onnx: activation {a!r}")
        return pre

    def ch_axis(ax, r):  # an NHWC axis inside the NCHW graph
        ax %= r
        return {0: 0, 1: 2, 2: 3, 3: 1}[ax] if r == 4 else ax

    inputs = []
    for t in g.inputs:
        inputs.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shape[t])))
        if rank[t] == 4:
            nodes.append(helper.make_node("Transpose", [t], [t + "/nchw"], perm=[0, 3, 1, 2]))
    name = {t: (t + "/nchw" if rank[t] == 4 else t) for t in g.inputs}
    for n in g.nodes:
        a = n.attrs
        ins = [name.get(t, t) for t in n.inputs]
        out = n.outputs[0]
        name[out] = out
        y = act(out, a.get("activation"), n.name)
        if n.op in ("conv2d", "depthwise_conv2d", "grouped_conv2d"):
            w = g.constants[n.inputs[1]]
            x_shape = shape[n.inputs[0]]
            pads, _, strides, dil = geometry(x_shape, w.shape, a)
            if n.op != "depthwise_conv2d":  # (kh, kw, c_in/groups, c_out) -> OIHW
                wo, group = w.transpose(3, 2, 0, 1), int(a.get("groups", 1))
            else:
                wo, group = w.transpose(2, 0, 1)[:, None], x_shape[3]
            cin = [ins[0], const(n.name + "/w_oihw", wo.astype(np.float32))]
            if len(n.inputs) > 2:
                cin.append(n.inputs[2])
            nodes.append(helper.make_node("Conv", cin, [y], name=n.name, strides=list(strides), dilations=list(dil),
                                          pads=[pads[0], pads[2], pads[1], pads[3]], group=group,
                                          kernel_shape=list(w.shape[:2])))
        elif n.op in ("max_pool2d", "avg_pool2d"):
            k, s, pads, _ = window(shape[n.inputs[0]], a)
            kw = {"kernel_shape": list(k), "strides": list(s), "pads": [pads[0], pads[2], pads[1], pads[3]]}
            if n.op == "avg_pool2d":
                kw["count_include_pad"] = 0
            nodes.append(helper.make_node("MaxPool" if n.op == "max_pool2d" else "AveragePool", ins[:1], [y],
                                          name=n.name, **kw))
        elif n.op in ("add", "mul", "add_n"):
            op = {"add": "Add", "mul": "Mul", "add_n": "Sum"}[n.op]
            nodes.append(helper.make_node(op, ins, [y], name=n.name))
        elif n.op == "concat":
            nodes.append(helper.make_node("Concat", ins, [y], name=n.name,
                                          axis=ch_axis(int(a.get("axis", -1)), rank[out])))
        elif n.op == "slice":
            from leti.engine.ops.slice import bounds

            b = bounds(shape[n.inputs[0]], a)
            r = rank[out]
            axes = [ch_axis(i, r) for i in range(r)]
            nodes.append(helper.make_node("Slice", [ins[0], const(n.name + "/s", np.array([lo for lo, _ in b])),
                                                    const(n.name + "/e", np.array([hi for _, hi in b])),
                                                    const(n.name + "/a", np.array(axes))], [y], name=n.name))
        elif n.op == "mean":
            r = rank[n.inputs[0]]
            axes = sorted(ch_axis(int(x), r) for x in a.get("axes", [1, 2]))
            nodes.append(helper.make_node("ReduceMean", ins[:1], [y], name=n.name, axes=axes,
                                          keepdims=int(bool(a.get("keepdims", False)))))
        elif n.op == "fully_connected":
            nodes.append(helper.make_node("Gemm", ins, [y], name=n.name))
        elif n.op == "softmax":
            nodes.append(helper.make_node("Softmax", ins[:1], [y], name=n.name, axis=-1))
        elif n.op in ("relu", "relu6"):
            if n.op == "relu":
                nodes.append(helper.make_node("Relu", ins[:1], [y], name=n.name))
            else:
                nodes.append(helper.make_node("Clip", [ins[0], const(n.name + "/lo", np.float32(0)),
                                                       const(n.name + "/hi", np.float32(6))], [y], name=n.name))
        elif n.op == "pad":
            p = a["pads"]
            r = rank[out]
            order = [0, 3, 1, 2] if r == 4 else list(range(r))
            pp = [p[i][0] for i in order] + [p[i][1] for i in order]
            nodes.append(helper.make_node("Pad", [ins[0], const(n.name + "/p", np.array(pp, np.int64)),
                                                  const(n.name + "/v", np.float32(a.get("value", 0.0)))], [y],
                                          name=n.name))
        elif n.op == "reshape" and rank[n.inputs[0]] != 4 and rank[out] != 4:
            nodes.append(helper.make_node("Reshape", [ins[0], const(n.name + "/shape",
                                                                    np.array(shape[out], np.int64))], [y], name=n.name))
        else:
            raise ValueError(f"to_onnx: op {n.op} not exported")
        nodes.extend(post)
    used = {t for n in g.nodes for i, t in enumerate(n.inputs)
            if t in g.constants and (i >= 2 or n.op in ("add", "mul", "add_n", "concat", "fully_connected"))}
    for t in sorted(used):
        inits.append(numpy_helper.from_array(np.asarray(g.constants[t], np.float32), t))
    outputs = []
    for t in g.outputs:
        if rank[t] == 4:
            nodes.append(helper.make_node("Transpose", [t], [t + "/nhwc"], perm=[0, 2, 3, 1]))
            outputs.append(helper.make_tensor_value_info(t + "/nhwc", TensorProto.FLOAT, list(shape[t])))
        else:
            outputs.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shape[t])))
    model = helper.make_model(helper.make_graph(nodes, "leti", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 13)], producer_name="leti-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


# ---- runners: each returns (run, output) callables ------------------------------------------------
def tflite_runner(data: bytes, x: np.ndarray, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data, num_threads=threads)
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    it.set_tensor(inp["index"], x)
    return it.invoke, lambda: it.get_tensor(out["index"])


def ort_runner(onnx_path: str, x: np.ndarray, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    res = {}

    def run():
        res["y"] = sess.run(None, {iname: x})[0]

    return run, lambda: res["y"]


def openvino_runner(onnx_path: str, x: np.ndarray, threads: int):
    import openvino as ov

    core = ov.Core()
    cm = core.compile_model(onnx_path, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                               "INFERENCE_PRECISION_HINT": "f32"})
    req = cm.create_infer_request()
    req.set_input_tensor(ov.Tensor(x))

    def run():
        req.infer()

    return run, lambda: np.array(req.get_output_tensor(0).data)


def mnn_runner(mnn_path: str, x: np.ndarray, threads: int):
    import MNN

    it = MNN.Interpreter(mnn_path)
    sess = it.createSession({"numThread": threads, "backend": "CPU", "precision": "high"})
    inp = it.getSessionInput(sess)
    # the ONNX model declares the NHWC input literally: hand MNN the array in the input's own dimension type
    host = MNN.Tensor(x.shape, MNN.Halide_Type_Float, x, inp.getDimensionType())
    out = it.getSessionOutput(sess)

    def run():
        inp.copyFrom(host)
        it.runSession(sess)

    def output():
        shp = out.getShape()
        o = MNN.Tensor(shp, MNN.Halide_Type_Float, np.zeros(shp, np.float32), out.getDimensionType())
        out.copyToHostTensor(o)
        return np.array(o.getNumpyData(), copy=True).reshape(shp)

    return run, output


def ncnn_runner(param_path: str, x: np.ndarray, threads: int):
    import ncnn

    net = ncnn.Net()
    opt = net.opt  # options must be set before the model is loaded
    opt.num_threads = threads
    opt.lightmode = True  # free intermediate blobs as soon as they are consumed (ncnn's default)
    opt.use_packing_layout = True  # SIMD-packed channels (elempack 4/8/16)
    opt.use_vulkan_compute = False
    # FP32 end to end like every other column: no half/bfloat16 storage or arithmetic (on by default)
    opt.use_fp16_storage = opt.use_fp16_packed = opt.use_fp16_arithmetic = False
    opt.use_bf16_storage = opt.use_bf16_packed = False
    if net.load_param(param_path) != 0 or net.load_model(str(Path(param_path).with_suffix(".bin"))) != 0:
        raise RuntimeError(f"ncnn cannot load {param_path}")
    iname, oname = net.input_names()[0], net.output_names()[0]
    # the batch axis is ncnn's implicit one: (1, H, W, C) -> a 3-D Mat, which the model's Permute turns to NCHW
    mat = ncnn.Mat(x, batch_index=0)
    res = {}

    def run():
        ex = net.create_extractor()  # an extractor is single-use: one per inference
        ex.input(iname, mat)
        rc, res["y"] = ex.extract(oname)
        if rc != 0:
            raise RuntimeError(f"ncnn extract returned {rc}")

    return run, lambda: np.array(res["y"].numpy(batch_index=0), copy=True)


def engine_runner(g: Graph, x: np.ndarray, threads: int, **options):
    s = Session(g, backends=("cpu",), threads=threads, **options).resize()
    s._feed(x)
    s.run(copy=False)
    return (lambda: s.run(copy=False)), (lambda: next(iter(s.run(x).values()))), s


def avx512_available() -> bool:
    """Whether the engine's products run AVX-512 here (the CPU has it and ``LETI_AVX512=0`` did not turn it off)."""
    from leti.engine.backends.cpu import ckernels

    return ckernels.set_avx512(None)


#: the ablations ``--ablation`` times as the extra engine column: (what the column shows, the ckernels switch, the
#: value that turns the engine's default off for the run, whether it applies on a host with AVX-512 / without)
ABLATIONS = {"avx2": ("AVX2 products only", "set_avx512", False, (True, False)),
             "1panel": ("one-panel AVX-512 products", "set_pair512", False, (True, False)),
             "kblocked": ("k-blocked AVX2 products", "set_full_k", False, (False, True)),
             "fixed": ("each thread its fixed part of every step (no stolen chunks)", "set_steal_chunks", 1, (True, True)),
             "1panel2": ("one-panel AVX2 tiles", "set_pair_panels", False, (False, True)),
             "h12": ("12-row half-panel AVX2 tiles", "set_wide_tail", False, (False, True))}


def ablation_runner(g: Graph, x: np.ndarray, threads: int, switch: str = "set_avx512", off=False):
    """The engine with one of its kernels' defaults turned off around each run only (``csrc/gemm.c``,
    ``csrc/program.c``): ``set_avx512``, the AVX2 micro-kernel where the CPU has AVX-512; ``set_pair512``, the AVX-512
    tiles of one 16-column panel instead of two; ``set_full_k``, the k-blocked order of the AVX2 products instead of
    whole-k row blocks; ``set_steal_chunks`` at 1, every thread its fixed part of each step; ``set_pair_panels``, the
    AVX2 tiles of one 16-column panel instead of two; ``set_wide_tail``, 12-row half-panel tiles instead of 4 x 24."""
    from leti.engine.backends.cpu import ckernels

    run, out, s = engine_runner(g, x, threads)
    flip = getattr(ckernels, switch)

    def turned_off(fn):
        def call():
            default = flip(None)
            flip(off)
            try:
                return fn()
            finally:
                flip(default)
        return call

    return turned_off(run), turned_off(out), s


def numpy_runner(g: Graph, x: np.ndarray, threads: int):
    """The plain NumPy baseline: every conv is ``np.pad`` + a strided window view copied into the
    im2col matrix + one ``np.matmul`` (BLAS with ``threads`` threads), depthwise convs a NumPy sum
    over the taps, pools a max/mean over a window view; the other ops run their reference code."""
    from numpy.lib.stride_tricks import sliding_window_view as windows

    from leti.engine import ops

    def act(y, a):
        if a == "relu":
            np.maximum(y, 0, out=y)
        elif a == "relu6":
            np.clip(y, 0, 6, out=y)
        return y

    def patches(xv, k, strides, dil, pads, out_hw, value=0.0):
        (kh, kw), (sh, sw), (dh, dw), (oh, ow) = k, strides, dil, out_hw
        if any(pads):
            xv = np.pad(xv, ((0, 0), (pads[0], pads[1]), (pads[2], pads[3]), (0, 0)), constant_values=value)
        v = windows(xv, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(1, 2))
        return v[:, :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw, :, ::dh, ::dw]  # (n, oh, ow, c, kh, kw)

    steps = []
    for n in g.nodes:
        a = dict(n.attrs)
        an = a.get("activation")
        if n.op == "conv2d":
            w = g.constants[n.inputs[1]]
            b = g.constants[n.inputs[2]] if len(n.inputs) > 2 else 0.0
            x_shape = g.tensors[n.inputs[0]].shape
            pads, hw, st, dl = geometry(x_shape, w.shape, a)
            w2 = np.ascontiguousarray(w.transpose(2, 0, 1, 3).reshape(-1, w.shape[3]), np.float32)

            def f(xv, w2=w2, b=b, k=w.shape[:2], pads=pads, hw=hw, st=st, dl=dl, act_=an):
                p = patches(xv, k, st, dl, pads, hw)
                col = p.reshape(-1, w2.shape[0]) if p.flags.c_contiguous else np.ascontiguousarray(p).reshape(
                    p.shape[0] * hw[0] * hw[1], -1)
                y = col @ w2
                y += b
                return act(y, act_).reshape(p.shape[0], hw[0], hw[1], -1)
        elif n.op == "depthwise_conv2d":
            w = g.constants[n.inputs[1]]
            b = g.constants[n.inputs[2]] if len(n.inputs) > 2 else 0.0
            pads, hw, st, dl = geometry(g.tensors[n.inputs[0]].shape, w.shape, a)
            mult = int(a.get("multiplier", 1))

            def f(xv, w=w, b=b, pads=pads, hw=hw, st=st, dl=dl, mult=mult, act_=an):
                p = patches(np.repeat(xv, mult, axis=3) if mult > 1 else xv, w.shape[:2], st, dl, pads, hw)
                y = np.zeros(p.shape[:4], np.float32) + b
                for i in range(w.shape[0]):
                    for j in range(w.shape[1]):
                        y += p[..., i, j] * w[i, j]
                return act(y, act_)
        elif n.op in ("max_pool2d", "avg_pool2d"):
            k, st, pads, hw = window(g.tensors[n.inputs[0]].shape, a)
            if n.op == "max_pool2d":
                def f(xv, k=k, st=st, pads=pads, hw=hw, act_=an):
                    return act(patches(xv, k, st, (1, 1), pads, hw, -np.inf).max(axis=(4, 5)), act_)
            else:
                def f(xv, k=k, st=st, pads=pads, hw=hw, act_=an):
                    total = patches(xv, k, st, (1, 1), pads, hw).sum(axis=(4, 5))
                    ones = np.ones(xv.shape[:3] + (1,), np.float32)
                    return act(total / patches(ones, k, st, (1, 1), pads, hw).sum(axis=(4, 5)), act_)
        else:
            ref = ops.get(n.op).reference

            def f(*xs, ref=ref, a=a):
                return ref(list(xs), a)[0].astype(np.float32, copy=False)
        steps.append((f, list(n.inputs), n.outputs[0], n.op in ("conv2d", "depthwise_conv2d",
                                                                   "max_pool2d", "avg_pool2d")))
    env = dict(g.constants)
    inp, out = g.inputs[0], g.outputs[0]

    def run():
        env[inp] = x
        for f, ins, o, single in steps:
            env[o] = f(env[ins[0]]) if single else f(*(env[t] for t in ins))

    return run, lambda: env[out]


# ---- models -----------------------------------------------------------------------------------------
def models(n_networks: int, mobilenet: bool, size: int = 224, nb101: bool = True, resnet: bool = False,
           regnet: bool = False):
    import keras

    from leti.models.keras_builder import cell_model, network_model, randomize_weights
    from leti.models.tflite import convert_keras

    if nb101:
        space = enumerate_space()
        cells = [space.sample(n_networks + 1, seed=1).cell(i) for i in range(n_networks + 1)]
        for c in cells[:n_networks]:
            m = randomize_weights(network_model(c, NetworkConfig()), seed=0)
            yield f"nb101 net 32x32 {c.hash[:8]}", convert_keras(m)
            keras.backend.clear_session()
        c = cells[-1]
        m = randomize_weights(cell_model(c, (96, 96, 128), 128), seed=0)
        yield f"nb101 cell 96x96x128 {c.hash[:8]}", convert_keras(m)
        keras.backend.clear_session()
    nets = ((f"mobilenet_v1 {size}", keras.applications.MobileNet),
            (f"mobilenet_v2 {size}", keras.applications.MobileNetV2)) if mobilenet else ()
    if resnet:
        nets += ((f"resnet50 {size}", keras.applications.ResNet50),)
    for name, ctor in nets:
        # the stock top reshapes with a run-time SHAPE op; the same head as GAP + Dense + softmax
        base = ctor(input_shape=(size, size, 3), weights=None, include_top=False, pooling="avg")
        out = keras.layers.Dense(1000, activation="softmax")(base.output)
        m = randomize_weights(keras.Model(base.input, out), seed=0)
        yield name, convert_keras(m)
        keras.backend.clear_session()
    if regnet:  # RegNetX-200MF (the zoo's builder): 3x3 convolutions over groups of 8 channels
        from leti.models.zoo import CLASSES, REGNETS
        from leti.models.zoo_blocks import build_keras_net

        depths, widths, gw, se = REGNETS["x002"]
        params = {"depths": depths, "widths": widths, "group_width": gw, "se": se, "classes": CLASSES}
        m = randomize_weights(build_keras_net("regnet", params, size, "regnetx_002"), seed=0)
        yield f"regnetx_002 {size}", convert_keras(m)
        keras.backend.clear_session()


def ncnn_pads_as_padding(ncnn_param: Path, pnnx_param: Path) -> int:
    """pnnx passes an ONNX ``Pad`` (ResNet50's zero padding before its stem and its max-pool) to the ncnn graph as a
    ``Pad`` layer, which ncnn does not have ("layer Pad not exists or registered": ResNet50 ran without ncnn until
    session 48). Rewrite each as ncnn's ``Padding`` (0 top, 1 bottom, 2 left, 3 right, 4 type 0 = constant, 5 value)
    from the pads pnnx recorded for it (ONNX order: N, C, H, W begins, then ends). Returns how many were rewritten."""
    import re

    pads = {}
    for line in pnnx_param.read_text().splitlines():
        f = line.split()
        m = re.search(r"pads=\(([-\d,]+)\)", line)
        if len(f) > 1 and f[0] == "Pad" and m:
            v = [int(x) for x in m.group(1).split(",")]
            value = re.search(r"value=([-\d.e+]+)", line)
            pads[f[1]] = (v, float(value.group(1)) if value else 0.0)
    lines, done = ncnn_param.read_text().splitlines(), 0
    for i, line in enumerate(lines):
        f = line.split()
        if len(f) > 4 and f[0] == "Pad" and f[1] in pads:
            v, value = pads[f[1]]
            if len(v) != 8 or v[0] or v[1] or v[4] or v[5]:
                raise RuntimeError(f"ncnn: cannot express pads {v} of {f[1]} (only H and W)")
            n_in, n_out = int(f[2]), int(f[3])
            blobs = f[4:4 + n_in + n_out]
            lines[i] = " ".join(["Padding", f[1], str(n_in), str(n_out), *blobs,
                                 f"0={v[2]}", f"1={v[6]}", f"2={v[3]}", f"3={v[7]}", "4=0", f"5={value:g}"])
            done += 1
    if done:
        ncnn_param.write_text("\n".join(lines) + "\n")
    return done


def peer_files(g_opt: Graph, tmp: Path, tag: str, errors: dict) -> dict[str, str]:
    files = {}
    try:
        p = tmp / f"{tag}.onnx"
        p.write_bytes(to_onnx(g_opt))
        files["onnx"] = str(p)
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        errors.setdefault("onnx export", f"{type(e).__name__}: {e}")
        return files
    try:
        mnn = tmp / f"{tag}.mnn"
        exe = Path(os.sys.executable).with_name("mnnconvert")
        r = subprocess.run([str(exe), "-f", "ONNX", "--modelFile", files["onnx"], "--MNNModel", str(mnn),
                            "--bizCode", "leti"], capture_output=True, text=True, timeout=300, check=False)
        if not mnn.exists():
            raise RuntimeError(r.stdout[-300:] + r.stderr[-300:])
        files["mnn"] = str(mnn)
    except Exception as e:  # noqa: BLE001
        errors.setdefault("mnn convert", f"{type(e).__name__}: {e}")
    try:
        # pnnx (the ``pnnx`` wheel ships the converter binary beside its package; no torch import needed):
        # ONNX -> ncnn .param/.bin, weights kept in FP32 (its default fp16=1 would halve them)
        import importlib.util

        spec = importlib.util.find_spec("pnnx")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'pnnx'")
        exe = Path(next(iter(spec.submodule_search_locations))) / "pnnx"
        shapes = ",".join("[" + ",".join(str(d if d and d > 0 else 1) for d in g_opt.tensors[t].shape) + "]"
                          for t in g_opt.inputs)
        out = {k: str(tmp / f"{tag}{suffix}") for k, suffix in (
            ("ncnnparam", ".ncnn.param"), ("ncnnbin", ".ncnn.bin"), ("ncnnpy", "_ncnn.py"),
            ("pnnxparam", ".pnnx.param"), ("pnnxbin", ".pnnx.bin"), ("pnnxpy", "_pnnx.py"),
            ("pnnxonnx", ".pnnx.onnx"))}
        r = subprocess.run([str(exe), files["onnx"], f"inputshape={shapes}", "fp16=0",
                            *(f"{k}={v}" for k, v in out.items())],
                           capture_output=True, text=True, timeout=300, check=False, cwd=tmp)
        if r.returncode != 0 or not Path(out["ncnnbin"]).exists():
            raise RuntimeError(f"pnnx exit {r.returncode}: " + r.stdout[-300:] + r.stderr[-300:])
        ncnn_pads_as_padding(Path(out["ncnnparam"]), Path(out["pnnxparam"]))
        files["ncnn"] = out["ncnnparam"]
    except Exception as e:  # noqa: BLE001
        errors.setdefault("ncnn convert", f"{type(e).__name__}: {e}")
    return files


def make_runners(data, g, g_opt, files, x, threads, errors, ablation="avx2"):
    runners = {}

    def add(key, factory, *args):
        try:
            r = factory(*args)
            runners[key] = r[:2]
        except Exception as e:  # noqa: BLE001
            errors.setdefault(key, f"{type(e).__name__}: {e}")

    add("tflite", tflite_runner, data, x, threads)
    if "onnx" in files:
        add("onnxruntime", ort_runner, files["onnx"], x, threads)
        add("openvino", openvino_runner, files["onnx"], x, threads)
    if "mnn" in files:
        add("mnn", mnn_runner, files["mnn"], x, threads)
    if "ncnn" in files:
        add("ncnn", ncnn_runner, files["ncnn"], x, threads)
    add("engine", engine_runner, g, x, threads)
    _, switch, off, applies = ABLATIONS[ablation]
    if applies[0 if avx512_available() else 1]:  # the AVX-512 switches need it; whole-k products run on AVX2
        add(ablation, lambda *a: ablation_runner(*a, switch=switch, off=off), g, x, threads)
    add("im2col", lambda *a: engine_runner(*a, conv_scheme="im2col"), g, x, threads)
    add("numpy", numpy_runner, g_opt, x, threads)
    # BLAS threads: the engine keeps BLAS at one thread inside its own pool (its C kernels use none), the NumPy
    # baseline uses BLAS's threads and sets them back to one after each run, so that only the baseline pays the
    # ctypes calls (~0.05 ms a run; until session 28 every engine column paid them too); the peers use no OpenBLAS.
    from threadpoolctl import ThreadpoolController

    blas = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    for c in blas:
        c.set_num_threads(1)

    def with_blas(fn, n):
        def run():
            for c in blas:
                c.set_num_threads(n)
            try:
                fn()
            finally:
                for c in blas:
                    c.set_num_threads(1)
        return run

    if "numpy" in runners:
        runners["numpy"] = (with_blas(runners["numpy"][0], threads), runners["numpy"][1])
    return runners


#: Pause before each block of timed runs (see :func:`time_interleaved`).
PAUSE_S = 0.05
#: Untimed runs after the pause: WARM_RUNS at least, and until WARM_S seconds have passed. Why: on this VM the first
#: runs after a pause are slow, and not every runtime's alike: TFLite's MobileNet v2 at two threads took 2.46, 2.04,
#: 1.99, 1.87 and 1.94 ms in the five runs after the 50 ms pause and one untimed run (the protocol until session 33),
#: the engine's 2.25-2.01 (medians over 20 blocks, ``benchmarks/results/bench_warmup_session33.txt``, run 2).
WARM_RUNS, WARM_S = 3, 0.03


#: A window of QUIET_WINDOW_S in which this process's threads used under QUIET_CPU_S of CPU ends the pause
#: (:func:`quiesce`)
QUIET_WINDOW_S, QUIET_CPU_S, MAX_PAUSE_S = 0.01, 0.0005, 2.0


def quiesce() -> float:
    """Sleep :data:`PAUSE_S`, then on until no thread of this process spins: a window of :data:`QUIET_WINDOW_S` in
    which the process used under :data:`QUIET_CPU_S` of CPU (:data:`MAX_PAUSE_S` at most). Returns the seconds slept.
    Why: a runtime's workers spin for work after its runs, some for longer than any fixed pause (OpenBLAS's threads
    after the NumPy baseline: the pause ends ~120 ms after it, 60 ms after the others), and on 2 cores a spinning
    worker takes a core from the runtime timed next: after the NumPy baseline and the 50 ms pause alone, TFLite's
    MobileNet v2 at two threads took 4.28 ms and the engine's 3.46, after it and ``quiesce`` 1.59 and 2.08
    (``benchmarks/results/bench_warmup_session33.txt``)."""
    t0 = time.perf_counter()
    time.sleep(PAUSE_S)
    while time.perf_counter() - t0 < MAX_PAUSE_S:
        c0 = time.process_time()
        time.sleep(QUIET_WINDOW_S)
        if time.process_time() - c0 < QUIET_CPU_S:
            break
    return time.perf_counter() - t0


def warm(fn) -> None:
    """Run ``fn`` untimed :data:`WARM_RUNS` times and on until :data:`WARM_S` seconds have passed (the paired
    protocol's warm-up, ``leti.device.protocol.warm_up``, at the bench's lengths)."""
    from leti.device.protocol import warm_up

    warm_up(fn, time.perf_counter_ns, ms=1e3 * WARM_S, runs=WARM_RUNS)


def time_interleaved(runners: dict, runs: int, rounds: int, warmup: int = 2) -> tuple[dict[str, float], dict]:
    for fn, _ in runners.values():
        for _ in range(warmup):
            fn()
    per = {k: [] for k in runners}
    keys = list(runners)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(keys)
        for k in keys:
            fn = runners[k][0]
            # the previous engine's worker threads may still be spinning for work (ONNX Runtime's and OpenBLAS's
            # do for milliseconds); on 2 cores they would take a core from this block: let them sleep first,
            # then untimed runs for WARM_S (WARM_RUNS at least) bring this engine's weights back into the cache and
            # its threads (and this VM's second vCPU) back up to speed
            quiesce()
            warm(fn)
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            per[k].append(np.median(ts))
    return {k: float(np.median(v) * 1e3) for k, v in per.items()}, per


def paired_ratio(per: dict, a: str, b: str) -> float:
    """The median over rounds of a's time over b's in the same round: the host's drift between rounds (this VM's
    speed moves by up to 1.5x within minutes) cancels, where a ratio of the two overall medians keeps it."""
    return float(np.median(np.array(per[a]) / np.array(per[b])))


def median_interval(values, level: float = 0.90) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values`` (order statistics: the j-th smallest and largest,
    with j the largest rank whose binomial tail stays within (1 - level) / 2): how far a paired ratio's median could
    sit from the host's true ratio given how the rounds scattered. With 11 rounds it is the 3rd to the 9th of the
    sorted ratios (93.5 % coverage); under 5 rounds it is their whole range."""
    v = np.sort(np.asarray(values, dtype=float))
    n = len(v)
    tail, j = 0.0, 0
    while True:
        tail += math.comb(n, j) / 2 ** n
        if tail > (1 - level) / 2 or j + 1 > n // 2:
            break
        j += 1
    j = max(j, 1)
    return float(v[j - 1]), float(v[n - j])


def fma_peak() -> str:
    """One core's FMA peak now (``bench_fma_peak.py``, three short repeats): the VM's clock, which moves by several percent
    within minutes, beside the ratios it scales."""
    try:
        return f"{fma_measure(3, 5_000_000)[1]:.0f} GFLOP/s"
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        return f"n/a ({e})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", type=int, default=2)
    # many short blocks rather than a few long ones: this host's speed drifts over seconds, and every engine
    # should sample the same drift (5 x 10 until session 12)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per engine per round")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds (the figure is their median)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mobilenet", action="store_true", help="also MobileNet v1/v2 (slow to convert)")
    ap.add_argument("--mobilenet-size", type=int, default=224)
    ap.add_argument("--only-mobilenet", action="store_true", help="skip the NB101 models")
    ap.add_argument("--no-nb101", action="store_true", help="skip the NB101 models (e.g. with --regnet alone)")
    ap.add_argument("--resnet50", action="store_true", help="also ResNet50 (slow to convert)")
    ap.add_argument("--regnet", action="store_true", help="also RegNetX-200MF (grouped convolutions)")
    ap.add_argument("--ablation", choices=sorted(ABLATIONS), default="avx2",
                    help="the extra engine column: where the CPU has AVX-512, avx2 (products on the AVX2 kernel) or "
                         "1panel (AVX-512 tiles of one 16-column panel); without it, kblocked (k-blocked AVX2 "
                         "products), 1panel2 (AVX2 tiles of one panel) or h12 (12-row half-panel tiles); fixed (no "
                         "stolen chunks) on both")
    args = ap.parse_args()
    from leti.engine.backends.cpu import blas

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; engine GEMMs: {blas.name()}")
    print(f"one core's FMA peak before: {fma_peak()}", flush=True)
    errors: dict[str, str] = {}
    ablation = args.ablation
    cols = list(PEERS) + ["engine", ablation, "im2col", "numpy"]
    hdr = (f"{'model':28s} {'thr':>3s} " + " ".join(f"{c[:8]:>8s}" for c in cols)
           + f" {'best':>8s} {'x best':>6s} {'90% int.':>9s} {'x im2col':>8s} {'x numpy':>7s}  rel.err")
    rows, worst, worst_ablation, intervals = [], [], [], []
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        for mi, (name, data) in enumerate(models(args.networks, args.mobilenet or args.only_mobilenet,
                                                        args.mobilenet_size,
                                                        not (args.only_mobilenet or args.no_nb101),
                                                        args.resnet50, args.regnet)):
            g = from_tflite(data)
            g_opt, _ = passes.optimize(g)
            files = peer_files(g_opt, tmp, f"m{mi}", errors)
            for threads in args.threads:
                shape = Session(g, backends=("cpu",)).contexts()[0].in_shapes[0]
                x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                runners = make_runners(data, g, g_opt, files, x, threads, errors, ablation)
                runners["tflite"][0]()
                ref = runners["tflite"][1]().copy()
                err = {}
                for k, (fn, out) in runners.items():
                    fn()
                    y = out()
                    err[k] = float(np.abs(y.reshape(ref.shape) - ref).max() / max(np.abs(ref).max(), 1e-12))
                bad = [k for k, e in err.items() if e > 1e-3]
                for k in bad:
                    errors.setdefault(f"{k} on {name}", f"output differs from TFLite (rel. err {err[k]:.1e}); dropped")
                    runners.pop(k)
                t, per = time_interleaved(runners, args.runs, args.rounds)
                peers = {k: t[k] for k in PEERS if k in t}
                if not peers or "engine" not in t:
                    print(f"{name}: no peer or no engine ran: {errors}")
                    continue
                best = min(peers, key=peers.get)
                cells = " ".join(f"{t[c]:8.2f}" if c in t else f"{'n/a':>8s}" for c in cols)
                x_best = paired_ratio(per, "engine", best)
                lo, hi = median_interval(np.array(per["engine"]) / np.array(per[best]))
                line = (f"{name:28s} {threads:3d} {cells} {best[:8]:>8s} {x_best:6.2f} {lo:4.2f}-{hi:4.2f} "
                        f"{paired_ratio(per, 'engine', 'im2col'):8.2f} {paired_ratio(per, 'engine', 'numpy'):7.2f}  "
                        f"{max(err[k] for k in ('engine', ablation, 'im2col') if k in err):.1e}")
                rows.append(line)
                worst.append((x_best, name, threads))
                intervals.append((lo, hi, name.strip(), threads))
                if ablation in t:
                    worst_ablation.append((paired_ratio(per, ablation, best), name, threads))
                print(line if len(rows) > 1 else hdr + "\n" + line, flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}; one core's FMA peak after: {fma_peak()}")
    for k, v in errors.items():
        print(f"n/a {k}: {v}")
    if worst_ablation:
        ratio, name, threads = max(worst_ablation)
        print(f"engine with {ABLATIONS[ablation][0]}/best-peer worst ratio: {ratio:.2f} ({name.strip()}, {threads} "
              "threads)")
    if intervals:
        # the worst ratio is the largest of many noisy medians, biased upward on a shared host: say which
        # configurations are behind beyond the rounds' scatter (their whole interval above 1.00)
        behind = [f"{n} ({t} threads, {lo:.2f}-{hi:.2f})" for lo, hi, n, t in intervals if lo > 1.0]
        print(f"engine/best-peer behind beyond the rounds' scatter (90% interval of the paired median above 1.00): "
              f"{', '.join(behind) or 'none'}")
    if worst:
        ratio, name, threads = max(worst)
        print(f"engine/best-peer worst ratio: {ratio:.2f} ({name.strip()}, {threads} threads)")


if __name__ == "__main__":
    main()
