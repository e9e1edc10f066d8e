"""Rankings beside the main one: a second counterfactual on the same selection part, other tasks' heads, and the
attribution estimate's ranking against the exact one it approximates."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.methods.counterfactuals import counterfactual_problems
from af1.methods.heads.attribution import ESTIMATE, RankAgreement, agreement
from af1.methods.heads.patching import layout_path_patching
from af1.methods.heads.ranking import Settings, key_heads, overlap, problem_split, top_heads
from af1.results import Part
from af1.tasks.evaluation import evaluated, require_solved, solved
from af1.tasks.task import Task

if TYPE_CHECKING:
    from af1.models.loading import LoadedModel
    from af1.tasks.spec import TaskSpec

EXACT = "total"  # the path the attribution estimate approximates: activation patching at the last position


@with_config(ConfigDict(extra="forbid"))
class SecondCounterfactual(TypedDict):
    """The heads a second counterfactual ranks, path patching only on the same selection part."""

    counterfactual_kind: str
    counterfactual: str
    measured: str
    top_heads: list[list[int]]
    key_heads: list[list[int]]
    effect_layer_head: list[list[float | None]]
    top_k_overlap: float
    top_k_overlap_chance: float
    top_k_overlap_p: float
    counterfactual_problems: list[dict[str, Any]]


@with_config(ConfigDict(extra="forbid"))
class NoSecondCounterfactual(TypedDict):
    """Why the second counterfactual has no ranking (e.g. no other operand value keeps a problem's layout)."""

    counterfactual_kind: str
    error: str


@with_config(ConfigDict(extra="forbid"))
class TaskOverlap(TypedDict):
    """Key and top-k heads of another task (chosen on its own selection part) against this one's; or why it has
    none (`error`)."""

    task: str
    style: str
    error: NotRequired[str]
    n_solved: NotRequired[int]
    n_selection: NotRequired[int]
    key_heads: NotRequired[list[list[int]]]
    key_heads_jaccard: NotRequired[float | None]
    top_k_overlap: NotRequired[float]
    top_k_overlap_chance: NotRequired[float]
    top_k_overlap_p: NotRequired[float]
    k: NotRequired[int]


def second_ranking(
    lm: LoadedModel, chosen_on: Task, kept: Task, sel: list[int], top: list[tuple[int, int]], s: Settings, kind: str
) -> SecondCounterfactual | NoSecondCounterfactual:
    """The ranking by another counterfactual on the same selection part (path patching only) and its overlap with
    the main one's top heads; a counterfactual that cannot be built is said, not fatal."""
    try:
        second = s.rank(lm, chosen_on, kind)
    except Af1Error as exc:  # e.g. no other operand value keeps a problem's token layout
        return NoSecondCounterfactual(counterfactual_kind=kind, error=str(exc))
    shared = overlap(top, second["top_heads"], lm.adapter.n_heads, s.k)
    return SecondCounterfactual(
        counterfactual=second["counterfactual"],
        counterfactual_kind=second["counterfactual_kind"],
        measured="path patching only, on the same selection part (no knock-outs)",
        top_heads=[list(h) for h in second["top_heads"]],
        key_heads=[list(h) for h in key_heads(second["effect"], second["threshold"], second["metric"])],
        effect_layer_head=second["effect"].tolist(),
        top_k_overlap=shared["top_k_overlap"],
        top_k_overlap_chance=shared["top_k_overlap_chance"],
        top_k_overlap_p=shared["top_k_overlap_p"],
        counterfactual_problems=counterfactual_problems(kept, sel, second["pp"]["counterfactual_rows"], prompt=False),
    )


def task_overlap(
    lm: LoadedModel, other: TaskSpec, top: list[tuple[int, int]], keys: list[tuple[int, int]], s: Settings
) -> TaskOverlap:
    """Another task's heads, chosen on its own selection part, against this task's: the top-k overlap with its
    chance expectation and the key heads' Jaccard index; a task that cannot be ranked is said, not fatal."""
    try:
        o = evaluated(lm.model, lm.tokenizer, other)
        o_kept = solved(o.task, o.base)
        require_solved(len(o_kept), other)
        o_sel, _ = problem_split(len(o_kept), s.split)
        theirs = s.rank(lm, o_kept.subset(o_sel), s.kind)
    except Af1Error as exc:
        return TaskOverlap(task=other.operation, style=other.style, error=str(exc))
    shared = overlap(top, top_heads(theirs["effect"], s.k, theirs["metric"]), lm.adapter.n_heads, s.k)
    o_keys = key_heads(theirs["effect"], theirs["threshold"], theirs["metric"])
    return TaskOverlap(
        task=other.operation,
        style=other.style,
        n_solved=len(o_kept),
        n_selection=len(o_sel),
        key_heads=[list(h) for h in o_keys],
        key_heads_jaccard=overlap(keys, o_keys, lm.adapter.n_heads)["jaccard"],
        top_k_overlap=shared["top_k_overlap"],
        top_k_overlap_chance=shared["top_k_overlap_chance"],
        top_k_overlap_p=shared["top_k_overlap_p"],
        k=s.k,
    )


class Ranked(Part):
    """Both rankings of every head on the same problems, the estimate's and the exact one's, how they agree
    (`RankAgreement`) and the time each took."""

    n_patched: int
    counterfactual: str
    counterfactual_kind: str
    exact_path: str
    agreement: RankAgreement
    estimate_layer_head: list[list[float | None]]
    exact_layer_head: list[list[float | None]]
    estimate_seconds: float
    exact_seconds: float


def estimate_against_exact(lm: LoadedModel, kept: Task, counterfactual: str | None, k: int, seed: int) -> Ranked:
    """Every head's effect on the solved problems `kept` estimated to first order and measured exactly (path EXACT),
    compared over the problems both could patch: Spearman's rho with its bootstrap interval, the top-k overlap."""
    measured = {}
    for path in (ESTIMATE, EXACT):
        start = time.perf_counter()
        pp, cf = layout_path_patching(lm.adapter, kept, lm.tokenizer, path, counterfactual)
        measured[path] = (pp, time.perf_counter() - start)
    (estimate, estimate_s), (exact, exact_s) = measured[ESTIMATE], measured[EXACT]
    rows = [i for i, row in enumerate(exact["counterfactual_rows"]) if row is not None]
    per_problem = "relative_logit_change_problem_layer_head"
    return Ranked(
        n_patched=len(rows),
        counterfactual=cf.replacement,
        counterfactual_kind=cf.kind,
        exact_path=EXACT,
        agreement=agreement(estimate[per_problem][rows].flatten(1), exact[per_problem][rows].flatten(1), k, seed),
        estimate_layer_head=estimate["relative_logit_change_layer_head"].tolist(),
        exact_layer_head=exact["relative_logit_change_layer_head"].tolist(),
        estimate_seconds=estimate_s,
        exact_seconds=exact_s,
    )
