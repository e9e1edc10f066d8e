"""Neurons of the compute stage (docs/methods.md §5): attributed under AF1 on the selection part, knocked out on the
confirmation part against random neurons of the same layers. Shapes: P problems, B batch, L layers, I neurons."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, over_problems_and_draws
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config, af1_intervention
from af1.interventions.sites import Edit, edit_sites, neurons
from af1.methods.allforone.faithfulness import faithfulness
from af1.methods.heads.attribution import RankAgreement, agreement, last_position_leaves
from af1.methods.heuristics import Pattern
from af1.methods.setup import Setup, executors
from af1.models.forward import forward_last
from af1.progress import progress
from af1.results import Part
from af1.stats import Rate
from af1.tasks.evaluation import Scores, batches

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # knocked-out set sizes, each tested against random sets
FAMILY = "neurons of the compute stage"


Means = dict[Any, dict[int, torch.Tensor]]  # per answer step and layout (part_key), per layer: the mean activations [I]


@with_config(ConfigDict(extra="forbid"))
class Neuron(TypedDict):
    """One neuron and its attribution (mean over the selection part, log-probability units)."""

    layer: int
    neuron: int
    attribution: float


class Neurons(Part):
    """The neurons' part: the ranking, the top neurons, AF1's faithfulness alone and with the top k mean-ablated beside
    `draws` random sets of k (k in `sizes`), the k that loses half of it, and the claims."""

    config: AF1Config
    compute_layers: list[int]
    neurons_per_layer: int
    attribution: str
    means: str
    n_selection: int
    n_confirmation: int
    top: list[Neuron]  # the first 64 by attribution
    faithfulness: Rate
    sizes: list[int]
    top_faithfulness: list[Rate]
    random_faithfulness: list[list[float]]  # per size, one per draw
    random_drawn_from: str
    random_neurons: list[list[list[int]]]  # per draw, its set of the largest size ([layer, neuron]; size k: first k)
    half_faithfulness_top: int | None  # the smallest size whose top set leaves at most half of AF1's faithfulness
    half_faithfulness_top_interval: int | None  # the same by the upper end of its 95 % interval
    half_faithfulness_random: int | None  # the same for the mean of the random sets
    pieces_without_means: int  # (problem, step) pieces of the confirmation part whose step the selection lacks
    claims: list[Claim]
    verified: RankAgreement  # the estimate against exact single-neuron knock-outs (`verified`)
    patterns: list[Pattern] = []  # the top neurons' activations over the operands (two integer operands only)


def compute_layers(config: AF1Config, n_layers: int) -> list[int]:
    """The layers after the transfer window (or after wait, with none): where the last token computes alone."""
    return config.stages(n_layers)["compute"]


def attribution_and_means(
    setup: Setup, config: AF1Config, layers: Sequence[int], batch_size: int = 8
) -> tuple[torch.Tensor, Means]:
    """Under AF1 (reference hooks, each step's CAMA means): every problem's attribution of every neuron [P, L, I]
    (float32) and each step's mean activations (float64)."""
    if config.ablation == "resample":
        raise Af1Error("the neurons study runs under the cama, mean or zero ablation (resample draws donors per run)")
    adapter = setup.adapter
    sites = [neurons(layer) for layer in layers]
    estimate_PLI = torch.zeros(len(setup.kept), len(layers), adapter.n_neurons)
    means: Means = {}
    for step in progress(setup.steps, desc="neuron attribution"):
        ids, answer = step.kept.input_ids_PT, step.kept.answer_ids_P
        act_PLI = torch.zeros(len(ids), *estimate_PLI.shape[1:])
        grad_PLI = torch.zeros_like(act_PLI)
        for sl in batches(len(ids), batch_size):
            batch = ids[sl].to(adapter.device)
            with (
                last_position_leaves(adapter, sites) as (acts, zeros),
                af1_intervention(adapter, step.kept, config, step.means, batch),
            ):
                logp = forward_last(adapter.model, batch).log_softmax(-1).gather(1, answer[sl][:, None])
                grads = torch.autograd.grad(logp.sum(), [zeros[s] for s in sites])
            act_PLI[sl] = torch.stack([acts[s].float().cpu() for s in sites], 1)
            grad_PLI[sl] = torch.stack([g.float().cpu() for g in grads], 1)
        mean_LI = act_PLI.double().mean(0)
        estimate_PLI[step.kept.rows_in_parent] += (mean_LI.float() - act_PLI) * grad_PLI
        means[step.kept.part_key] = dict(zip(layers, mean_LI, strict=True))
    return estimate_PLI, means


def ranked(estimate_LI: torch.Tensor, layers: Sequence[int]) -> list[Neuron]:
    """Every neuron, most negative attribution first."""
    order = estimate_LI.flatten().argsort().tolist()
    width = estimate_LI.shape[1]
    return [
        Neuron(layer=layers[i // width], neuron=i % width, attribution=float(estimate_LI.flatten()[i])) for i in order
    ]


def matched_random(top: list[Neuron], width: int, seed: int) -> list[tuple[int, int]]:
    """One random neuron for each of the `top` neurons, of the same layer, never one of them nor one drawn already
    (seeded): a random set of len(top) from the same layers, each layer as often as in the top set."""
    rng = random.Random(seed)
    taken = {(n["layer"], n["neuron"]) for n in top}
    drawn = []
    for n in top:
        free = [j for j in range(width) if (n["layer"], j) not in taken]
        if not free:
            raise Af1Error(f"layer {n['layer']} has no neuron left to draw: use a smaller largest set")
        pick = (n["layer"], rng.choice(free))
        taken.add(pick)
        drawn.append(pick)
    return drawn


def knocked_out(
    setup: Setup, config: AF1Config, chosen: list[tuple[int, int]], means: Means, reference: bool = False
) -> Scores:
    """AF1's scores with the chosen (layer, neuron)s set to their mean at the last position (the MLP's output projection
    input, which every executor runs through), by the executor AF1 picks."""
    layers = sorted({layer for layer, _ in chosen})
    rows = {layer: torch.tensor([j for m, j in chosen if m == layer]) for layer in layers}
    picked = executors(setup, config, reference)
    logits = []
    for step, (executor, _) in zip(setup.steps, picked, strict=True):
        mean = means.get(step.kept.part_key)  # a step the selection part lacks keeps its own (counted)
        edits = {neurons(m): _set_last(rows[m], mean[m][rows[m]]) for m in layers} if mean is not None else {}
        with edit_sites(setup.adapter, edits):
            logits.append(executor.logits(step, config))
    return Scores.from_steps(setup.kept, logits)


def _set_last(index: torch.Tensor, value: torch.Tensor) -> Edit:
    """The edit that sets the neurons `index` at the last position to `value`."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, -1, index.to(x.device)] = value.to(x.device, x.dtype)
        return x

    return fn


VERIFIED = 32  # top neurons, and as many random ones of the same layers, knocked out one by one on the selection part


def verified(
    selection: Setup,
    config: AF1Config,
    estimate_PLI: torch.Tensor,
    layers: Sequence[int],
    order: list[Neuron],
    means: Means,
) -> RankAgreement:
    """The attribution checked exactly on its own problems: the top VERIFIED and VERIFIED random neurons each
    mean-ablated alone, per problem the answer's log-probability change, and the rank agreement over these neurons."""
    top = [(n["layer"], n["neuron"]) for n in order[:VERIFIED]]
    rest = [(n["layer"], n["neuron"]) for n in order[VERIFIED:]]
    chosen = top + random.Random(0).sample(rest, min(VERIFIED, len(rest)))
    row = {layer: i for i, layer in enumerate(layers)}
    estimate_PZ = torch.stack([estimate_PLI[:, row[layer], j] for layer, j in chosen], 1)
    base_P = _log_p(faithfulness(selection, config))
    singles = progress(chosen, desc="neurons knocked out one by one (the estimate checked)")
    exact_PZ = torch.stack([_log_p(knocked_out(selection, config, [neuron], means)) - base_P for neuron in singles], 1)
    return agreement(estimate_PZ, exact_PZ, k=10)


def _log_p(scores: Scores) -> torch.Tensor:
    """The whole answer's log-probability per problem, float64 (a float32 probability rounds to 1 near certainty)."""
    assert scores.log_p_correct_P is not None, "knock-outs score logits, not greedy tokens"
    return scores.log_p_correct_P.double()


def half_size(sizes: Sequence[int], rates: Sequence[float], full: float, baseline: float) -> int | None:
    """The smallest size whose faithfulness (a point, or an interval's upper end) is at most half of `full`; None
    where none is, or where AF1 alone does no better than the constant guess (nothing to lose)."""
    if full <= baseline:
        return None
    return next((k for k, r in zip(sizes, rates, strict=True) if r <= full / 2), None)


def study(
    selection: Setup, confirmation: Setup, config: AF1Config, *, draws: int, largest: int, measured_on: str
) -> Neurons:
    """Rank the compute neurons on `selection`; on `confirmation` knock out the top k and `draws` random sets of k per k
    in SIZES, and claim the top set leaves fewer right (paired permutation tests, one Holm family)."""
    adapter = selection.adapter
    layers = compute_layers(config, adapter.n_layers)
    if not layers:
        raise Af1Error(f"AF1 at {config.cell} leaves no compute layer")
    width = adapter.n_neurons
    sizes = [k for k in SIZES if k <= min(largest, len(layers) * width // 2)]
    estimate_PLI, means = attribution_and_means(selection, config, layers)
    order = ranked(estimate_PLI.double().mean(0), layers)
    top = order[: sizes[-1]]
    alone = faithfulness(confirmation, config)  # warms the executor's tables before any neuron is edited
    check = verified(selection, config, estimate_PLI, layers, order, means)
    full = alone.rate(confirmation.kept)
    top_scores, random_scores = [], []
    drawn = [matched_random(top, width, seed=d) for d in range(draws)]  # never a top neuron; draw d's k: its first k
    for k in progress(sizes, desc=f"neuron knock-outs (top and {draws} random sets per size)"):
        top_scores.append(knocked_out(confirmation, config, [(n["layer"], n["neuron"]) for n in top[:k]], means))
        random_scores.append([knocked_out(confirmation, config, chosen[:k], means) for chosen in drawn])
    kept = confirmation.kept
    top_rates = [s.rate(kept) for s in top_scores]
    random_rates = [[s.rate(kept)["value"] for s in per] for per in random_scores]
    claims = [
        over_problems_and_draws(
            About(
                "neurons_vs_random",
                f"mean-ablating the top {k} neurons of the compute layers leaves fewer problems right under AF1 than "
                f"random sets of {k} from the same layers do on average (over such sets, {draws} drawn, and over "
                "these problems)",
                measured_on,
                str(k),
            ),
            t.correct_P.float().tolist(),
            [s.correct_P.float().tolist() for s in per],
            top_lower=True,
        )
        for k, t, per in zip(sizes, top_scores, random_scores, strict=True)
    ]
    missing = sum(len(s.kept) for s in confirmation.steps if s.kept.part_key not in means)
    full_and_guess = (full["value"], full["baseline"])
    return Neurons(
        config=config,
        compute_layers=layers,
        neurons_per_layer=width,
        attribution="per neuron, the first-order estimate of mean-ablating it at the last token under AF1: (its mean "
        "on the selection part - its activation) x the gradient of the log-probability of the correct token, summed "
        "over every answer step (the whole answer's log-probability), then averaged over the selection part's "
        "problems; most negative first (removing it costs the answer most)",
        means="each neuron's mean activation at the last token under AF1 over the selection part's problems, per "
        "answer step and token layout: no knocked-out problem (confirmation part) is inside the mean it takes",
        n_selection=len(selection.kept),
        n_confirmation=len(kept),
        top=order[:64],
        faithfulness=full,
        sizes=sizes,
        top_faithfulness=top_rates,
        random_faithfulness=random_rates,
        random_drawn_from="per draw, for each top neuron of the largest size one of the same layer drawn at random "
        "(seeded) among those not in that top set and not drawn already; a size k's random set is the draw's first k",
        random_neurons=[[list(n) for n in chosen] for chosen in drawn],
        half_faithfulness_top=half_size(sizes, [r["value"] for r in top_rates], *full_and_guess),
        half_faithfulness_top_interval=half_size(sizes, [r["ci"][1] for r in top_rates], *full_and_guess),
        half_faithfulness_random=half_size(sizes, [sum(r) / len(r) for r in random_rates], *full_and_guess),
        pieces_without_means=missing,
        verified=check,
        claims=adjust(claims, FAMILY),
    )
