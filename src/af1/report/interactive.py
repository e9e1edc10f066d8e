"""Interactive figures for the offline HTML report: plotly.js embedded once per page, each figure its JSON drawn by an
inline script; sweep cells click through to their problems, tables sort, and each figure saves as SVG."""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from af1.stats import Rate, with_ci

if TYPE_CHECKING:  # the parts the figures read; importing them would load torch before a figure is drawn
    from af1.methods.allforone.groups import Grouping
    from af1.methods.allforone.necessity import Necessity
    from af1.methods.allforone.prune import Pruning
    from af1.methods.allforone.rounds import Cell
    from af1.methods.allforone.search import Found
    from af1.methods.allforone.sweep import Grid
    from af1.methods.heads.attention import TokenAttention
    from af1.methods.heads.compared import Ranked
    from af1.methods.heads.study import HeadsStudy
    from af1.methods.heuristics import Pattern
    from af1.methods.neurons import Neurons
    from af1.methods.positional.study import Positional
    from af1.methods.probes import Probes
    from af1.methods.setup import SetupDescription

PLOT_CLASS = "af1-plot"
SORTABLE_CLASS = "sortable"
HOVER = "%{text}<extra></extra>"  # a trace's hover: each point's own text
UNIT = (-0.02, 1.02)  # an axis of rates, 0 and 1 just inside it
STAGE_COLOURS = {"wait": "#bbbbbb", "transfer": "#f0a030", "compute": "#50a050"}
PALETTE = ("#1f77b4", "#d62728", "#9467bd", "#e377c2", "#8c564b", "#17becf", "#bcbd22")


@cache
def plotly_js() -> str:
    """plotly.js as the installed `plotly` package bundles it (minified): embedded, so the page needs no network."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def clean(value: Any) -> Any:
    """JSON-ready: NaN and infinities become null (JSON has neither), tensors and arrays plain lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no '</' can close it early)."""
    return json.dumps(clean(value), separators=(",", ":")).replace("</", "<\\/")


def plot_html(data: list[dict[str, Any]], layout: dict[str, Any], detail: dict[str, Any] | None = None) -> str:
    """One figure: a div the page's script draws from the JSON beside it; `detail` (a sweep's cells and problems)
    makes a click on a cell list that cell's problems under the figure."""
    spec: dict[str, Any] = {"data": data, "layout": {"margin": {"t": 40}, **layout}}
    if detail is not None:
        spec["detail"] = detail
    return (
        f'<div class="{PLOT_CLASS}"><script type="application/json">{script_json(spec)}</script>'
        '<div class="af1-plot-area"></div><div class="af1-detail"></div></div>'
    )


def ci_of(ci: Any) -> list[float | None]:
    """[low, high] of an interval, [None, None] when there is none."""
    return [ci[0], ci[1]] if ci and len(ci) == 2 else [None, None]


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a hover text: a float to `digits` places, "-" where there is none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def hover_of(value: Any, ci: Any, n: Any, baseline: Any) -> str:
    """A rate as hover text: value [interval], n and the constant guess; a missing part says it is missing."""
    low, high = ci_of(ci)
    rate = with_ci(value, [low, high]) + ("" if low is not None else " [interval not stored]")
    guess = fmt(baseline) if baseline is not None else "not stored"
    return f"faithfulness {rate}<br>n {fmt(n)}<br>constant guess {guess}"


def rate_hover(r: Rate) -> str:
    """A rate as hover text (`hover_of` its parts)."""
    return hover_of(r["value"], r["ci"], r["n"], r["baseline"])


# --- the traces and axes every figure is built from ----------------------------------------------------------------


def axis(title: str, **extra: Any) -> dict[str, Any]:
    """An axis titled `title`, with its other settings."""
    return {"title": {"text": title}, **extra}


def heading(text: str, size: int = 13) -> dict[str, Any]:
    """A figure's title in a small font (the titles are long)."""
    return {"text": text, "font": {"size": size}}


def scatter(name: str, x: list[Any], y: list[Any], hover: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A scatter trace, markers unless `mode` says otherwise; with `hover`, each point shows its own text."""
    trace: dict[str, Any] = {"type": "scatter", "mode": "markers", "name": name, "x": x, "y": y, **extra}
    return trace | ({"text": hover, "hovertemplate": HOVER} if hover is not None else {})


def heatmap(z: Any, hover: list[list[str]] | None = None, **extra: Any) -> dict[str, Any]:
    """A heatmap trace; with `hover`, each cell shows its own text."""
    trace: dict[str, Any] = {"type": "heatmap", "z": z, **extra}
    return trace | ({"text": hover, "hovertemplate": HOVER} if hover is not None else {})


def curve(
    x: list[Any], values: list[Any], cis: list[Any] | None, name: str, hover: list[str], **extra: Any
) -> dict[str, Any]:
    """A line with its 95 % intervals as asymmetric error bars (none where they are not stored)."""
    trace = scatter(name, x, values, hover, mode="lines+markers", **extra)
    if cis:
        bounds = [ci_of(ci) for ci in cis]
        up = [None if h is None or v is None else h - v for v, (_, h) in zip(values, bounds, strict=False)]
        down = [None if lo is None or v is None else v - lo for v, (lo, _) in zip(values, bounds, strict=False)]
        bars = {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "thickness": 1, "width": 3}
        trace["error_y"] = bars
    return trace


def rate_curve(x: list[Any], rates: list[Rate], name: str, labels: list[str], **extra: Any) -> dict[str, Any]:
    """A line of rates with their intervals, each point hovered with its label over the rate's parts."""
    hover = [f"{label}<br>{rate_hover(r)}" for label, r in zip(labels, rates, strict=True)]
    return curve(x, [r["value"] for r in rates], [r["ci"] for r in rates], name, hover, **extra)


GUESS = "constant guess"


def levels(*marks: tuple[Any, str, str, str], xref: str = "x", yref: str = "y") -> dict[str, list[dict[str, Any]]]:
    """Horizontal lines across the plot, each (y, label, dash, colour), labelled at its right end; the constant
    guess (`guess`) at its left. A y that is not stored draws nothing. Spread into a layout (shapes, annotations)."""
    shown = [m for m in marks if m[0] is not None]
    domain = f"{xref} domain"
    line = {"type": "line", "xref": domain, "x0": 0, "x1": 1, "yref": yref}
    shapes = [line | {"y0": y, "y1": y, "line": {"dash": d, "color": c}} for y, _, d, c in shown]
    notes = [
        {"xref": domain, "x": 0 if text == GUESS else 1, "yref": yref, "y": y, "text": text, "showarrow": False}
        | {"xanchor": "left" if text == GUESS else "right", "yanchor": "bottom", "font": {"size": 10, "color": c}}
        for y, text, _, c in shown
    ]
    return {"shapes": shapes, "annotations": notes}


def guess(value: Any) -> tuple[Any, str, str, str]:
    """The constant guess as a dotted grey level."""
    return (value, GUESS, "dot", "grey")


# --- the (L_wait, L_transfer) grid, the search's frontier and choice -----------------------------------------------


def cells_heatmap(name: str, x: list[int], y: list[int], z: Any, bar: str, **extra: Any) -> dict[str, Any]:
    """A rate on 0..1 per (L_wait row, L_transfer column) cell, the cells a pixel apart, an empty one not hovered."""
    scale = {"zmin": 0, "zmax": 1, "colorscale": "Viridis", "colorbar": {"title": {"text": bar}}}
    return heatmap(z, name=name, x=x, y=y, **scale, hoverongaps=False, xgap=1, ygap=1, **extra)


def cells_layout(
    title: dict[str, Any], xaxis: dict[str, Any], yaxis: dict[str, Any], n_layers: int, found: Found | None
) -> dict[str, Any]:
    """The layout of a figure over the (L_wait, L_transfer) cells: a tick a layer, the legend below, the search's
    judged cell outlined."""
    return {
        "title": title,
        "xaxis": {**xaxis, "dtick": 1, "zeroline": False},
        "yaxis": {**yaxis, "dtick": 1, "zeroline": False},
        "height": min(900, 340 + 22 * n_layers),
        "legend": {"orientation": "h", "y": -0.2},
        "showlegend": True,  # a lone marker (a best cell, no frontier) is named too
        "shapes": chosen_shape(found),
    }


def sweep_grid(grid: Grid, setup: SetupDescription, found: Found | None = None) -> str:
    """Faithfulness over (L_wait rows, L_transfer columns), each cell hovered with its rate, interval, n, guess and
    executor and clicked through to its problems; with `found`, the search's frontier and cell on top."""
    faith = clean(grid.faithfulness_wait_transfer)
    low, high = clean(grid.ci_low_wait_transfer), clean(grid.ci_high_wait_transfer)
    L = setup.n_layers
    # the columns up to the largest L_transfer swept (a --max-transfer sweep leaves the rest empty)
    width = 1 + max((c for row in faith for c, v in enumerate(row) if v is not None), default=L)
    faith, low, high = ([row[:width] for row in rows] for rows in (faith, low, high))
    waits, transfers = list(range(-1, L)), list(range(width))
    n, baseline = setup.n_solved, grid.faithfulness_baseline
    text = [
        [
            ""
            if faith[r][c] is None
            else f"L_wait {w}, L_transfer {k}<br>"
            + hover_of(faith[r][c], [low[r][c], high[r][c]], n, baseline)
            + f"<br>executor {html.escape(grid.cell_executors.get(f'{w},{k}', grid.executor))}"
            + ("<br>click: its problems" if grid.cells else "")
            for c, k in enumerate(transfers)
        ]
        for r, w in enumerate(waits)
    ]
    data = [cells_heatmap("faithfulness", transfers, waits, faith, "faithfulness", text=text, hovertemplate=HOVER)]
    threshold = found.threshold if found else 0.9
    if marked := confident_cells(low, threshold):
        name = f"95 % interval at or above {threshold} (in-sample, uncorrected across cells: descriptive)"
        x, y = [k for _, k in marked], [w + 0.3 for w, _ in marked]
        data.append(scatter(name, x, y, marker={"symbol": "triangle-up", "color": "red", "size": 6}, hoverinfo="skip"))
    if found:
        data += search_traces(found)
    title = (
        f"AF1 faithfulness: {setup.model} {setup.task} ({setup.style}, {setup.scoring} answer), n={n}, "
        f"constant guess {fmt(baseline)}"
    )
    xaxis = axis("L_transfer (layers in which the last token peeks)")
    yaxis = axis("L_wait (CAMA at the output of this block; -1 = none)")
    layout = cells_layout(heading(html.escape(title)), xaxis, yaxis, L, found)
    return plot_html(data, layout, sweep_detail(grid, faith, low, high))


def confident_cells(low_WK: list[list[float | None]], threshold: float) -> list[tuple[int, int]]:
    """(L_wait, L_transfer) of the cells whose whole 95 % interval (its lower ends by L_wait row from -1 and
    L_transfer column) lies at or above the threshold."""
    return [(r - 1, c) for r, row in enumerate(low_WK) for c, v in enumerate(row) if v is not None and v >= threshold]


def sweep_detail(grid: Grid, faith: list[list[Any]], low: list[list[Any]], high: list[list[Any]]) -> dict[str, Any]:
    """What a click on a cell lists: each problem's input and answer, and the cell's correctness bits (one per solved
    problem, in the order of `kept_problems`)."""
    rates = {}
    for cell in grid.cells:
        w, k = map(int, cell.split(","))
        rates[cell] = {"value": faith[w + 1][k], "ci": [low[w + 1][k], high[w + 1][k]]}
    return {
        "kind": "cells",
        "cells": grid.cells,
        "rates": rates,
        "baseline": grid.faithfulness_baseline,
        "executors": grid.cell_executors,
        "problems": [{"input": p["input"], "answer": p["answer_text"]} for p in grid.kept_problems],
        "no_prediction": "the sweep stores only whether each problem is right under a cell, not what the model "
        "predicted there (af1 run --wait W --transfer K lists the predictions under that cell)",
    }


def cell_text(cell: Cell, n: int) -> str:
    """What a measured cell's square shows: its rate where every selection problem was measured, else its misses of
    the problems measured (✗ misses / measured: it stopped once decided)."""
    if cell["measured"] == n:
        return f"{cell['right'] / n:.2f}"[1:] if cell["right"] < n else "1"
    return f"✗{cell['measured'] - cell['right']}/{cell['measured']}"


def cell_hover(cell: Cell, found: Found) -> str:
    """A measured cell's hover: right of measured on the selection split and why measuring stopped; for the judged
    cell, both splits' rates."""
    from af1.methods.allforone.rounds import STOPS  # torch with it: only when a search is drawn

    text = (
        f"L_wait {cell['wait']}, L_transfer {cell['transfer']}<br>{cell['right']} right of {cell['measured']} "
        f"measured (of {found.n_selection} selection problems)<br>{html.escape(STOPS[cell['stopped']])}"
    )
    judged = found.judged
    if judged is not None and (judged["wait"], judged["transfer"]) == (cell["wait"], cell["transfer"]):
        text += "<br>selection split: " + rate_hover(judged["selection"])
        text += "<br>confirmation split: " + rate_hover(judged["confirmation"])
    return text


def search_traces(found: Found) -> list[dict[str, Any]]:
    """The search's frontier (per L_wait measured, the smallest L_transfer reaching the threshold on the selection
    split) and its judged cell, with both splits' rates in the hover."""
    traces: list[dict[str, Any]] = []
    if frontier := found.frontier:
        name = f"frontier: smallest L_transfer reaching {found.threshold} (selection split)"
        x, y = [f["transfer"] for f in frontier], [f["wait"] for f in frontier]
        style = {"mode": "lines+markers", "line": {"color": "orange", "width": 2}, "marker": {"size": 7}}
        traces.append(scatter(name, x, y, [cell_hover(f, found) for f in frontier], **style))
    if (judged := found.judged) is not None:
        what = "chosen cell" if found.chosen else f"best cell (none reaches {found.threshold})"
        sel = judged["selection"]
        cell: Cell = {
            "wait": judged["wait"],
            "transfer": judged["transfer"],
            "right": sel["k"],
            "measured": sel["n"],
            "stopped": "all",
        }
        marker = {"symbol": "x", "color": "red", "size": 9}
        traces.append(scatter(what, [judged["transfer"]], [judged["wait"]], [cell_hover(cell, found)], marker=marker))
    return traces


def chosen_shape(found: Found | None) -> list[dict[str, Any]]:
    """The search's judged cell outlined in red (dashed where none reached the threshold); none without a search."""
    if found is None or (cell := found.judged) is None:
        return []
    w, k = cell["wait"], cell["transfer"]
    line = {"color": "red", "width": 3, **({} if found.chosen else {"dash": "dash"})}
    return [{"type": "rect", "x0": k - 0.5, "x1": k + 0.5, "y0": w - 0.5, "y1": w + 0.5, "line": line}]


def search_plot(found: Found, n_layers: int) -> str:
    """The cells the search measured: a selection rate where measured whole, else misses of the problems measured
    before it stopped; frontier and judged cell on top. Cells the rule did not need stay empty."""
    L, n = n_layers, found.n_selection
    waits, transfers = list(range(-1, L)), list(range(L + 1))
    z: list[list[float | None]] = [[None] * len(transfers) for _ in waits]
    text = [[""] * len(transfers) for _ in waits]
    hover = [[""] * len(transfers) for _ in waits]
    for cell in found.measured:
        r, c = cell["wait"] + 1, cell["transfer"]
        z[r][c] = cell["right"] / cell["measured"]
        text[r][c], hover[r][c] = cell_text(cell, n), cell_hover(cell, found)
    shown = {"text": text, "texttemplate": "%{text}", "textfont": {"size": 8}}  # each cell's rate or misses
    hovered = {"customdata": hover, "hovertemplate": "%{customdata}<extra></extra>"}
    name = "selection rate on the problems measured"
    data = [cells_heatmap(name, transfers, waits, z, "right / measured", **shown, **hovered), *search_traces(found)]
    stopped = sum(c["measured"] < n for c in found.measured)
    title = (
        f"The cells the search measured: {len(found.measured)}, {stopped} stopped once decided<br>(shown as ✗ misses /"
        f" problems measured), the rest measured on all {n} selection problems (their rate)"
    )  # numbers and fixed words only: nothing to escape
    xaxis, yaxis = axis("L_transfer", range=[-0.5, L + 0.5]), axis("L_wait", range=[-1.5, L - 0.5])
    return plot_html(data, cells_layout(heading(title, 12), xaxis, yaxis, L, found))


def groups_plot(grouping: Grouping, n_layers: int, whole: list[int] | None) -> str:
    """Each group's staircase (per L_wait the first cell reaching the threshold on its selection problems) and judged
    cell, hovered with its confirmation rate; the whole task's judged cell beside them."""
    data: list[dict[str, Any]] = []
    if whole is not None:
        marker = {"size": 20, "symbol": "square-open", "color": "black"}
        hover = "the whole task's judged cell (%{y}, %{x})<extra></extra>"
        data.append(scatter("the whole task's judged cell", [whole[1]], [whole[0]], marker=marker, hovertemplate=hover))
    for i, group in enumerate(grouping.groups):
        colour, name, stairs = PALETTE[i % len(PALETTE)], group["name"], group["frontier"]
        x, y = [c["transfer"] for c in stairs], [c["wait"] for c in stairs]
        style = {"mode": "lines+markers", "legendgroup": name, "line": {"shape": "hv", "color": colour}}
        hover = f"{html.escape(name)}: (%{{y}}, %{{x}})<extra></extra>"
        data.append(scatter(f"{name}: staircase", x, y, **style, hovertemplate=hover))
        if (judged := group["judged"]) is not None:
            what = f"{name}: judged cell" + ("" if group["chosen"] else " (best)")
            marker = {"size": 16, "symbol": "star" if group["chosen"] else "x", "color": colour}
            rate = [rate_hover(judged["confirmation"])]
            hover = f"{html.escape(name)}<br>%{{customdata}}<extra></extra>"
            x, y = [judged["transfer"]], [judged["wait"]]
            data.append(scatter(what, x, y, legendgroup=name, marker=marker, customdata=rate, hovertemplate=hover))
    layout = {
        "title": {"text": f"Each group's staircase and judged cell (grouped by {html.escape(grouping.by)})"},
        "xaxis": axis("L_transfer", range=[-0.5, n_layers + 0.5], dtick=1),
        "yaxis": axis("L_wait", range=[-1.5, n_layers - 0.5], dtick=1),
        "height": min(700, 320 + 14 * n_layers),
        "legend": {"orientation": "h", "y": -0.25},
    }
    return plot_html(data, layout)


# --- curves with their intervals -----------------------------------------------------------------------------------


def necessity_plot(result: Necessity, n: int) -> str:
    """Faithfulness with the last token kept from reading the problem, per first blocked layer and window; and in the
    chosen cell with the transfer window moved later. Each point with its interval, n and constant guess."""
    baseline = next((rates[0]["baseline"] for rates in result.windows.values() if rates), None)
    data = []
    for width, rates in result.windows.items():
        labels = [f"blocked layers {i}..{i + int(width) - 1}" for i in range(len(rates))]
        data.append(rate_curve(list(range(len(rates))), rates, f"{width} layer(s) from here", labels))
    layout: dict[str, Any] = {
        "xaxis": axis("first blocked layer", dtick=1),
        "yaxis": axis("faithfulness", range=UNIT),
        "title": heading("the last token cannot read the problem (operands, slots)"),
        **levels(guess(baseline)),
        "height": 380,
    }
    if shifted := result.shifted_transfer:
        by = shifted["by_start"]
        rates, labels = [s["faithfulness"] for s in by], [f"transfer layers from {s['start']}" for s in by]
        name = f"AF1 ({shifted['config'].cell}), window moved"
        data.append(rate_curve([s["start"] for s in by], rates, name, labels, xaxis="x2", yaxis="y2"))
        layout.update(
            xaxis={**layout["xaxis"], "domain": [0, 0.55]},
            xaxis2=axis("first transfer layer", domain=[0.65, 1], dtick=1, anchor="y2"),
            yaxis2={"range": UNIT, "anchor": "x2"},
        )
        moved = levels(guess(rates[0]["baseline"] if rates else None), xref="x2", yref="y2")
        layout.update({k: layout[k] + v for k, v in moved.items()})
    return plot_html(data, layout)


def pruning_plot(result: Pruning) -> str:
    """Faithfulness on the selection split as transfer heads stop peeking one by one, with intervals, n and the
    constant guess; the line at `keep` (95 %) of the unpruned."""
    rates, order = result.faithfulness_vs_pruned, result.prune_order
    labels = [
        f"{i} heads pruned" + (f" (last: {order[i - 1][0]}.{order[i - 1][1]})" if 0 < i <= len(order) else "")
        for i in range(len(rates))
    ]
    keep = (result.keep * rates[0]["value"], f"{result.keep * 100:.0f} % of unpruned", "dash", "orange")
    layout = {
        "xaxis": axis(
            f"transfer heads that no longer peek (of {result.n_transfer_heads})", dtick=max(1, len(rates) // 20)
        ),
        "yaxis": axis("faithfulness (selection split)", range=UNIT),
        **levels(guess(rates[0]["baseline"]), keep),
        "height": 360,
    }
    return plot_html([rate_curve(list(range(len(rates))), rates, "faithfulness", labels)], layout)


def neurons_plot(result: Neurons) -> str:
    """Faithfulness under AF1 as the top k compute-layer neurons are mean-ablated, beside random sets of k (points,
    mean), k on a log axis; AF1's own faithfulness, half of it and the constant guess as lines."""
    sizes, randoms = result.sizes, result.random_faithfulness
    mean = [sum(r) / len(r) for r in randoms]
    points = scatter(
        "random sets of k (same layers)",
        [k for k, r in zip(sizes, randoms, strict=True) for _ in r],
        [v for r in randoms for v in r],
        marker={"color": "grey", "size": 5, "opacity": 0.5},
        hovertemplate="random set of %{x}: %{y:.3f}<extra></extra>",
    )
    hover = [f"{k} random: mean {fmt(m)}" for k, m in zip(sizes, mean, strict=True)]
    random_mean = curve(sizes, mean, None, "random sets, mean", hover, line={"color": "grey", "dash": "dash"})
    full = result.faithfulness["value"]
    layout = {
        "xaxis": axis("neurons mean-ablated at the last token (k)", type="log"),
        "yaxis": axis("faithfulness under AF1 (confirmation part)", range=UNIT),
        **levels(
            guess(result.faithfulness["baseline"]),
            (full, "AF1, nothing ablated", "solid", "green"),
            (full / 2, "half of it", "dash", "orange"),
        ),
        "height": 380,
    }
    top = rate_curve(sizes, result.top_faithfulness, "top k by attribution", [f"top {k}" for k in sizes])
    return plot_html([top, random_mean, points], layout)


def attribution_plot(result: Ranked) -> str:
    """Each head's exact effect (x) against its attribution estimate (y), the diagonal where they agree; hover names
    the head."""
    exact, estimate, agreement = clean(result.exact_layer_head), clean(result.estimate_layer_head), result.agreement
    pairs = [
        (x, y, f"head {layer}.{h}<br>exact {fmt(x)}<br>estimate {fmt(y)}")
        for layer, (xs, ys) in enumerate(zip(exact, estimate, strict=True))
        for h, (x, y) in enumerate(zip(xs, ys, strict=True))
        if x is not None and y is not None
    ]
    values = [v for x, y, _ in pairs for v in (x, y)] or [0.0]
    low, high = min(values), max(values)
    x, y, hover = [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]
    points = scatter("heads", x, y, hover, marker={"size": 5, "opacity": 0.6})
    rho = with_ci(agreement["spearman"], agreement["spearman_ci"])
    layout = {
        "xaxis": axis(f"exact effect (path '{result.exact_path}'), relative change of the logit"),
        "yaxis": axis("attribution estimate"),
        "title": heading(f"Spearman's rho {rho}, {agreement['n_ranked']} heads, n {agreement['n']}"),
        "shapes": [
            {"type": "line", "x0": low, "y0": low, "x1": high, "y1": high, "line": {"dash": "dot", "color": "grey"}}
        ],
        "height": 400,
    }
    return plot_html([points], layout)


def neuron_patterns_plot(patterns: list[Pattern]) -> str:
    """Each top neuron's activation at the last prompt token under AF1 over the (a, b) grid of solved problems, one
    small heatmap each (blank: a problem not solved, or not in the task), titled with what its pattern follows."""
    cols = 3
    rows = -(-len(patterns) // cols)
    data, layout = [], {"height": 300 * rows + 40, "annotations": [], "margin": {"t": 30}}
    for i, p in enumerate(patterns):
        a_values = sorted({o[0] for o in p["operands"]})
        b_values = sorted({o[1] for o in p["operands"]})
        cell = {(o[0], o[1]): v for o, v in zip(p["operands"], p["activation"], strict=True)}
        z = [[cell.get((a, b)) for a in a_values] for b in b_values]
        k = "" if i == 0 else str(i + 1)
        r, c = divmod(i, cols)
        x0, top = c / cols + 0.02, 1 - (r + 0.1) / rows  # each row: its title, the map, then room for "a"
        layout[f"xaxis{k}"] = axis("a", domain=[x0, x0 + 1 / cols - 0.06], anchor=f"y{k}")
        layout[f"yaxis{k}"] = axis("b", domain=[top - 0.62 / rows, top], anchor=f"x{k}")
        where = {"xref": f"x{k} domain", "yref": f"y{k} domain", "x": 0.5, "y": 1.12, "showarrow": False}
        tags = ", ".join(p["tags"]) or "no grouping above chance"
        layout["annotations"].append({"text": f"{p['layer']}.{p['neuron']}: {tags}", **where, "font": {"size": 11}})
        hover = f"neuron {p['layer']}.{p['neuron']}<br>a %{{x}}, b %{{y}}: %{{z:.3f}}<extra></extra>"
        scale = {"colorscale": "RdBu", "zmid": 0, "showscale": False}
        data.append(heatmap(z, x=a_values, y=b_values, xaxis=f"x{k}", yaxis=f"y{k}", **scale, hovertemplate=hover))
    return plot_html(data, layout)


# --- heads ------------------------------------------------------------------------------------------------------


def heads_map(result: HeadsStudy) -> str:
    """The path-patching effect per (layer, head), layer on the y-axis, key and top heads marked; hover gives each
    head's effect and rank."""
    name, values, key_high = result.ranked_effect()
    effect = clean(values)
    L, H = len(effect), len(effect[0]) if effect else 0
    flat = [v for row in effect for v in row if v is not None]
    lim = max([1e-6, *(abs(v) for v in flat)])
    keys = {tuple(h) for h in result.key_heads}
    top = [tuple(h) for h in result.top_heads]
    where = f"on {result.split['n_selection']} selection problems, path patching: {result.path}"
    text = [
        [
            f"layer {layer}, head {h}<br>{name} {fmt(effect[layer][h])}<br>"
            + ("past the key threshold here" if (layer, h) in keys else "not past the key threshold here")
            + (f", top {top.index((layer, h)) + 1}" if (layer, h) in top else "")
            + f"<br>{where}"
            for h in range(H)
        ]
        for layer in range(L)
    ]
    scale = {"zmin": -lim, "zmax": lim, "colorscale": "RdBu", "reversescale": not key_high}  # a key head red either way
    bar = {"title": {"text": "share" if key_high else "relative change"}}
    data = [heatmap(effect, text, x=list(range(H)), y=list(range(L)), **scale, colorbar=bar, xgap=1, ygap=1)]
    if top:
        ranks = {"text": [str(i + 1) for i in range(len(top))], "textposition": "middle center"}
        marker = {"symbol": "circle", "size": 17, "color": "white", "line": {"color": "black", "width": 1}}
        style = {"mode": "markers+text", "marker": marker, "textfont": {"size": 10, "color": "black"}}
        x, y = [h for _, h in top], [layer for layer, _ in top]
        data.append(scatter("top heads (rank)", x, y, **ranks, **style, hoverinfo="skip"))
    layout = {
        "title": heading(f"{name} ({html.escape(where)})"),
        "xaxis": axis("head", dtick=1),
        "yaxis": axis("layer", dtick=1),
        "height": min(900, 300 + 18 * L),
    }
    return plot_html(data, layout)


def mlp_plot(result: HeadsStudy) -> str:
    """The path-patching effect of each MLP layer and, where measured, its logit lens (layer on the y-axis)."""
    mlp = clean(result.relative_logit_change_mlp_layer)
    lens = clean(result.mlp_logit_lens_layer)
    bar = {"type": "bar", "orientation": "h"}
    name = f"path patching ({result.path}), {result.split['n_selection']} selection problems"
    hover = "MLP of layer %{y}: relative change of the correct logit %{x:.3f}<extra></extra>"
    data = [{**bar, "name": name, "x": mlp, "y": list(range(len(mlp))), "hovertemplate": hover}]
    layout: dict[str, Any] = {
        "title": heading("MLP layers"),
        "xaxis": axis("relative change of the correct logit", domain=[0, 0.45]),
        "yaxis": axis("layer", dtick=1),
        "height": min(700, 290 + 16 * len(mlp)),
        "legend": {"orientation": "h", "y": -0.4},
        "margin": {"t": 40, "b": 110},
    }
    if lens is not None:
        name = f"logit lens ({result.mlp_logit_lens_measured_on})"
        hover = "MLP of layer %{y}: output through the final norm . answer unembedding %{x:.3f}<extra></extra>"
        lensed = {"name": name, "x": lens, "y": list(range(len(lens))), "xaxis": "x2", "yaxis": "y2"}
        data.append({**bar, **lensed, "hovertemplate": hover})
        layout["xaxis2"] = axis("MLP output . answer unembedding", domain=[0.55, 1], anchor="y2")
        layout["yaxis2"] = {"anchor": "x2", "dtick": 1}
    return plot_html(data, layout)


def attention_plot(looks: TokenAttention) -> str:
    """Each top and key head's attention from the last position over one problem's tokens (rows: heads)."""
    tokens, roles = looks["tokens"], looks["roles"]
    heads = list(looks["heads"])
    shown = [repr(t)[1:-1] or "·" for t in tokens]
    text = [
        [
            f"head {h}<br>token {i} {html.escape(shown[i])!s} ({html.escape(str(roles[i]))})<br>"
            f"attention {fmt(looks['heads'][h][i])}"
            for i in range(len(tokens))
        ]
        for h in heads
    ]
    scale = {"zmin": 0, "colorscale": [[0, "#f7fbff"], [1, "#08306b"]]}  # more attention, darker
    x, y, z = list(range(len(tokens))), list(range(len(heads))), [looks["heads"][h] for h in heads]
    data = [heatmap(z, text, x=x, y=y, **scale, colorbar={"title": {"text": "attention"}})]
    short = len(tokens) <= 30
    prompt = html.escape(looks["prompt"])
    title = f"where the heads look from the last position: {prompt} (answer step {looks['answer_step']})"
    layout = {
        "title": heading(title),
        "xaxis": {
            "tickmode": "array",
            "tickvals": x,
            "ticktext": [html.escape(s) for s in shown],
            "tickangle": 0 if short else -60,
            "tickfont": {"size": 11 if short else 9},
        },
        "yaxis": axis("head (layer.head)", tickmode="array", tickvals=y, ticktext=heads, autorange="reversed"),
        "height": 260 + 22 * len(heads),
        "margin": {"t": 40, "b": 90},
    }
    return plot_html(data, layout)


# --- the page's script ----------------------------------------------------------------------------------------------

STYLE = """
.af1-plot{margin:.8em 0}.af1-detail table{font-size:.85em}.af1-detail .scroll{max-height:420px;overflow:auto}
.af1-detail td.input{text-align:left;white-space:pre-wrap;font-family:monospace;font-size:1em}
td.right{color:#176b1b}td.wrong{color:#b00020}table.sortable th{cursor:pointer}
table.sortable th:after{content:" \\21C5";color:#aaa;font-size:.8em}
"""


def page_head(body: str) -> str:
    """What a page's <head> needs for its body: the style, and plotly.js once when it has a figure (packed: the
    page's script unpacks it from this element with a DecompressionStream before drawing)."""
    plots = f'class="{PLOT_CLASS}"' in body
    if not plots and f'class="{SORTABLE_CLASS}"' not in body:
        return ""
    library = f'<script id="af1-plotly" type="application/gzip;base64">{packed_plotly_js()}</script>' if plots else ""
    return f"<style>{STYLE}</style>{library}"


@cache
def packed_plotly_js() -> str:
    """plotly.js gzipped and base64-encoded: 2.0 MB in the page instead of 4.8 (unpacked by the page's script)."""
    return base64.b64encode(gzip.compress(plotly_js().encode(), 9, mtime=0)).decode()


@cache
def page_script() -> str:
    """The script that draws the figures, lists a clicked cell's problems and sorts the tables (report.js beside
    this module), once at the end of the page."""
    return f"<script>{(Path(__file__).parent / 'report.js').read_text()}</script>"


def sortable(fragment: str) -> str:
    """An HTML fragment whose tables sort by a click on a header."""
    return fragment.replace("<table>", f'<table class="{SORTABLE_CLASS}">')


# --- position and meaning in attention logits ---------------------------------------------------------------------


def positional_plot(result: Positional) -> str:
    """Pearson r of a[i-j] + b[i] + c[j] per (layer, head) on the trained model (in sample), the heads' r beside
    random init's, and perplexity as adjacent tokens or position ids are swapped."""
    bar = {"x": 0.265, "len": 0.9, "thickness": 12, "title": {"text": "r"}}
    hover = "layer %{y}, head %{x}<br>r %{z:.3f}<extra></extra>"
    r_map = heatmap(clean(result.r_layer_head), zmin=0, zmax=1, colorscale="Viridis", colorbar=bar, hovertemplate=hover)
    data: list[dict[str, Any]] = [r_map | {"showlegend": False}]
    bins = {"start": -0.2, "end": 1.0, "size": 0.03}
    for r_LH, label in (
        (result.r_layer_head, "trained"),
        (result.r_row_centred_layer_head, "trained, row-centred"),
        (result.r_random_init_layer_head, "random init"),
    ):
        r = [v for row in clean(r_LH) for v in row if v is not None]
        data.append(
            {"type": "histogram", "x": r, "name": label, "opacity": 0.5, "xbins": bins, "xaxis": "x2", "yaxis": "y2"}
        )
    for swapped, label in (
        (result.perplexity_vs_swap, "adjacent tokens swapped"),
        (result.perplexity_vs_position_swap, "position ids swapped"),
    ):
        x, y = [float(f) for f in swapped], clean(list(swapped.values()))
        hover = [f"{label}: {fx:g}<br>perplexity {fmt(v)}" for fx, v in zip(x, y, strict=True)]
        data.append(curve(x, y, None, label, hover, xaxis="x3", yaxis="y3"))
    layout = {
        "barmode": "overlay",
        "height": 400,
        "title": {"text": "position + meaning: r per head (trained, in sample), against random init, and swaps"},
        "xaxis": axis("head", domain=[0, 0.25], dtick=1),
        "yaxis": axis("layer", dtick=1),
        "xaxis2": axis("Pearson r per head", domain=[0.38, 0.64], anchor="y2"),
        "yaxis2": axis("heads", anchor="x2"),
        "xaxis3": axis("fraction swapped", domain=[0.74, 1.0], anchor="y3"),
        "yaxis3": axis("perplexity", anchor="x3"),
        "legend": {"orientation": "h", "y": -0.22},
    }
    return plot_html(data, layout)


# --- probes: what the last token holds, block by block ------------------------------------------------------------


def probes_plot(result: Probes) -> str:
    """Held-out probe accuracy per block and target, unmodified (left) and under AF1 with its no-transfer control
    (right, thin), AF1's stages shaded; the Fourier probe drawn, the linear one a legend click away."""
    panels = [(result.unmodified, "x", "")]
    if result.under_af1:
        panels += [(result.under_af1, "x2", ""), (result.no_transfer, "x2", ", no transfer")]
    data = []
    for curves, xaxis, control in panels:
        for c in curves:
            hover = [
                f"{c['target']} ({c['kind']} probe{control}) after block {i}<br>accuracy {with_ci(a, ci)}, "
                f"n {c['n']}<br>most common label {fmt(c['majority'])}, shuffled labels {fmt(s)}<br>"
                f"{'above chance' if r else 'not above chance'}"
                for i, (a, ci, s, r) in enumerate(
                    zip(c["accuracy"], c["accuracy_ci"], c["shuffled"], c["above_chance"], strict=True)
                )
            ]
            group = f"{c['target']}, {c['kind']}"  # one legend entry toggles the probe in both panels
            colour = PALETTE[result.targets.index(c["target"]) % len(PALETTE)]
            fourier = c["kind"] == "fourier"
            style = {
                "legendgroup": group,
                "showlegend": xaxis == "x",
                "line": {"color": colour, "dash": "solid" if fourier else "dot", "width": 1 if control else 2},
                "marker": {"color": colour, "size": 3 if control else 6},
                "opacity": 0.5 if control else 1,
                **({} if fourier else {"visible": "legendonly"}),
            }
            blocks, cis = list(range(len(c["accuracy"]))), None if control else c["accuracy_ci"]
            yaxis = xaxis.replace("x", "y")
            data.append(curve(blocks, c["accuracy"], cis, group + control, hover, xaxis=xaxis, yaxis=yaxis, **style))
    two = len(panels) > 1
    layout: dict[str, Any] = {
        "xaxis": axis("after block (unmodified)", domain=[0, 0.47] if two else [0, 1]),
        "yaxis": axis("held-out accuracy", range=UNIT),
        "title": heading(
            "what the last token holds (shaded: AF1's wait, transfer and compute blocks; right, thin: the same "
            "CAMA with no transfer layers)"
        ),
        "shapes": stage_shapes(result, list(dict.fromkeys(p[1] for p in panels))),
        "height": 420,
    }
    if two and result.config is not None:
        layout["xaxis2"] = axis(f"after block (under AF1: {result.config.cell})", domain=[0.53, 1], anchor="y2")
        layout["yaxis2"] = {"range": UNIT, "anchor": "x2"}
    return plot_html(data, layout)


def stage_shapes(result: Probes, x_axes: list[str]) -> list[dict[str, Any]]:
    """AF1's wait, transfer and compute blocks shaded on each of the panels' x axes (none without a config)."""
    if result.config is None:
        return []
    n_layers = len(result.unmodified[0]["accuracy"]) if result.unmodified else 0
    w, t = result.config.wait, result.config.transfer
    spans = {"wait": (-0.5, w + 0.5), "transfer": (w + 0.5, w + t + 0.5), "compute": (w + t + 0.5, n_layers - 0.5)}
    return [
        {"type": "rect", "xref": xaxis, "yref": f"{xaxis.replace('x', 'y')} domain", "x0": x0, "x1": x1, "y0": 0}
        | {"y1": 1, "fillcolor": STAGE_COLOURS[stage], "opacity": 0.12, "line": {"width": 0}, "layer": "below"}
        for xaxis in x_axes
        for stage, (x0, x1) in spans.items()
        if x1 > x0
    ]
