"""groups: one circuit or several: the AF1 search per group of problems (carry or none, operand size, found groups).
Each group's cell chosen on its selection half; the claims decided on confirmation problems, Holm per grouping."""

from __future__ import annotations

import html

from pydantic import Field, field_validator
from rich.table import Table

from af1.claims import outcome_text
from af1.experiments import base, costs
from af1.experiments.search import the_search
from af1.methods import allforone
from af1.methods.allforone.groups import FOUND, MIN_SIDE, PROFILE, Grouping
from af1.report import interactive
from af1.report.markup import Tab, claims_html, claims_lines, figure_html
from af1.stats import Rate, rate_text, split_indices
from af1.tasks.evaluation import ProblemInputs

# the share of the (L_wait, L_transfer) grid the groups' searches measure on the selection problems, staircases
# included: 0.35 to 0.71 per grouping in the demo's two models (its cost)
GRID_SHARE = 0.5


class Options(base.Options):
    selection: base.Share = Field(
        default=0.5, description="share of each group's solved problems its search chooses on (with the search's seed)"
    )
    by: list[str] = Field(
        default_factory=lambda: ["carry", FOUND],
        description="groupings: carry, carryN, borrow, borrowN, size, answer_length, a task file's column, or found "
        "(clusters of the selection problems' profiles, carried to every problem by what it is)",
    )
    reference: bool = Field(default=False, description="the hook-based path instead of the fast executor")

    @field_validator("by")
    @classmethod
    def _some(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) < len(v):
            raise ValueError("by must name at least one grouping, each once")
        return v


class Result(base.SetupFields):
    """The groupings on one split of the solved problems at the search's threshold, with `whole` the whole task's
    judged cell; inputs: solved, selection, confirmation (the groups' halves), whole_confirmation (the search's)."""

    threshold: float
    selection_fraction: float
    split_seed: int
    whole: list[int] | None
    groupings: list[Grouping]
    executor: str
    inputs: ProblemInputs


class Groups(base.Experiment):
    name = "groups"
    Options = Options
    Result = Result
    small = {"by": ["size", FOUND]}
    cost = costs.Cost(slowdown=0.36)

    def needs(self, options: Options) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Per grouping: its groups' staircases (GRID_SHARE of the grid on selection problems), three cells each on
        confirmation problems, and for found groups the profile's cells on selection problems."""
        t, L = s.on, s.model.layers
        sel = s.found.solved * options.selection
        searches = L * (L + 1) / 2 * sel * GRID_SHARE + 3 * (s.found.solved - sel)
        pairs = len(options.by) * searches + (FOUND in options.by) * (L + 2) * sel
        return pairs * t.steps * (2 * L + 1) / 3 + s.clean, pairs * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        search = the_search(inputs)
        setup = inputs.resources.setup(inputs.spec)
        whole = search.cell()
        _, whole_on = split_indices(len(setup.kept), search.selection_fraction, search.split_seed)
        searched = allforone.groups.Searched(
            search.config, search.threshold, options.selection, search.split_seed, whole, whole_on
        )
        groupings, executor = allforone.groups.groups(setup, options.by, searched, options.reference)
        sel, conf = split_indices(len(setup.kept), options.selection, search.split_seed)
        halves = {"selection": setup.on(sel), "confirmation": setup.on(conf), "whole_confirmation": setup.on(whole_on)}
        return Result.of(
            setup.describe(),
            threshold=search.threshold,
            selection_fraction=options.selection,
            split_seed=search.split_seed,
            whole=None if whole is None else list(whole),
            groupings=groupings,
            executor=executor,
            inputs=allforone.faithfulness.setup_inputs(setup, **halves),
        )

    def tables(self, result: Result) -> list[Tab]:
        return [tab for g in result.groupings for tab in grouping_tables(g, result.whole)]

    def section(self, result: Result) -> list[str]:
        parts = [f"<h2>One circuit or several</h2><p>{html.escape(about(result))}</p>"]
        for g in result.groupings:
            parts.append(f"<h3>Grouped by {html.escape(g.by)}</h3><p>{html.escape(grouping_line(g))}</p>")
            if g.groups:
                parts.append(figure_html(lambda g=g: interactive.groups_plot(g, result.n_layers, result.whole)))
            parts += [t.html() for t in grouping_tables(g, result.whole)]
            parts.append(claims_html(g.claims))
        return parts

    def show(self, result: Result) -> list[Table | str]:
        lines: list[Table | str] = [about(result)]
        for g in result.groupings:
            lines.append(f"grouped by {g.by}: {grouping_line(g)}")
            lines += [t.rich() for t in grouping_tables(g, result.whole) if t.rows]
            lines += claims_lines(g.claims)
        return lines


def about(result: Result) -> str:
    whole = "no cell" if result.whole is None else f"({result.whole[0]}, {result.whole[1]})"
    return (
        f"Each group's cell is chosen by the search's rule (faithfulness >= {result.threshold}) on its selection half "
        f"({result.selection_fraction:.0%} of its solved problems) and judged on the rest; a group is searched where "
        f"it holds at least {MIN_SIDE} solved problems on each side. The whole task's judged cell is {whole}, "
        "measured on each group's confirmation problems that did not choose it."
    )


def grouping_line(g: Grouping) -> str:
    """How the problems were grouped, what was left out, and how many claims were confirmed."""
    made = (
        f"found groups: the selection problems clustered by their profile ({PROFILE}; average linkage of the Hamming "
        f"distance cut at {g.description['cut']}: {g.description['clusters']} clusters), every solved problem then "
        "assigned by a ridge description of what it is (its tokens and named groups), which agrees with the clusters "
        f"on {rate_text(g.description['agreement'])} of the clustered selection problems it was fitted to (in "
        f"sample; constant guess, every problem in the largest cluster: {g.description['agreement']['baseline']:.3f})"
        if g.by == FOUND and g.description is not None
        else f"named groups: each problem's {g.by}"
    )
    left = "; ".join(f"{name} ({n} solved)" for name, n in g.left_out.items())
    confirmed = sum(c["outcome"] == "confirmed" for c in g.claims)
    crossed = crossed_pairs(g)
    ends = (
        f"{confirmed} of {len(g.claims)} claims that the groups differ confirmed; "
        + (
            f"crossed (each group's own cell keeps more of its problems than the other's, both confirmed): {crossed}"
            if crossed
            else "no pair is crossed (a one-way claim can mean one cell is weaker for every group)"
        )
        if g.claims
        else "fewer than two groups were searched: nothing to compare"
        if len(g.groups) < 2
        else "the searched groups judged the same cell: nothing to claim"
    )
    return f"{made}. {len(g.groups)} groups searched{f'; too small to search: {left}' if left else ''}. {ends}."


def crossed_pairs(g: Grouping) -> str:
    """The pairs of groups whose cell claims are confirmed both ways: each group is kept better by its own cell."""
    done = {c["subject"] for c in g.claims if c["kind"] == "group_cell" and c["outcome"] == "confirmed"}
    names = [x["name"] for x in g.groups]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if {f"{a} on {b}", f"{b} on {a}"} <= done]
    return "; ".join(f"{a} and {b}" for a, b in pairs)


def grouping_tables(g: Grouping, whole: list[int] | None) -> list[Tab]:
    rows = []
    for group in g.groups:
        judged = group["judged"]
        cell = "-" if judged is None else f"({judged['wait']}, {judged['transfer']})"
        rows.append(
            [
                group["name"],
                group["n_selection"],
                group["n_confirmation"],
                cell + ("" if group["chosen"] else " best"),
                rate_text(judged["confirmation"]) if judged else "-",
                outcome_text(group["claim"]) if group["claim"] else "-",
                whole_text(group["whole"]),
            ]
        )
    at = "the whole task's cell" if whole is None else f"the whole task's cell ({whole[0]}, {whole[1]})"
    headers = ["group", "selection", "confirmation", "cell", "faithfulness (confirmation)", "its claim", at]
    wrong = [[group["name"], len(group["whole_wrong"]), last_lines(group["whole_wrong"][:5])] for group in g.groups]
    return [
        Tab(headers, rows, title=f"Each group's cell (grouped by {g.by})"),
        Tab(
            ["group", "wrong", "the first inputs"],
            [r for r in wrong if r[1]],
            title=f"The confirmation problems {at} gets wrong, by group",
        ),
    ]


def whole_text(r: Rate | None) -> str:
    return "-" if r is None else f"{rate_text(r)}, n {r['n']} (constant guess {r['baseline']:.3f})"


def last_lines(inputs: list[str]) -> str:
    """Inputs as a reader tells them apart: each one's last line (the problem; the worked examples before it are
    the same in every input, and the JSON keeps each input whole)."""
    return "; ".join(repr(text.rsplit("\n", 1)[-1]) for text in inputs)
