"""The cross-model report of a study: unit states, faithfulness per model and task, and the transfer table."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from af1.report.html import image_html, page, table_html, with_ci
from af1.results import write_atomic, write_json
from af1.study.plan import StudyPlan, Unit, task_label
from af1.study.store import Store


def _cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "no config (no eligible cell)"
    return f"{part['faithfulness']:.3f} (wait {part['wait']}, transfer {part['transfer']})"


def study_tables(store: Store, units: list[Unit]) -> dict[str, Any]:
    """The report's data from the store's records of the plan's units."""
    records = {u.id: store.record(u) or {} for u in units}
    done = {u.id: record["result"] for u in units if (record := store.done(u)) is not None}
    rows, faith, transfer = [], [], {}
    top_heads: dict[str, dict[str, list[list[int]]]] = {}
    for unit in units:
        rec = records[unit.id]
        rows.append(
            {
                **unit.describe(),
                "state": rec.get("state", "missing") if rec.get("key", unit.key) == unit.key else "stale",
                "seconds": rec.get("seconds"),
                "host": (rec.get("worker") or {}).get("host"),
                "error": rec.get("error"),
            }
        )
        if unit.id not in done:
            continue
        result = done[unit.id]
        if unit.experiment == "search":
            sweep = done.get(unit.deps[0]) or {}
            cell = result if result["found"] else result.get("best") or {}
            faith.append(
                {
                    "model": unit.model.name,
                    "task": task_label(unit.task),  # type: ignore[arg-type]
                    "n_layers": result["n_layers"],
                    "base_accuracy": sweep.get("base_accuracy"),
                    "n_solved": sweep.get("n_solved"),
                    "threshold": result["threshold"],
                    "found": result["found"],
                    "wait": cell.get("wait"),
                    "transfer": cell.get("transfer"),
                    "faithfulness": cell.get("faithfulness"),
                    "faithfulness_ci": cell.get("faithfulness_ci"),
                    "faithfulness_baseline": result.get("faithfulness_baseline"),
                    "n_confirmation": result.get("n_confirmation"),
                    "base_accuracy_ci": sweep.get("base_accuracy_ci"),
                }
            )
        if unit.experiment == "heads":
            top_heads.setdefault(unit.model.name, {})[task_label(unit.task)] = result["top_heads"]  # type: ignore[arg-type]
        if unit.experiment == "transfer":
            for row in result["rows"]:
                transfer.setdefault(task_label(unit.task), []).append(  # type: ignore[arg-type]
                    {
                        "source": row["source"]["model"],
                        "target": unit.model.name,
                        "source_found": row["source"]["found"],
                        "source_wait": row["source"]["wait"],
                        "source_transfer": row["source"]["transfer"],
                        "absolute": row["absolute"],
                        "relative": row["relative"],
                    }
                )
            for source in result.get("sources_without_config", {}):
                transfer.setdefault(task_label(unit.task), []).append(  # type: ignore[arg-type]
                    {
                        "source": source,
                        "target": unit.model.name,
                        "source_found": False,
                        "absolute": None,
                        "relative": None,
                    }
                )
    states = [r["state"] for r in rows]
    return {
        "n_units": len(rows),
        "n_done": states.count("done"),
        "n_failed": states.count("failed"),
        "n_unfinished": len(rows) - states.count("done") - states.count("failed"),
        "units": rows,
        "faithfulness": faith,
        "transfer": transfer,
        "heads_overlap": _heads_overlap(top_heads),
    }


def _heads_overlap(top_heads: dict[str, dict[str, list[list[int]]]]) -> list[dict[str, Any]]:
    """Per model and pair of tasks: how many of the top heads by path patching are the same."""
    from af1.heads import overlap

    rows = []
    for model, by_task in top_heads.items():
        tasks = sorted(by_task)
        for i, a in enumerate(tasks):
            for b in tasks[i + 1 :]:
                rows.append({"model": model, "task_a": a, "task_b": b, **overlap(by_task[a], by_task[b])})
    return rows


def build_study_report(store: Store, plan: StudyPlan, units: list[Unit]) -> Path:
    """DIR/report.json and a self-contained DIR/report.html."""
    data = {"name": plan.name, **study_tables(store, units)}
    write_json(store.root / "report.json", data)
    parts = [
        f"<p>{data['n_done']} of {data['n_units']} units done, {data['n_failed']} failed, "
        f"{data['n_unfinished']} not finished. Each unit's record, result and figure are under "
        "<code>units/&lt;model&gt;/&lt;task&gt;/&lt;experiment&gt;/</code>.</p>"
    ]
    if data["faithfulness"]:
        parts.append(
            "<h2>AF1 per model and task</h2><p>The subgraph the search found on a selection half of the solved "
            "problems (largest L_wait, then smallest L_transfer, faithfulness at or above the threshold, a "
            "compute stage, an interval above the constant guess); where none was found, the best eligible cell, "
            "marked <i>best</i>. Faithfulness is measured on the other half (the confirmation split), with its "
            "95 % interval, beside what a constant guess scores there.</p>"
        )
        parts.append(
            table_html(
                [
                    "model",
                    "task",
                    "layers",
                    "base accuracy",
                    "solved",
                    "AF1",
                    "wait",
                    "transfer",
                    "faithfulness (confirmation)",
                    "n",
                    "constant guess",
                ],
                [
                    [
                        r["model"],
                        r["task"],
                        r["n_layers"],
                        with_ci(r["base_accuracy"], r.get("base_accuracy_ci")),
                        r["n_solved"],
                        "found" if r["found"] else f"best (< {r['threshold']})",
                        r["wait"],
                        r["transfer"],
                        with_ci(r["faithfulness"], r.get("faithfulness_ci")),
                        r.get("n_confirmation"),
                        r.get("faithfulness_baseline"),
                    ]
                    for r in data["faithfulness"]
                ],
            )
        )
    for label, rows in data["transfer"].items():
        sources = sorted({r["source"] for r in rows})
        targets = sorted({r["target"] for r in rows})
        by = {(r["source"], r["target"]): r for r in rows}
        parts.append(
            f"<h2>Transfer on <code>{html.escape(label)}</code></h2><p>Rows: the model whose AF1 config is "
            "applied; columns: the model it is applied to, by the same layer numbers (absolute) and by the "
            "same relative depth. The diagonal is each model's own config.</p>"
        )
        for how in ("absolute", "relative"):
            parts.append(f"<p><b>{how}</b></p>")
            parts.append(
                table_html(
                    ["config of \\ applied to", *targets],
                    [[s] + [_cell(by[s, t][how]) if (s, t) in by else "" for t in targets] for s in sources],
                )
            )
    if data["heads_overlap"]:
        parts.append(
            "<h2>The same heads across tasks?</h2><p>Per model, the share of the top heads by path patching "
            "that two tasks have in common (top-k overlap).</p>"
        )
        parts.append(
            table_html(
                ["model", "task", "task", "k", "top-k overlap"],
                [[r["model"], r["task_a"], r["task_b"], r["k"], r["top_k_overlap"]] for r in data["heads_overlap"]],
            )
        )
    parts.append("<h2>Units</h2>")
    parts.append(
        table_html(
            ["unit", "state", "seconds", "host", "error"],
            [
                [r["id"], r["state"], "" if r["seconds"] is None else r["seconds"], r["host"] or "", r["error"] or ""]
                for r in data["units"]
            ],
        )
    )
    for unit in units:
        if unit.experiment == "sweep" and (store.unit_dir(unit) / "sweep.png").is_file():
            parts.append(f"<h3>{html.escape(unit.id)}</h3>" + image_html(store.unit_dir(unit), "sweep.png"))
    return write_atomic(store.root / "report.html", page(f"af1 study: {plan.name}", parts))
