"""Alternatives: every ablation and ABP variant at one configuration (the search's or a fixed one), each paired
with it."""

from __future__ import annotations

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, paired_differs, paired_greater
from af1.interventions.af1 import ABLATIONS, AF1Config
from af1.interventions.masks import ABP_VARIANTS
from af1.methods.allforone.faithfulness import Faithfulness, faith_fields, faithfulness
from af1.methods.setup import ALL_SOLVED, Setup
from af1.results import Part
from af1.stats import McNemar, MeanStd, mcnemar_exact, mean_std
from af1.tasks.evaluation import Scores

RESAMPLE_SEEDS = 5


@with_config(ConfigDict(extra="forbid"))
class Alternative(Faithfulness):
    """One alternative intervention, paired against the configured one on the same problems."""

    mcnemar_vs_configured: McNemar


@with_config(ConfigDict(extra="forbid"))
class Resampled(TypedDict):
    """Resample ablation over several seeds: mean and spread of faithfulness and each seed's pairing (its test
    against the configured one is its claim: each problem's share of seeds right, paired)."""

    faithfulness: MeanStd
    per_seed: list[Alternative]
    seeds: int


class Alternatives(Part):
    """Every ablation and every ABP variant at one config (`alternatives`), each paired against the configured one."""

    config: AF1Config
    configured: Faithfulness  # of `config`, which every alternative is paired against
    ablations: dict[str, Alternative | Resampled]
    abp_variants: dict[str, Alternative]
    claims: list[Claim]  # each alternative against the configured intervention: one family (Holm)


def alternatives(
    setup: Setup, config: AF1Config, seeds: int = RESAMPLE_SEEDS, measured_on: str = ALL_SOLVED
) -> Alternatives:
    """At one config, each ablation with ABP as configured and each ABP variant with CAMA against the configured
    intervention on the same problems (paired exact McNemar; resample: permutation over `seeds` seeds), one family."""
    reference_scores = faithfulness(setup, config)
    reference_correct = reference_scores.correct_P.tolist()
    on = f"{measured_on} ({len(setup.kept)})"
    configured = f"CAMA with ABP {config.abp}" if config.ablation == "cama" else f"{config.ablation} with {config.abp}"
    claims: list[Claim] = []

    def differs(name: str, scores: Scores) -> None:
        statement = f"{name} changes faithfulness from {configured}"
        claims.append(
            paired_differs(About("alternative", statement, on, name), scores.correct_P.tolist(), reference_correct)
        )

    def entry(scores: Scores) -> Alternative:
        return Alternative(
            **faith_fields(setup, scores),
            mcnemar_vs_configured=mcnemar_exact(scores.correct_P.tolist(), reference_correct),
        )

    ablations: dict[str, Alternative | Resampled] = {}
    for name in ABLATIONS:
        if name == "resample":  # one paired test of each problem's share of seeds right (not when configured)
            runs = [faithfulness(setup, config.model_copy(update={"ablation": name, "seed": s})) for s in range(seeds)]
            ablations[name] = Resampled(
                faithfulness=mean_std([r.accuracy for r in runs]),
                per_seed=[entry(r) for r in runs],
                seeds=seeds,
            )
            if config.ablation != name:
                share_P = torch.stack([r.correct_P.float() for r in runs]).mean(0).tolist()
                statement = f"ablation resample ({seeds} seeds) changes faithfulness from {configured}"
                reference = [float(c) for c in reference_correct]
                claims.append(
                    paired_greater(
                        About("alternative", statement, on, "ablation resample"),
                        share_P,
                        reference,
                        alternative="two-sided",
                    )
                )
        else:
            scores = faithfulness(setup, config.model_copy(update={"ablation": name}))
            ablations[name] = entry(scores)
            if name != config.ablation:
                differs(f"ablation {name}", scores)
    variants = {}
    for v in ABP_VARIANTS:
        scores = faithfulness(setup, config.model_copy(update={"abp": v}))
        variants[v] = entry(scores)
        if v != config.abp:
            differs(f"ABP {v}", scores)
    return Alternatives(
        config=config,
        configured=faith_fields(setup, reference_scores),
        ablations=ablations,
        abp_variants=variants,
        claims=adjust(claims, f"alternatives at {config.cell}"),
    )
