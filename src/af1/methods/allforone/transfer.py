"""Transfer: a configuration found on one model mapped onto another's layers and measured there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, paired_differs
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import Faithfulness, faith_fields, faithfulness
from af1.methods.setup import Setup
from af1.tasks.evaluation import Scores


def map_config(config: AF1Config, from_layers: int, to_layers: int, by: str) -> AF1Config:
    """A config found on one model, for another: the same layers, or the same relative depth."""
    if by == "absolute":
        wait, transfer = config.wait, config.transfer
    elif by == "relative":
        wait = round((config.wait + 1) * to_layers / from_layers) - 1
        transfer = max(1, round(config.transfer * to_layers / from_layers)) if config.transfer else 0
    else:
        raise Af1Error(f"unknown mapping '{by}': absolute or relative")
    wait = min(wait, to_layers - 2)  # a mapped config keeps at least one compute layer
    transfer = max(0, min(transfer, to_layers - 2 - wait))
    return config.model_copy(update={"wait": wait, "transfer": transfer, "transfer_start": None, "pruned_heads": []})


@with_config(ConfigDict(extra="forbid"))
class TransferSource(TypedDict):
    """Where a transferred config comes from: its layers and its model's depth (a study adds which model, whether
    its search chose the cell or it is the best eligible one, whether its claim was confirmed, at what threshold)."""

    wait: int
    transfer: int
    n_layers: int
    model: NotRequired[str | None]
    chosen: NotRequired[bool]
    found: NotRequired[bool]
    threshold: NotRequired[float]


@with_config(ConfigDict(extra="forbid"))
class Mapped(Faithfulness):
    """A config as mapped onto this model, measured; where this model has its own config, the claim that the
    mapped one differs from it on the same problems (its p adjusted over the transfer result's family)."""

    wait: int
    transfer: int
    vs_own: NotRequired[Claim]


@with_config(ConfigDict(extra="forbid"))
class Transferred(TypedDict):
    """A config found on another model measured here (`transfer_config`): by the same layers, by the same relative
    depth, and this model's own config beside them when it has one."""

    source: TransferSource
    absolute: Mapped
    relative: Mapped
    own: NotRequired[Mapped]


def transfer_config(
    setup: Setup,
    config: AF1Config,
    from_layers: int,
    own: AF1Config | None = None,
    measured: dict[str, Scores] | None = None,
) -> Transferred:
    """Faithfulness here of a config found elsewhere, by absolute layers and by relative depth; with `own`, that too and
    a raw paired McNemar of each differing mapping. `measured` caches scores per config across calls."""
    measured = {} if measured is None else measured

    def scored(at: AF1Config) -> Scores:
        key = at.model_dump_json()
        if key not in measured:
            measured[key] = faithfulness(setup, at)
        return measured[key]

    own_scores = None if own is None else scored(own)

    def mapped(by: str) -> Mapped:
        to = map_config(config, from_layers, setup.adapter.n_layers, by)
        scores = scored(to)
        out = Mapped(wait=to.wait, transfer=to.transfer, **faith_fields(setup, scores))
        if own_scores is not None and own is not None and (to.wait, to.transfer) != (own.wait, own.transfer):
            out["vs_own"] = paired_differs(
                About(
                    "transfer",
                    f"the config mapped here ({to.cell}) differs in faithfulness from this model's own ({own.cell})",
                    f"{len(setup.kept)} solved problems",
                ),
                scores.correct_P.tolist(),
                own_scores.correct_P.tolist(),
            )
        return out

    out = Transferred(
        source=TransferSource(wait=config.wait, transfer=config.transfer, n_layers=from_layers),
        absolute=mapped("absolute"),
        relative=mapped("relative"),
    )
    if own is not None and own_scores is not None:
        out["own"] = Mapped(wait=own.wait, transfer=own.transfer, **faith_fields(setup, own_scores))
    return out


def tested(rows: Sequence[Mapping[str, Any]]) -> list[Claim]:
    """Each mapped config's test against the target's own, in the table's order (rows as built or as read back)."""
    claims = (row[by].get("vs_own") for row in rows for by in ("absolute", "relative"))
    return [claim for claim in claims if claim is not None]


def transfer_family(rows: list[Transferred]) -> None:
    """Every mapped config's test against the target's own, adjusted together (Holm), in place."""
    adjusted = iter(adjust(tested(rows), "transfer"))
    for row in rows:
        for by in ("absolute", "relative"):
            if "vs_own" in row[by]:
                row[by]["vs_own"] = next(adjusted)
