"""Training on the answer tokens with gradients outside the slices zeroed (Adam, no weight decay), and the text measures
that say what it cost."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import mean_interval
from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter
from af1.tasks.evaluation import batches
from af1.tasks.task import PAD, Task


class FinetuneConfig(BaseModel):
    steps: int = Field(default=200, ge=1)
    lr: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=16, ge=1)
    seed: int = 0


def answer_batch(task: Task, index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts followed by the answer (and its end where checked) [B, L], and the label each position must predict [B,
    L] (-100: prompt, padding); padding after each row, so causality ignores it."""
    targets = task.scored_tokens
    rows = [[t for t in task.input_ids_PT[i].tolist() if t != PAD] + list(targets[i]) for i in index]
    L = max(map(len, rows))
    ids = torch.zeros(len(index), L, dtype=torch.long)
    labels = torch.full((len(index), L), -100, dtype=torch.long)
    for row, (i, tokens) in enumerate(zip(index, rows, strict=True)):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        start = len(tokens) - len(targets[i]) - 1  # the last prompt position predicts answer token 0
        labels[row, start : len(tokens) - 1] = torch.tensor(targets[i], dtype=torch.long)
    return ids, labels


def check_disjoint(train: Task, evaluation: Task) -> None:
    """Refuses training problems that are also evaluation problems (by prompt)."""
    overlap = {p.prompt for p in train.problems} & {p.prompt for p in evaluation.problems}
    if overlap:
        raise Af1Error(f"{len(overlap)} training problems are also evaluation problems (e.g. {sorted(overlap)[0]!r})")


@dataclass
class TrainResult:
    losses: list[float]
    trained_parameters: int


def train(
    adapter: ModelAdapter, task: Task, config: FinetuneConfig, masks: dict[str, torch.Tensor] | None
) -> TrainResult:
    """Cross-entropy on every answer token (teacher forced); masks None trains every parameter."""
    if adapter.offloaded():
        raise Af1Error("fine-tuning needs every weight in device memory: use a device map without CPU/disk offload")
    model = adapter.model
    named = dict(model.named_parameters())
    params = [named[n] for n in masks] if masks is not None else list(named.values())
    for p in params:
        p.requires_grad_(True)
    hooks = [named[n].register_hook(lambda g, m=m: g * m.to(g.dtype)) for n, m in (masks or {}).items()]
    optimiser = torch.optim.Adam(params, lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    losses = []
    model.train()
    try:
        for _ in range(config.steps):
            index = rng.sample(range(len(task)), min(config.batch_size, len(task)))
            ids, labels = answer_batch(task, index)
            logits = model(input_ids=ids.to(adapter.device), use_cache=False).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.to(logits.device).flatten())
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
    finally:
        model.eval()
        for h in hooks:
            h.remove()
        for p in params:
            p.requires_grad_(False)
            p.grad = None
    count = sum(int(m.sum()) for m in masks.values()) if masks is not None else sum(p.numel() for p in params)
    return TrainResult(losses, count)


class TextMeasures(TypedDict):
    """The non-math measure on general text: perplexity and next-token accuracy, each with its 95 % bootstrap
    interval over windows."""

    perplexity: float
    perplexity_ci: list[float]
    next_token_accuracy: float
    next_token_accuracy_ci: list[float]


@torch.no_grad()
def text_measures(adapter: ModelAdapter, windows_NT: torch.Tensor) -> TextMeasures:
    """Perplexity and next-token accuracy on general text (the non-math measure), each with a 95 % bootstrap interval
    over windows (a window's tokens are not independent, so they stay together)."""
    nll_N = torch.zeros(len(windows_NT), dtype=torch.float64)
    right_N = torch.zeros(len(windows_NT), dtype=torch.float64)
    for sl in batches(len(windows_NT), 4):
        ids = windows_NT[sl].to(adapter.device)
        logits = adapter.model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        target = ids[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        nll_N[sl] = nll.double().mean(-1).cpu()
        right_N[sl] = (logits.argmax(-1) == target).double().mean(-1).cpu()
    low, high = mean_interval(nll_N.tolist())  # windows of one length: the mean of their means is the mean
    return TextMeasures(
        perplexity=float(nll_N.mean().exp()),
        perplexity_ci=[float(torch.tensor(low).exp()), float(torch.tensor(high).exp())],
        next_token_accuracy=float(right_N.mean()),
        next_token_accuracy_ci=mean_interval(right_N.tolist()),
    )
