"""The key heads against AF1 (docs/methods.md §2 beside §1): on the search's confirmation split, faithfulness when in
its transfer layers all, key, top, random or no heads peek."""

from __future__ import annotations

from dataclasses import dataclass

from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, over_problems_and_draws, paired_differs
from af1.interventions.af1 import AF1Config
from af1.interventions.heads import matched_draws
from af1.methods.allforone.faithfulness import Faithfulness, faith_fields, faithfulness
from af1.methods.allforone.prune import pruned_scores
from af1.methods.setup import Setup
from af1.stats import McNemar, MeanStd, mcnemar_exact, mean_std
from af1.tasks.evaluation import Scores


class PeekRow(Faithfulness):
    """AF1's faithfulness when in its transfer layers only some heads peek, against all heads peeking."""

    variant: str
    peeking: int
    mcnemar_vs_all: McNemar | None  # None: the row of all heads itself


class RandomPeekRow(TypedDict):
    """As many random heads of the transfer layers as top heads there (matched by layer and key/value group, never top
    or key) peek: faithfulness mean ± std over draws, the guess, each draw's heads."""

    variant: str
    peeking: int
    random_heads: list[list[list[int]]]
    random_matched: dict[str, int]  # over all draws, how many heads were matched at each level (`matched_heads`)
    faithfulness: MeanStd
    faithfulness_per_draw: list[float]
    baseline: float
    mcnemar_vs_all: None


class Consistency(TypedDict):
    """The key heads against AF1 (`consistency`): the search's config, its transfer layers' heads and the
    faithfulness of each way of letting only some of them peek."""

    config: AF1Config
    transfer_layers: list[int]
    n_transfer_heads: int
    key_heads_in_transfer_layers: list[list[int]]
    top_heads_in_transfer_layers: list[list[int]]
    n: int
    measured_on: str
    heads_chosen_on: str
    counterfactual: str
    rows: list[PeekRow | RandomPeekRow]
    claims: list[Claim]  # raw: the study adjusts them with its own as one family


RANDOM_DRAWS = 39  # draws of random heads by default: the claim treats them as a sample, as it does the problems
KEY_PEEK = "only the heads chosen as key (selection half) peek"


@dataclass(frozen=True)
class Chosen:
    """The heads the study chose on the search's selection split, the counterfactual that ranked them, and how many
    random draws their control makes (the study's, as for its knock-out)."""

    key: list[list[int]]
    top: list[list[int]]
    counterfactual: str
    draws: int = RANDOM_DRAWS


def consistency(on: Setup, config: AF1Config, chosen: Chosen) -> Consistency:
    """The AF1 config's faithfulness on `on` when all, key, top-k, random (mean ± std over draws) or no heads of its
    transfer layers peek, each tested against all peeking (raw p: the study adjusts)."""
    transfer_heads = [(layer, h) for layer in config.peek_layers() for h in range(on.adapter.n_heads)]
    keys = {(h[0], h[1]) for h in chosen.key}
    top = {(h[0], h[1]) for h in chosen.top}
    top_name = f"only the top-{len(top)} heads of these layers ({sum(h in top for h in transfer_heads)}) peek"
    variants = {
        "all heads peek": [],
        KEY_PEEK: [h for h in transfer_heads if h not in keys],
        top_name: [h for h in transfer_heads if h not in top],
        "no head peeks": transfer_heads,
    }
    scores = {
        name: faithfulness(on, config.model_copy(update={"pruned_heads": pruned})) for name, pruned in variants.items()
    }
    full = scores["all heads peek"]
    measured = f"the search's confirmation split ({len(on.kept)} solved problems)"
    claims = [
        paired_differs(
            About("peek_variant", f"'{name}' changes faithfulness from 'all heads peek'", measured, name),
            scores[name].correct_P.tolist(),
            full.correct_P.tolist(),
        )
        for i, name in enumerate(variants)
        if variants[name] and variants[name] not in list(variants.values())[i + 1 :]  # a duplicate row: one test
    ]
    rows: list[PeekRow | RandomPeekRow] = [
        PeekRow(
            variant=name,
            peeking=len(transfer_heads) - len(pruned),
            **faith_fields(on, scores[name]),
            mcnemar_vs_all=mcnemar_exact(scores[name].correct_P.tolist(), full.correct_P.tolist()) if pruned else None,
        )
        for name, pruned in variants.items()
    ]
    others = [h for h in transfer_heads if h not in top and h not in keys]  # random heads: never the chosen ones
    top_here = [h for h in transfer_heads if h in top]
    if 0 < len(top_here) <= len(others):  # as many matched random heads, not top ones: is the top set special?
        random_row, claim = random_peek(
            on, config, transfer_heads, others, top_here, scores[top_name], full, chosen.draws
        )
        rows.insert(3, random_row)
        claims.append(claim)
    return Consistency(
        config=config,
        transfer_layers=config.peek_layers(),
        n_transfer_heads=len(transfer_heads),
        key_heads_in_transfer_layers=sorted([list(h) for h in keys if h in set(transfer_heads)]),
        top_heads_in_transfer_layers=sorted([list(h) for h in top if h in set(transfer_heads)]),
        n=len(on.kept),
        measured_on="the search's confirmation split",
        heads_chosen_on="the search's selection split (path patching, not faithfulness)",
        counterfactual=chosen.counterfactual,
        rows=rows,
        claims=claims,
    )


def random_peek(
    on: Setup,
    config: AF1Config,
    transfer_heads: list[tuple[int, int]],
    others: list[tuple[int, int]],
    top_here: list[tuple[int, int]],
    top_only: Scores,
    full: Scores,
    n_draws: int = RANDOM_DRAWS,
) -> tuple[RandomPeekRow, Claim]:
    """As many random matched heads as the top heads of the transfer layers (`matched_heads`) let peek in `n_draws`
    seeded draws, and the paired claim that the top heads alone keep more right."""
    k_top = len(top_here)
    every = [(m, j) for m in range(on.adapter.n_layers) for j in range(on.adapter.n_heads)]
    draws, matched = matched_draws(on.adapter, top_here, range(n_draws), [h for h in every if h not in others])
    drawn = pruned_scores(on, config, [[h for h in transfer_heads if h not in d] for d in draws])
    spread = mean_std([s.accuracy for s in drawn])
    claim = over_problems_and_draws(
        About(
            "top_peek_vs_random",
            f"letting only the {k_top} top heads of the transfer layers peek keeps more problems right than "
            f"letting as many random heads of the same layers and key/value groups peek does on average (over such "
            f"draws, {n_draws} made, and over these problems; none of the top or key heads)",
            f"the search's confirmation split ({len(on.kept)} solved problems)",
        ),
        top_only.correct_P.float().tolist(),
        [s.correct_P.float().tolist() for s in drawn],
        top_lower=False,
    )
    row = RandomPeekRow(
        variant=f"{k_top} random heads of the same layers and key/value groups, none of the top or key heads, peek "
        f"({n_draws} draws)",
        peeking=k_top,
        random_heads=[sorted(list(h) for h in d) for d in draws],
        random_matched=matched,
        faithfulness=spread,
        faithfulness_per_draw=[s.accuracy for s in drawn],
        baseline=full.rate(on.kept)["baseline"],
        mcnemar_vs_all=None,
    )
    return row, claim
