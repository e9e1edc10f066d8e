"""The heads study (docs/methods.md §2): ranking, knock-outs against matched random heads, and their claims."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import Claim, adjust, confirmed, mean_below, paired_greater
from af1.errors import Af1Error
from af1.interventions.heads import matched_draws
from af1.methods.counterfactuals import counterfactual_problems
from af1.methods.heads.attention import TokenAttention, last_query_attention, token_attention
from af1.methods.heads.knockouts import head_sums_by_step, knockouts, loo_fallbacks
from af1.methods.heads.lens import mlp_logit_lens
from af1.methods.heads.patching import LayoutNotPatched, LayoutPatched, layout_path_patching
from af1.methods.heads.ranking import (
    METRICS,
    Ranked,
    ScoringNote,
    Split,
    effect_of,
    key_heads,
    overlap,
    problem_effects,
    problem_split,
    ranked,
    top_heads,
)
from af1.models.adapter import ModelAdapter
from af1.progress import stage as progress_stage
from af1.stats import baseline_warning
from af1.tasks.evaluation import Evaluated, Scores, evaluated, require_solved, solved
from af1.tasks.task import LayoutRow, Task

if TYPE_CHECKING:
    from af1.models.loading import LoadedModel
    from af1.tasks.spec import TaskSpec
    from af1.tasks.task import Tokenizer


@with_config(ConfigDict(extra="forbid"))
class Knockout(TypedDict):
    """The top k heads mean-ablated against random sets of k, on the confirmation part, with intervals."""

    k: int
    heads: list[list[int]]
    scoring: str
    means: str
    means_without_other_problems: int
    measured_on: str
    n: int
    accuracy_top_k: float
    accuracy_top_k_ci: list[float]
    random_drawn_from: str
    random_matched: dict[str, int]  # over all draws: heads matched by layer and key/value group, by layer, nearest
    random_heads: list[list[list[int]]]
    top_rank_among_random: int  # random sets that leave as few problems right as the top set, or fewer
    top_rank_p: (
        float  # (1 + those) / (draws + 1): how rare the top set is among random draws (at least 1 / (draws + 1))
    )
    accuracy_random_k_mean: float
    accuracy_random_k_std: float
    accuracy_random_k: list[float]
    accuracy_random_k_ci: list[list[float]]
    accuracy_baseline: float
    base_accuracy: float


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


class HeadsStudy(TypedDict):
    """The arithmetic-heads study (`study`): path patching's effects and what it scored, the key and top heads
    chosen on the selection part, their knock-out and attention on the confirmation part, the MLP logit lens, a
    second counterfactual's ranking and other tasks' heads."""

    model: str | None
    task: str
    style: str
    n: int
    n_solved: int
    layouts: list[LayoutRow]  # path patching, knock-outs and attention per layout, pooled by each one's n
    scoring: str
    path_patching_scoring: ScoringNote
    base_accuracy_all: float
    split: Split
    counterfactual: str
    counterfactual_kind: str
    counterfactual_problems: list[dict[str, Any]]
    n_heads: int
    threshold: float
    path: str
    metric: str
    key_heads: list[list[int]]
    key_head_share: float
    key_heads_by_metric: dict[str, list[list[int]]]
    top_heads: list[list[int]]
    relative_logit_change_layer_head: list[list[float | None]]
    logit_diff_change_layer_head: list[list[float | None]]
    relative_logit_change_mlp_layer: list[float | None]
    logit_diff_change_mlp_layer: list[float | None]
    clean_logit_diff: float
    answer_steps_n: dict[str, int]  # solved problems of the selection part with an answer step k, by k
    layouts_patched: NotRequired[list[LayoutPatched]]
    layouts_not_patched: NotRequired[list[LayoutNotPatched]]
    knockout: Knockout
    attention_of_top_heads: dict[str, dict[str, float]]
    attention_measured_on: str
    attention_over_tokens: TokenAttention | None
    mlp_logit_lens_layer: list[float | None] | None  # None: a family whose MLP output is not linear in its input
    mlp_logit_lens_measured_on: str
    warnings: list[str]
    second_counterfactual: NotRequired[SecondCounterfactual | NoSecondCounterfactual]
    overlap: list[TaskOverlap]
    confirmed_key_heads: list[list[int]]  # key heads whose claim is confirmed on the confirmation part
    claims: list[Claim]  # each key head's, and the top heads' against matched random heads: one family


def key_head_claims(
    adapter: ModelAdapter,
    tested_on: Task,
    tokenizer: Tokenizer,
    candidates: list[tuple[int, int]],
    *,
    threshold: float,
    path: str,
    metric: str,
    kind: str | None,
) -> list[Claim]:
    """Each key head chosen on the selection part, judged on the confirmation part: path patching of its layers
    there, its per-problem effects' mean against the threshold (one-sided t test, bootstrap interval)."""
    if not candidates:
        return []
    layers = sorted({layer for layer, _ in candidates})
    with progress_stage(f"key heads confirmed: path patching of {len(layers)} layers on the confirmation part"):
        pp, _ = layout_path_patching(adapter, tested_on, tokenizer, path, kind, layers=layers)
    effect_PLH = problem_effects(pp, metric)
    return [
        mean_below(
            "key_head",
            f"head {layer}.{h} is a key head (path-patching effect below {threshold})",
            effect_PLH[:, layer, h].tolist(),
            threshold,
            f"the confirmation part ({len(tested_on)} solved problems that did not choose the head)",
            subject=f"{layer}.{h}",
        )
        for layer, h in candidates
    ]


def top_vs_random_claim(top: Scores, randoms: list[Scores], k: int, measured_on: str) -> Claim:
    """'Knocking out the top k heads leaves fewer problems right than knocking out matched random sets of k': per
    problem, the share of random sets that leave it right against whether the top set does (paired permutation
    test over problems)."""
    random_correct = torch.stack([s.correct_P.float() for s in randoms])  # [random set, problem]
    return paired_greater(
        "top_vs_random",
        f"mean-ablating the top {k} heads leaves fewer problems right than these {len(randoms)} random sets of {k} "
        "from the same layers and key/value groups (the draws held fixed: over new draws, `top_rank_p`)",
        random_correct.mean(0).tolist(),
        top.correct_P.float().tolist(),
        measured_on,
    )


FAMILY = "the heads study"


def decide(claims: list[Claim]) -> tuple[list[Claim], list[list[int]]]:
    """The study's claims adjusted as one family (Holm), and the key heads that stay confirmed."""
    family = adjust(claims, FAMILY)
    return family, [list(map(int, h.split("."))) for h in confirmed(family, "key_head")]


@dataclass(frozen=True)
class Settings:
    """How the study ranks and tests heads: path patching by `path` with the counterfactual `kind` (None: the
    task's default), key heads by `metric` below `threshold`, the top `k` knocked out against `draws` matched
    random sets, all chosen on the selection part of `split` (fraction, seed; `split_from` says whose split)."""

    threshold: float
    k: int
    draws: int
    path: str
    metric: str
    split: tuple[float, int]
    split_from: str
    kind: str | None = None

    def rank(self, lm: LoadedModel, on: Task, kind: str | None) -> Ranked:
        return ranked(lm.adapter, on, lm.tokenizer, self.path, self.metric, self.k, kind)


def study(
    lm: LoadedModel,
    spec: TaskSpec,
    settings: Settings,
    *,
    second_kind: str | None = None,
    compare_specs: list[TaskSpec] | None = None,
    done: Evaluated | None = None,
) -> HeadsStudy:
    """Path patching (every answer step unless the task scores the first token) and key and top-k heads (both
    metrics kept), chosen on the selection part of the solved problems (the search's split where there is one); on
    the confirmation part, the knock-out of the top k against matched random sets, each key head's claim and where
    the top heads look; the MLP logit lens on all solved problems; the ranking of a second counterfactual
    (`second_kind`, path patching only); overlap with other tasks (each chosen on its own selection part); `done`
    is an evaluation of the same spec already made."""
    s, adapter = settings, lm.adapter
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    require_solved(int(done.base.correct_P.sum()), spec)
    kept = solved(done.task, done.base)
    sel, conf = problem_split(len(kept), s.split)
    chosen_on, tested_on = kept.subset(sel), kept.subset(conf)
    main = s.rank(lm, chosen_on, s.kind)
    keys = key_heads(main["effect"], s.threshold)
    knockout, top_claim = knocked_out(adapter, done.task, tested_on, main["top_heads"], keys, s)
    claims = [
        *key_head_claims(
            adapter, tested_on, lm.tokenizer, keys, threshold=s.threshold, path=s.path, metric=s.metric, kind=s.kind
        ),
        top_claim,
    ]
    result = HeadsStudy(
        model=lm.info.get("spec"),
        task=spec.name,
        style=spec.style_name,
        n=len(done.task),
        n_solved=len(kept),
        layouts=kept.layouts(),  # path patching, knock-outs and attention per layout, pooled by each one's n
        scoring=spec.scoring,
        base_accuracy_all=done.base.accuracy,
        split=split_record(s, len(sel), len(conf)),
        counterfactual_problems=counterfactual_problems(kept, sel, main["pp"]["counterfactual_rows"]),
        **patching_fields(main, keys, s, adapter.n_layers * adapter.n_heads),
        knockout=knockout,
        **looks(lm, kept, tested_on, main["top_heads"], keys),
        warnings=[w for w in [main["scoring"]["warning"], knockout_warning(knockout, spec.scoring)] if w],
        overlap=[],
        confirmed_key_heads=[],
        claims=[],
    )
    result["claims"], result["confirmed_key_heads"] = decide(claims)
    if "layouts_patched" in main["pp"]:
        result["layouts_patched"] = main["pp"]["layouts_patched"]
    if "layouts_not_patched" in main["pp"]:
        result["layouts_not_patched"] = main["pp"]["layouts_not_patched"]
    if second_kind is not None:
        result["second_counterfactual"] = second_ranking(lm, chosen_on, kept, sel, main["top_heads"], s, second_kind)
    result["overlap"] = [task_overlap(lm, other, main["top_heads"], keys, s) for other in compare_specs or []]
    return result


def split_record(s: Settings, n_selection: int, n_confirmation: int) -> Split:
    return Split(
        {
            "from": s.split_from,
            "selection_fraction": s.split[0],
            "split_seed": s.split[1],
            "n_selection": n_selection,
            "n_confirmation": n_confirmation,
            "heads_chosen_on": "the selection part (path patching)",
            "tested_on": "the confirmation part (knock-outs, attention of the top heads)",
        }
    )


def patching_fields(main: Ranked, keys: list[tuple[int, int]], s: Settings, n_heads: int) -> dict[str, Any]:
    """What path patching measured on the selection part and the heads it chose."""
    pp = main["pp"]
    return {
        "path_patching_scoring": main["scoring"],
        "counterfactual": main["counterfactual"],
        "counterfactual_kind": main["counterfactual_kind"],
        "n_heads": n_heads,
        "threshold": s.threshold,
        "path": pp["path"],
        "metric": s.metric,
        "key_heads": [list(h) for h in keys],
        "key_head_share": len(keys) / n_heads,
        "key_heads_by_metric": {m: [list(h) for h in key_heads(effect_of(pp, m), s.threshold)] for m in METRICS},
        "top_heads": [list(h) for h in main["top_heads"]],
        "relative_logit_change_layer_head": pp["relative_logit_change_layer_head"].tolist(),
        "logit_diff_change_layer_head": pp["logit_diff_change_layer_head"].tolist(),
        "relative_logit_change_mlp_layer": pp["relative_logit_change_mlp_layer"].tolist(),
        "logit_diff_change_mlp_layer": pp["logit_diff_change_mlp_layer"].tolist(),
        "clean_logit_diff": float(pp["clean_logit_diff"]),
        "answer_steps_n": pp["answer_steps_n"],
    }


CONFIRMATION = "the confirmation part of the solved problems"


def knocked_out(
    adapter: ModelAdapter,
    task: Task,
    tested_on: Task,
    top: list[tuple[int, int]],
    keys: list[tuple[int, int]],
    s: Settings,
) -> tuple[Knockout, Claim]:
    """The top k heads mean-ablated on the confirmation part against `s.draws` random sets of k from the same layers
    and key/value groups, never a top or key head (leave-one-out means, every answer token scored), and the
    paired claim that the top set leaves fewer problems right."""
    chosen = list(dict.fromkeys(top + keys))
    means = head_sums_by_step(adapter, task)
    rand_sets, matched = matched_draws(adapter, top, range(s.draws), chosen)
    with progress_stage(f"knock-outs: top {s.k} and {s.draws} random sets"):
        top_scores, *rand_scores = knockouts(adapter, tested_on, [top, *rand_sets], means)
    randoms_detail = [r.rate(tested_on) for r in rand_scores]
    randoms = [r["value"] for r in randoms_detail]
    rand = torch.tensor(randoms)
    top_rate = top_scores.rate(tested_on)
    n_heads = adapter.n_layers * adapter.n_heads
    knockout = Knockout(
        k=s.k,
        heads=[list(h) for h in top],
        scoring=tested_on.spec.scoring,
        means="per answer step and position, over all the task's problems, each knocked-out problem's own "
        "clean state left out (leave-one-out); a (problem, step) that no other problem shares keeps its own "
        "state, so its heads are not knocked out there (counted in means_without_other_problems)",
        means_without_other_problems=loo_fallbacks(tested_on, means),
        measured_on=CONFIRMATION,
        n=len(tested_on),
        accuracy_top_k=top_rate["value"],
        accuracy_top_k_ci=top_rate["ci"],
        random_drawn_from=f"for each top head, one of the same layer and key/value group (else the same layer, else "
        f"the nearest), among the {n_heads - len(chosen)} heads neither in the top {s.k} nor key heads",
        random_matched=matched,
        random_heads=[[list(h) for h in heads] for heads in rand_sets],
        top_rank_among_random=sum(r <= top_rate["value"] for r in randoms),
        top_rank_p=(1 + sum(r <= top_rate["value"] for r in randoms)) / (s.draws + 1),
        accuracy_random_k_mean=float(rand.mean()),
        accuracy_random_k_std=float(rand.std()) if s.draws > 1 else 0.0,
        accuracy_random_k=randoms,
        accuracy_random_k_ci=[r["ci"] for r in randoms_detail],
        accuracy_baseline=top_rate["baseline"],
        base_accuracy=1.0,
    )
    return knockout, top_vs_random_claim(top_scores, rand_scores, s.k, CONFIRMATION)


def knockout_warning(knockout: Knockout, scoring: str) -> str | None:
    return baseline_warning(f"the knock-outs ({scoring} answer)", knockout["accuracy_baseline"], knockout["n"])


def looks(
    lm: LoadedModel, kept: Task, tested_on: Task, top: list[tuple[int, int]], keys: list[tuple[int, int]]
) -> dict[str, Any]:
    """Where the top heads look on the confirmation part, and the MLP logit lens on all solved problems."""
    lens = mlp_logit_lens(lm.adapter, kept)
    return {
        "attention_of_top_heads": last_query_attention(lm.adapter, tested_on, top[:5]),
        "attention_measured_on": CONFIRMATION,
        # one problem's tokens (the confirmation part's first): where each top and key head looks, token by token
        "attention_over_tokens": token_attention(
            lm.adapter, lm.tokenizer, tested_on, list(dict.fromkeys(top + keys))[:16]
        ),
        "mlp_logit_lens_layer": None if lens is None else lens.tolist(),
        "mlp_logit_lens_measured_on": "all solved problems (no head is chosen by it)",
    }


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
        key_heads=[list(h) for h in key_heads(second["effect"], s.threshold)],
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
        o_effect = s.rank(lm, o_kept.subset(o_sel), s.kind)["effect"]
    except Af1Error as exc:
        return TaskOverlap(task=other.operation, style=other.style, error=str(exc))
    shared = overlap(top, top_heads(o_effect, s.k), lm.adapter.n_heads, s.k)
    o_keys = key_heads(o_effect, s.threshold)
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
