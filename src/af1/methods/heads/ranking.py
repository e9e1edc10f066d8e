"""Key heads: ranked by path patching, chosen on one split of the problems, with the chance overlap of two lists."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.methods.counterfactuals import defines_answers
from af1.methods.heads.attribution import ESTIMATE
from af1.methods.heads.capture import SCORED, Effects
from af1.methods.heads.patching import PooledPathPatching, layout_path_patching
from af1.models.adapter import ModelAdapter
from af1.stats import baseline_warning, constant_baseline, split_indices
from af1.tasks.evaluation import Evaluated, require_solved, solved
from af1.tasks.task import Task

if TYPE_CHECKING:
    from af1.models.loading import LoadedModel
    from af1.tasks.task import Tokenizer

METRICS = ("share", "relative", "logit_diff")
# where a head counts as key by default: the share of the way to the counterfactual's answer above 5 %, or the
# correct logit (or its difference from the top wrong one) lowered by more than 5 %
THRESHOLDS = {"share": 0.05, "relative": -0.05, "logit_diff": -0.05}
SIGN = {"share": -1.0, "relative": 1.0, "logit_diff": 1.0}  # times the effect: lower is a stronger head
DESCRIPTIVE = "relative"  # the share needs a counterfactual answer: without one, heads are ranked by this alone


OWN_SPLIT = "the heads study's own seeded split"  # where the heads are chosen without a search's split


def effect_of(pp: Effects, metric: str) -> torch.Tensor:
    """[layer, head] by one metric: the share of the way towards the counterfactual's answer (positive: carries it), the
    relative change of the correct logit, or the logit difference's change (negative: supports)."""
    if metric == "share":
        gap = pp["counterfactual_gap"]
        return pp["logit_diff_change_layer_head"] / (gap if gap != 0 else float("nan"))
    if metric == "relative":
        return pp["relative_logit_change_layer_head"]
    if metric == "logit_diff":
        return pp["logit_diff_change_layer_head"] / max(abs(pp["clean_logit_diff"]), 1e-6)
    raise Af1Error(f"unknown metric '{metric}': one of {', '.join(METRICS)}")


def key_heads(effect_LH: torch.Tensor, threshold: float, metric: str) -> list[tuple[int, int]]:
    """Heads past the threshold (a share above it; a relative change below it), strongest first."""
    oriented = SIGN[metric] * effect_LH
    found = [
        (float(oriented[layer, h]), layer, h) for layer, h in (oriented < SIGN[metric] * threshold).nonzero().tolist()
    ]
    return [(layer, h) for _, layer, h in sorted(found)]


@with_config(ConfigDict(extra="forbid"))
class Overlap(TypedDict):
    """Two head sets compared: Jaccard (None when both are empty), the top k's share in common, what random heads in the
    second's layers would share, and the chance of as many or more."""

    jaccard: float | None
    top_k_overlap: float
    k: int
    top_k_overlap_chance: float
    top_k_overlap_p: float


OVERLAP_DRAWS = 10_000  # draws of the layer-matched null: the smallest p is 1 / 10,001


def overlap(
    a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], heads_per_layer: int, k: int | None = None
) -> Overlap:
    """Jaccard of two head sets (None when both are empty) and the overlap of their top-k, against chance: `b`'s
    top k redrawn at random within their own layers, a seeded Monte-Carlo p."""
    sa, sb = set(map(tuple, a)), set(map(tuple, b))
    jac = len(sa & sb) / len(sa | sb) if sa | sb else None
    k = k or min(len(a), len(b))
    top_a, top_b = set(map(tuple, a[:k])), [tuple(h) for h in b[:k]]
    shared = len(top_a & set(top_b))
    rng = np.random.default_rng(0)
    simulated = np.zeros(OVERLAP_DRAWS, dtype=int)
    expected = 0.0
    for layer in sorted({h[0] for h in top_b}):
        count = sum(h[0] == layer for h in top_b)
        mine = np.array([h in top_a for h in ((layer, j) for j in range(heads_per_layer))])
        drawn = rng.permuted(np.tile(np.arange(heads_per_layer), (OVERLAP_DRAWS, 1)), axis=1)[:, :count]
        simulated += mine[drawn].sum(1)
        expected += count * mine.sum() / heads_per_layer
    return Overlap(
        jaccard=jac,
        top_k_overlap=shared / k if k else 1.0,
        k=k,
        top_k_overlap_chance=float(expected / k) if k else 0.0,
        top_k_overlap_p=float((1 + (simulated >= shared).sum()) / (OVERLAP_DRAWS + 1)),
    )


def top_heads(effect_LH: torch.Tensor, k: int, metric: str) -> list[tuple[int, int]]:
    """The k strongest heads by the metric (the largest share; the most negative relative change)."""
    order = (SIGN[metric] * effect_LH).nan_to_num(float("inf")).flatten().argsort()[:k].tolist()
    H = effect_LH.shape[1]
    return [(i // H, i % H) for i in order]


@with_config(ConfigDict(extra="forbid"))
class ScoringNote(TypedDict):
    """What path patching scored, on how many problems, and the constant guess of it (a warning when near one)."""

    scoring: str
    definition: str
    n: int
    constant_guess: float
    constant_guess_by_step: dict[str, float]
    warning: str | None


def scoring_note(on: Task, scored: str) -> ScoringNote:
    """What path patching scored on these problems, with the constant guess of it (one per token layout): the whole
    answer and each step (full), or the first token (warned when near constant)."""
    answers, layouts = on.answer_tokens, on.layout_P.tolist()
    first = constant_baseline([a[0] for a in answers], layouts)
    by_step = {}
    for k in range(max(map(len, answers)) if scored == "full" else 1):
        rows = [i for i, a in enumerate(answers) if len(a) > k]
        by_step[str(k)] = constant_baseline([answers[i][k] for i in rows], [layouts[i] for i in rows])
    return ScoringNote(
        scoring=scored,
        definition=SCORED[scored],
        n=len(on),
        constant_guess=first if scored == "first" else constant_baseline([tuple(a) for a in answers], layouts),
        constant_guess_by_step=by_step,
        warning=baseline_warning("the first answer token path patching scores", first, len(on))
        if scored == "first"
        else None,
    )


class Ranked(TypedDict):
    """Heads ranked by path patching with one counterfactual: the patching, the metric (the share where the
    counterfactual defines an answer, else `DESCRIPTIVE`), threshold, effect, top k, what was scored."""

    pp: PooledPathPatching
    metric: str
    threshold: float
    counterfactual: str
    counterfactual_kind: str
    top_heads: list[tuple[int, int]]
    effect: torch.Tensor
    scoring: ScoringNote


def ranked(
    adapter: ModelAdapter,
    on: Task,
    tokenizer: Tokenizer,
    path: str,
    metric: str,
    k: int,
    kind: str | None = None,
    threshold: float | None = None,
) -> Ranked:
    """Path patching on these problems with one counterfactual and the heads it ranks by `metric` (the share falls back
    to `DESCRIPTIVE` without an answer), with each problem's counterfactual input."""
    if metric == "share" and not defines_answers(on, tokenizer, kind):
        metric, threshold = DESCRIPTIVE, None
    pp, cf = layout_path_patching(
        adapter, on, tokenizer, path, kind, contrast="answer" if metric == "share" else "top wrong"
    )
    effect = effect_of(pp, metric)
    patched = on.subset([i for i, row in enumerate(pp["counterfactual_rows"]) if row is not None])
    return Ranked(
        pp=pp,
        metric=metric,
        threshold=THRESHOLDS[metric] if threshold is None else threshold,
        counterfactual=cf.replacement,
        counterfactual_kind=cf.kind,
        top_heads=top_heads(effect, k, metric),
        effect=effect,
        scoring=scoring_note(patched, pp["scoring"]),
    )


def problem_split(n: int, split: tuple[float, int]) -> tuple[list[int], list[int]]:
    """(selection, confirmation) rows of n solved problems: heads are chosen on the first and tested on the
    second."""
    if n < 2:
        raise Af1Error(
            f"{n} solved problem: heads are chosen on one half of the solved problems and tested on the other, "
            "which needs at least 2"
        )
    selection, seed = split
    sel, conf = split_indices(n, selection, seed)
    if not sel or not conf:
        raise Af1Error(f"the split of {n} solved problems at {selection} leaves one half empty: use more problems")
    return sel, conf


# which solved problems chose the heads and which tested them ("from": the split's origin; a keyword, so this form)
Split = with_config(ConfigDict(extra="forbid"))(
    TypedDict(
        "Split",
        {
            "from": str,
            "selection_fraction": float,
            "split_seed": int,
            "n_selection": int,
            "n_confirmation": int,
            "heads_chosen_on": str,
            "tested_on": str,
        },
    )
)


@with_config(ConfigDict(extra="forbid"))
class ChosenHeads(TypedDict):
    """The top-k heads by path patching on every solved problem of an evaluation, with what was scored."""

    top_heads: list[tuple[int, int]]
    n_solved: int
    path: str
    scoring: ScoringNote


def choose_heads(lm: LoadedModel, done: Evaluated, k: int, path: str = "wang", metric: str = "relative") -> ChosenHeads:
    """The top-k heads by path patching on all of an evaluation's solved problems (for fine-tuning, which tests
    them on other problems): the heads, what was scored and on how many."""
    kept = solved(done.task, done.base)
    require_solved(len(kept), done.task.spec)
    found = ranked(lm.adapter, kept, lm.tokenizer, path, metric, k, kind="a" if done.task.spec.file is None else None)
    return ChosenHeads(top_heads=found["top_heads"], n_solved=len(kept), path=path, scoring=found["scoring"])


@dataclass(frozen=True)
class Settings:
    """How the study ranks and tests heads (`threshold` None: the metric's own), chosen on the selection part of
    `split`; `ranked_by` attribution chooses by the estimate, the claims stay exact."""

    threshold: float | None
    k: int
    draws: int
    path: str
    metric: str
    split: tuple[float, int]
    split_from: str
    kind: str | None  # None: the task's default counterfactual
    ranked_by: str = "exact"  # or "attribution"

    def rank(self, lm: LoadedModel, on: Task, kind: str | None) -> Ranked:
        path = ESTIMATE if self.ranked_by == ESTIMATE else self.path
        return ranked(lm.adapter, on, lm.tokenizer, path, self.metric, self.k, kind, threshold=self.threshold)
