"""The reference executor: AF1 by hooks on the full, unmodified model; runs every configuration, slowest."""

from __future__ import annotations

import torch

from af1.interventions.af1 import AF1Config, af1_intervention, donor_states, resample_donors
from af1.interventions.means import PositionMeans
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last
from af1.progress import progress
from af1.tasks.evaluation import batches
from af1.tasks.task import Task


@torch.no_grad()
def reference_logits(
    adapter: ModelAdapter,
    task: Task,
    config: AF1Config,
    means: PositionMeans | None,
    batch_size: int = 32,
    extra_masks: dict[int, torch.Tensor] | None = None,
    desc: str | None = None,
    donors: Task | None = None,
) -> torch.Tensor:
    """Last-position logits [P, V] under AF1, by hooks on the full model; resample donors come from `donors` (the task
    itself when None)."""
    ids = task.input_ids_PT
    P = len(ids)
    resample = config.ablation == "resample" and config.wait >= 0
    donors = donors if donors is not None else task
    pick = resample_donors(task, donors, config.seed) if resample else None
    out = []
    for sl in progress(list(batches(P, batch_size)), desc=desc):
        batch = ids[sl].to(adapter.device)
        donor = donor_states(adapter, donors, config.wait, pick[sl]) if pick is not None else None
        with af1_intervention(adapter, task, config, means, batch, donor, extra_masks):
            out.append(forward_last(adapter.model, batch))
    return torch.cat(out)
