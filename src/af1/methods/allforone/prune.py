"""Head pruning: how many heads of the transfer layers AF1 needs, chosen on selection, judged on confirmation."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, rate_below
from af1.errors import Af1Error
from af1.executors.fast import fast_pruned_logits
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import Faithfulness, faith_fields, faithfulness, scored, setup_inputs
from af1.methods.setup import Setup, executors
from af1.progress import progress
from af1.results import Part
from af1.stats import McNemar, Rate, mcnemar_exact, split_indices
from af1.tasks.evaluation import ProblemInputs, Scores


def pruned_scores(setup: Setup, config: AF1Config, head_sets: list[list[tuple[int, int]]]) -> list[Scores]:
    """Scores under `config` with each set of its transfer layers' heads kept from peeking, all sets at once on the fast
    path; executors are picked once, as pruned heads never change which supports a case."""
    chosen = executors(setup, config)
    if any(executor.name != "fast" for executor, _ in chosen):
        return [scored(setup, config.model_copy(update={"pruned_heads": hs}), chosen) for hs in head_sets]
    per_step = [
        fast_pruned_logits(step.adapter, step.kept, config, step.local_kv(config), head_sets) for step in setup.steps
    ]
    return [Scores.from_steps(setup.kept, [logits[i] for logits in per_step]) for i in range(len(head_sets))]


@with_config(ConfigDict(extra="forbid"))
class PrunedConfirmation(TypedDict):
    """The pruned set checked on the confirmation split: unpruned and pruned faithfulness, paired (exact McNemar)."""

    unpruned: Faithfulness
    pruned: Faithfulness
    mcnemar: McNemar


class Pruning(Part):
    """Transfer-layer heads kept from peeking one at a time (`prune_heads`): the order, the curves on the selection
    split (faithfulness a rate, the unpruned config first), the set before the first drop, and its confirmation."""

    config: AF1Config
    n_transfer_heads: int
    measure: str
    curve: str
    n_selection: int
    n_confirmation: int
    prune_order: list[list[int]]
    faithfulness_vs_pruned: list[Rate]
    mean_p_correct_vs_pruned: list[float]
    mean_log_p_correct_vs_pruned: list[float]
    keep: float
    n_pruned_before_first_drop: int
    inputs: ProblemInputs
    confirmation: PrunedConfirmation
    claims: list[Claim]  # the pruned set keeps `keep` of the unpruned faithfulness on the confirmation split


def prune_heads(
    setup: Setup,
    config: AF1Config,
    *,
    selection: float,
    seed: int,
    whole_curve: bool,
    keep: float = 0.95,
) -> Pruning:
    """Greedy pruning of transfer heads' peeking on a selection split by the answer's float64 log-probability, to the
    first drop below `keep` x unpruned (`whole_curve`: every head); that set confirmed on the other split."""
    if config.transfer == 0:
        raise Af1Error("head pruning needs a config with transfer layers (transfer > 0)")
    sel, conf = split_indices(len(setup.kept), selection, seed)
    on_sel, on_conf = setup.on(sel), setup.on(conf)
    heads = [(layer, h) for layer in config.peek_layers() for h in range(setup.adapter.n_heads)]
    order, curve = greedy_order(on_sel, config, heads, whole_curve=whole_curve, keep=keep)
    faith_curve = [c.accuracy for c in curve]
    # the last set before the curve first falls below keep x unpruned (a later recovery does not count)
    n_pruned = next((i for i, f in enumerate(faith_curve) if f < keep * faith_curve[0]), len(faith_curve)) - 1
    pruned = config.model_copy(update={"pruned_heads": order[:n_pruned]})
    conf_full, conf_pruned = faithfulness(on_conf, config), faithfulness(on_conf, pruned)
    return Pruning(
        config=config,
        n_transfer_heads=len(heads),
        measure="mean log-probability of the correct answer, summed over its steps, float64 (selection split), "
        "re-ranked after every removal",
        curve="every head" if whole_curve else "up to the first drop below keep x unpruned",
        n_selection=len(sel),
        n_confirmation=len(conf),
        prune_order=[list(hd) for hd in order],
        faithfulness_vs_pruned=[c.rate(on_sel.kept) for c in curve],
        mean_p_correct_vs_pruned=[c.mean_p_correct for c in curve],
        mean_log_p_correct_vs_pruned=[c.mean_log_p_correct for c in curve],
        keep=keep,
        n_pruned_before_first_drop=n_pruned,
        inputs=setup_inputs(setup, selection=on_sel, confirmation=on_conf),
        confirmation=PrunedConfirmation(
            unpruned=faith_fields(on_conf, conf_full),
            pruned=faith_fields(on_conf, conf_pruned),
            mcnemar=mcnemar_exact(conf_pruned.correct_P.tolist(), conf_full.correct_P.tolist()),
        ),
        claims=pruned_claims(n_pruned, (1 - keep) * faith_curve[0], conf_full, conf_pruned) if n_pruned else [],
    )


def greedy_order(
    on_sel: Setup, config: AF1Config, heads: list[tuple[int, int]], *, whole_curve: bool, keep: float
) -> tuple[list[tuple[int, int]], list[Scores]]:
    """The heads in the order they are pruned, and the scores of the unpruned config and after each removal: every
    round removes the head whose removal keeps the mean log-probability highest (ties: the earlier head)."""
    curve, order, remaining = [faithfulness(on_sel, config)], [], list(heads)
    for _ in progress(range(len(heads)), desc="prune heads"):
        scores = pruned_scores(on_sel, config, [[*order, h] for h in remaining])
        best = max(range(len(remaining)), key=lambda i: (scores[i].mean_log_p_correct, -i))
        order.append(remaining.pop(best))
        curve.append(scores[best])
        if not whole_curve and curve[-1].accuracy < keep * curve[0].accuracy:
            break
    return order, curve


def pruned_claims(n_pruned: int, margin: float, full: Scores, pruned: Scores) -> list[Claim]:
    """'The pruned heads need not peek': on the confirmation split, under `margin` of problems go from right unpruned to
    wrong pruned; `margin` ((1 - keep) x selection's unpruned faithfulness) is fixed before confirmation is read."""
    return [
        rate_below(
            About(
                "pruned_keeps",
                f"the {n_pruned} heads chosen on the selection half need not peek: kept from peeking, they break "
                f"fewer than {margin:.3f} of the problems (what the selection split's rule lets fall)",
                f"the confirmation split ({len(full.correct_P)} solved problems)",
            ),
            (full.correct_P & ~pruned.correct_P).tolist(),  # right unpruned, wrong pruned
            margin,
        )
    ]
