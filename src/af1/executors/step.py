"""What every executor reads for one answer step: its kept problems, CAMA means, resample donors, and the tables
(context keys/values, clean suffix states, token-local keys/values) computed once and shared by splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from af1.executors.fast import (
    ProblemKV,
    TokenLocalKV,
    context_kv,
    own_states,
    token_local_kv,
)
from af1.executors.shared_context import clean_suffix_states
from af1.interventions.af1 import AF1Config
from af1.interventions.means import PositionMeans
from af1.models import ModelAdapter
from af1.tasks.task import Task


@dataclass
class StepSetup:
    """One scoring step (answer token k): its solved problems, its CAMA means, resample donors, fast-path tables."""

    adapter: ModelAdapter
    kept: Task  # step k of the solved problems (of a split of them, after `Setup.on`)
    means: PositionMeans  # over step k of the task distribution
    donors: Task  # step k of the task distribution
    tables: dict[Any, Any] = field(default_factory=dict, repr=False)  # fast-path caches, shared by subsets
    solved: Task | None = None  # step k of every solved problem: what the shared tables cover (kept by splits)

    def __post_init__(self) -> None:
        if self.solved is None:
            self.solved = self.kept

    @property
    def all_solved(self) -> Task:
        assert self.solved is not None
        return self.solved

    def context(self) -> ProblemKV:
        """The context's keys/values, computed once per setup."""
        if "context" not in self.tables:
            self.tables["context"] = context_kv(self.adapter, self.kept)
        return self.tables["context"]

    def clean_all(self) -> list[torch.Tensor]:
        """The unmodified suffix states [P, n-c, D] of every solved problem per layer, in the model's dtype (on disk
        past the memory budget): where shared-context configs resume. Computed once; splits read rows (`kept_rows`)."""
        if "clean" not in self.tables:
            self.tables["clean"] = clean_suffix_states(self.adapter, self.all_solved, self.context())
        return self.tables["clean"]

    def kept_rows(self) -> torch.Tensor | None:
        """Where the kept problems are among every solved problem (None: they are all of them)."""
        return None if self.kept is self.solved else rows_in(self.all_solved, self.kept)

    def build_local_kv(self, config: AF1Config, like: TokenLocalKV | None = None) -> TokenLocalKV:
        """Token-local keys/values after `wait` for every solved problem (leave-one-out problems run their own
        positions); `like`: another step's tables, whose matching rows are reused."""
        solved = self.all_solved
        own = self.own_states(config.wait) if config.wait >= 0 else None
        return token_local_kv(self.adapter, solved, config, self.means, self.context(), own_PUD=own, like=like)

    def own_states(self, layer: int) -> torch.Tensor | None:
        """h[layer] [P, n-c, D] at the suffix positions of the problems that run their own positions (an unseen
        token, or leave-one-out), zeros for the others; None where none does."""
        if "clean" in self.tables:
            return self.clean_all()[layer]
        if "own" not in self.tables:
            ids = self.all_solved.input_ids_PT
            rows = (self.means.unseen(ids) | self.means.inside(ids)).nonzero().flatten()
            every = list(range(self.adapter.n_layers))
            states = own_states(self.adapter, self.all_solved.subset(rows), every) if len(rows) else {}
            self.tables["own"] = (rows, states)
        rows, states = self.tables["own"]
        if not len(rows):
            return None
        out = torch.zeros(len(self.all_solved), *states[layer].shape[1:])
        out[rows] = states[layer]
        return out

    def local_kv(self, config: AF1Config) -> TokenLocalKV:
        """Token-local keys/values after `wait`; they depend only on wait and ablation, so repeated configs
        (pruning, alternatives, moved windows) and splits share them."""
        key = (config.wait, config.ablation)
        if key not in self.tables:
            self.tables[key] = self.build_local_kv(config)
        return self.tables[key]


def rows_in(whole: Task, part: Task) -> torch.Tensor:
    """Where each row of `part` is in `whole` (the same prompts: a split of a step's problems)."""
    index = {row.numpy().tobytes(): i for i, row in enumerate(whole.input_ids_PT)}
    return torch.tensor([index[row.numpy().tobytes()] for row in part.input_ids_PT], dtype=torch.long)
