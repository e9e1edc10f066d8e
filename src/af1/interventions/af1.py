"""The AF1 intervention (docs/methods.md §1): non-context positions ablated after block `wait`, then the last token
peeks for `transfer` blocks and sees only context and itself after; its config, edits and attention plans."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from pydantic import BaseModel, Field

from af1.errors import Af1Error
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.masks import ABPVariant, abp_masks
from af1.interventions.means import PositionMeans
from af1.interventions.residual import edit_residual, replace_positions, zero_attention_outputs
from af1.interventions.sites import record, residual
from af1.models.adapter import ModelAdapter
from af1.tasks.task import Task

Ablation = Literal["cama", "zero", "mean", "resample", "none"]
ABLATIONS: tuple[str, ...] = ("cama", "zero", "mean", "resample", "none")


class AF1Config(BaseModel):
    """One AF1 subgraph: where waiting ends, how long the last token peeks, and with what."""

    wait: int = Field(default=-1, ge=-1)
    transfer: int = Field(default=0, ge=0)
    ablation: Ablation = "cama"
    abp: ABPVariant = "af1"
    transfer_start: int | None = None  # first peek layer; default wait + 1 (moved by the necessity study)
    pruned_heads: list[tuple[int, int]] = []  # (layer, head) of peek layers that do not peek
    seed: int = 0  # for the resample ablation

    @property
    def leaves_one_out(self) -> bool:
        """Whether h[wait] takes a mean a problem may be inside of (CAMA, the token-agnostic mean): its own state is
        then left out of it."""
        return self.wait >= 0 and self.ablation in ("cama", "mean")

    @property
    def cell(self) -> str:
        """Its place in the grid, as every text names it."""
        return f"L_wait {self.wait}, L_transfer {self.transfer}"

    @property
    def first_peek(self) -> int:
        return self.wait + 1 if self.transfer_start is None else self.transfer_start

    def peek_layers(self) -> list[int]:
        return list(range(self.first_peek, self.first_peek + self.transfer))

    def pruned_by_layer(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for layer, head in self.pruned_heads:
            out.setdefault(layer, []).append(head)
        return out

    def check(self, n_layers: int, n_heads: int | None = None) -> None:
        if self.wait >= n_layers:
            raise Af1Error(f"wait {self.wait} is out of range: this model has layers 0..{n_layers - 1}")
        if self.first_peek <= self.wait:
            raise Af1Error(f"the transfer window must start after wait {self.wait}")
        if self.transfer > 0 and self.first_peek + self.transfer > n_layers:
            raise Af1Error(
                f"transfer {self.transfer} from layer {self.first_peek} runs past the last layer {n_layers - 1}"
            )
        for layer, head in self.pruned_heads:
            if layer not in self.peek_layers() or (n_heads is not None and not 0 <= head < n_heads):
                raise Af1Error(f"pruned head ({layer}, {head}) is not a head of a transfer layer")

    def stages(self, n_layers: int) -> dict[str, list[int]]:
        """The layers of each stage: wait, transfer (peek), compute."""
        peek = self.peek_layers()
        return {
            "wait": list(range(0, self.wait + 1)),
            "transfer": peek,
            "compute": [layer for layer in range(self.wait + 1, n_layers) if layer not in peek],
        }


def ablated_states(
    config: AF1Config, means: PositionMeans | None, ids_BT: torch.Tensor, own_BUD: torch.Tensor | None = None
) -> torch.Tensor:
    """What CAMA, the token-agnostic mean or the zero ablation writes into h[wait] at the last s positions [B, s, D]
    (s = own's length, else all); `own`, the unablated h[wait] there, is left out of its mean (leave-one-out)."""
    s = ids_BT.shape[1] if own_BUD is None else own_BUD.shape[1]
    if config.ablation == "zero":
        if means is None:
            raise Af1Error("the zero ablation needs the position means for the hidden size")
        return torch.zeros(ids_BT.shape[0], s, means.sums_LTSD.shape[-1])
    if means is None:
        raise Af1Error(f"the {config.ablation} ablation needs position means")
    return means.replacement(config.wait, ids_BT, own_BUD, conditional=config.ablation == "cama")


def ablation_start(config: AF1Config, task: Task) -> int:
    """First position the ablation overwrites. CAMA leaves the first varying position, whose state is already its
    conditional mean (it sees only context and itself); the other ablations replace it too."""
    return task.context_len + 1 if config.ablation == "cama" else task.context_len


def ablation_edit(
    config: AF1Config,
    means: PositionMeans | None,
    task: Task,
    ids_BT: torch.Tensor,
    donor_BTD: torch.Tensor | None,
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The overwrite of h[wait] for one batch: positions after the first varying one."""
    if config.wait < 0 or config.ablation == "none":
        return None
    if config.ablation == "resample":
        assert donor_BTD is not None
    return overwrite_from(config, means, ids_BT, donor_BTD, ablation_start(config, task))


def overwrite_from(
    config: AF1Config, means: PositionMeans | None, ids_BT: torch.Tensor, donor_BUD: torch.Tensor | None, start: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The overwrite of h[wait] from position `start`: the donors' states (resample), else the ablation's, from the
    unablated states (a problem inside the means leaves its own out: `PositionMeans.replacement`)."""
    if donor_BUD is not None:
        return lambda h: replace_positions(h, donor_BUD, start)
    return lambda h: replace_positions(h, ablated_states(config, means, ids_BT, h), start)


def plans_for(
    task: Task, config: AF1Config, adapter: ModelAdapter, extra: dict[int, torch.Tensor] | None = None
) -> dict[int, LayerPlan]:
    """Attention plans of an AF1 config, with extra masks (e.g. necessity knock-outs) ANDed in."""
    masks = abp_masks(
        task.n_positions,
        task.context_len,
        config.wait,
        config.peek_layers(),
        adapter.n_layers,
        config.abp,
        config.pruned_by_layer(),
        adapter.n_heads,
    )
    for layer, mask in (extra or {}).items():
        masks[layer] = masks[layer] & mask if layer in masks else mask
    return {layer: LayerPlan(allowed_BQK=m) for layer, m in masks.items()}


def donor_states(adapter: ModelAdapter, donors: Task, layer: int, index: torch.Tensor) -> torch.Tensor:
    """h[layer] of the resample donors of a batch (rows `index` of the donor task)."""
    ids = donors.input_ids_PT[index].to(adapter.device)
    with record(adapter, [residual(layer)]) as cache:
        adapter.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=1)
    return cache[residual(layer)]


def resample_donors(task: Task, donors: Task, seed: int) -> torch.Tensor:
    """For each problem, a seeded random donor from the whole distribution whose input differs from its own."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(donors), (len(task),), generator=g)
    for i in range(len(task)):
        while len(donors) > 1 and torch.equal(donors.input_ids_PT[pick[i]], task.input_ids_PT[i]):
            pick[i] = int(torch.randint(len(donors), (1,), generator=g))
    return pick


@contextlib.contextmanager
def af1_intervention(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    ids_BT: torch.Tensor,
    donor_BTD: torch.Tensor | None = None,
    extra_masks: dict[int, torch.Tensor] | None = None,
) -> Iterator[None]:
    """CAMA (or another ablation) at `wait` plus the ABP plans, for one batch of prompts."""
    edit = ablation_edit(config, means, task, ids_BT, donor_BTD)
    with (
        edit_residual(adapter, {config.wait: edit} if edit else {}),
        attention_plans(adapter, plans_for(task, config, adapter, extra_masks)),
        zero_attention_outputs(adapter, zeroed_outputs(task, config, adapter.n_layers)),
    ):
        yield


def zeroed_outputs(task: Task, config: AF1Config, n_layers: int) -> dict[int, list[int]]:
    """The ABP variant zero-output: instead of masking, the attention output of every non-context position after
    `wait` is zeroed, except the last position's in transfer layers."""
    if config.abp != "zero-output":
        return {}
    n, peek = task.n_positions, set(config.peek_layers())
    return {
        layer: list(range(task.context_len, n - 1 if layer in peek else n))
        for layer in range(config.wait + 1, n_layers)
    }
