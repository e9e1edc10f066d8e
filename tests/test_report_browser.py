"""The interactive report in a real browser (headless Chromium through playwright): it loads with no console error,
no request leaves the file, a sweep cell's hover gives its numbers and a click lists its problems; tables sort; each
figure saves as SVG from its one declaration."""

from __future__ import annotations

import html
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

import af1.api
from af1.report import interactive
from af1.report.markup import page, table_html
from af1.study.report import build_report
from af1.tasks.spec import TaskSpec

from cli_helpers import run_cli
from conftest import fitted_tiny_model

CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get install chromium"


def chromium() -> str:
    """Debian's Chromium (playwright's own download needs the internet); missing, the test fails saying how to
    install it, never skips."""
    found = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    if found is None:
        pytest.fail(f"no Chromium at {CHROMIUM}: install it with `{INSTALL}` (make test does)", pytrace=False)
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev]'", pytrace=False)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield launched
        launched.close()


class Opened:
    """A page of the browser on a file, recording console errors and every request that is not the file's own."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_load_state("load")

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:")):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()


@pytest.fixture(scope="module")
def results(tmp_path_factory, tokenizer) -> Path:
    """A search (threshold 0.5) and the sweep beside it of a tiny fitted model, as `af1 sweep --with
    search.threshold=0.5 --out DIR` writes them."""
    spec = TaskSpec(operation="a+b", shots=1, n=12)
    root = tmp_path_factory.mktemp("browser")
    model = fitted_tiny_model("llama", [spec], tokenizer, n_layers=3)
    model.save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    lm = af1.api.load_model(str(root / "m"))
    af1.api.run("sweep", lm, spec, root / "out", upstream={"search": {"threshold": 0.5}})
    return root / "out"


def cell_point(page: Any, index: int, wait: int, transfer: int) -> tuple[float, float]:
    """Where on the screen the grid `index` draws cell (wait, transfer): from plotly's own axes."""
    area = page.locator("div.af1-plot-area").nth(index)
    area.scroll_into_view_if_needed()
    x, y = page.evaluate(
        """([i, w, k]) => {
            const gd = document.querySelectorAll('div.af1-plot-area')[i], fl = gd._fullLayout;
            const r = gd.getBoundingClientRect();
            return [r.left + fl._size.l + fl.xaxis.d2p(k), r.top + fl._size.t + fl.yaxis.d2p(w)];
        }""",
        [index, wait, transfer],
    )
    return x, y


def test_the_interactive_report_loads_offline_hovers_and_clicks_through(results, browser):
    report = build_report(results)
    text = report.read_text()
    packed = interactive.packed_plotly_js()  # plotly.js embedded once, gzipped, for both grids
    assert text.count(packed) == 1 and len(packed) < len(interactive.plotly_js()) / 2 and len(text) < 2.5e6
    ours = text.replace(packed, "")  # the page around the library
    assert "<script src" not in ours and "http" not in ours.replace("http://www.w3.org", "")
    sweep = json.loads((results / "sweep.json").read_text())
    search = json.loads((results / "search.json").read_text())
    marked = {(search["judged"]["wait"], search["judged"]["transfer"])}
    marked |= {(c["wait"], c["transfer"]) for c in sweep["rule_on_grid"]["frontier"]}
    w, k = next((w, k) for w in range(-1, search["n_layers"]) for k in range(2) if (w, k) not in marked)
    bits = sweep["cells"][f"{w},{k}"]  # a cell the search does not mark: its hover is the grid's own

    opened = Opened(browser, report)
    page = opened.page
    assert page.locator("div.af1-plot-area .main-svg").count() >= 2  # the cells the search measured, and the grid
    assert text.count('class="af1-plot"') == 2 and "The search's rule read off this whole grid judges" in text
    grid = int(text.index("The (L_wait, L_transfer) grid") > text.index("The AF1 search and its claim"))
    x, y = cell_point(page, grid, w, k)
    page.mouse.move(x, y)
    plot = page.locator("div.af1-plot").nth(grid)  # its hover and its detail, not the search figure's
    hover = plot.locator(".hoverlayer")
    hover.locator("text").first.wait_for()
    said = hover.text_content() or ""
    row = w + 1
    faith, low = sweep["faithfulness_wait_transfer"][row][k], sweep["ci_low_wait_transfer"][row][k]
    assert f"L_wait {w}, L_transfer {k}" in said and f"faithfulness {faith:.3f} [{low:.2f}," in said, said
    assert f"n {sweep['n_solved']}" in said and f"constant guess {sweep['faithfulness_baseline']:.3f}" in said, said

    page.mouse.click(x, y)
    detail = plot.locator(".af1-detail")
    detail.locator("table.problems").wait_for()
    rows = detail.locator("table.problems tr")
    assert rows.count() == 1 + sweep["n_solved"] == 1 + len(bits)
    verdicts = [rows.nth(i + 1).locator("td").nth(3).inner_text() for i in range(len(bits))]
    assert verdicts == ["right" if b == "1" else "wrong" for b in bits]
    first = sweep["kept_problems"][0]
    assert rows.nth(1).locator("td").nth(1).inner_text().strip() == first["input"].strip()
    assert rows.nth(1).locator("td").nth(2).inner_text() == str(first["answer_text"])
    assert f"n {len(bits)} ({bits.count('1')} right)" in detail.inner_text()
    assert "not stored" in detail.inner_text()  # no prediction under the cell is invented
    assert opened.errors == [] and opened.outside == []
    page.close()


def test_each_figure_saves_as_svg_for_a_paper(results, browser, capsys):
    """`af1 report` writes the page; each figure's camera button saves SVG, and plotly renders that SVG offline
    from the figure's one declaration (the axis titles inside it)."""
    code, out, _ = run_cli(capsys, "report", str(results))
    assert code == 0 and "wrote" in out
    opened = Opened(browser, results / "report.html")
    page = opened.page
    page.locator("div.af1-plot-area .main-svg").first.wait_for()
    saved = page.evaluate(
        """async () => Promise.all([...document.querySelectorAll('div.af1-plot-area')].map(async (gd) => [
            gd._context.toImageButtonOptions.format, await Plotly.toImage(gd, {format: 'svg'})]))"""
    )
    assert len(saved) == 2 and all(fmt == "svg" for fmt, _ in saved)
    svgs = [unquote(url.split(",", 1)[1]) for _, url in saved]
    assert all(url.startswith("data:image/svg+xml") for _, url in saved)
    assert all("<svg" in svg and "L_transfer" in svg for svg in svgs)
    assert opened.errors == [] and opened.outside == []
    page.close()


def test_a_sortable_table_sorts_by_a_header_click(browser, tmp_path):
    table = table_html(["model", "faithfulness"], [["b", "0.500 [0.30, 0.70]"], ["a", "0.917 [0.6, 1]"], ["c", "n/a"]])
    path = tmp_path / "t.html"
    path.write_text(page("tables", [interactive.sortable(table)]))
    opened = Opened(browser, path)
    cells = opened.page.locator("table.sortable td:first-child")
    header = opened.page.locator("table.sortable th").nth(1)
    header.click()
    assert cells.all_inner_texts() == ["b", "a", "c"]  # numbers by value, then text
    header.click()
    assert cells.all_inner_texts() == ["a", "b", "c"]  # descending; text stays after the numbers
    first = opened.page.locator("table.sortable th").first
    first.click()
    first.click()
    assert cells.all_inner_texts() == ["c", "b", "a"]
    assert opened.errors == [] and opened.outside == []
    opened.page.close()


def test_a_missing_chromium_fails_saying_how_to_install_it(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(pytest.fail.Exception, match="install it with `apt-get install chromium`"):
        chromium()


def test_a_result_the_figure_cannot_read_says_why_and_the_section_stands():
    from af1.report.markup import figure_html

    def old_result() -> str:
        raise KeyError("faithfulness_wait_transfer")

    assert (
        figure_html(old_result) == "<p class='note'>No figure (KeyError: &#x27;faithfulness_wait_transfer&#x27;).</p>"
    )


def test_the_groups_section_shows_each_grouping_s_staircases_and_claims(browser, tokenizer, tmp_path):
    """`af1 groups` on the planted two-route model (its search first), as `af1 report` draws it: one figure per
    grouping with a staircase and a judged cell per group, the groups' table, and the claims with their outcomes;
    it loads offline with no console error, and a judged cell's hover gives its confirmation rate."""
    from test_groups import ALL_SUMS, two_route_model

    result = af1.api.run("groups", two_route_model(tokenizer, 0), ALL_SUMS, tmp_path, by=["size", "found"])
    report = build_report(tmp_path)
    text = html.unescape(report.read_text())
    assert "One circuit or several" in text and "Each group's cell (grouped by size)" in text
    assert "small,small's cell (0, 1) keeps fewer of large,large's problems" in text and "confirmed" in text
    opened = Opened(browser, report)
    page = opened.page
    figures = page.locator("div.af1-plot-area")
    figures.first.wait_for()
    drawn = page.evaluate(
        "() => [...document.querySelectorAll('div.af1-plot-area')].map(g => (g.data || []).map(t => t.name))"
    )
    size = next(names for names in drawn if "small,small: staircase" in names)
    assert {f"{g['name']}: judged cell" for g in result.groupings[0].groups} <= set(size)
    assert len([names for names in drawn if any(n.endswith(": staircase") for n in names)]) == 2  # size and found
    assert opened.errors == [] and opened.outside == []
    page.close()
