"""What real models cost beyond their kernels, against the kernel build's random networks (issue 16, session 38).

    python benchmarks/overhead_gap.py --predictor kp/ --zoo zoo/ --dataset datasets/zoo_local_cpu_zen5b.parquet

For every zoo model (``benchmarks/build_zoo.py``) with a measured latency in ``--dataset`` and every calibration network
of the predictor's build (its ``kernels.sqlite``), prints the measured latency over the kernels' predicted sum *alone*
(the regressors only: no cache cost, no overhead), binned by MB of weights and by MB of weights per ms of kernel work,
networks beside zoo, and the predictor's own Acc@10 on the zoo. Where the zoo's ratio exceeds the networks' in a bin,
the overhead the networks teach under-predicts the zoo there. The zoo's latencies are read as
``bench_kernels_zoo.py`` reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

WEIGHT_BINS = (0, 4, 8, 16, 32, 64, 1e4)
INTENSITY_BINS = (0, 1, 2, 4, 8, 16, 1e4)


def per_model(kp, table: pd.DataFrame) -> pd.DataFrame:
    """Per model: the kernels' predicted sum alone, what the predictor says in all, and the MB of weights."""
    from leti.predict.kernels.overhead import model_aggregates

    kernels = kp.predict_kernels(table, allow_unknown=True)  # each kernel alone, before its cost inside the model
    rows = kp.in_model(kernels)
    agg = model_aggregates(rows, rows["predicted_ms"].to_numpy(), kp.overhead.cache_sizes())
    alone = kernels.groupby("model", sort=False)["predicted_ms"].sum()
    return pd.DataFrame({"alone_ms": alone.reindex(agg.index), "predicted_ms": kp.overhead.predict(agg),
                         "weights_mb": agg["weights_mb"]}, index=agg.index)


def binned(d: pd.DataFrame, col: pd.Series, bins) -> pd.Series:
    ratio = d["measured_ms"] / d["alone_ms"]
    return ratio.groupby(pd.cut(col, list(bins)), observed=True).agg(lambda r: f"{len(r):>3} x {np.median(r):.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", type=Path, required=True)
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--dataset", type=Path, required=True)
    args = ap.parse_args(argv)

    from bench_kernels_zoo import measured_latency

    from leti.predict.kernels.build_fit import calibration_tables
    from leti.predict.kernels.build_store import BuildStore
    from leti.predict.kernels.model import load_kernel_predictor
    from leti.predict.kernels.split import split_model

    kp = load_kernel_predictor(args.predictor)
    truth, how = measured_latency(args.dataset, args.zoo, "auto")
    tables = [split_model(args.zoo / m, kp.rules, device=kp.device) for m in truth.index if (args.zoo / m).is_file()]
    zoo = per_model(kp, pd.concat(tables, ignore_index=True))
    zoo = zoo.join(truth.rename(index=lambda f: Path(f).stem).rename("measured_ms"), how="inner")
    with BuildStore(args.predictor / "kernels.sqlite") as store:
        net_kernels, nets = calibration_tables(store, kp.runtime, "network")
    if nets.empty:
        print(f"error: {args.predictor}: its build has no calibration networks", file=sys.stderr)
        return 1
    net = per_model(kp, net_kernels).join(nets.set_index("model").latency_ms.rename("measured_ms"), how="inner")
    print(f"predictor {args.predictor} ({kp.describes}); zoo latencies: {how}")
    print(f"{len(net)} networks, {len(zoo)} zoo models; load average {os.getloadavg()[0]:.1f}")
    err = zoo.predicted_ms / zoo.measured_ms - 1
    print(f"the predictor on the zoo: Acc@10 {np.mean(np.abs(err) <= 0.1) * 100:.1f} %, bias {np.median(err) * 100:+.1f} %")
    for title, bins, key in (("MB of weights", WEIGHT_BINS, lambda d: d.weights_mb),
                             ("MB of weights per ms of kernel work", INTENSITY_BINS, lambda d: d.weights_mb / d.alone_ms)):
        print(f"measured / kernels alone (count x median) by {title}:")
        table = pd.DataFrame({"networks": binned(net, key(net), bins), "zoo": binned(zoo, key(zoo), bins)}).fillna("")
        print(table.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
