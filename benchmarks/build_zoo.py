"""Write the unseen-model zoo of issue 16 (``leti.models.zoo``): ``<out>/<name>.tflite`` + ``zoo.csv``/``zoo.parquet``.

    python benchmarks/build_zoo.py --out zoo/ [--limit N] [--jobs J] [--seed S]

``--limit N`` takes N models spread over the families (round robin), for a quick look. The run resumes:
finished models are not built again. Prints the count per family, the models dropped (and why), the
wall time and the load average before and after (the machine is shared).
Then: ``leti measure --models zoo/ --device local --db zoo.sqlite --adaptive --runs 100 --passes 2 --reference auto
--clock cpu`` (see ``datasets/zoo_local_cpu.README.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from itertools import zip_longest
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def spread(entries, limit: int | None):
    """The first ``limit`` entries taken round robin over the families (all when ``limit`` is None)."""
    if limit is None:
        return entries
    by_family: dict[str, list] = {}
    for e in entries:
        by_family.setdefault(e.family, []).append(e)
    mixed = [e for group in zip_longest(*by_family.values()) for e in group if e is not None]
    return mixed[:limit]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from leti.models.zoo import families, write_zoo, zoo_entries

    entries = spread(zoo_entries(args.seed), args.limit)
    print(f"zoo (seed {args.seed}): {len(entries)} models; load average before {os.getloadavg()}", flush=True)
    start = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            print(f"  {done}/{total} models ({time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.2f})",
                  flush=True)

    records = write_zoo(args.out, entries, jobs=args.jobs, progress=progress)
    wall = time.perf_counter() - start
    ok = [r for r in records if r["status"] == "ok"]
    dropped = [r for r in records if r["status"] != "ok"]
    print(f"wrote {len(ok)} models to {args.out} in {wall / 60:.1f} min; load average after {os.getloadavg()}")
    kept = families(r_entry for r_entry in entries if r_entry.name in {r["name"] for r in ok})
    for fam, n in families(entries).items():
        print(f"  {fam:24s} {kept.get(fam, 0):4d} of {n}")
    for r in dropped:
        print(f"dropped {r['name']} at {r['stage']}: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
