"""Base accuracy: does the model's greedy next token equal the answer's first token?"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from af1.models.adapter import input_device
from af1.progress import progress
from af1.tasks import Task


@dataclass
class Scores:
    """Per-problem outcome of one (possibly intervened) evaluation."""

    predicted_P: torch.Tensor  # greedy next token
    p_correct_P: torch.Tensor  # probability of the answer token
    correct_P: torch.Tensor  # bool

    @property
    def accuracy(self) -> float:
        return float(self.correct_P.float().mean()) if len(self.correct_P) else float("nan")

    @property
    def mean_p_correct(self) -> float:
        return float(self.p_correct_P.mean()) if len(self.p_correct_P) else float("nan")

    @classmethod
    def from_logits(cls, logits_PV: torch.Tensor, answer_ids_P: torch.Tensor) -> Scores:
        logits_PV = logits_PV.float()
        predicted = logits_PV.argmax(-1)
        p = torch.softmax(logits_PV, -1).gather(-1, answer_ids_P[:, None].to(logits_PV.device))[:, 0]
        return cls(predicted.cpu(), p.cpu(), (predicted.cpu() == answer_ids_P.cpu()))


def batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(n, start + batch_size))


def forward_last(model: Any, ids_BT: torch.Tensor) -> torch.Tensor:
    """Next-token logits [B, V] at the last position (fp32, CPU), with explicit mask and position ids."""
    B, T = ids_BT.shape
    ids = ids_BT.to(input_device(model))
    pos = torch.arange(T, device=ids.device).expand(B, T)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos, use_cache=False, logits_to_keep=1)
    return out.logits[:, -1].float().cpu()


@torch.no_grad()
def last_logits(model: Any, input_ids_PT: torch.Tensor, batch_size: int = 64, desc: str | None = None) -> torch.Tensor:
    """Next-token logits at the last position of every prompt, batched."""
    out = [forward_last(model, input_ids_PT[sl]) for sl in progress(list(batches(len(input_ids_PT), batch_size)), desc)]
    return torch.cat(out) if out else torch.empty(0)


def evaluate(model: Any, task: Task, batch_size: int = 64) -> Scores:
    """Score a model on a task: greedy next token against the answer's first token."""
    logits = last_logits(model, task.input_ids_PT, batch_size=batch_size, desc="evaluate")
    return Scores.from_logits(logits, task.answer_ids_P)


def solved(task: Task, scores: Scores) -> Task:
    """The problems the model answers correctly: the set every AF1 measurement is taken on."""
    return task.subset(scores.correct_P.nonzero().flatten())
