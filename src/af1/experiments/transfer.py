"""transfer: every model's AF1 config on every model of the plan, by the same layers and the same relative depth,
on this model's confirmation split beside its own config (paired McNemar)."""

from __future__ import annotations

import html
from typing import Any

from af1.claims import Claim
from af1.experiments import base, costs
from af1.experiments.search import NO_CELL, searched_config
from af1.experiments.search import Result as Searched
from af1.methods import allforone
from af1.report.markup import Tab, table_html
from af1.stats import rate_text
from af1.tasks.evaluation import ProblemInputs


class Options(base.Options):
    pass


class Result(base.SetupFields):
    target: str
    rows: list[allforone.transfer.Transferred]
    sources_without_config: dict[str, str] = {}
    missing_sources: list[str] = []  # in a study: the sources' units that did not finish (it ran without them)
    measured_on: str = "solved problems"
    n_measured: int = 0
    inputs: ProblemInputs | None = None  # sets: solved; confirmation when measured there

    @property
    def claims(self) -> list[Claim]:
        """Each mapped config's test against the target's own (one family, Holm), in the table's order."""
        return allforone.transfer.tested(self.rows)


DIFFERS = {"confirmed": "differs", "not confirmed": "not shown to differ", "rejected": "does not differ"}


def own_text(row: allforone.transfer.Transferred) -> str:
    """The target's own config on the same problems, and how each mapped config differs from it."""
    own = row.get("own")
    if not own:
        return "-"
    said = []
    for by in ("absolute", "relative"):
        claim = row[by].get("vs_own")
        if claim is not None:
            verdict = DIFFERS[claim["outcome"]]
            said.append(f"{by}: {verdict}, p {claim['p_value']:.2g}, adjusted {claim['p_adjusted']:.2g}")
    tests = f" ({'; '.join(said)})" if said else ""
    return f"{own['wait']} / {own['transfer']}: {rate_text(own['faithfulness'])}{tests}"


def _cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "no config (no eligible cell)"
    return f"{rate_text(part['faithfulness'])} (wait {part['wait']}, transfer {part['transfer']})"


def overview_of(finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
    """Per task, the matrix of every model's config on every model, by the same layers and by relative depth."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for f in finished:
        for row in f.result.rows:
            tables.setdefault(f.task, []).append(
                {
                    "source": row["source"].get("model"),
                    "target": f.model,
                    "source_chosen": row["source"].get("chosen", True),
                    "source_wait": row["source"]["wait"],
                    "source_transfer": row["source"]["transfer"],
                    "absolute": row["absolute"],
                    "relative": row["relative"],
                    "own": row.get("own"),
                    "n": f.result.n_measured,
                }
            )
        for source in f.result.sources_without_config:
            tables.setdefault(f.task, []).append(
                {"source": source, "target": f.model, "source_chosen": False, "absolute": None, "relative": None}
            )
    parts = []
    for label, rows in tables.items():
        sources = sorted({r["source"] for r in rows})
        targets = sorted({r["target"] for r in rows})
        by = {(r["source"], r["target"]): r for r in rows}
        parts.append(
            f"<h2>Transfer on <code>{html.escape(label)}</code></h2><p>Rows: the model whose AF1 config is "
            "applied; columns: the model it is applied to, by the same layer numbers (absolute) and by the "
            "same relative depth, on the confirmation split of the target's own search. The diagonal is each "
            "model's own config. A mapped config keeps at least one block to compute in: where it would reach the "
            "target's last block, L_wait is capped at its depth less 2 and L_transfer shortened; each cell names the "
            "config that ran.</p>"
        )
        for how in ("absolute", "relative"):
            parts.append(f"<p><b>{how}</b></p>")
            parts.append(
                table_html(
                    ["config of \\ applied to", *targets],
                    [[s] + [_cell(by[s, t][how]) if (s, t) in by else "" for t in targets] for s in sources],
                )
            )
    return {"transfer": tables}, parts


class Transfer(base.Experiment):
    name = "transfer"
    Options = Options
    Result = Result
    small = {}
    cost = costs.Cost(slowdown=0.6)
    scope = "models"

    def needs(self, options: Options) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Each distinct config once: its own, and the other model's by layers and by depth."""
        return 3 * s.faith + s.clean, 3 * s.half * s.on.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        setup = inputs.resources.setup(inputs.spec)
        searches = inputs.every(Searched)
        mine = next((s for s in searches if s.model == inputs.model_name), None)
        own = searched_config(mine) if mine is not None else None
        on, where = setup, "solved problems"
        if own is not None and mine is not None:  # where this model's own config is fair: not chosen there
            on = allforone.search.confirmation(setup, mine.selection_fraction, mine.split_seed)
            where = "the confirmation split of its own search"
        rows, without, measured = [], {}, {}  # each config's scores here, measured once for every source
        for search in searches:
            config = searched_config(search)
            if config is None:
                without[search.model] = NO_CELL
                continue
            row = allforone.transfer.transfer_config(on, config, search.n_layers, own=own, measured=measured)
            row["source"].update(
                model=search.model, chosen=search.chosen, found=search.found, threshold=search.threshold
            )
            rows.append(row)
        allforone.transfer.transfer_family(rows)
        return Result.of(
            setup.describe(),
            target=inputs.model_name,
            rows=rows,
            sources_without_config=without,
            measured_on=where,
            n_measured=len(on.kept),
            inputs=allforone.faithfulness.setup_inputs(setup, **({} if on is setup else {"confirmation": on})),
        )

    def overview(self, finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
        return overview_of(finished)

    def tables(self, result: Result) -> list[Tab]:
        headers = ["config of", "L_wait / L_transfer", "same layers", "same relative depth", "constant guess"]
        headers.append("own, and whether each differs from it (Holm over this table)")
        rows = [
            [
                r["source"].get("model"),
                f"{r['source']['wait']} / {r['source']['transfer']}"
                + ("" if r["source"].get("chosen", True) else " (best)"),
                f"{r['absolute']['wait']} / {r['absolute']['transfer']}: " + rate_text(r["absolute"]["faithfulness"]),
                f"{r['relative']['wait']} / {r['relative']['transfer']}: " + rate_text(r["relative"]["faithfulness"]),
                r["absolute"]["faithfulness"]["baseline"],
                own_text(r),
            ]
            for r in result.rows
        ]
        return [Tab(headers, rows + [[m, "no config", "", "", "", ""] for m in result.sources_without_config])]

    def section(self, result: Result) -> list[str]:
        return [
            f"<h2>Other models' configs on {html.escape(result.target)}</h2><p>On {result.n_measured} problems "
            f"({result.measured_on}).</p>",
            *super().section(result),
        ]
