"""Necessity: faithfulness with the last token kept from reading the operands in each window of layers, and the
found configuration's transfer window moved to later starts."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, rate_below
from af1.executors.fast import knockout_logits
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import Faithfulness, faith_fields, faithfulness
from af1.methods.setup import Setup
from af1.results import Part
from af1.stats import Rate, constant_baseline
from af1.tasks.evaluation import Scores


@with_config(ConfigDict(extra="forbid"))
class ShiftedStart(Faithfulness):
    """Faithfulness with the transfer window starting at `start` instead of right after the wait."""

    start: int


@with_config(ConfigDict(extra="forbid"))
class ShiftedTransfer(TypedDict):
    """The search's chosen cell's transfer window moved to every later start, on n problems."""

    config: AF1Config
    n: int
    by_start: list[ShiftedStart]


class Necessity(Part):
    """Faithfulness (a rate: interval, n, constant guess) with the last token kept from reading the operands in each
    window of layers, by width (the windows' first layers in order); and the chosen cell's moved transfer window."""

    windows: dict[str, list[Rate]]
    claims: list[Claim]  # per window, 'blocking it leaves faithfulness below the threshold': one family (Holm)
    shifted_transfer: ShiftedTransfer | None = None


def necessity(
    setup: Setup,
    *,
    windows: Sequence[int],
    found: AF1Config | None = None,
    found_on: Setup | None = None,
    threshold: float = 0.9,
) -> Necessity:
    """Faithfulness with the last token kept from reading the operands in each window, per window the claim it falls
    below `threshold` (one Holm family), and `found`'s transfer window moved to every later start (on `found_on`)."""
    L = setup.adapter.n_layers
    per_window: dict[str, list[Rate]] = {}
    widths = [w for w in dict.fromkeys(windows) if w <= L]
    sets = [list(range(s, s + width)) for width in widths for s in range(L - width + 1)]
    per_step = [knockout_logits(step.adapter, step.kept, sets, greedy=True) for step in setup.steps]
    scored = [Scores.from_steps(setup.kept, [logits[i] for logits in per_step]) for i in range(len(sets))]
    rates = [s.rate(setup.kept) for s in scored]
    baseline = constant_baseline(setup.kept.targets(), setup.kept.layout_P.tolist())
    claims = [
        rate_below(
            About(
                "necessary_window",
                f"kept from reading the other tokens in {_layers_text(s)}, the last token answers less often than "
                f"{threshold}",
                f"the {len(setup.kept)} solved problems",
                _layers_text(s),
                baseline,
            ),
            scores.correct_P.tolist(),
            threshold,
        )
        for s, scores in zip(sets, scored, strict=True)
    ]
    for width in widths:
        per_window[str(width)] = [r for s, r in zip(sets, rates, strict=True) if len(s) == width]
    result = Necessity(
        windows=per_window,
        claims=adjust(claims, "necessity: every blocked window"),
    )
    if found is not None and found.transfer > 0:
        on = found_on or setup
        shifted = []
        for start in range(found.wait + 1, L - found.transfer + 1):
            config = found.model_copy(update={"transfer_start": start})
            shifted.append(ShiftedStart(start=start, **faith_fields(on, faithfulness(on, config))))
        result.shifted_transfer = ShiftedTransfer(config=found, n=len(on.kept), by_start=shifted)
    return result


def _layers_text(layers: list[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
