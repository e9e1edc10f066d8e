"""HTML pieces every report section is written with: tables, rates with intervals, embedded figures, a page."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from af1.claims import n_to_decide_text, outcome_text
from af1.report import interactive
from af1.stats import with_ci

Rows = Sequence[Mapping[str, Any]]  # JSON records: per-layout rates, layout rows

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
img{max-width:100%} .note{color:#555;font-size:.92em} code{background:#f5f5f5;padding:0 3px}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
.warnings{background:#fff8e1;border-left:3px solid #e0a800;padding:.3em .8em;margin:.5em 0;font-size:.92em}
.guide{background:#f4f8fc;border-left:3px solid #4a7fb0;padding:.3em .8em;margin:.5em 0}
"""


def cell_text(v: Any) -> str:
    """A table cell as text, the same in the report and on the terminal: a float to 3 places, None empty."""
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(v)


def table_html(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain HTML table, every cell escaped (`cell_text`)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


@dataclass(frozen=True)
class Tab:
    """One table of a result, declared once: its report section shows it as HTML, the terminal as a rich table
    (an experiment's `tables`)."""

    headers: list[str]
    rows: list[list[Any]]
    title: str = ""

    def html(self) -> str:
        """The table as HTML under its title; nothing without rows."""
        if not self.rows:
            return ""
        return (f"<p>{html.escape(self.title)}:</p>" if self.title else "") + table_html(self.headers, self.rows)

    def rich(self) -> Table:
        """The table for a terminal."""
        table = Table(*self.headers, title=self.title or None)
        for row in self.rows:
            table.add_row(*map(cell_text, row))
        return table


def stages_tab(stages: dict[str, list[int]] | None) -> Tab:
    """AF1's stages: which layers wait, transfer and compute."""
    rows = [[stage, f"{layers[0]}..{layers[-1]}" if layers else "none"] for stage, layers in (stages or {}).items()]
    return Tab(["stage", "layers"], rows)


def load_json(d: Path, name: str) -> dict[str, Any] | None:
    """A result file of a folder, None where it is not there."""
    path = d / name
    return json.loads(path.read_text()) if path.is_file() else None


def page(title: str, parts: list[str]) -> str:
    """A self-contained HTML page of the given sections: plotly.js embedded once (when a figure needs it) with the
    script that draws the figures and sorts tables; nothing is fetched from elsewhere."""
    title = html.escape(title)
    body = "".join(parts)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
        f"{interactive.page_head(body)}</head><body><h1>{title}</h1>{body}{interactive.page_script()}</body></html>"
    )


def figure_html(figure: Callable[[], str]) -> str:
    """A section's figure, or a note saying why it could not be drawn (the section's tables stand)."""
    try:
        return figure()
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # e.g. a result beside it that does not fit
        return f"<p class='note'>No figure ({html.escape(type(exc).__name__)}: {html.escape(str(exc))}).</p>"


def layout_tab(what: str, by_layout: Rows | None, layouts: Rows | None) -> Tab:
    """The per-layout table under a pooled rate, titled with what is pooled: a row per token layout with its part
    of the rate; no rows for a task of one layout."""
    shape = {row["layout"]: row for row in layouts or []}
    rows = []
    for r in by_layout or []:
        found = shape.get(r["layout"], {})
        example = str(found.get("example_input") or "")
        guess = "" if r.get("baseline") is None else f"{r['baseline']:.3f}"
        rate = with_ci(r["value"], r["ci"])
        rows.append([r["layout"], found.get("n_positions", ""), example[-40:], r["n"], rate, guess])
    headers = ["layout", "positions", "example input (its end)", "n", "rate [95 % CI]", "constant guess"]
    each = f"{len(rows)} layouts, each with its own CAMA means and interventions"
    return Tab(headers, rows, f"{what} per token layout, pooled above ({each})")


def layouts_text(by_layout: Rows | None) -> str:
    """A pooled rate's parts in one line ('' for one layout): 'layout 0: 0.967 [0.83, 0.99], n 30 (constant guess
    0.100); layout 1: ...'."""
    return "; ".join(
        f"layout {r['layout']}: {with_ci(r['value'], r['ci'])}, n {r['n']}"
        + (f" (constant guess {r['baseline']:.3f})" if r.get("baseline") is not None else "")
        for r in by_layout or []
    )


CLAIM_HEADERS = ["outcome", "claim", "estimate [95 % CI]", "n", "baseline", "p", "p adjusted"]
CLAIM_HEADERS += ["p against (adjusted)", "n to decide"]


def claims_html(claims: Rows | None, family: str = "") -> str:
    """The claims of a result with their rule: a row per claim (`af1.claims.Claim`), its outcome first, then its
    numbers; under them how each was decided."""
    rows = []
    for c in claims or []:
        p, adj, q, q_adj = (c.get(key) for key in ("p_value", "p_adjusted", "p_against", "p_against_adjusted"))
        rows.append(
            [
                str(c["outcome"]),
                str(c["statement"]),
                with_ci(c["estimate"], c["ci"]),
                str(c["n"]),
                "" if c.get("baseline") is None else f"{c['baseline']:.3f}",
                "" if p is None else f"{p:.2g}",
                "" if adj is None else f"{adj:.2g}",
                "" if q is None else f"{q:.2g}" + ("" if q_adj is None else f" ({q_adj:.2g})"),
                n_to_decide_text(c),
            ]
        )
    if not rows:
        return ""
    families = sorted({str(c["family"]) for c in claims or [] if c.get("family")})
    rules = sorted({str(c["rule"]) for c in claims or []})
    note = (
        "<p class='note'>Each claim is decided by a rule stated before the data, on problems that did not choose "
        "what it is about: "
        + html.escape("; ".join(rules))
        + "."
        + (" Tests adjusted together: " + html.escape("; ".join(families)) + "." if families else "")
        + " <i>baseline</i>: for a rate, what a constant guess scores on the same problems; for an effect or a "
        "difference, its null. <i>p against</i>: a one-sided claim's test the other way, which rejects it. <i>not "
        "confirmed</i>: neither test decides; <i>n to decide</i> is the n at which the observed estimate would be "
        "decided with 80 % power.</p>"
    )
    return (f"<p>{html.escape(family)}</p>" if family else "") + table_html(CLAIM_HEADERS, rows) + note


def claims_lines(claims: Sequence[Any] | None, title: str = "claims") -> list[str]:
    """The claims for a terminal: a title, then one line each with its outcome and numbers (`outcome_text`)."""
    if not claims:
        return []
    return [f"{title}:", *(f"  {outcome_text(c)}" for c in claims)]


def folded_warnings(warnings: Sequence[str]) -> list[str]:
    """Warnings to show a reader: those that differ only in their answer step and numbers ("step 0: ...",
    "step 1: ...") said once, naming the steps; the result keeps each one whole."""
    shown: list[str] = []
    steps: dict[str, list[str]] = {}  # a warning's shape (step and numbers left out) -> its steps
    first: dict[str, int] = {}  # the shape -> where its first warning is shown
    for warning in warnings:
        step = re.match(r"step (\d+): ", warning)
        if step is None:
            shown.append(warning)
            continue
        shape = re.sub(r"\d+", "#", re.sub(r"\[[\d, ]*\]", "[]", warning[step.end() :]))
        if shape in steps:
            steps[shape].append(step[1])
            continue
        steps[shape] = [step[1]]
        first[shape] = len(shown)
        shown.append(warning)
    for shape, at in first.items():
        if len(steps[shape]) > 1:
            text = shown[at].split(": ", 1)[1]
            shown[at] = f"steps {', '.join(steps[shape])}: {text} (at step {steps[shape][0]}; the others alike)"
    return shown


def warnings_html(warnings: Sequence[str] | None) -> str:
    """A result's warnings (its own and its inputs'), shown under its section; nothing when there are none."""
    if not warnings:
        return ""
    warnings = folded_warnings(warnings)
    items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    title = f"{len(warnings)} warning{'s' * (len(warnings) > 1)}: where these numbers are weaker (click to read)"
    return f'<details class="warnings"><summary><b>{title}</b></summary><ul>{items}</ul></details>'


# What a reader who has not read the paper needs before the numbers (docs/methods.md has the full definitions).
READING_GUIDE = (
    '<details class="guide" open><summary><b>How to read this report</b></summary><p>af1 asks <i>where and when</i> '
    "a language model does mental arithmetic (the All-for-One study): it cuts the paths along which the prompt's "
    "tokens inform its last token, where the answer is predicted, and asks whether the model still answers. "
    "<b>L_wait</b>: through this block nothing specific to the problem may reach the last token. <b>CAMA</b> does "
    "it: at the output of block L_wait each token's state is replaced by its mean over many problems with the same "
    "token there, so a token keeps what it is but loses what it read from the others. <b>L_transfer</b>: in the "
    "next L_transfer blocks the last token may read the other tokens (where the operands could reach it); after "
    "them it sees "
    "only the constant context and itself, so it computes the answer alone. <b>ABP</b> is that attention mask "
    "(after L_wait the other tokens see only the context and themselves, so even the grid's corner with no wait "
    "and transfer everywhere is not the unmodified model). <b>Faithfulness</b>: the share of the "
    "problems the model solves that it still solves under an (L_wait, L_transfer) cell, every answer token "
    "checked. Every number comes with its n, a 95 % interval and the <b>constant guess</b> (what always giving the "
    "most common answer scores on the same problems). A cell is <b>chosen</b> on one half of the problems "
    "(selection): the largest L_wait, then the smallest L_transfer, whose selection faithfulness reaches the "
    "threshold, leaves blocks to compute in and clears the constant guess; where none does, the best cell on the "
    "selection half is judged instead. The claim that it reaches the threshold is then <b>confirmed</b>, "
    "<b>rejected</b> or <b>not confirmed</b> on the other half (confirmation) by its interval, and where the "
    "interval cannot decide, the report says about how many problems would. Full definitions: af1's "
    "<code>docs/methods.md</code>.</p></details>"
)
