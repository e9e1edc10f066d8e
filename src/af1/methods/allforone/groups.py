"""One circuit or several (docs/methods.md §1): the search per group (named, or clustered on selection problems and
assigned by what a problem is), and Holm claims on confirmation problems that their cells differ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, groups_greater, paired_more
from af1.executors.cells import Cells
from af1.executors.protocol import Executor, recorded
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.rounds import Cell, Meter
from af1.methods.allforone.search import Judged, Rule, decide
from af1.methods.ridge import ridge_predict
from af1.methods.setup import Setup
from af1.results import Part
from af1.stats import Rate, rate, split_indices
from af1.tasks.groupings import described, labels
from af1.tasks.task import Task

FOUND = "found"
MIN_SIDE = 8  # a group is searched where it holds this many solved problems on each side of the split
PROFILE_CUT = 0.15  # found groups: average-linkage clusters of the profiles' Hamming distance, cut at this
PROFILE = (
    "right or wrong at each L_wait's cell with the most transfer blocks that leaves a compute stage, and at the "
    "whole task's judged cell"
)


@with_config(ConfigDict(extra="forbid"))
class Group(TypedDict):
    """One group's search on its part of the split: the judged cell with both sides' rates and claim, the staircase (per
    L_wait its first cell at the threshold), and the whole task's cell on its confirmation problems, with its misses."""

    name: str
    n_selection: int
    n_confirmation: int
    chosen: bool
    found: bool
    judged: Judged | None
    claim: Claim | None
    frontier: list[Cell]
    whole: Rate | None  # the whole task's judged cell on this group's confirmation problems outside its selection
    whole_wrong: list[str]  # the inputs of those it gets wrong
    problem_cells: int


@with_config(ConfigDict(extra="forbid"))
class Description(TypedDict):
    """How found groups were made: the profile's cells, the cut, and how well the token description reproduces the
    clusters on the selection problems it was fitted to."""

    cells: list[list[int]]
    cut: float
    clusters: int  # at the cut, before groups under MIN_SIDE are left out
    agreement: Rate  # the description's group against the cluster, on the clustered selection problems


class Grouping(Part):
    """The groups of one grouping (`by`): each group's search, the groups too small to search, and the claims that
    their cells differ (one Holm family)."""

    by: str
    label_P: list[str]  # each solved problem's group, in the order of the solved problems
    groups: list[Group]
    left_out: dict[str, int]  # groups with fewer than MIN_SIDE problems on a side: their solved problems
    claims: list[Claim]
    description: Description | None = None  # found groups only


class Memo:
    """A meter that measures each (cell, problem) once, however often it is asked."""

    def __init__(self, meter: Meter) -> None:
        self.meter, self.seen = meter, dict[tuple[int, int, int], bool]()

    def right(self, asks: list[tuple[int, int, list[int]]]) -> list[list[bool]]:
        new = [(w, k, rows) for w, k, r in asks if (rows := sorted({x for x in r if (w, k, x) not in self.seen}))]
        if new:
            for (w, k, rows), right in zip(new, self.meter.right(new), strict=True):
                self.seen.update({(w, k, r): ok for r, ok in zip(rows, right, strict=True)})
        return [[self.seen[w, k, r] for r in rows] for w, k, rows in asks]

    def executors(self) -> list[tuple[Executor, str | None]]:
        return self.meter.executors()


def profile_cells(n_layers: int, whole: tuple[int, int] | None) -> list[tuple[int, int]]:
    cells = [(w, n_layers - 2 - w) for w in range(n_layers - 2, -2, -1)]
    return cells + ([whole] if whole is not None and whole not in cells else [])


def features(setup: Setup) -> torch.Tensor:
    """[P, F] what each solved problem is: its token at each position and its group under every named grouping,
    one-hot."""
    ids_PT = setup.kept.input_ids_PT
    tokens = [torch.nn.functional.one_hot(ids_PT[:, t]).double() for t in range(ids_PT.shape[1])]
    named = described(setup.spec, setup.kept.problems)
    values = sorted({x for row in named for x in row})
    named_PF = torch.tensor([[float(v in row) for v in values] for row in named], dtype=torch.float64)
    return torch.cat([*tokens, named_PF.reshape(len(named), len(values))], 1)


def found_labels(
    setup: Setup, meter: Memo, sel: list[int], whole: tuple[int, int] | None
) -> tuple[list[str], Description]:
    """Found groups: the selection problems clustered by profile, every solved problem then labelled by the
    description fitted on its tokens (module docstring)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    cells = profile_cells(setup.adapter.n_layers, whole)
    bits_CS = torch.tensor(meter.right([(w, k, sel) for w, k in cells]), dtype=torch.float64)
    if len(sel) > 1 and bool((bits_CS != bits_CS[:, :1]).any()):
        cluster_S = fcluster(linkage(bits_CS.T.numpy(), "average", metric="hamming"), PROFILE_CUT, "distance")
    else:
        cluster_S = [1] * len(sel)
    sizes = {c: list(cluster_S).count(c) for c in set(cluster_S)}
    kept = sorted((c for c in sizes if sizes[c] >= MIN_SIDE), key=lambda c: (-sizes[c], c))
    name = {c: f"{FOUND} {i + 1}" for i, c in enumerate(kept)}
    train = [j for j, c in enumerate(cluster_S) if c in name]
    onehot_PF = features(setup)
    if len(kept) > 1:
        target_SG = torch.tensor([[float(cluster_S[j] == c) for c in kept] for j in train], dtype=torch.float64)
        train_SF = onehot_PF[[sel[j] for j in train]]
        varies = train_SF.std(0) > 0  # a feature the fit never saw vary says nothing
        assigned = ridge_predict(train_SF[:, varies], target_SG, onehot_PF[:, varies])[0].argmax(1).tolist()
        label_P = [name[kept[g]] for g in assigned]
    else:
        label_P = [name[kept[0]] if kept else f"{FOUND} 1"] * len(setup.kept)
    agree = [label_P[sel[j]] == name[cluster_S[j]] for j in train]
    rules = [list(c) for c in cells]
    agreement = rate(agree, [name[cluster_S[j]] for j in train])  # baseline: every problem in the largest
    return label_P, Description(cells=rules, cut=PROFILE_CUT, clusters=len(sizes), agreement=agreement)


@dataclass(frozen=True)
class Searched:
    """What every group's search shares with the whole task's (its config, threshold and split seed), the groups'
    selection share, and the whole task's judged cell (None where it judged none) with its confirmation rows."""

    base: AF1Config
    threshold: float
    selection: float
    seed: int
    whole: tuple[int, int] | None
    whole_on: list[int]


def group_search(rule: Rule, meter: Memo, name: str, searched: Searched, kept: Task) -> Group:
    """One group's search (`rule` holds its part of the split) and the whole task's cell on its confirmation
    problems that did not choose that cell (`kept`: the solved problems, the inputs it gets wrong written)."""
    found = decide(rule, meter, searched.base, frontier=True)
    whole_rate, wrong = None, []
    if searched.whole is not None:
        on = sorted(set(rule.conf) & set(searched.whole_on))
        right = meter.right([(*searched.whole, on)])[0]
        whole_rate = rule.rate(right, on)
        wrong = [r for r, ok in zip(on, right, strict=True) if not ok]
    return Group(
        name=name,
        n_selection=len(rule.sel),
        n_confirmation=len(rule.conf),
        chosen=found.chosen,
        found=found.found,
        judged=found.judged,
        claim=None if found.claim is None else Claim(**{**found.claim, "subject": name}),
        frontier=found.frontier,
        whole=whole_rate,
        whole_wrong=[kept.input_text(r) for r in wrong],
        problem_cells=found.problem_cells,
    )


def cell_of(group: Group) -> tuple[int, int] | None:
    judged = group["judged"]
    return None if judged is None else (judged["wait"], judged["transfer"])


Ask = tuple[About, tuple[int, int], tuple[int, int], list[int]]  # a claim: its cell, the other cell, on these rows


def cell_asks(groups: list[Group], rows: dict[str, list[int]]) -> list[Ask]:
    """Per ordered pair of groups whose judged cells differ: 'A's cell keeps fewer of B's confirmation problems
    than B's own cell'."""
    asks: list[Ask] = []
    for a in groups:
        for b in groups:
            ca, cb = cell_of(a), cell_of(b)
            if a is b or ca is None or cb is None or ca == cb:
                continue
            statement = f"{a['name']}'s cell {ca} keeps fewer of {b['name']}'s problems than {b['name']}'s cell {cb}"
            on = f"{b['name']}'s confirmation problems"
            asks.append((About("group_cell", statement, on, f"{a['name']} on {b['name']}"), cb, ca, rows[b["name"]]))
    return asks


def frontier_asks(groups: list[Group], rows: dict[str, list[int]]) -> list[Ask]:
    """Per wait where two staircases have cells of different transfer: the group needing more loses problems at the
    other's cell (on its confirmation problems; that the other needs no more is its selection's choice, untested)."""
    asks: list[Ask] = []
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            stairs_a = {c["wait"]: c["transfer"] for c in a["frontier"]}
            for c in b["frontier"]:
                w, kb = c["wait"], c["transfer"]
                if w not in stairs_a or stairs_a[w] == kb:
                    continue
                low, high = (a, b) if stairs_a[w] < kb else (b, a)
                k_low, k_high = sorted((stairs_a[w], kb))
                statement = (
                    f"at L_wait {w} {high['name']}'s problems need more transfer blocks than {low['name']}'s staircase "
                    f"gives ({k_high}, not {k_low})"
                )
                subject = f"L_wait {w}: {high['name']} over {low['name']}"
                about = About("group_frontier", statement, f"{high['name']}'s confirmation problems", subject)
                asks.append((about, (w, k_high), (w, k_low), rows[high["name"]]))
    return asks


def whole_claims(groups: list[Group], rows: dict[str, list[int]], meter: Memo, searched: Searched) -> list[Claim]:
    """Per pair of groups: 'the whole task's cell keeps the two groups' problems at different rates', on their
    confirmation problems that did not choose it (a permutation test over problems, two-sided)."""
    if searched.whole is None:
        return []
    on = {g["name"]: sorted(set(rows[g["name"]]) & set(searched.whole_on)) for g in groups}
    right = dict(zip(on, meter.right([(*searched.whole, r) for r in on.values()]), strict=True))
    claims = []
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            first, second = right[a["name"]], right[b["name"]]
            statement = f"the whole task's cell {searched.whole} keeps {a['name']} and {b['name']} at different rates"
            where = "both groups' confirmation problems that did not choose the whole task's cell"
            about = About("group_whole", statement, where, f"whole: {a['name']} vs {b['name']}")
            claims.append(
                groups_greater(about, [float(x) for x in first], [float(x) for x in second], "two-sided", "problems")
            )
    return claims


def differ_claims(
    groups: list[Group], rows: dict[str, list[int]], meter: Memo, by: str, searched: Searched
) -> list[Claim]:
    """The claims that the groups differ (`cell_asks`, `frontier_asks`, `whole_claims`), one Holm family."""
    claims, seen = [], set()
    for about, mine, other, conf in [*cell_asks(groups, rows), *frontier_asks(groups, rows)]:
        if (mine, other, tuple(conf)) in seen:  # a staircase cell that is also a judged cell: tested once
            continue
        seen.add((mine, other, tuple(conf)))
        own, theirs = meter.right([(*mine, conf), (*other, conf)])
        claims.append(paired_more(about, own, theirs))
    return adjust([*claims, *whole_claims(groups, rows, meter, searched)], f"groups by {by}")


def grouping(setup: Setup, meter: Memo, by: str, searched: Searched) -> Grouping:
    """One grouping's groups searched (those with MIN_SIDE problems on each side), and their claims."""
    sel, conf = split_indices(len(setup.kept), searched.selection, searched.seed)
    description = None
    if by == FOUND:
        label_P, description = found_labels(setup, meter, sel, searched.whole)
    else:
        label_P = labels(setup.spec, setup.kept.problems, by)
    targets = setup.kept.targets()
    layouts = setup.kept.layout_P.tolist() if setup.kept.groups else None
    groups, left_out, rows = [], {}, {}
    for name in sorted(set(label_P), key=lambda g: (-label_P.count(g), g)):
        g_sel = [i for i in sel if label_P[i] == name]
        g_conf = [i for i in conf if label_P[i] == name]
        if min(len(g_sel), len(g_conf)) < MIN_SIDE:
            left_out[name] = len(g_sel) + len(g_conf)
            continue
        split = (g_sel, g_conf)
        rule = Rule(
            targets, layouts, setup.adapter.n_layers, searched.threshold, searched.selection, searched.seed, split
        )
        groups.append(group_search(rule, meter, name, searched, setup.kept))
        rows[name] = g_conf
    claims = differ_claims(groups, rows, meter, by, searched)
    return Grouping(by=by, label_P=label_P, groups=groups, left_out=left_out, claims=claims, description=description)


def groups(setup: Setup, by: Sequence[str], searched: Searched, reference: bool = False) -> tuple[list[Grouping], str]:
    """Every grouping of `by` on one meter (a cell measured on a problem once for all of them), and the executor."""
    meter = Memo(Cells(setup.kept, setup.steps, searched.base, reference))
    out = [grouping(setup, meter, b, searched) for b in by]
    return out, recorded(meter.executors())["executor"]
