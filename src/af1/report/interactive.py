"""Interactive figures for the HTML report, still one offline file: plotly.js is embedded once per page (from the
`plotly` package, never a CDN), each figure is its JSON beside a div that a small inline script draws, a sweep cell
clicks through to its problems, tables marked sortable sort by a header click, and each figure's camera button saves
it as SVG (a paper's static copy, from the same declaration)."""

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


# --- the (L_wait, L_transfer) grid, the search's frontier and choice -----------------------------------------------


def sweep_grid(grid: Grid, setup: SetupDescription, found: Found | None = None) -> str:
    """Faithfulness over (L_wait rows, L_transfer columns), the layer on the y-axis; hover gives each
    cell's rate, 95 % interval, n, constant guess and executor; a click lists the cell's problems and whether each is
    right under it. With `found` (a search), its frontier and its chosen (or best) cell on top."""
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
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "name": "faithfulness",
            "x": transfers,
            "y": waits,
            "z": faith,
            "zmin": 0,
            "zmax": 1,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": "faithfulness"}},
            "text": text,
            "hovertemplate": "%{text}<extra></extra>",
            "hoverongaps": False,
            "xgap": 1,
            "ygap": 1,
        }
    ]
    threshold = found.threshold if found else 0.9
    marked = confident_cells(low, threshold)
    if marked:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"95 % interval at or above {threshold} (in-sample, uncorrected across cells: descriptive)",
                "x": [k for _, k in marked],
                "y": [w + 0.3 for w, _ in marked],
                "marker": {"symbol": "triangle-up", "color": "red", "size": 6},
                "hoverinfo": "skip",
            }
        )
    if found:
        data += search_traces(found)
    title = (
        f"AF1 faithfulness: {setup.model} {setup.task} ({setup.style}, {setup.scoring} answer), n={n}, "
        f"constant guess {fmt(baseline)}"
    )
    layout = {
        "title": {"text": html.escape(title), "font": {"size": 13}},
        "xaxis": {
            "title": {"text": "L_transfer (layers in which the last token peeks)"},
            "dtick": 1,
            "zeroline": False,
        },
        "yaxis": {
            "title": {"text": "L_wait (CAMA at the output of this block; -1 = none)"},
            "dtick": 1,
            "zeroline": False,
        },
        "height": min(900, 340 + 22 * L),
        "legend": {"orientation": "h", "y": -0.2},
        "showlegend": True,  # a lone marker (a best cell, no frontier) is named too
        "shapes": chosen_shape(found) if found else [],
    }
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
        sel, conf = judged["selection"], judged["confirmation"]
        text += "<br>selection split: " + rate_hover(sel)
        text += "<br>confirmation split: " + rate_hover(conf)
    return text


def search_traces(found: Found) -> list[dict[str, Any]]:
    """The search's frontier (per L_wait measured, the smallest L_transfer reaching the threshold on the selection
    split) and its judged cell, with both splits' rates in the hover."""
    traces: list[dict[str, Any]] = []
    if found.frontier:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"frontier: smallest L_transfer reaching {found.threshold} (selection split)",
                "x": [f["transfer"] for f in found.frontier],
                "y": [f["wait"] for f in found.frontier],
                "line": {"color": "orange", "width": 2},
                "marker": {"size": 7},
                "text": [cell_hover(f, found) for f in found.frontier],
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
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
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": what,
                "x": [judged["transfer"]],
                "y": [judged["wait"]],
                "marker": {"symbol": "x", "color": "red", "size": 9},
                "text": [cell_hover(cell, found)],
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    return traces


def chosen_shape(found: Found) -> list[dict[str, Any]]:
    """The search's judged cell outlined in red (dashed where none reached the threshold)."""
    if (cell := found.judged) is None:
        return []
    w, k = cell["wait"], cell["transfer"]
    line = {"color": "red", "width": 3, **({} if found.chosen else {"dash": "dash"})}
    return [{"type": "rect", "x0": k - 0.5, "x1": k + 0.5, "y0": w - 0.5, "y1": w + 0.5, "line": line}]


def search_plot(found: Found, n_layers: int) -> str:
    """The cells the search measured on the (L_wait, L_transfer) axes: each one's selection rate where it was
    measured whole, else its misses of the problems measured before it stopped (hover: why); the frontier and the
    judged cell on top. Cells it never measured stay empty: the rule did not need them."""
    L, n = n_layers, found.n_selection
    waits, transfers = list(range(-1, L)), list(range(L + 1))
    z: list[list[float | None]] = [[None] * len(transfers) for _ in waits]
    text = [[""] * len(transfers) for _ in waits]
    hover = [[""] * len(transfers) for _ in waits]
    for cell in found.measured:
        r, c = cell["wait"] + 1, cell["transfer"]
        z[r][c] = cell["right"] / cell["measured"]
        text[r][c], hover[r][c] = cell_text(cell, n), cell_hover(cell, found)
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "name": "selection rate on the problems measured",
            "x": transfers,
            "y": waits,
            "z": z,
            "zmin": 0,
            "zmax": 1,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": "right / measured"}},
            "text": text,
            "texttemplate": "%{text}",
            "textfont": {"size": 8},
            "customdata": hover,
            "hovertemplate": "%{customdata}<extra></extra>",
            "hoverongaps": False,
            "xgap": 1,
            "ygap": 1,
        },
        *search_traces(found),
    ]
    stopped = sum(c["measured"] < n for c in found.measured)
    title = (
        f"The cells the search measured: {len(found.measured)}, {stopped} stopped once decided<br>(shown as ✗ misses /"
        f" problems measured), the rest measured on all {n} selection problems (their rate)"
    )  # numbers and fixed words only: nothing to escape
    layout = {
        "title": {"text": title, "font": {"size": 12}},
        "xaxis": {"title": {"text": "L_transfer"}, "range": [-0.5, L + 0.5], "dtick": 1, "zeroline": False},
        "yaxis": {"title": {"text": "L_wait"}, "range": [-1.5, L - 0.5], "dtick": 1, "zeroline": False},
        "height": min(900, 340 + 22 * L),
        "legend": {"orientation": "h", "y": -0.2},
        "showlegend": True,
        "shapes": chosen_shape(found),
    }
    return plot_html(data, layout)


def groups_plot(grouping: Grouping, n_layers: int, whole: list[int] | None) -> str:
    """Each group's staircase on the (L_transfer, L_wait) axes (per L_wait its first cell reaching the threshold on
    the group's selection problems) and its judged cell, hovered with its confirmation rate; the whole task's judged
    cell beside them."""
    data: list[dict[str, Any]] = []
    if whole is not None:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "the whole task's judged cell",
                "x": [whole[1]],
                "y": [whole[0]],
                "marker": {"size": 20, "symbol": "square-open", "color": "black"},
                "hovertemplate": "the whole task's judged cell (%{y}, %{x})<extra></extra>",
            }
        )
    for i, group in enumerate(grouping.groups):
        colour = PALETTE[i % len(PALETTE)]
        stairs = group["frontier"]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{group['name']}: staircase",
                "legendgroup": group["name"],
                "x": [c["transfer"] for c in stairs],
                "y": [c["wait"] for c in stairs],
                "line": {"shape": "hv", "color": colour},
                "hovertemplate": f"{html.escape(group['name'])}: (%{{y}}, %{{x}})<extra></extra>",
            }
        )
        judged = group["judged"]
        if judged is not None:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"{group['name']}: judged cell" + ("" if group["chosen"] else " (best)"),
                    "legendgroup": group["name"],
                    "x": [judged["transfer"]],
                    "y": [judged["wait"]],
                    "marker": {"size": 16, "symbol": "star" if group["chosen"] else "x", "color": colour},
                    "customdata": [rate_hover(judged["confirmation"])],
                    "hovertemplate": f"{html.escape(group['name'])}<br>%{{customdata}}<extra></extra>",
                }
            )
    layout = {
        "title": {"text": f"Each group's staircase and judged cell (grouped by {html.escape(grouping.by)})"},
        "xaxis": {"title": {"text": "L_transfer"}, "range": [-0.5, n_layers + 0.5], "dtick": 1},
        "yaxis": {"title": {"text": "L_wait"}, "range": [-1.5, n_layers - 0.5], "dtick": 1},
        "height": min(700, 320 + 14 * n_layers),
        "legend": {"orientation": "h", "y": -0.25},
    }
    return plot_html(data, layout)


# --- curves with their intervals -----------------------------------------------------------------------------------


def curve(
    x: list[Any], values: list[Any], cis: list[Any] | None, name: str, hover: list[str], **extra: Any
) -> dict[str, Any]:
    """A line with its 95 % intervals as asymmetric error bars (none where they are not stored)."""
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines+markers",
        "name": name,
        "x": x,
        "y": values,
        "text": hover,
        "hovertemplate": "%{text}<extra></extra>",
        **extra,
    }
    if cis:
        bounds = [ci_of(ci) for ci in cis]
        trace["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": [None if h is None or v is None else h - v for v, (_, h) in zip(values, bounds, strict=False)],
            "arrayminus": [
                None if lo is None or v is None else v - lo for v, (lo, _) in zip(values, bounds, strict=False)
            ],
            "thickness": 1,
            "width": 3,
        }
    return trace


GUESS = "constant guess"


def levels(*marks: tuple[Any, str, str, str], xref: str = "x", yref: str = "y") -> dict[str, list[dict[str, Any]]]:
    """Horizontal lines across the plot, each (y, label, dash, colour), labelled at its right end; the constant
    guess (`guess`) at its left. A y that is not stored draws nothing. Spread into a layout (shapes, annotations)."""
    shown = [m for m in marks if m[0] is not None]
    domain = f"{xref} domain"
    shapes = [
        {
            "type": "line",
            "xref": domain,
            "x0": 0,
            "x1": 1,
            "yref": yref,
            "y0": y,
            "y1": y,
            "line": {"dash": d, "color": c},
        }
        for y, _, d, c in shown
    ]
    notes = [
        {"xref": domain, "x": 0 if text == GUESS else 1, "yref": yref, "y": y, "text": text, "showarrow": False}
        | {"xanchor": "left" if text == GUESS else "right", "yanchor": "bottom", "font": {"size": 10, "color": c}}
        for y, text, _, c in shown
    ]
    return {"shapes": shapes, "annotations": notes}


def guess(value: Any) -> tuple[Any, str, str, str]:
    """The constant guess as a dotted grey level."""
    return (value, GUESS, "dot", "grey")


def necessity_plot(result: Necessity, n: int) -> str:
    """Faithfulness with the last token kept from reading the problem, per first blocked layer and window width; and,
    inside the search's chosen cell, with the transfer window moved later. Every point: its interval, n and constant
    guess."""
    baseline = next((rates[0]["baseline"] for rates in result.windows.values() if rates), None)
    data = []
    for width, rates in result.windows.items():
        hover = [f"blocked layers {i}..{i + int(width) - 1}<br>" + rate_hover(r) for i, r in enumerate(rates)]
        values, cis = [r["value"] for r in rates], [r["ci"] for r in rates]
        data.append(curve(list(range(len(rates))), values, cis, f"{width} layer(s) from here", hover))
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": "first blocked layer"}, "dtick": 1},
        "yaxis": {"title": {"text": "faithfulness"}, "range": [-0.02, 1.02]},
        "title": {"text": "the last token cannot read the problem (operands, slots)", "font": {"size": 13}},
        **levels(guess(baseline)),
        "height": 380,
    }
    shifted = result.shifted_transfer
    if shifted:
        by = shifted["by_start"]
        hover = [f"transfer layers from {s['start']}<br>" + rate_hover(s["faithfulness"]) for s in by]
        data.append(
            curve(
                [s["start"] for s in by],
                [s["faithfulness"]["value"] for s in by],
                [s["faithfulness"]["ci"] for s in by],
                f"AF1 ({shifted['config'].cell}), window moved",
                hover,
                xaxis="x2",
                yaxis="y2",
            )
        )
        layout.update(
            xaxis={**layout["xaxis"], "domain": [0, 0.55]},
            xaxis2={"title": {"text": "first transfer layer"}, "domain": [0.65, 1], "dtick": 1, "anchor": "y2"},
            yaxis2={"range": [-0.02, 1.02], "anchor": "x2"},
        )
        moved = levels(guess(by[0]["faithfulness"]["baseline"] if by else None), xref="x2", yref="y2")
        layout.update({k: layout[k] + v for k, v in moved.items()})
    return plot_html(data, layout)


def pruning_plot(result: Pruning) -> str:
    """Faithfulness on the selection split as transfer heads stop peeking one by one, with intervals, n and the
    constant guess; the line at `keep` (95 %) of the unpruned."""
    rates, order = result.faithfulness_vs_pruned, result.prune_order
    values, cis, baseline = [r["value"] for r in rates], [r["ci"] for r in rates], rates[0]["baseline"]
    hover = [
        (f"{i} heads pruned" + (f" (last: {order[i - 1][0]}.{order[i - 1][1]})" if 0 < i <= len(order) else ""))
        + "<br>"
        + rate_hover(r)
        for i, r in enumerate(rates)
    ]
    keep = result.keep * values[0]
    layout = {
        "xaxis": {
            "title": {"text": f"transfer heads that no longer peek (of {result.n_transfer_heads})"},
            "dtick": max(1, len(values) // 20),
        },
        "yaxis": {"title": {"text": "faithfulness (selection split)"}, "range": [-0.02, 1.02]},
        **levels(guess(baseline), (keep, f"{result.keep * 100:.0f} % of unpruned", "dash", "orange")),
        "height": 360,
    }
    return plot_html([curve(list(range(len(values))), values, cis, "faithfulness", hover)], layout)


def neurons_plot(result: Neurons) -> str:
    """Faithfulness under AF1 on the confirmation part as the top k neurons of the compute layers are mean-ablated
    (with intervals), beside each random set of k from the same layers (points) and their mean; k on a log axis;
    AF1's own faithfulness and half of it as lines, the constant guess dotted."""
    sizes, baseline, tops = result.sizes, result.faithfulness["baseline"], result.top_faithfulness
    hover = [f"top {k}<br>" + rate_hover(r) for k, r in zip(sizes, tops, strict=True)]
    randoms = result.random_faithfulness
    mean = [sum(r) / len(r) for r in randoms]
    points = {
        "type": "scatter",
        "mode": "markers",
        "name": "random sets of k (same layers)",
        "x": [k for k, r in zip(sizes, randoms, strict=True) for _ in r],
        "y": [v for r in randoms for v in r],
        "marker": {"color": "grey", "size": 5, "opacity": 0.5},
        "hovertemplate": "random set of %{x}: %{y:.3f}<extra></extra>",
    }
    random_mean = curve(
        sizes,
        mean,
        None,
        "random sets, mean",
        [f"{k} random: mean {fmt(m)}" for k, m in zip(sizes, mean, strict=True)],
        line={"color": "grey", "dash": "dash"},
    )
    full = result.faithfulness["value"]
    layout = {
        "xaxis": {"title": {"text": "neurons mean-ablated at the last token (k)"}, "type": "log"},
        "yaxis": {"title": {"text": "faithfulness under AF1 (confirmation part)"}, "range": [-0.02, 1.02]},
        **levels(
            guess(baseline),
            (full, "AF1, nothing ablated", "solid", "green"),
            (full / 2, "half of it", "dash", "orange"),
        ),
        "height": 380,
    }
    top = curve(sizes, [r["value"] for r in tops], [r["ci"] for r in tops], "top k by attribution", hover)
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
    points = {
        "type": "scatter",
        "mode": "markers",
        "name": "heads",
        "x": [x for x, _, _ in pairs],
        "y": [y for _, y, _ in pairs],
        "text": [t for _, _, t in pairs],
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"size": 5, "opacity": 0.6},
    }
    layout = {
        "xaxis": {"title": {"text": f"exact effect (path '{result.exact_path}'), relative change of the logit"}},
        "yaxis": {"title": {"text": "attribution estimate"}},
        "title": {
            "text": f"Spearman's rho {with_ci(agreement['spearman'], agreement['spearman_ci'])}, "
            f"{agreement['n_ranked']} heads, n {agreement['n']}",
            "font": {"size": 13},
        },
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
        layout[f"xaxis{k}"] = {"domain": [x0, x0 + 1 / cols - 0.06], "anchor": f"y{k}", "title": {"text": "a"}}
        layout[f"yaxis{k}"] = {"domain": [top - 0.62 / rows, top], "anchor": f"x{k}", "title": {"text": "b"}}
        tags = ", ".join(p["tags"]) or "no grouping above chance"
        layout["annotations"].append(
            {
                "text": f"{p['layer']}.{p['neuron']}: {tags}",
                "xref": f"x{k} domain",
                "yref": f"y{k} domain",
                "x": 0.5,
                "y": 1.12,
                "showarrow": False,
                "font": {"size": 11},
            }
        )
        data.append(
            {
                "type": "heatmap",
                "x": a_values,
                "y": b_values,
                "z": z,
                "xaxis": f"x{k}",
                "yaxis": f"y{k}",
                "colorscale": "RdBu",
                "zmid": 0,
                "showscale": False,
                "hovertemplate": f"neuron {p['layer']}.{p['neuron']}<br>a %{{x}}, b %{{y}}: %{{z:.3f}}<extra></extra>",
            }
        )
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
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "x": list(range(H)),
            "y": list(range(L)),
            "z": effect,
            "zmin": -lim,
            "zmax": lim,
            "colorscale": "RdBu",
            "reversescale": not key_high,  # a key head red either way
            "colorbar": {"title": {"text": "share" if key_high else "relative change"}},
            "text": text,
            "hovertemplate": "%{text}<extra></extra>",
            "xgap": 1,
            "ygap": 1,
        }
    ]
    if top:
        data.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "top heads (rank)",
                "x": [h for _, h in top],
                "y": [layer for layer, _ in top],
                "text": [str(i + 1) for i in range(len(top))],
                "textposition": "middle center",
                "marker": {"symbol": "circle", "size": 17, "color": "white", "line": {"color": "black", "width": 1}},
                "textfont": {"size": 10, "color": "black"},
                "hoverinfo": "skip",
            }
        )
    layout = {
        "title": {"text": f"{name} ({html.escape(where)})", "font": {"size": 13}},
        "xaxis": {"title": {"text": "head"}, "dtick": 1},
        "yaxis": {"title": {"text": "layer"}, "dtick": 1},
        "height": min(900, 300 + 18 * L),
    }
    return plot_html(data, layout)


def mlp_plot(result: HeadsStudy) -> str:
    """The path-patching effect of each MLP layer and, where measured, its logit lens (layer on the y-axis)."""
    mlp = clean(result.relative_logit_change_mlp_layer)
    lens = clean(result.mlp_logit_lens_layer)
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "orientation": "h",
            "name": f"path patching ({result.path}), {result.split['n_selection']} selection problems",
            "x": mlp,
            "y": list(range(len(mlp))),
            "hovertemplate": "MLP of layer %{y}: relative change of the correct logit %{x:.3f}<extra></extra>",
        }
    ]
    layout: dict[str, Any] = {
        "title": {"text": "MLP layers", "font": {"size": 13}},
        "xaxis": {"title": {"text": "relative change of the correct logit"}, "domain": [0, 0.45]},
        "yaxis": {"title": {"text": "layer"}, "dtick": 1},
        "height": min(700, 290 + 16 * len(mlp)),
        "legend": {"orientation": "h", "y": -0.4},
        "margin": {"t": 40, "b": 110},
    }
    if lens is not None:
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"logit lens ({result.mlp_logit_lens_measured_on})",
                "x": lens,
                "y": list(range(len(lens))),
                "xaxis": "x2",
                "yaxis": "y2",
                "hovertemplate": "MLP of layer %{y}: output through the final norm . answer unembedding %{x:.3f}"
                "<extra></extra>",
            }
        )
        layout["xaxis2"] = {"title": {"text": "MLP output . answer unembedding"}, "domain": [0.55, 1], "anchor": "y2"}
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
    data = [
        {
            "type": "heatmap",
            "x": list(range(len(tokens))),
            "y": list(range(len(heads))),
            "z": [looks["heads"][h] for h in heads],
            "zmin": 0,
            "colorscale": [[0, "#f7fbff"], [1, "#08306b"]],  # more attention, darker
            "colorbar": {"title": {"text": "attention"}},
            "text": text,
            "hovertemplate": "%{text}<extra></extra>",
        }
    ]
    layout = {
        "title": {
            "text": f"where the heads look from the last position: {html.escape(looks['prompt'])} "
            f"(answer step {looks['answer_step']})",
            "font": {"size": 13},
        },
        "xaxis": {
            "tickmode": "array",
            "tickvals": list(range(len(tokens))),
            "ticktext": [html.escape(s) for s in shown],
            "tickangle": 0 if len(tokens) <= 30 else -60,
            "tickfont": {"size": 11 if len(tokens) <= 30 else 9},
        },
        "yaxis": {
            "title": {"text": "head (layer.head)"},
            "tickmode": "array",
            "tickvals": list(range(len(heads))),
            "ticktext": heads,
            "autorange": "reversed",
        },
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


@cache
def boot_js() -> str:
    """The page's script (report.js beside this module): draws each figure, lists a clicked cell's problems, sorts
    tables."""
    return (Path(__file__).parent / "report.js").read_text()


def page_head(body: str) -> str:
    """What a page's <head> needs for its body: the style, and plotly.js once when it has a figure."""
    plots = f'class="{PLOT_CLASS}"' in body
    if not plots and f'class="{SORTABLE_CLASS}"' not in body:
        return ""
    library = f'<script id="{PACKED_ID}" type="application/gzip;base64">{packed_plotly_js()}</script>' if plots else ""
    return f"<style>{STYLE}</style>{library}"


PACKED_ID = "af1-plotly"  # report.js unpacks the library from this element (DecompressionStream) before drawing


@cache
def packed_plotly_js() -> str:
    """plotly.js gzipped and base64-encoded: 2.0 MB in the page instead of 4.8 (unpacked by the page's script)."""
    return base64.b64encode(gzip.compress(plotly_js().encode(), 9, mtime=0)).decode()


def page_script() -> str:
    """The script that draws the figures and sorts the tables, once at the end of the page."""
    return f"<script>{boot_js()}</script>"


def sortable(fragment: str) -> str:
    """An HTML fragment whose tables sort by a click on a header."""
    return fragment.replace("<table>", f'<table class="{SORTABLE_CLASS}">')


# --- position and meaning in attention logits ---------------------------------------------------------------------


def positional_plot(result: Positional) -> str:
    """Pearson r of a[i-j] + b[i] + c[j] per (layer, head) on the trained model (in sample), the heads' r beside
    random init's, and perplexity as adjacent tokens or position ids are swapped."""
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "z": clean(result.r_layer_head),
            "zmin": 0,
            "zmax": 1,
            "colorscale": "Viridis",
            "colorbar": {"x": 0.265, "len": 0.9, "thickness": 12, "title": {"text": "r"}},
            "hovertemplate": "layer %{y}, head %{x}<br>r %{z:.3f}<extra></extra>",
            "showlegend": False,
        }
    ]
    for r_LH, label in (
        (result.r_layer_head, "trained"),
        (result.r_row_centred_layer_head, "trained, row-centred"),
        (result.r_random_init_layer_head, "random init"),
    ):
        r = [v for row in clean(r_LH) for v in row if v is not None]
        bins = {"start": -0.2, "end": 1.0, "size": 0.03}
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
        "xaxis": {"domain": [0, 0.25], "title": {"text": "head"}, "dtick": 1},
        "yaxis": {"title": {"text": "layer"}, "dtick": 1},
        "xaxis2": {"domain": [0.38, 0.64], "anchor": "y2", "title": {"text": "Pearson r per head"}},
        "yaxis2": {"anchor": "x2", "title": {"text": "heads"}},
        "xaxis3": {"domain": [0.74, 1.0], "anchor": "y3", "title": {"text": "fraction swapped"}},
        "yaxis3": {"anchor": "x3", "title": {"text": "perplexity"}},
        "legend": {"orientation": "h", "y": -0.22},
    }
    return plot_html(data, layout)


# --- probes: what the last token holds, block by block ------------------------------------------------------------

STAGE_COLOURS = {"wait": "#bbbbbb", "transfer": "#f0a030", "compute": "#50a050"}
PALETTE = ("#1f77b4", "#d62728", "#9467bd", "#e377c2", "#8c564b", "#17becf", "#bcbd22")


def probes_plot(result: Probes) -> str:
    """Held-out probe accuracy after every block, per target, on the unmodified model (left) and under AF1 (right,
    beside it thin: the control with no transfer layers), AF1's stages shaded on both; the Fourier probe drawn, the
    linear one a click away in the legend."""
    panels = [(result.unmodified, "x", "y", "")]
    if result.under_af1:
        panels += [(result.under_af1, "x2", "y2", ""), (result.no_transfer, "x2", "y2", ", no transfer")]
    data = []
    for curves, xaxis, yaxis, control in panels:
        for c in curves:
            blocks = list(range(len(c["accuracy"])))
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
            style = {
                "legendgroup": group,
                "showlegend": xaxis == "x",
                "line": {
                    "color": colour,
                    "dash": "solid" if c["kind"] == "fourier" else "dot",
                    "width": 1 if control else 2,
                },
                "marker": {"color": colour, "size": 3 if control else 6},
                "opacity": 0.5 if control else 1,
                **({} if c["kind"] == "fourier" else {"visible": "legendonly"}),
            }
            data.append(
                curve(
                    blocks,
                    c["accuracy"],
                    None if control else c["accuracy_ci"],
                    group + control,
                    hover,
                    xaxis=xaxis,
                    yaxis=yaxis,
                    **style,
                )
            )
    shapes = stage_shapes(result, list(dict.fromkeys(p[1] for p in panels)))
    two = len(panels) > 1
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": "after block (unmodified)"}, "domain": [0, 0.47] if two else [0, 1]},
        "yaxis": {"title": {"text": "held-out accuracy"}, "range": [-0.02, 1.02]},
        "title": {
            "text": "what the last token holds (shaded: AF1's wait, transfer and compute blocks; right, thin: the same "
            "CAMA with no transfer layers)",
            "font": {"size": 13},
        },
        "shapes": shapes,
        "height": 420,
    }
    if two and result.config is not None:
        af1 = f"after block (under AF1: {result.config.cell})"
        layout["xaxis2"] = {"title": {"text": af1}, "domain": [0.53, 1], "anchor": "y2"}
        layout["yaxis2"] = {"range": [-0.02, 1.02], "anchor": "x2"}
    return plot_html(data, layout)


def stage_shapes(result: Probes, x_axes: list[str]) -> list[dict[str, Any]]:
    """AF1's wait, transfer and compute blocks shaded on each of the panels' x axes (none without a config)."""
    if result.config is None:
        return []
    n_layers = len(result.unmodified[0]["accuracy"]) if result.unmodified else 0
    w, t = result.config.wait, result.config.transfer
    spans = {"wait": (-0.5, w + 0.5), "transfer": (w + 0.5, w + t + 0.5), "compute": (w + t + 0.5, n_layers - 0.5)}
    return [
        {
            "type": "rect",
            "xref": xaxis,
            "yref": f"{xaxis.replace('x', 'y')} domain",
            "x0": x0,
            "x1": x1,
            "y0": 0,
            "y1": 1,
            "fillcolor": STAGE_COLOURS[stage],
            "opacity": 0.12,
            "line": {"width": 0},
            "layer": "below",
        }
        for xaxis in x_axes
        for stage, (x0, x1) in spans.items()
        if x1 > x0
    ]
