"""The cost estimate against the time each unit really took: for finished study stores (default: the focused and the
full demo's, from `make demo` and `af1 demo --full --out results/full`), each unit's estimate on this machine beside
its recorded seconds and peak memory, and their ratios. `--fit` prints the slowdowns that would make the
estimates of these stores exact (the geometric mean per experiment), for each experiment's `cost` (its `slowdown`,
or `slowdown_without_bf16` on a CPU whose bfloat16 products do not pay).

Run it on the machine the stores ran on, alone: the estimate measures this machine's matrix-product rate."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from af1.results import read_json, write_json
from af1.study import cost
from af1.study.plan import StudyPlan, expand
from af1.study.store import Store

from common import RESULTS, machine

FITTED_ON = ("demo", "full")  # the stores the experiments' slowdowns were fitted on; any other is held out


def compare(root: Path) -> list[dict[str, Any]]:
    """Each unit that ran (not the ones that did not apply): its estimate now (from what the store measured), the
    one made before it ran where the store kept it, its time and peak memory, and their ratios."""
    store = Store(root)
    units = expand(StudyPlan.model_validate(read_json(root / "plan.json")["plan"]))
    path = root / "estimate.json"
    before = {e["unit"]: e["seconds"] for e in read_json(path)["units"]} if path.is_file() else {}
    rows = []
    for unit, estimate in zip(units, cost.estimate_store(store, units, redo_done=True), strict=True):
        record = store.record(unit) or {}
        if record.get("state") != "done":
            continue
        seconds, peak_mb = record["seconds"], (record.get("worker") or {}).get("peak_rss_mb")
        rows.append(
            {
                "store": str(root),
                "fitted_on_it": root.name in FITTED_ON,
                "unit": unit.id,
                "estimate_s": round(estimate.seconds, 1),
                "estimate_before_run_s": round(before[unit.id], 1) if unit.id in before else None,
                "actual_s": round(seconds, 1),
                "ratio": estimate.seconds / seconds if seconds > 0.5 else None,
                "estimate_gb": round(estimate.peak_gb, 2),
                "actual_gb": round(peak_mb / 1000, 2) if peak_mb else None,
            }
        )
    return rows


def fitted(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per experiment, the slowdown that makes the geometric mean of its ratios 1."""
    logs: dict[str, list[float]] = {}
    for row in rows:
        if row["ratio"]:
            logs.setdefault(row["unit"].rsplit("/", 1)[1], []).append(math.log(row["ratio"]))
    return {name: round(cost.slowdown(name) / math.exp(sum(values) / len(values)), 3) for name, values in logs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("stores", nargs="*", type=Path, default=[Path("results/demo"), Path("results/full")])
    parser.add_argument("--fit", action="store_true", help="print the slowdowns these stores fit")
    args = parser.parse_args()
    rows = [row for root in args.stores for row in compare(root)]
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(
            f"{row['unit']:50s} {row['estimate_s']:7.1f} s {row['actual_s']:7.1f} s ratio {ratio:5s} "
            f"(before the run {row['estimate_before_run_s']}) {row['estimate_gb']:5.2f} GB {row['actual_gb']} GB"
        )
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    within = sum(1 / 1.5 <= r <= 1.5 for r in ratios)
    print(f"{within} of {len(ratios)} units within a factor of 1.5")
    held_out = [r["ratio"] for r in rows if r["ratio"] and not r["fitted_on_it"]]
    held_within = sum(1 / 1.5 <= r <= 1.5 for r in held_out)
    print(f"held out (stores not fitted on): {held_within} of {len(held_out)} within a factor of 1.5")
    if args.fit:
        print(fitted(rows))
        return
    path = write_json(
        RESULTS / "estimate.json",
        {
            "benchmark": "estimate",
            "machine": machine(),
            "matmul_rate_gflops": round(cost.matmul_rate() / 1e9, 1),
            "units": [{**r, "ratio": None if r["ratio"] is None else round(r["ratio"], 3)} for r in rows],
            "within_1_5": within,
            "n_timed": len(ratios),
            "held_out_within_1_5": held_within,
            "n_held_out": len(held_out),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
