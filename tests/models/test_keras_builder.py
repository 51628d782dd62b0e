"""Keras models of cells and networks: layer mapping, parameter counts against costs.py and the
published NB101 counts, the GPU-compatible rewrites, bad inputs."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

import keras

from leti.errors import ConversionError
from leti.spaces.cell import Cell
from leti.spaces.costs import cell_costs, network_costs
from leti.models.keras_builder import (
    BN_EPSILON,
    BN_MOMENTUM,
    ChannelSlice,
    ChannelSplit,
    build_keras,
    cell_model,
    network_model,
    randomize_weights,
    trainable_params,
)
from leti.spaces.layer_graph import Layer, LayerGraph
from leti.spaces.nb101_network import NetworkConfig, cell_graph

# The three NB101 specs of shared/golden/nb101.json with their published trainable parameter counts
# (nasbench README / NNI / NASLib; google-research/nasbench issue 23): (hash, matrix, ops, params).
GOLDEN_SPECS = [
    ("00005c142e6f48ac74fdcf73e3439874",
     [[0, 1, 0, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 1], [0, 0, 0, 0, 0, 1, 0],
      [0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0]],
     ["input", "conv3x3-bn-relu", "maxpool3x3", "conv3x3-bn-relu", "conv3x3-bn-relu", "conv1x1-bn-relu", "output"],
     8_555_530),
    ("28cfc7874f6d200472e1a9dcd8650aa0",
     [[0, 1, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0, 0],
      [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0]],
     ["input", "conv1x1-bn-relu", "conv3x3-bn-relu", "conv3x3-bn-relu", "conv3x3-bn-relu", "maxpool3x3", "output"],
     2_694_282),
    ("02e5a0247bbdcf2860b7e96f74961594",
     [[0, 1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0],
      [0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0]],
     ["input", "conv1x1-bn-relu", "conv3x3-bn-relu", "maxpool3x3", "conv3x3-bn-relu", "conv3x3-bn-relu", "output"],
     32_426_634),
]
# A cell whose module truncates a 4-channel vertex to 3 channels and sums 3 tensors (10 out channels).
TRUNC_CELL = Cell(
    [[0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 0, 1], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1],
     [0, 0, 0, 0, 0, 0]],
    ["input", "conv1x1-bn-relu", "maxpool3x3", "conv1x1-bn-relu", "conv3x3-bn-relu", "output"],
)
SMALL_NET = NetworkConfig(input_size=8, input_channels=3, stem_channels=8, num_stacks=2, modules_per_stack=2,
                          num_classes=5)


@pytest.fixture(autouse=True)
def _clear():
    yield
    keras.backend.clear_session(free_memory=False)


def _golden_cells():
    out = []
    for h, matrix, ops, params in GOLDEN_SPECS:
        cell = Cell(matrix, ops)
        assert cell.hash == h
        out.append((cell, params))
    return out


def test_network_params_match_published_and_costs():
    for cell, published in _golden_cells():
        model = network_model(cell)
        assert trainable_params(model) == published == network_costs(cell).params
        assert tuple(model.output.shape) == (1, 10)
        keras.backend.clear_session(free_memory=False)


def test_gpu_compatible_network_keeps_trainable_params():
    cell, published = _golden_cells()[0]
    for truncation in ("split", "conv"):
        model = network_model(cell, gpu_compatible=True, truncation=truncation)
        assert trainable_params(model) == published


@pytest.mark.parametrize("gpu_compatible", [False, True])
def test_random_cells_params_match_costs(gpu_compatible, nb101_space):
    cells = list(nb101_space.sample(12, seed=7))
    for cell in cells:
        m = cell_model(cell, (8, 8, 6), 10, gpu_compatible=gpu_compatible)
        assert trainable_params(m) == cell_costs(cell, (8, 8, 6), 10).params, cell.to_json()
        assert tuple(m.output.shape) == (1, 8, 8, 10)
    for cell in cells[:4]:
        m = network_model(cell, SMALL_NET, gpu_compatible=gpu_compatible)
        assert trainable_params(m) == network_costs(cell, SMALL_NET).params, cell.to_json()
        assert tuple(m.output.shape) == (1, 5)


def test_layers_map_one_to_one():
    graph = cell_graph(TRUNC_CELL, (8, 8, 6), 10)
    model = build_keras(graph)
    kinds = [lay.kind for lay in graph.layers]
    convs = [lay for lay in model.layers if isinstance(lay, keras.layers.Conv2D)]
    bns = [lay for lay in model.layers if isinstance(lay, keras.layers.BatchNormalization)]
    assert len(convs) == kinds.count("conv") == len(bns)
    assert all(not c.use_bias and c.padding == "same" for c in convs)
    assert all(bn.momentum == BN_MOMENTUM and bn.epsilon == BN_EPSILON for bn in bns)
    pools = [lay for lay in model.layers if isinstance(lay, keras.layers.MaxPooling2D)]
    assert len(pools) == kinds.count("maxpool") and all(p.padding == "same" for p in pools)
    slices = [lay for lay in model.layers if isinstance(lay, ChannelSlice)]
    assert len(slices) == kinds.count("truncate") == 1 and slices[0].keep == 3
    adds = [lay for lay in model.layers if isinstance(lay, keras.layers.Add)]
    assert sorted(len(a.input) for a in adds) == sorted(len(lay.inputs) for lay in graph.layers if lay.kind == "add")
    assert max(len(a.input) for a in adds) == 3  # faithful: one Add of three tensors


def test_gpu_compatible_rewrites():
    graph = cell_graph(TRUNC_CELL, (8, 8, 6), 10)
    model = build_keras(graph, gpu_compatible=True)
    adds = [lay for lay in model.layers if isinstance(lay, keras.layers.Add)]
    assert adds and all(len(a.input) == 2 for a in adds)
    n_add_inputs = sum(len(lay.inputs) - 1 for lay in graph.layers if lay.kind == "add")
    assert len(adds) == n_add_inputs  # a chain of n-1 two-input adds per n-way sum
    assert not any(isinstance(lay, ChannelSlice) for lay in model.layers)
    assert sum(isinstance(lay, ChannelSplit) for lay in model.layers) == 1
    conv_model = build_keras(graph, gpu_compatible=True, truncation="conv")
    select = [lay for lay in conv_model.layers if lay.name.endswith("_select")]
    assert len(select) == 1 and not select[0].trainable
    kernel = select[0].get_weights()[0]
    assert kernel.shape == (1, 1, 4, 3) and np.array_equal(kernel[0, 0], np.eye(4, 3))


def test_variants_compute_the_same_function():
    graph = cell_graph(TRUNC_CELL, (8, 8, 6), 10)
    ref = randomize_weights(build_keras(graph), seed=3)
    x = np.random.default_rng(0).normal(size=(1, 8, 8, 6)).astype("float32")
    want = keras.ops.convert_to_numpy(ref(x, training=False))
    for truncation in ("split", "conv", "slice"):
        other = build_keras(graph, gpu_compatible=True, truncation=truncation)
        for layer in ref.layers:
            if layer.weights:
                other.get_layer(layer.name).set_weights(layer.get_weights())
        got = keras.ops.convert_to_numpy(other(x, training=False))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # randomize_weights really sets non-trivial batch-norm statistics
    bn = next(lay for lay in ref.layers if isinstance(lay, keras.layers.BatchNormalization))
    mean, var = bn.moving_mean.numpy(), bn.moving_variance.numpy()
    assert np.abs(mean).max() > 0.01 and np.abs(var - 1).max() > 0.01


def test_two_vertex_cell_is_a_projection():
    cell = Cell([[0, 1], [0, 0]], ["input", "output"])
    model = cell_model(cell, (4, 4, 3), 5)
    assert [type(lay).__name__ for lay in model.layers] == ["InputLayer", "Conv2D", "BatchNormalization", "ReLU"]
    assert trainable_params(model) == cell_costs(cell, (4, 4, 3), 5).params == 3 * 5 + 2 * 5


def test_bad_graphs_and_options():
    graph = LayerGraph()
    graph.add(Layer("input", "input", (), (4, 4, 3)))
    graph.add(Layer("weird", "softmax", ("input",), (4, 4, 3)))
    graph.output = "weird"
    with pytest.raises(ConversionError, match="has kind 'softmax'"):
        build_keras(graph)
    with pytest.raises(ConversionError, match="unknown truncation 'gather'"):
        build_keras(cell_graph(TRUNC_CELL, (8, 8, 6), 10), truncation="gather")
    graph2 = LayerGraph()
    graph2.add(Layer("input", "input", (), (4, 4, 3)))
    graph2.output = "missing"
    with pytest.raises(ConversionError, match="output 'missing'"):
        build_keras(graph2)
