"""Knock-outs: heads mean-ablated at the last position, alone or as a set, scored over every answer step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, over_problems_and_draws
from af1.interventions.heads import HeadSums, head_sums, matched_draws
from af1.interventions.sites import Site, edit_sites, head_inputs, record
from af1.methods.heads.capture import head_deltas
from af1.methods.heads.ranking import Settings
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last, suffix_start
from af1.progress import stage as progress_stage
from af1.stats import MeanStd, Rate, baseline_warning, mean_std
from af1.tasks.evaluation import Scores, batches
from af1.tasks.task import Task

if TYPE_CHECKING:
    pass


@torch.no_grad()
def knocked_step(
    adapter: ModelAdapter,
    step: Task,
    head_sets: list[list[tuple[int, int]]],
    sums: HeadSums,
    batch_size: int = 32,
) -> list[Scores]:
    """One step's scores with each set of heads mean-ablated everywhere (leave-one-out, `HeadSums.loo`), a `Scores` per
    set; sets share a forward and only the suffix runs, on the context's cache."""
    c = suffix_start(adapter.model, step.input_ids_PT, step.context_len)
    layers = sorted({layer for heads in head_sets for layer, _ in heads})
    member_P = sums.member_B(step.input_ids_PT)
    parts: list[list[Scores]] = [[] for _ in head_sets]
    for sl in batches(len(step), batch_size):
        ids = step.input_ids_PT[sl]
        B = len(ids)
        own: dict[Site, torch.Tensor] = {}
        if layers:
            with record(adapter, [head_inputs(layer) for layer in layers]) as own:
                forward_last(adapter.model, ids, step.context_len)
        loo = {layer: sums.loo(layer, c, own[head_inputs(layer)], member_P[sl]) for layer in layers}
        for chunk in batches(len(head_sets), max(1, batch_size // B)):
            sets = head_sets[chunk]

            edits = {layer: _ablation(adapter, layer, sets, loo[layer]) for layer in layers}
            knocked = {layer for heads in sets for layer, _ in heads}
            with edit_sites(adapter, {head_inputs(layer): edit for layer, edit in edits.items() if layer in knocked}):
                logits = forward_last(adapter.model, ids.repeat(len(sets), 1), step.context_len)
            for s in range(len(sets)):
                parts[chunk.start + s].append(Scores.from_logits(logits[s * B : (s + 1) * B], step.answer_ids_P[sl]))
    return [Scores.concat(p) for p in parts]


def _ablation(adapter: ModelAdapter, layer: int, sets: list[list[tuple[int, int]]], mean_BTE: torch.Tensor):
    """The edit of a layer's head inputs for rows set x problem (row s*B + b: set s, problem b): each set's heads
    of this layer take the problem's mean."""
    d, B = adapter.head_dim, len(mean_BTE)
    mask_SE = torch.zeros(len(sets), adapter.n_heads * d, dtype=torch.bool)
    for s, heads in enumerate(sets):
        for hl, h in heads:
            if hl == layer:
                mask_SE[s, h * d : (h + 1) * d] = True
    mask_R1E = mask_SE.repeat_interleave(B, 0)[:, None]
    mean_RTE = mean_BTE.repeat(len(sets), 1, 1)

    def fn(z: torch.Tensor) -> torch.Tensor:
        return torch.where(mask_R1E.to(z.device), mean_RTE.to(z.device, z.dtype), z)

    return fn


def head_sums_by_step(adapter: ModelAdapter, task: Task) -> dict[Any, HeadSums]:
    """Head sums per token layout and answer step (teacher forced) over all the task's problems, by `part_key`:
    what knockout ablates to (leave-one-out for the problems among them)."""
    return {step.part_key: head_sums(adapter, step) for step in task.steps()}


def knockouts(
    adapter: ModelAdapter, kept: Task, head_sets: list[list[tuple[int, int]]], means: dict[Any, HeadSums]
) -> list[Scores]:
    """Every answer step of the solved problems with each set of heads mean-ablated (leave-one-out means), a
    `Scores` per set; the sets share forwards."""
    per_step = [knocked_step(adapter, step, head_sets, means[step.part_key]) for step in kept.steps()]
    return [Scores.combine(kept, [scores[i] for scores in per_step]) for i in range(len(head_sets))]


def loo_fallbacks(kept: Task, means: dict[Any, HeadSums]) -> int:
    """(problem, answer step) pieces whose mean has no other problem (a sum of one): they keep their own state."""
    return sum(
        int(sums.member_B(step.input_ids_PT).sum()) for step in kept.steps() if (sums := means[step.part_key]).n == 1
    )


@with_config(ConfigDict(extra="forbid"))
class Knockout(TypedDict):
    """The top k heads mean-ablated against random sets of k, on the confirmation part: each set's accuracy a rate
    (interval, n, constant guess), the random sets' spread over draws."""

    k: int
    heads: list[list[int]]
    scoring: str
    means: str
    means_without_other_problems: int
    measured_on: str
    n: int
    accuracy_top_k: Rate
    random_drawn_from: str
    random_matched: dict[str, int]  # over all draws: heads matched by layer and key/value group, by layer, nearest
    ablation_size_top: float  # the top set's summed ablation size (`ablation_sizes`)
    ablation_size_random_mean: float  # the random sets' mean of theirs
    random_heads: list[list[list[int]]]
    top_rank_among_random: int  # random sets that leave as few problems right as the top set, or fewer
    top_rank_p: float  # (1 + those) / (draws + 1): the top set's rank among the draws, at least 1 / (draws + 1)
    accuracy_random_k_spread: MeanStd
    accuracy_random_k: list[Rate]
    base_accuracy: float  # on the solved problems with nothing knocked out: 1 by construction


CONFIRMATION = "the confirmation part of the solved problems"


@torch.no_grad()
def ablation_sizes(adapter: ModelAdapter, tested_on: Task, means: dict[Any, HeadSums], batch_size: int = 32):
    """[L, H]: per head the mean norm of what mean-ablating it adds to the residual at the last position (through
    o_proj): how far its knock-out moves the state, which random heads are matched on."""
    L, H = adapter.n_layers, adapter.n_heads
    total, n = torch.zeros(L, H), 0
    for step in tested_on.steps():
        if step.step:
            continue
        mean_of = means[step.part_key]
        for sl in batches(len(step), batch_size):
            with record(adapter, [head_inputs(layer) for layer in range(L)], last_only=True) as own:
                forward_last(adapter.model, step.input_ids_PT[sl], step.context_len)
            for layer in range(L):
                z_BE = own[head_inputs(layer)]
                mean_BE = mean_of.mean(layer)[-1].to(z_BE.device, z_BE.dtype).expand_as(z_BE)
                total[layer] += head_deltas(adapter, layer, z_BE, mean_BE).float().norm(dim=-1).sum(1).cpu()
            n += len(step.input_ids_PT[sl])
    return total / max(n, 1)


def knocked_out(
    adapter: ModelAdapter,
    task: Task,
    tested_on: Task,
    top: list[tuple[int, int]],
    keys: list[tuple[int, int]],
    s: Settings,
) -> tuple[Knockout, Claim]:
    """The top k heads mean-ablated on the confirmation part against `s.draws` matched random sets (never top or key),
    and the paired claim that the top set leaves fewer problems right."""
    chosen = list(dict.fromkeys(top + keys))
    means = head_sums_by_step(adapter, task)
    size_LH = ablation_sizes(adapter, tested_on, means)
    rand_sets, matched = matched_draws(adapter, top, range(s.draws), chosen, size_LH)
    with progress_stage(f"knock-outs: top {s.k} and {s.draws} random sets"):
        top_scores, *rand_scores = knockouts(adapter, tested_on, [top, *rand_sets], means)
    random_rates = [r.rate(tested_on) for r in rand_scores]
    randoms = [r["value"] for r in random_rates]
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
        accuracy_top_k=top_rate,
        random_drawn_from=f"for each top head, one of the same layer and key/value group (else the same layer, else "
        f"the nearest), among the {n_heads - len(chosen)} heads neither in the top {s.k} nor key heads, from the half "
        "of those nearest it in ablation size (the norm of the change its mean-ablation makes to the last position's "
        "state)",
        random_matched=matched,
        ablation_size_top=float(sum(size_LH[h] for h in top)),
        ablation_size_random_mean=float(torch.tensor([sum(float(size_LH[h]) for h in r) for r in rand_sets]).mean()),
        random_heads=[[list(h) for h in heads] for heads in rand_sets],
        top_rank_among_random=sum(r <= top_rate["value"] for r in randoms),
        top_rank_p=(1 + sum(r <= top_rate["value"] for r in randoms)) / (s.draws + 1),
        accuracy_random_k_spread=mean_std(randoms),
        accuracy_random_k=random_rates,
        base_accuracy=1.0,
    )
    return knockout, top_vs_random_claim(top_scores, rand_scores, s.k, CONFIRMATION)


def knockout_warning(knockout: Knockout, scoring: str) -> str | None:
    top = knockout["accuracy_top_k"]
    return baseline_warning(f"the knock-outs ({scoring} answer)", top["baseline"], knockout["n"])


def top_vs_random_claim(top: Scores, randoms: list[Scores], k: int, measured_on: str) -> Claim:
    """'Knocking out the top k heads leaves fewer problems right than knocking out matched random sets of k', over
    the problems and over such sets (`over_problems_and_draws`: each problem right or not under each set)."""
    return over_problems_and_draws(
        About(
            "top_vs_random",
            f"mean-ablating the top {k} heads leaves fewer problems right than random sets of {k} from the same "
            f"layers and key/value groups, matched on ablation size, do on average (over such sets, {len(randoms)} "
            "drawn, and over these problems)",
            measured_on,
        ),
        top.correct_P.float().tolist(),
        [s.correct_P.float().tolist() for s in randoms],
        top_lower=True,
    )
