"""The study's report: what each model does (search verdicts, AF1 per model and task), the cross-model tables
(transfer, paired base accuracy, shared heads), then every unit's own section from its experiment, and wall times."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from af1.experiments import REGISTRY
from af1.experiments.base_accuracy import paired
from af1.experiments.search import verdict
from af1.report.markup import page, table_html, with_ci
from af1.results import write_atomic, write_json
from af1.study.plan import StudyPlan, Unit, task_label
from af1.study.store import Store


def _cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "no config (no eligible cell)"
    return f"{part['faithfulness']:.3f} (wait {part['wait']}, transfer {part['transfer']})"


def typed(unit: Unit, result: dict[str, Any]) -> Any:
    return REGISTRY[unit.experiment].Result.model_validate(result)


def study_tables(store: Store, units: list[Unit]) -> dict[str, Any]:
    """The report's data from the store's records of the plan's units."""
    records = {u.id: store.record(u) or {} for u in units}
    done = {u.id: typed(u, r["result"]) for u in units if (r := store.done(u)) is not None and "result" in r}
    rows, faith, verdicts, transfer, pairs = [], [], [], {}, []
    top_heads: dict[str, dict[str, list[list[int]]]] = {}
    evals: dict[str, dict[str, Any]] = {}
    for unit in units:
        rec = records[unit.id]
        rows.append(
            {
                **unit.describe(),
                "state": rec.get("state", "missing") if rec.get("key", unit.key) == unit.key else "stale",
                "seconds": rec.get("seconds"),
                "host": (rec.get("worker") or {}).get("host"),
                "error": rec.get("error") or rec.get("reason"),
            }
        )
        if unit.id not in done:
            continue
        result, label = done[unit.id], task_label(unit.task) if unit.task is not None else "model"
        if unit.experiment == "eval":
            evals.setdefault(label, {})[unit.model.name or ""] = result
        if unit.experiment == "search":
            sweep = done.get(unit.deps[0])
            cell = result.data() if result.found else result.best or {}
            if sweep is not None:
                verdicts.append(
                    verdict(result, sweep, (rec.get("provenance") or {}).get("model", {}).get("description"))
                )
            faith.append(
                {
                    "model": unit.model.name,
                    "task": label,
                    "n_layers": result.n_layers,
                    "base_accuracy": sweep.base_accuracy if sweep else None,
                    "base_accuracy_ci": sweep.base_accuracy_ci if sweep else None,
                    "n_solved": sweep.n_solved if sweep else None,
                    "threshold": result.threshold,
                    "found": result.found,
                    "wait": cell.get("wait"),
                    "transfer": cell.get("transfer"),
                    "faithfulness": cell.get("faithfulness"),
                    "faithfulness_ci": cell.get("faithfulness_ci"),
                    "faithfulness_baseline": result.faithfulness_baseline,
                    "n_confirmation": result.n_confirmation,
                }
            )
        if unit.experiment == "heads":
            top_heads.setdefault(unit.model.name or "", {})[label] = result.top_heads
        if unit.experiment == "transfer":
            for row in result.rows:
                transfer.setdefault(label, []).append(
                    {
                        "source": row["source"]["model"],
                        "target": unit.model.name,
                        "source_found": row["source"]["found"],
                        "source_wait": row["source"]["wait"],
                        "source_transfer": row["source"]["transfer"],
                        "absolute": row["absolute"],
                        "relative": row["relative"],
                        "own": row.get("own"),
                    }
                )
            for source in result.sources_without_config:
                transfer.setdefault(label, []).append(
                    {
                        "source": source,
                        "target": unit.model.name,
                        "source_found": False,
                        "absolute": None,
                        "relative": None,
                    }
                )
    for label, by_model in evals.items():
        names = list(by_model)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                test = paired(by_model[a], by_model[b])
                if test is not None:
                    pairs.append({"task": label, "models": [a, b], **test})
    states = [r["state"] for r in rows]
    return {
        "n_units": len(rows),
        "n_done": states.count("done"),
        "n_not_applicable": states.count("not_applicable"),
        "n_failed": states.count("failed"),
        "n_unfinished": len(rows) - states.count("done") - states.count("failed") - states.count("not_applicable"),
        "units": rows,
        "verdicts": verdicts,
        "faithfulness": faith,
        "transfer": transfer,
        "base_accuracy_paired": pairs,
        "heads_overlap": _heads_overlap(top_heads),
        "seconds_total": sum(r["seconds"] or 0 for r in rows),
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


def _overview(data: dict[str, Any]) -> list[str]:
    """The cross-model part: verdicts, AF1 per model and task, transfer, paired base accuracy, shared heads."""
    parts = []
    if data["verdicts"]:
        parts.append("<h2>Where each model waits, transfers and computes</h2><ul>")
        parts += [f"<li>{html.escape(line)}</li>" for line in data["verdicts"]]
        parts.append("</ul>")
    if data["faithfulness"]:
        parts.append(
            "<h2>AF1 per model and task</h2><p>The subgraph the search found on a selection half of the solved "
            "problems (largest L_wait, then smallest L_transfer, faithfulness at or above the threshold, a "
            "compute stage, an interval above the constant guess); where none was found, the best eligible cell, "
            "marked <i>best</i>. Faithfulness is measured on the other half (the confirmation split), with its "
            "95 % interval, beside what a constant guess scores there.</p>"
        )
        header = ["model", "task", "layers", "base accuracy", "solved", "AF1", "wait", "transfer"]
        parts.append(
            table_html(
                [*header, "faithfulness (confirmation)", "n", "constant guess"],
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
            "same relative depth, on the confirmation split of the target's own search. The diagonal is each "
            "model's own config.</p>"
        )
        for how in ("absolute", "relative"):
            parts.append(f"<p><b>{how}</b></p>")
            parts.append(
                table_html(
                    ["config of \\ applied to", *targets],
                    [[s] + [_cell(by[s, t][how]) if (s, t) in by else "" for t in targets] for s in sources],
                )
            )
    for test in data["base_accuracy_paired"]:
        a, b = test["models"]
        parts.append(
            f"<p>Base accuracy of {html.escape(a)} and {html.escape(b)} on the same {test['n']} problems of "
            f"<code>{html.escape(test['task'])}</code>: solved by {html.escape(a)} only {test['only_first']}, by "
            f"{html.escape(b)} only {test['only_second']}, McNemar p {test['p_value']:.2g}.</p>"
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
    return parts


def unit_sections(store: Store, units: list[Unit]) -> list[str]:
    """Every finished unit's own section, written by its experiment, grouped by model and task."""
    parts: list[str] = []
    heading = None
    for unit in units:
        record = store.done(unit)
        if record is None or "result" not in record:
            continue
        where = f"{unit.model.name} on {task_label(unit.task) if unit.task is not None else 'its own'}"
        if where != heading:
            parts.append(f"<h2 class='unit'>{html.escape(where)}</h2>")
            heading = where
        experiment = REGISTRY[unit.experiment]
        try:
            section = experiment.section(typed(unit, record["result"]), store.unit_dir(unit))
        except Exception as exc:  # an older record the section cannot read: the report still renders
            section = [f"<p>{html.escape(unit.id)}: cannot show ({html.escape(str(exc).splitlines()[0])})</p>"]
        parts += [p.replace("<h2>", "<h3>").replace("</h2>", "</h3>") for p in section]
    return parts


def build_study_report(store: Store, plan: StudyPlan, units: list[Unit]) -> Path:
    """DIR/report.json and a self-contained DIR/report.html."""
    data = {"name": plan.name, **study_tables(store, units)}
    write_json(store.root / "report.json", data)
    parts = [
        f"<p>{data['n_done']} of {data['n_units']} units done, {data['n_not_applicable']} not applicable, "
        f"{data['n_failed']} failed, {data['n_unfinished']} not finished. Each unit's record, result and figure are "
        "under <code>units/&lt;model&gt;/&lt;task&gt;/&lt;experiment&gt;/</code>. Every rate comes with its n, "
        "its 95 % Wilson interval and what a constant guess scores on the same problems.</p>",
        *_overview(data),
        *unit_sections(store, units),
        "<h2>Units and wall time</h2>",
        table_html(
            ["unit", "state", "seconds", "host", "error or reason"],
            [
                [r["id"], r["state"], "" if r["seconds"] is None else r["seconds"], r["host"] or "", r["error"] or ""]
                for r in data["units"]
            ]
            + [["total", "", data["seconds_total"], "", ""]],
        ),
    ]
    return write_atomic(store.root / "report.html", page(f"af1 study: {plan.name}", parts))
