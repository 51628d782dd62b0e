import numpy as np

from leti.spaces.cell import Cell
from leti.spaces.costs import cell_costs, network_costs
from leti.spaces.nb101_network import NetworkConfig
from leti.spaces.search_space import NB101Space


def _cells(naslib):
    return [Cell([list(r) for r in m], list(o)) for m, o in zip(naslib.matrix, naslib.ops)]


def test_vectorised_network_costs_equal_costs_py(naslib):
    cells = _cells(naslib)[:80]
    t = NB101Space().table(cells)
    for i, c in enumerate(cells):
        ref = network_costs(c)
        assert (t.flops[i], t.params[i], t.peak_memory[i]) == (ref.flops, ref.params, ref.peak_memory_bytes)


def test_params_of_all_500_naslib_cells(naslib):
    t = NB101Space().table(_cells(naslib))
    np.testing.assert_array_equal(t.params, naslib.trainable_parameters.to_numpy())


def test_other_configs_and_cell_scope(nb101_space):
    space = nb101_space.sample(40, seed=3)
    cells = list(space)
    cfg = NetworkConfig(input_size=96, stem_channels=16, num_stacks=2, modules_per_stack=2)
    t = NB101Space(cfg).table(space)  # the columnar fast path
    t_cell = NB101Space(scope="cell", cell_input=(16, 16, 32)).table(cells)
    for i, c in enumerate(cells):
        ref = network_costs(c, cfg)
        assert (t.flops[i], t.params[i], t.peak_memory[i]) == (ref.flops, ref.params, ref.peak_memory_bytes)
        ref = cell_costs(c, (16, 16, 32))
        assert (t_cell.flops[i], t_cell.params[i], t_cell.peak_memory[i]) == (ref.flops, ref.params,
                                                                              ref.peak_memory_bytes)


def test_space_fast_path_equals_cell_path(nb101_space):
    space = nb101_space.sample(50, seed=4)
    a, b = NB101Space().table(space), NB101Space().table(list(space))
    for name in ("adjacency", "ops", "flops", "params", "peak_memory", "node_flops"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # per-vertex FLOPs cover the modules; what is left (stem, downsampling, classifier) is the same for all
    rest = a.flops - a.node_flops.sum(axis=1)
    assert np.ptp(rest) == 0 and rest[0] > 0


def test_one_module_per_stack_and_more_stacks(nb101_space):
    space = nb101_space.sample(30, seed=5)
    cfg = NetworkConfig(input_size=40, input_channels=1, stem_channels=8, num_stacks=4, modules_per_stack=1,
                        num_classes=7)
    t = NB101Space(cfg).table(space)
    for i, c in enumerate(space):
        ref = network_costs(c, cfg)
        assert (t.flops[i], t.params[i], t.peak_memory[i]) == (ref.flops, ref.params, ref.peak_memory_bytes)
