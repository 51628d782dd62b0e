"""A model campaign's reference network on a kernel build's scale: is a zoo campaign's bias the host's or the predictor's?

A kernel build times its calibration networks against its reference kernel; a model campaign (``leti measure
--models ... --reference``) times every model against a reference network, and its ``corrected_ms`` is each ratio
times that network's median latency over the campaign. The two scales move apart on a shared host. This script
times the campaign's reference network now, paired, against the build's own calibration networks of
``--min-ms``..``--max-ms`` (the zoo campaign's protocol, from the export's ``.device.json``). Each network's
build-time latency divided by its ratio to the reference is the reference's latency on the build's scale; the
median over the networks is printed beside the reference's latency in each ``--dataset`` campaign. A campaign whose
reference ran at that latency is on the build's scale, and a bias there is the predictor's.

    PYTHONPATH=. python benchmarks/anchor_campaign.py --predictor kp/ --zoo zoo/ \\
        --dataset datasets/zoo_local_cpu_zen5b.parquet datasets/zoo_local_cpu_zen5.parquet

Session 36 (the Zen 5, `datasets/kernels_local_cpu_zen5b.*`): the reference at 2.160 and 2.166 ms on the build's scale (two runs); the
campaign timed right after the build had it at 2.159 ms, session 34's at 2.226 and the rerun at 2.046.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", type=Path, required=True, help="a kernel build's folder (kernels.sqlite, "
                                                                  "networks.parquet)")
    ap.add_argument("--zoo", type=Path, required=True, help="the folder holding the campaign's reference model")
    ap.add_argument("--dataset", type=Path, nargs="+", required=True, help="campaign exports (with .device.json)")
    ap.add_argument("--min-ms", type=float, default=0.8)
    ap.add_argument("--max-ms", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="local")
    args = ap.parse_args(argv)

    from leti.device.protocol import Protocol, measure
    from leti.device.registry import open_device
    from leti.models.keras_import import keras_to_tflite
    from leti.models.random_networks import keras_network
    from leti.models.tflite import release
    from leti.predict.kernels.build_store import BuildStore

    sides = []
    for ds in args.dataset:
        side_path = ds.with_suffix(".device.json")
        if not ds.is_file() or not side_path.is_file():
            print(f"error: {ds}: needs the export and its .device.json beside it", file=sys.stderr)
            return 2
        sides.append(json.loads(side_path.read_text()))
    refs = {s.get("reference_model") for s in sides}
    if len(refs) != 1 or None in refs:
        print(f"error: the campaigns must share one reference model (they have {sorted(map(str, refs))})",
              file=sys.stderr)
        return 2
    ref = args.zoo / refs.pop()
    if not ref.is_file():
        print(f"error: {ref}: the campaigns' reference model is not there", file=sys.stderr)
        return 2
    nets_path = args.predictor / "networks.parquet"
    if not nets_path.is_file():
        print(f"error: {nets_path}: no calibration networks (run leti kernels build first)", file=sys.stderr)
        return 2
    nets = pd.read_parquet(nets_path).set_index("model").latency_ms
    pick = nets[(nets > args.min_ms) & (nets < args.max_ms)]
    if pick.empty:
        print(f"error: no calibration network of {args.min_ms}-{args.max_ms} ms", file=sys.stderr)
        return 2
    with BuildStore(args.predictor / "kernels.sqlite") as store:
        params = {r["name"]: r["config"]["params"] for r in store.measured("network").to_dict("records")}
    proto = Protocol(**sides[0]["protocol"])
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"anchor_{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in pick.index:
        path = work / f"{name}.tflite"
        path.write_bytes(keras_to_tflite(keras_network(params[name], name=name.replace("-", "_"))))
        release()
        files[name] = path
    dev = open_device(args.device, threads=1)
    load0, ratios = os.getloadavg()[0], {n: [] for n in files}
    for _ in range(args.repeats):
        for name, path in files.items():
            m = measure(dev, path, proto, reference=ref)
            dev.release(path)
            ratios[name].append(float(m.ratio))
    on_build = pd.Series({n: pick[n] / float(np.median(r)) for n, r in ratios.items()})
    mid, lo, hi = on_build.median(), on_build.quantile(0.25), on_build.quantile(0.75)
    print(f"{'network':<10}{'build ms':>10}{'ratio now':>11}{'reference on the build scale':>30}")
    for n in files:
        print(f"{n:<10}{pick[n]:>10.4f}{np.median(ratios[n]):>11.4f}{on_build[n]:>30.4f}")
    print(f"reference {ref.name} on the build's scale: {mid:.4f} ms (IQR {lo:.4f}-{hi:.4f}, {len(files)} networks)")
    for ds in args.dataset:
        d = pd.read_parquet(ds)
        campaign = float((d.corrected_ms / d.ratio).median())
        print(f"{ds.name}: reference {campaign:.4f} ms in the campaign = {campaign / mid:.3f}x the build's scale")
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
