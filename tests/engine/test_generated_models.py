"""Every model ``leti generate --format tflite`` can write converts to the engine, runs, and matches TFLite.

Property-style: 200 NB101 cells drawn (seeded) from the whole space, 40 alone at each of five channel counts (odd ones
make the channel truncation a ``SPLIT_V`` in the GPU-compatible default model, even ones a plain
projection); of each 40 the fewest (greedily) whose layer graphs hold every kind of layer the 40 hold (kind,
kernel, stride, BN/ReLU/bias, channels, and the kinds and channels of its inputs: about half; the Keras/TFLite
export is most of the time), plus two small stacked networks; all exported in one process with the real Keras/TFLite
converter, then converted and checked with :func:`leti.engine.tools.check_against_tflite` (reference op by
op and engine CPU outputs against the interpreter). The issue's own command line is replayed through the CLI.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from typer.testing import CliRunner

from leti.cli import app
from leti.engine import format as fmt
from leti.engine.convert.from_tflite import from_tflite
from leti.engine.tools import check_against_tflite
from leti.models.export import export_models
from leti.spaces.nb101_network import NetworkConfig
from leti.spaces.spec import ModelSpec

pytest.importorskip("tensorflow")

TOLERANCE = 1e-4
CHANNELS = (7, 13, 16, 21, 32)  # 7, 13, 21: uneven channel splits among the vertices; 16, 32: the CLI's kind
PER_CHANNEL_COUNT = 40


def _layer_kinds(graph) -> set:
    """Each layer as the converter sees it: kind, attributes, channels, and the kinds and channels of its inputs."""
    by = {lay.name: lay for lay in graph.layers}
    return {(lay.kind, lay.kernel, lay.stride, lay.bn, lay.relu, lay.bias, lay.shape[-1],
             tuple(sorted((by[i].kind, by[i].shape[-1]) for i in lay.inputs))) for lay in graph.layers}


def _covering(cells, spec) -> list:
    """The fewest cells (greedy set cover, in sample order on ties) holding every layer kind the sample holds."""
    kinds = [_layer_kinds(spec.graph(c)) for c in cells]
    left, chosen = set().union(*kinds), []
    while left:
        i = max(range(len(cells)), key=lambda i: (len(kinds[i] & left), -i))
        chosen.append(i)
        left -= kinds[i]
    assert set().union(*(kinds[i] for i in chosen)) == set().union(*kinds)
    return [cells[i] for i in sorted(chosen)]


def _check_all(records) -> collections.Counter:
    ops: collections.Counter = collections.Counter()
    for r in records:
        path = Path(r["paths"]["tflite"])
        ops.update(r["ops"])
        g = from_tflite(path)  # converts ...
        assert [n.op for n in fmt.load(fmt.save(g, path.with_suffix(".leti"))).nodes] == [n.op for n in g.nodes]
        check_against_tflite(path).verify(TOLERANCE)  # ... and runs like TFLite
    return ops


@pytest.mark.parametrize("channels", CHANNELS)  # one test each, so ``-n 2`` spreads the 200 cells
def test_sampled_cells_of_varied_channels_convert_run_and_match_tflite(tmp_path, channels, nb101_space):
    cells = list(nb101_space.sample(PER_CHANNEL_COUNT, seed=100 + channels))
    spec = ModelSpec("cell", (6, 6, channels), channels)
    cells = _covering(cells, spec)
    assert len(cells) < PER_CHANNEL_COUNT
    records = export_models(cells, tmp_path, spec, formats=("tflite",), jobs=1)
    assert len(records) == len(cells) and not any(r.get("error") for r in records)
    ops = _check_all(records)
    # the sample really exercised the truncation rewrite and every cell op
    assert ops["SPLIT_V"] > 0 and {"CONV_2D", "MAX_POOL_2D", "CONCATENATION", "ADD"} <= set(ops)


def test_stacked_networks_convert_run_and_match_tflite(tmp_path, nb101_space):
    cells = list(nb101_space.sample(2, seed=7))
    config = NetworkConfig(input_size=8, stem_channels=11, num_stacks=2, modules_per_stack=1, num_classes=5)
    records = export_models(cells, tmp_path, ModelSpec("network", config=config), formats=("tflite",), jobs=1)
    ops = _check_all(records)
    assert ops["FULLY_CONNECTED"] == 2 and ops["SPLIT_V"] > 0


def test_the_issue_command_line_generates_converts_and_checks(tmp_path):
    """``leti generate --sample 1 --seed 3 --cell --channels 32 --format tflite`` (the issue's line) used to write a model that
    ``leti engine convert`` refused ("TFLite op SPLIT_V is not supported")."""
    runner = CliRunner()
    r = runner.invoke(app, ["generate", "--sample", "1", "--seed", "3", "--cell", "--channels", "32",
                            "--format", "tflite", "--out", str(tmp_path / "g")])
    assert r.exit_code == 0, r.output
    (model,) = (tmp_path / "g" / "tflite").glob("*.tflite")
    out = tmp_path / "m.leti"
    r = runner.invoke(app, ["engine", "convert", str(model), "-o", str(out)])
    assert r.exit_code == 0 and "wrote" in r.output, r.output
    assert "slice" in {n.op for n in fmt.load(out).nodes}  # the SPLIT_V became slices
    r = runner.invoke(app, ["engine", "check", str(model)])
    assert r.exit_code == 0 and "outputs (engine CPU vs TFLite): max rel error" in r.output, r.output
