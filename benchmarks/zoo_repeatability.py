"""How well one campaign of the unseen-model zoo predicts another campaign of the same zoo: the ceiling of Acc@10.

A zoo campaign (``leti measure --models zoo/ --reference auto``) times every model paired against a reference network;
two campaigns of the same files on the same kind of host differ by a common scale (the host's speed that hour) and,
model by model, by what the host did to each one (memory bandwidth, a neighbour's cache pressure). A latency predictor
is scored against one campaign; if another campaign of the same models, used as the "prediction", is within 10 % of
it for only 98 % of the models, no predictor can be shown to reach 99 % on that host. This script prints, for each
pair of campaigns given (the first against each later one), Acc@5 / Acc@10 per family and overall, on two scales:

* ``paired`` — each model's median ratio to the reference network, the scale the predictors are scored on with
  ``bench_kernels_zoo.py --reference-ms`` (the host's speed that hour cancels);
* ``ms`` — the campaigns' own ``corrected_ms`` (what a user timing the model that hour would have seen).

Only the models both campaigns kept count.

    python benchmarks/zoo_repeatability.py datasets/zoo_local_cpu_zen5b.parquet datasets/zoo_local_cpu_zen5.parquet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels_zoo import acc, read_campaign  # noqa: E402

MODELS = Path(__file__).resolve().parents[1] / "datasets" / "zoo_local_cpu.models.parquet"


def campaign(path: Path) -> tuple[pd.DataFrame, dict]:
    """Per model: the median paired ratio to the campaign's reference network and the median ``corrected_ms``."""
    df, side = read_campaign(path)
    missing = {"model", "ratio", "corrected_ms"} - set(df.columns)
    if missing:
        sys.exit(f"zoo_repeatability: {path}: not a paired campaign export (lacks {', '.join(sorted(missing))})")
    per = df.groupby("model").agg(ratio=("ratio", "median"), ms=("corrected_ms", "median"))
    return per, side


def table(a: pd.DataFrame, b: pd.DataFrame, families: pd.Series) -> list[str]:
    both = a.add_suffix("_a").join(b.add_suffix("_b"), how="inner")
    both["family"] = families.reindex(both.index).fillna("other")
    both["paired"] = both.ratio_a / both.ratio_b - 1.0
    both["ms"] = both.ms_a / both.ms_b - 1.0
    lines = [f"{'family':<24}{'n':>5}{'paired@5':>10}{'paired@10':>11}{'ms@10':>8}{'med|d|':>8}{'worst':>7}"]

    def line(name, g):
        return (f"{name:<24}{len(g):>5}{acc(g.paired, .05):>10.1f}{acc(g.paired, .10):>11.1f}{acc(g.ms, .10):>8.1f}"
                f"{np.median(np.abs(g.paired)) * 100:>7.1f}%{np.abs(g.paired).max() * 100:>6.0f}%")

    for fam, g in sorted(both.groupby("family"), key=lambda kv: kv[0]):
        lines.append(line(fam, g))
    lines.append(line("ALL", both))
    log = np.log(both.ratio_a / both.ratio_b)
    lines.append(f"common scale (ms, a / b): {np.exp(np.median(np.log(both.ms_a / both.ms_b))):.3f}; std of the "
                 f"paired log ratio {log.std() * 100:.1f} %; models apart by more than 10 %: "
                 f"{', '.join(sorted(both.index[np.abs(both.paired) > .10])) or 'none'}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaigns", type=Path, nargs="+", help="zoo campaign exports (.parquet with .device.json); the "
                                                            "first is compared with each later one")
    ap.add_argument("--models", type=Path, default=MODELS, help="the zoo's model table (model, family)")
    args = ap.parse_args(argv)
    if len(args.campaigns) < 2:
        ap.error("give at least two campaign exports of the same zoo")
    families = pd.read_parquet(args.models).set_index("model")["family"] if args.models.is_file() else pd.Series(
        dtype=str)
    first, side0 = campaign(args.campaigns[0])
    for other in args.campaigns[1:]:
        per, side = campaign(other)
        if side.get("reference_model") != side0.get("reference_model"):
            sys.exit(f"zoo_repeatability: {other} was paired against {side.get('reference_model')}, "
                     f"{args.campaigns[0]} against {side0.get('reference_model')}: not comparable")
        print(f"a = {args.campaigns[0].name}, b = {other.name} (reference {side0.get('reference_model')}); "
              f"'paired': a's ratio to the reference over b's, 'ms': a's corrected_ms over b's")
        print("\n".join(table(first, per, families)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
