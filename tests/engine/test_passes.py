import numpy as np
import pytest

from leti.engine import passes
from leti.engine.convert.from_cell import from_cell
from leti.engine.graph import Graph
from leti.engine.reference import run_reference
from tests.engine.conftest import RICH, rel_err


def _chain_graph(rng):
    g = Graph()
    g.add_tensor("x", (1, 5, 5, 3))
    g.inputs = ["x"]
    w = g.add_constant("w", rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
    g.add_tensor("c", (1, 5, 5, 4))
    g.add_node("conv2d", ["x", w], ["c"], padding="same")
    bn = [g.add_constant(f"bn{i}", (rng.random(4) + 0.5).astype(np.float32)) for i in range(4)]
    g.add_tensor("b", (1, 5, 5, 4))
    g.add_node("batch_norm", ["c", *bn], ["b"], epsilon=1e-3)
    g.add_tensor("r", (1, 5, 5, 4))
    g.add_node("relu", ["b"], ["r"])
    for name, ins in (("s1", ["r", "r"]), ("s2", ["s1", "r"]), ("s3", ["s2", "r"])):
        g.add_tensor(name, (1, 5, 5, 4))
        g.add_node("add", ins, [name])
    # dead branch and a constant sub-expression
    g.add_tensor("dead", (1, 5, 5, 4))
    g.add_node("relu6", ["r"], ["dead"])
    k1 = g.add_constant("k1", np.full(4, 2.0, np.float32))
    k2 = g.add_constant("k2", np.full(4, 3.0, np.float32))
    g.add_tensor("k", (4,))
    g.add_node("mul", [k1, k2], ["k"])
    g.add_tensor("y", (1, 5, 5, 4))
    g.add_node("mul", ["s3", "k"], ["y"])
    g.outputs = ["y"]
    return g


def test_pipeline_rewrites_and_preserves_results(rng):
    g = _chain_graph(rng)
    x = rng.standard_normal((1, 5, 5, 3)).astype(np.float32)
    before = run_reference(g, {"x": x})["y"]
    opt, report = passes.optimize(g)
    assert report == {"depthwise_from_grouped": 0, "fold_constants": 1, "fold_batch_norm": 1, "fuse_activations": 1,
                      "merge_adds": 2, "remove_dead": 1}
    assert [n.op for n in opt.nodes] == ["conv2d", "add_n", "mul"]
    conv = opt.nodes[0]
    assert conv.attrs["activation"] == "relu" and len(conv.inputs) == 3  # folded bias
    assert opt.nodes[1].inputs == ["r"] * 4
    assert "dead" not in opt.tensors and "k1" not in opt.constants
    assert rel_err(run_reference(opt, {"x": x})["y"], before) < 1e-5
    assert len(g.nodes) == 9  # the input graph is untouched


def test_no_fusion_when_the_intermediate_has_another_reader(rng):
    g = _chain_graph(rng)
    g.outputs = ["y", "c"]  # conv output is now observable: BN cannot be folded into it
    opt, report = passes.optimize(g)
    assert report["fold_batch_norm"] == 0
    assert "c" in opt.tensors


def test_nb101_cell_folds_every_bn():
    g = from_cell(RICH, input_shape=(8, 8, 16))
    opt, report = passes.optimize(g)
    assert report["fold_batch_norm"] == report["fuse_activations"] == g.op_histogram()["conv2d"]
    assert "batch_norm" not in opt.op_histogram() and "relu" not in opt.op_histogram()


def test_inplace_candidates(rng):
    g = _chain_graph(rng)
    opt, _ = passes.optimize(g)
    cand = passes.inplace_candidates(opt)
    n = next(n for n in opt.nodes if n.outputs == ["s3"])
    assert n.op == "add_n" and n.inputs.count("r") > 1
    assert "s3" not in cand  # its first input read again: written in place, the later terms would read partial sums
    assert "r" not in cand  # conv is not element-wise
    g2 = Graph()
    for t in ("a", "b", "y"):
        g2.add_tensor(t, (1, 4, 4, 8))
    g2.inputs, g2.outputs = ["a", "b"], ["y"]
    g2.add_node("add_n", ["a", "b"], ["y"], name="s")
    assert passes.inplace_candidates(g2) == {"s": (0,)}  # distinct inputs: the first one's buffer may be reused


def _residual_block(rng, conv_act="none", bias=True, extra_reader=False, k=1):
    """x → conv(1×1, relu) = s → conv(k×k) = c → add(x, c, relu) = y: a ResNet block's shortcut."""
    g = Graph()
    g.add_tensor("x", (1, 12, 12, 40))
    g.inputs = ["x"]
    w0 = g.add_constant("w0", rng.standard_normal((1, 1, 40, 40)).astype(np.float32) * 0.2)
    g.add_tensor("s", (1, 12, 12, 40))
    g.add_node("conv2d", ["x", w0], ["s"], activation="relu")
    ins = ["s", g.add_constant("w", rng.standard_normal((k, k, 40, 40)).astype(np.float32) * 0.2)]
    if bias:
        ins.append(g.add_constant("b", rng.standard_normal(40).astype(np.float32)))
    g.add_tensor("c", (1, 12, 12, 40))
    g.add_node("conv2d", ins, ["c"], padding="same", activation=conv_act)
    g.add_tensor("y", (1, 12, 12, 40))
    g.add_node("add", ["x", "c"], ["y"], activation="relu")
    g.outputs = ["y"]
    if extra_reader:
        g.add_tensor("z", (1, 12, 12, 40))
        g.add_node("relu", ["c"], ["z"])
        g.outputs.append("z")
    return g


def test_fuse_residual_adds_moves_the_shortcut_into_the_conv(rng):
    x = rng.standard_normal((1, 12, 12, 40)).astype(np.float32)
    for bias in (True, False):
        g = _residual_block(rng, bias=bias)
        f, count = passes.fuse_residual_adds(g)
        assert count == 1 and [n.op for n in f.nodes] == ["conv2d", "conv2d"]
        conv = f.nodes[1]
        assert conv.inputs[3] == "x" and conv.outputs == ["y"] and conv.attrs["activation"] == "relu"
        assert len(g.nodes) == 3 and "c" not in f.tensors  # the source graph untouched, the sum gone
        if not bias:
            np.testing.assert_array_equal(f.constants[conv.inputs[2]], 0)
        assert rel_err(run_reference(f, {"x": x})["y"], run_reference(g, {"x": x})["y"]) < 1e-6


def test_fuse_residual_adds_leaves_what_it_cannot_fuse(rng):
    for g in (_residual_block(rng, conv_act="relu"),       # the conv's own activation comes before the sum
              _residual_block(rng, extra_reader=True)):    # someone else reads the conv's output
        f, count = passes.fuse_residual_adds(g)
        assert count == 0 and [n.op for n in f.nodes] == [n.op for n in g.nodes]


@pytest.mark.parametrize("mult", [1, 2])
def test_a_grouped_convolution_with_one_channel_a_group_runs_as_depthwise(rng, mult):
    from leti.engine.session import Session

    g = Graph()
    g.add_tensor("x", (1, 9, 9, 6))
    g.inputs = ["x"]
    g.add_constant("w", rng.standard_normal((7, 7, 1, 6 * mult)).astype(np.float32))
    g.add_constant("b", rng.standard_normal(6 * mult).astype(np.float32))
    g.add_tensor("y", (1, 9, 9, 6 * mult))
    g.add_node("grouped_conv2d", ["x", "w", "b"], ["y"], groups=6, padding="same", activation="relu")
    g.outputs = ["y"]
    x = rng.standard_normal((1, 9, 9, 6)).astype(np.float32)
    opt, n = passes.depthwise_from_grouped(g)
    assert n == 1 and opt.nodes[0].op == "depthwise_conv2d" and "groups" not in opt.nodes[0].attrs
    assert int(opt.nodes[0].attrs.get("multiplier", 1)) == mult and opt.constants[opt.nodes[0].inputs[1]].shape == (7, 7, 6 * mult)
    ref = run_reference(g, {"x": x})["y"]
    np.testing.assert_allclose(run_reference(opt, {"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    s = Session(g, backends=("cpu",)).resize()
    assert [st.op for st in s.steps] == ["depthwise_conv2d"]
    np.testing.assert_allclose(s.run(x)["y"], ref, rtol=1e-4, atol=1e-4)
    # two channels a group stay a grouped convolution
    g.constants["w"] = rng.standard_normal((7, 7, 2, 6 * mult)).astype(np.float32)
    g.nodes[0].attrs["groups"] = 3
    assert passes.depthwise_from_grouped(g)[1] == 0


def test_graph_copy_is_structural_and_shares_only_the_constant_arrays():
    g = Graph()
    g.add_tensor("x", (1, 4, 4, 2))
    w = g.add_constant("w", np.ones((1, 1, 2, 3), np.float32))
    g.add_tensor("y", (1, 4, 4, 3))
    g.add_node("conv2d", ["x", w], ["y"], strides=[1, 1], padding="same", extra={"pads": [[0, 1], (2, 3)]})
    g.inputs, g.outputs, g.metadata = ["x"], ["y"], {"source": "t", "notes": [1]}
    c = g.copy()
    assert c.nodes == g.nodes and c.tensors == g.tensors and c.inputs == g.inputs and c.metadata == g.metadata
    # nothing a pass may edit is shared: nodes, their lists and nested attrs, tensor infos, metadata
    c.nodes[0].attrs["extra"]["pads"][0].append(9)
    c.nodes[0].attrs["strides"][0] = 2
    c.nodes[0].inputs.append("z")
    c.tensors["y"].shape = (1, 2, 2, 3)
    c.metadata["notes"].append(2)
    c.inputs.append("w")
    assert g.nodes[0].attrs == {"strides": [1, 1], "padding": "same", "extra": {"pads": [[0, 1], (2, 3)]}}
    assert g.nodes[0].inputs == ["x", "w"] and g.tensors["y"].shape == (1, 4, 4, 3)
    assert g.metadata == {"source": "t", "notes": [1]} and g.inputs == ["x"]
    # the constant arrays are the same objects (never modified in place), the dict holding them is not
    assert c.constants["w"] is g.constants["w"]
    c.constants["v"] = np.zeros(1)
    assert "v" not in g.constants
