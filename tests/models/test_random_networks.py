"""The random calibration networks of a kernel build (issue 16): deterministic JSON-able descriptions in their
multiply-accumulate ranges, every block kind drawn, and a network built, converted and split into kernels whose
convolutions and classifier carry exactly the MACs the shape count gives."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from leti.models import random_networks as rn


def test_descriptions_are_deterministic_in_range_and_cover_every_block():
    params = [rn.network_params(s) for s in range(60)]
    assert json.dumps(params, sort_keys=True) == json.dumps([rn.network_params(s) for s in range(60)], sort_keys=True)
    assert params[0] != params[1]
    macs = [rn.network_macs(p) for p in params]
    small = [m for m in macs if m < rn.SMALL_RANGE[1]]
    assert all(rn.SMALL_RANGE[0] <= m <= rn.MACS_RANGE[1] for m in macs)
    assert 5 <= len(small) <= 35  # about SMALL_SHARE of them tenths of a millisecond
    assert {s["block"] for p in params for s in p["stages"]} == set(rn.BLOCKS)
    assert {p["act"] for p in params} == set(rn.ACTIVATIONS)
    assert any(s.get("se") for p in params for s in p["stages"])
    assert any(s.get("groups_width") for p in params for s in p["stages"])


def test_a_network_converts_and_splits_into_the_kernels_it_counts():
    from leti.engine.convert.from_tflite import from_tflite
    from leti.models.keras_import import keras_to_tflite
    from leti.predict.kernels.split import rules_for, split_graph

    # a small one with a shuffle unit, a grouped bottleneck and squeeze-excite
    seed = next(s for s in range(400) if rn.network_macs(p := rn.network_params(s)) < 4e6
                and {"shuffle", "bottleneck"} <= {st["block"] for st in p["stages"]}
                and any(st.get("se") for st in p["stages"]))
    p = rn.network_params(seed)
    rows = split_graph(from_tflite(keras_to_tflite(rn.keras_network(p))), rules_for("tflite-xnnpack"),
                       model="net", device="local")
    counted = rows[rows.kernel_type.isin(["conv2d", "depthwise_conv2d", "grouped_conv2d", "dense"])]
    assert counted.flops.sum() / 2 == rn.network_macs(p)
    assert {"conv2d", "depthwise_conv2d", "concat", "mean", "dense", "mul"} <= set(rows.kernel_type)
    assert rows.input_h.iloc[0] == p["input"] and rows.output_c.iloc[-1] == p["classes"]


def test_cells_and_nasnet_blocks_hold_what_xnnpack_leaves_out_and_the_split_marks_it():
    from leti.device.coverage import xnnpack_fallback_nodes
    from leti.engine.convert.from_tflite import from_tflite
    from leti.models.keras_import import keras_to_tflite
    from leti.predict.kernels.split import rules_for, split_graph

    seed = next(s for s in range(2000) if rn.network_macs(p := rn.network_params(s)) < 2e7
                and {"cell", "nasnet"} <= {st["block"] for st in p["stages"]})
    p = rn.network_params(seed)
    data = keras_to_tflite(rn.keras_network(p))
    nodes = xnnpack_fallback_nodes(data)
    assert {n.op for n in nodes} >= {"SPLIT_V", "CONCATENATION"}  # uneven truncations; six-input concatenations
    rows = split_graph(from_tflite(data), rules_for("tflite-xnnpack"), model="net", device="local", outside=nodes)
    assert rows.outside_delegate.sum() == len(nodes)  # each node left out is one kernel, marked
    marked = rows[rows.outside_delegate == 1]
    assert set(marked.kernel_type) <= {"slice", "concat", "avg_pool"}
    assert (marked[marked.kernel_type == "concat"].n_inputs == 6).all()
    counted = rows[rows.kernel_type.isin(["conv2d", "depthwise_conv2d", "grouped_conv2d", "dense"])]
    assert counted.flops.sum() / 2 == rn.network_macs(p)
    # without the delegate's nodes the split has no such column (not checked: not "none outside")
    assert "outside_delegate" not in split_graph(from_tflite(data), rules_for("tflite-xnnpack"), model="net")
