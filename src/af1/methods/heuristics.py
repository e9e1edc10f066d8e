"""What a neuron's activation at the last token follows (result, units digit, an operand; Nikankin et al., ICLR 2025),
against the same activations shuffled. Descriptive, shown beside the neurons study's claims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.interventions.af1 import AF1Config
from af1.interventions.sites import neurons
from af1.methods.probes import labels, last_token_values
from af1.methods.setup import Setup

GROUPINGS = ("result", "result mod 10", "operand a", "operand b")  # what a heuristic neuron may respond to
SHUFFLES = 1000  # of the activations across problems: the share each grouping explains by chance
PATTERNS = 6  # top neurons whose activation over the operands is shown


@with_config(ConfigDict(extra="forbid"))
class Pattern(TypedDict):
    """One top neuron's activation at the last prompt token on every solved problem, per grouping the variance share its
    means explain (eta squared) against its 95th percentile shuffled; `tags`: groupings above it (uncorrected)."""

    layer: int
    neuron: int
    operands: list[list[int]]
    activation: list[float]
    explained: dict[str, float]
    explained_by_chance: dict[str, float]
    tags: list[str]


def patterns(setup: Setup, config: AF1Config, chosen: Sequence[tuple[int, int]], seed: int = 0) -> list[Pattern]:
    """`Pattern` of each chosen (layer, neuron) on the setup's problems; none where the task's problems are not two
    varying integer operands with an integer answer."""
    targets = labels(setup.kept)
    if not {"a", "b", "answer"} <= set(targets) or "c" in targets:
        return []
    a, b, result = (np.asarray(targets[k]) for k in ("a", "b", "answer"))
    groups = {"result": result, "result mod 10": result % 10, "operand a": a, "operand b": b}
    sites = sorted({neurons(layer) for layer, _ in chosen}, key=lambda site: site.layer or 0)
    values = last_token_values(setup, config, sites)
    rng = np.random.default_rng(seed)
    out = []
    for layer, neuron in chosen:
        x = values[neurons(layer)][:, neuron].numpy()
        shuffled = np.stack([rng.permutation(x) for _ in range(SHUFFLES)])
        explained = {g: float(eta_squared(x[None], keys)[0]) for g, keys in groups.items()}
        chance = {g: float(np.percentile(eta_squared(shuffled, keys), 95)) for g, keys in groups.items()}
        out.append(
            Pattern(
                layer=layer,
                neuron=neuron,
                operands=[[int(i), int(j)] for i, j in zip(a, b, strict=True)],
                activation=x.tolist(),
                explained=explained,
                explained_by_chance=chance,
                tags=sorted((g for g in GROUPINGS if explained[g] > chance[g]), key=lambda g: -explained[g]),
            )
        )
    return out


def eta_squared(x_SP: np.ndarray, keys_P: np.ndarray) -> np.ndarray:
    """Per row of values over problems, the share of its variance that its groups' means (by key) explain [S]."""
    _, group_P = np.unique(keys_P, return_inverse=True)
    counts = np.bincount(group_P)
    means = np.stack([np.bincount(group_P, weights=row) / counts for row in x_SP])
    centred = x_SP - x_SP.mean(1, keepdims=True)
    between = ((means[:, group_P] - x_SP.mean(1, keepdims=True)) ** 2).sum(1)
    return between / np.maximum((centred**2).sum(1), 1e-30)
