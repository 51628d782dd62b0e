"""The CPU backend against the reference, scheme by scheme, and the session's planning."""

import numpy as np
import pytest

from leti.engine import format as fmt
from leti.engine.backends.base import Backend
from leti.engine.backends.cpu import CPUBackend
from leti.engine.convert.from_cell import from_cell, write_leti
from leti.engine.graph import Graph
from leti.engine.reference import run_reference
from leti.engine.session import Session
from leti.errors import ConversionError
from leti.spaces.nb101_network import NetworkConfig
from tests.engine.conftest import RICH, rel_err

TOL = 1e-4


def _single(op, x_shape, consts, out_shape=None, **attrs):
    g = Graph()
    g.add_tensor("x", x_shape)
    g.inputs = ["x"]
    names = [g.add_constant(f"c{i}", c) for i, c in enumerate(consts)]
    from leti.engine import ops

    shape = out_shape or ops.get(op).infer([x_shape] + [c.shape for c in consts], attrs)[0]
    g.add_tensor("y", shape)
    g.add_node(op, ["x", *names], ["y"], **attrs)
    g.outputs = ["y"]
    return g


def _check(g, rng, **opts):
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    s = Session(g, backends=("cpu",), **opts).resize()
    y = s.run({"x": x})["y"]
    assert rel_err(y, run_reference(g, {"x": x})["y"]) < TOL
    return s


@pytest.mark.parametrize("k, stride, dil, padding, scheme", [
    (1, 1, 1, "valid", "gemm"), (1, 1, 1, "same", "strassen"), (3, 1, 1, "same", "winograd"),
    (3, 1, 1, "same", "im2col"), (5, 1, 1, [2, 1, 0, 2], "winograd"), (3, 2, 1, "same", None),
    (3, 1, 2, "same", None), (1, 2, 1, "valid", None), (2, 1, 1, "same", "winograd"), (7, 2, 1, "same", None)])
@pytest.mark.parametrize("act", ["none", "relu6"])
def test_conv_schemes_match_reference(rng, k, stride, dil, padding, scheme, act):
    ic, oc = (32, 32) if scheme == "strassen" else (8, 12)  # Strassen must pay by MNN's inequality
    w = rng.standard_normal((k, k, ic, oc)).astype(np.float32) * 0.3
    b = rng.standard_normal(oc).astype(np.float32)
    g = _single("conv2d", (1, 12, 10, ic), [w, b], strides=[stride] * 2, dilations=[dil] * 2, padding=padding,
                activation=act)
    s = _check(g, rng, conv_scheme=scheme)
    used = s.steps[0].scheme.name
    assert used == (scheme or "im2col")


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_every_winograd_tile_matches_reference(rng, n):
    w = rng.standard_normal((3, 3, 16, 16)).astype(np.float32) * 0.2
    g = _single("conv2d", (2, 13, 11, 16), [w], padding="same")
    s = _check(g, rng, conv_scheme="winograd", winograd_max_tile=n)
    assert s.steps[0].scheme.params["n"] >= 2


@pytest.mark.parametrize("residual", [False, True])
def test_winograd_in_blocks_of_tiles_matches_reference(rng, monkeypatch, residual):
    """Two images of 13×11 pixels at F(2×2): 84 tiles, run as 3 passes of 28 tiles (the last image's tiles split
    across passes), and the scratch planned for one block only."""
    from leti.engine.backends.cpu import conv

    monkeypatch.setattr(conv, "WINOGRAD_BLOCK_MIN", 8)
    monkeypatch.setattr(conv, "WINOGRAD_BLOCK_BYTES", 30 * 16 * (16 + 24) * 4)  # α² = 16: 30 tiles fit
    assert conv.winograd_block(84, 4, 16, 24) == 28
    w = rng.standard_normal((3, 3, 16, 24)).astype(np.float32) * 0.2
    b = rng.standard_normal(24).astype(np.float32)
    g = _single("conv2d", (2, 13, 11, 16), [w, b], padding="same", activation="relu")
    if residual:  # a shortcut added after the convolution: applied once, after every pass
        g.add_tensor("r", (2, 13, 11, 24))
        g.inputs.append("r")
        g.add_tensor("z", (2, 13, 11, 24))
        g.add_node("add", ["y", "r"], ["z"])
        g.outputs = ["z"]
        feeds = {"x": rng.standard_normal((2, 13, 11, 16)).astype(np.float32),
                 "r": rng.standard_normal((2, 13, 11, 24)).astype(np.float32)}
        s = Session(g, backends=("cpu",), conv_scheme="winograd", winograd_max_tile=2).resize()
        assert rel_err(s.run(feeds)["z"], run_reference(g, feeds)["z"]) < TOL
    else:
        s = _check(g, rng, conv_scheme="winograd", winograd_max_tile=2)
    step = next(st for st in s.steps if st.op == "conv2d")
    assert step.scheme.name == "winograd" and step.scheme.params["n"] == 2
    assert sum(v.nbytes for v in step.scratch_views) == 28 * 16 * (16 + 24) * 4


def test_other_ops_on_cpu(rng):
    _check(_single("depthwise_conv2d", (1, 9, 9, 6), [rng.standard_normal((3, 3, 12)).astype(np.float32)],
                   multiplier=2, strides=[2, 2], padding="same", activation="relu"), rng)
    _check(_single("max_pool2d", (1, 9, 8, 5), [], kernel=[3, 3], strides=[2, 2], padding="same"), rng)
    _check(_single("avg_pool2d", (1, 9, 8, 5), [], kernel=[3, 3], strides=[1, 1], padding="same"), rng)
    _check(_single("fully_connected", (2, 7), [rng.standard_normal((7, 3)).astype(np.float32),
                                               rng.standard_normal(3).astype(np.float32)], activation="relu"), rng)
    _check(_single("mean", (1, 4, 5, 6), [], axes=[1, 2]), rng)
    _check(_single("pad", (1, 4, 5, 6), [], pads=[[0, 0], [1, 2], [2, 1], [0, 0]]), rng)
    _check(_single("softmax", (3, 10), [], beta=1.5), rng)
    _check(_single("reshape", (1, 2, 3, 4), [], shape=[1, -1]), rng)
    _check(_single("add", (1, 3, 3, 4), [rng.standard_normal(4).astype(np.float32)], activation="relu"), rng)
    _check(_single("slice", (1, 3, 3, 8), [], begin=[0, 0, 0, 0], size=[-1, -1, -1, 5]), rng)
    _check(_single("batch_norm", (1, 3, 3, 4), [(rng.random(4) + 0.5).astype(np.float32) for _ in range(4)]), rng)
    for seqs in (True, False):
        h = 6
        _check(_single("lstm", (2, 5, 3), [rng.standard_normal((3, 4 * h)).astype(np.float32) * 0.5,
                                           rng.standard_normal((h, 4 * h)).astype(np.float32) * 0.5,
                                           rng.standard_normal(4 * h).astype(np.float32)],
                       return_sequences=seqs), rng)


def test_nb101_network_end_to_end(tmp_path, rng):
    cfg = NetworkConfig(input_size=16, stem_channels=16, num_stacks=2, modules_per_stack=2, num_classes=10)
    path = write_leti(RICH, tmp_path / "net.leti", kind="network", config=cfg)
    g = fmt.load(path)
    x = rng.standard_normal((1, 16, 16, 3)).astype(np.float32)
    ref = run_reference(g, {"input": x})["dense"]
    s = Session(path, threads=1).resize()
    out = s.run(x)["dense"]
    assert rel_err(out, ref) < TOL
    out2 = s.run(x)["dense"]  # runs are repeatable: no state leaks through the arena
    np.testing.assert_array_equal(out, out2)
    info = s.describe()
    assert info["backends"] == ["cpu"] and "batch_norm" not in info["ops"]
    mem = info["memory"]["host"]
    assert mem["lower_bound_bytes"] <= mem["arena_bytes"] < mem["naive_bytes"]
    assert mem["inplace"] > 0
    rows = s.profile(x, runs=2)
    assert len(rows) == len(s.steps) and all(r["ms"] >= 0 for r in rows)


def test_declined_ops_fall_back_to_the_next_backend(rng):
    g = Graph()  # conv whose weights are an input: the CPU backend declines it
    g.add_tensor("x", (1, 5, 5, 2))
    g.add_tensor("w", (3, 3, 2, 3))
    g.add_tensor("y", (1, 5, 5, 3))
    g.inputs, g.outputs = ["x", "w"], ["y"]
    g.add_node("conv2d", ["x", "w"], ["y"], padding="same")
    feeds = {"x": rng.standard_normal((1, 5, 5, 2)).astype(np.float32),
             "w": rng.standard_normal((3, 3, 2, 3)).astype(np.float32)}
    s = Session(g, backends=("cpu", "reference")).resize()
    assert s.steps[0].backend.name == "reference"
    assert rel_err(s.run(feeds)["y"], run_reference(g, feeds)["y"]) < TOL
    with pytest.raises(ConversionError, match="no backend can run node 'y'.*tried cpu"):
        Session(g, backends=("cpu",)).resize()


class OtherDomainBackend(CPUBackend):
    """Test double: the CPU kernels, but claiming a separate memory domain so the session must
    plan a second arena and insert copies (what a CUDA backend will need)."""

    name = "cpu-other-domain"
    memory_domain = "other"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.copies = 0

    def create_execution(self, ctx):
        return super().create_execution(ctx) if ctx.node.op == "max_pool2d" else None

    def copy_in(self, src, src_backend, dst):
        self.copies += 1
        super().copy_in(src, src_backend, dst)


def test_cross_domain_copies(rng):
    g = from_cell(RICH, input_shape=(6, 6, 8))
    other = OtherDomainBackend()
    s = Session(g, backends=(other, "cpu")).resize()
    x = rng.standard_normal((1, 6, 6, 8)).astype(np.float32)
    out = s.run(x)[g.outputs[0]]
    assert rel_err(out, run_reference(g, {"input": x})[g.outputs[0]]) < TOL
    assert set(s.memory) == {"host", "other"} and other.copies >= 2
    assert any(st.op == "copy" for st in s.steps)


def test_input_errors(rng):
    g = from_cell(RICH, input_shape=(6, 6, 8))
    s = Session(g).resize()
    with pytest.raises(ConversionError, match="resized for"):
        s.run(np.zeros((1, 7, 6, 8), np.float32))
    with pytest.raises(ConversionError, match="missing input"):
        s.run({"other": np.zeros(3)})
    with pytest.raises(ConversionError, match="unknown input"):
        s.resize({"nope": (1, 2)})
    # resize to a new input shape re-plans everything
    s.resize({"input": (1, 10, 10, 8)})
    x = rng.standard_normal((1, 10, 10, 8)).astype(np.float32)
    assert rel_err(s.run(x)[g.outputs[0]], run_reference(g, {"input": x})[g.outputs[0]]) < TOL
    with pytest.raises(ConversionError, match="unknown backend 'tpu'"):
        Session(g, backends=("tpu",))
    assert isinstance(s.backends[0], Backend)


def test_inputs_survive_a_run(rng):
    g = _single("relu", (1, 4, 4, 3), [])
    s = Session(g, backends=("cpu",)).resize()
    x = rng.standard_normal((1, 4, 4, 3)).astype(np.float32)
    first = s.run({"x": x})["y"]
    np.testing.assert_array_equal(s.run()["y"], first)  # no feeds: the last inputs are reused
