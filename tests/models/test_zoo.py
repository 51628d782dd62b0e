"""The unseen-model zoo (issue 16): a deterministic definition over the named families, variants drawn in
range, and three small entries built, converted to TFLite and imported into the engine IR by write_zoo."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pandas as pd
import pytest

from leti.models import zoo as zoo_module
from leti.models import zoo_blocks, zoo_variants
from leti.models.zoo import ZooEntry, families, write_zoo, zoo_entries

# one xdist worker runs the whole module (make test: --dist loadgroup): its module-scoped fixture is built
# once, not once in each worker
pytestmark = pytest.mark.xdist_group("zoo-written")

NAMED = {"mobilenet", "mobilenetv2", "mobilenetv3small", "mobilenetv3large", "efficientnetb0", "efficientnetb1",
         "efficientnetv2b0", "resnet50", "densenet121", "nasnetmobile", "regnetx", "regnety", "var_mobilenetv2",
         "var_mobilenetv1", "var_resnet_basic", "var_resnet_bottleneck", "var_shufflenet", "var_ghostnet", "nb101"}


def test_definition_is_deterministic_large_and_named_uniquely():
    first = [e.to_dict() for e in zoo_entries(0)]
    zoo_module._entries.cache_clear()  # draw again from scratch, not from the cache
    again = [e.to_dict() for e in zoo_entries(0)]
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    entries = zoo_entries(0)
    assert len(entries) >= 220
    counts = families(entries)
    assert set(counts) == NAMED and min(counts.values()) >= 3
    names = [e.name for e in entries]
    assert len(set(names)) == len(names) and all(n.replace("_", "").replace(".", "").isalnum() for n in names)
    # another seed redraws the variants and the NB101 cells, not the keras.applications grid
    other = {e.name: e for e in zoo_entries(1)}
    apps = [e for e in entries if e.source == "keras.applications"]
    assert all(other[e.name] == e for e in apps)
    assert sum(1 for e in entries if e.source != "keras.applications" and other.get(e.name) != e) > 50


def test_keras_applications_entries_avoid_their_default_sizes():
    for e in zoo_entries(0):
        if e.source == "keras.applications":
            assert e.input_res < 224 or e.family.startswith("efficientnetb1") and e.input_res < 240, e.name


def test_variants_draw_multipliers_in_range_kernels_from_the_set_and_fit_the_budget():
    variants = [e for e in zoo_entries(0) if e.family.startswith("var_")]
    assert len(variants) >= 90
    lo, hi = zoo_variants.MULT_RANGE
    assert (lo, hi) == (0.2, 1.8)
    mults = [m for e in variants for m in e.params["mults"]]
    assert all(lo <= m <= hi for m in mults) and max(mults) > 1.6 and min(mults) < 0.4
    for e in variants:
        stages = e.params.get("stages") or e.params["blocks"]
        kernels = {s[0] for s in stages} if e.builder == "ghostnet_like" else {
            s[4] if e.builder == "mobilenetv2_like" else s[3] if e.builder in ("mobilenetv1_like", "resnet_like")
            else s[2] for s in stages}
        assert kernels <= {3, 5, 7}, e.name
        assert zoo_variants.estimated_ms(e.builder, e.params, e.input_res) <= zoo_variants.BUDGET_MS or \
            e.input_res == 64, e.name
    assert {k for e in variants if e.builder == "mobilenetv2_like" for k in (s[4] for s in e.params["stages"])} == \
        {3, 5, 7}


def test_fit_resolution_lowers_a_model_over_the_budget():
    e = next(e for e in zoo_entries(0) if e.family == "var_resnet_basic")
    assert zoo_variants.fit_resolution(e.builder, e.params, 512, budget_ms=5.0) < 512
    assert zoo_variants.fit_resolution(e.builder, e.params, 96, budget_ms=1e9) == 96


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Three small entries (one of each kind) and one that cannot be built, through write_zoo."""
    entries = zoo_entries(0)
    pick = [next(e for e in entries if e.name == "mobilenet_a0.25_r128"),
            min((e for e in entries if e.family == "var_shufflenet"),
                key=lambda e: zoo_blocks.count_macs(e.builder, e.params, e.input_res)),
            next(e for e in entries if e.family == "nb101" and e.params["stem"] == 16)]
    broken = ZooEntry("broken_r64", "broken", "base", 64, 1.0, "keras.applications", "NoSuchNet", {})
    out = tmp_path_factory.mktemp("zoo")
    return pick, out, write_zoo(out, pick + [broken], jobs=1)


def test_write_zoo_converts_engine_imports_and_writes_the_manifest(written):
    from leti.engine.convert import load_model
    from leti.models.tflite import tflite_macs

    pick, out, records = written
    ok, dropped = records[:3], records[3]
    assert [r["status"] for r in ok] == ["ok"] * 3 and [r["name"] for r in ok] == [e.name for e in pick]
    for e, r in zip(pick, ok):
        path = out / f"{e.name}.tflite"
        assert path.is_file() and r["model"] == path.name and r["params"] > 0 and r["flops"] == 2 * r["macs"] > 0
        assert load_model(path).nodes  # the engine IR holds the model
    from leti.models.tflite import op_histogram, read_ops

    app = out / f"{pick[0].name}.tflite"  # static batch 1: no SHAPE/PACK chain around its Reshape
    assert "SHAPE" not in op_histogram(app) and read_ops(app)[0].inputs[0].shape[0] == 1
    variant = pick[1]  # our own builder: the count made before building is what the converted model computes
    assert tflite_macs(out / f"{variant.name}.tflite") == zoo_blocks.count_macs(variant.builder, variant.params,
                                                                                 variant.input_res)
    assert dropped["status"] == "dropped" and dropped["stage"] == "build" and "NoSuchNet" in dropped["error"]
    assert not (out / "broken_r64.tflite").exists()
    manifest = pd.read_parquet(out / "zoo.parquet")
    assert list(manifest["name"]) == [r["name"] for r in records]
    assert list(manifest.columns) == list(zoo_module.MANIFEST_COLUMNS)
    assert pd.read_csv(out / "zoo.csv")["family"].tolist() == ["mobilenet", "var_shufflenet", "nb101", "broken"]
    assert sorted(p.name for p in out.glob("*.tflite")) == sorted(f"{e.name}.tflite" for e in pick)


def test_write_zoo_resumes_without_rebuilding(written):
    pick, out, records = written
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tflite")}
    again = write_zoo(out, pick, jobs=1)
    assert again == records[:3]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tflite")} == stamps
