"""Head-level interventions: the concatenated head outputs entering o_proj summed over a task (what a head is
mean-ablated to), and random heads matched to chosen ones."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from af1.errors import Af1Error
from af1.interventions.sites import head_inputs, record
from af1.models.adapter import ModelAdapter
from af1.models.forward import forward_last, suffix_start
from af1.tasks.evaluation import batches
from af1.tasks.task import Task


@dataclass
class HeadSums:
    """The o_proj input summed over a task's problems per layer and position ({layer: [T, E]}, fp32, on the CPU),
    with their count and their token ids: a problem inside the sum gets its own state left out (`loo`)."""

    sums: dict[int, torch.Tensor]
    n: int
    members: frozenset[tuple[int, ...]]

    def mean(self, layer: int) -> torch.Tensor:
        return self.sums[layer] / self.n

    def member_B(self, ids_BT: torch.Tensor) -> torch.Tensor:
        """[B] bool: which rows are problems of the sum (by their token ids)."""
        return torch.tensor([tuple(row) in self.members for row in ids_BT.tolist()], dtype=torch.bool)

    def loo(self, layer: int, start: int, own_BTE: torch.Tensor, member_B: torch.Tensor) -> torch.Tensor:
        """[B, T-start, E]: each row's mean from position `start` on, without its own state where it is a member
        ((sum - own) / (n - 1)); a member that is the sum's only problem keeps the plain mean (its own state)."""
        sum_TE = self.sums[layer][start:].to(own_BTE.device)
        out = (sum_TE / self.n).expand_as(own_BTE).clone()
        leave = member_B.to(own_BTE.device) & (self.n > 1)
        if bool(leave.any()):
            out[leave] = (sum_TE - own_BTE[leave].float()) / (self.n - 1)
        return out


@torch.no_grad()
def head_sums(adapter: ModelAdapter, task: Task, batch_size: int = 32) -> HeadSums:
    """The o_proj input summed per layer and position over the task (`HeadSums`). The suffix runs on the shared
    context; the context's positions, the same in every problem, come from one full row (times the count)."""

    def add(kept_TE: torch.Tensor | None, z_BTE: torch.Tensor) -> torch.Tensor:
        z_TE = z_BTE.float().sum(0).cpu()  # reduced during the forward: memory stays one [T, E] per layer
        return z_TE if kept_TE is None else kept_TE + z_TE

    L, N = adapter.n_layers, len(task)
    sites = [head_inputs(layer) for layer in range(L)]
    with record(adapter, sites, reduce=add) as recorded:
        for sl in batches(N, batch_size):
            forward_last(adapter.model, task.input_ids_PT[sl], task.context_len)
    sums = {layer: recorded[head_inputs(layer)] for layer in range(L)}
    c = suffix_start(adapter.model, task.input_ids_PT, task.context_len)
    if c:
        with record(adapter, sites) as first:
            forward_last(adapter.model, task.input_ids_PT[:1])
        sums = {layer: torch.cat([first[head_inputs(layer)][0, :c].float().cpu() * N, s]) for layer, s in sums.items()}
    return HeadSums(sums, N, frozenset(tuple(row) for row in task.input_ids_PT.tolist()))


def matched_heads(
    adapter: ModelAdapter,
    like: list[tuple[int, int]],
    seed: int,
    exclude: list[tuple[int, int]],
    size_LH: torch.Tensor | None = None,
) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """As many heads as `like`, seeded, from the same layer and key/value group, else that layer, else the nearest,
    never excluded or drawn twice; with `size_LH`, from the half nearest in size; and how many matched at each level."""
    rng = random.Random(seed)
    taken = set(exclude) | set(like)
    group = max(1, adapter.n_heads // adapter.n_kv_heads)
    L, H = adapter.n_layers, adapter.n_heads
    drawn: list[tuple[int, int]] = []
    levels = {"same layer and key/value group": 0, "same layer": 0, "nearest layer": 0}
    for layer, h in like:
        pools = {
            "same layer and key/value group": [(layer, j) for j in range(H) if j // group == h // group],
            "same layer": [(layer, j) for j in range(H)],
            "nearest layer": sorted(
                ((m, j) for m in range(L) for j in range(H)), key=lambda mj: (abs(mj[0] - layer), mj[0])
            ),
        }
        for level, pool in pools.items():
            free = [x for x in pool if x not in taken]
            if level == "nearest layer":  # the closest layer that has a head left
                free = [x for x in free if abs(x[0] - layer) == abs(free[0][0] - layer)] if free else []
            if free and size_LH is not None:
                free = _nearest_half(free, size_LH, float(size_LH[layer, h]))
            if free:
                pick = rng.choice(free)
                drawn.append(pick)
                taken.add(pick)
                levels[level] += 1
                break
        else:
            raise Af1Error(f"{len(like)} matched random heads cannot be drawn: too few heads are not chosen")
    return drawn, levels


def _nearest_half(free: list[tuple[int, int]], size_LH: torch.Tensor, size: float) -> list[tuple[int, int]]:
    """The half of the candidates (at least one) whose size is nearest `size` by ratio, in their own order."""
    distance = {x: abs(math.log((float(size_LH[x]) + 1e-12) / (size + 1e-12))) for x in free}
    nearest = set(sorted(free, key=lambda x: distance[x])[: max(1, math.ceil(len(free) / 2))])
    return [x for x in free if x in nearest]


def matched_draws(
    adapter: ModelAdapter,
    like: list[tuple[int, int]],
    seeds: range,
    exclude: list[tuple[int, int]],
    size_LH: torch.Tensor | None = None,
) -> tuple[list[list[tuple[int, int]]], dict[str, int]]:
    """One `matched_heads` draw per seed, and over all of them how many heads were matched at each level."""
    draws = [matched_heads(adapter, like, seed, exclude, size_LH) for seed in seeds]
    levels = {level: sum(counts[level] for _, counts in draws) for level in (draws[0][1] if draws else {})}
    return [drawn for drawn, _ in draws], levels
