"""Right or wrong at (L_wait, L_transfer) cells, problem by problem: what the search asks of a cell.
The fast executor runs all asked cells as one wavefront (two weight reads per layer); any other runs each cell whole."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from af1.executors.fast import TokenLocalKV, last_token_inputs, run_last, start_state
from af1.executors.greedy import MAX_RIVALS, greedy_tokens, rival_wins
from af1.executors.protocol import Executor, pick
from af1.executors.step import StepSetup
from af1.interventions.af1 import AF1Config
from af1.interventions.attention import LayerPlan, attention_plans
from af1.models.adapter import LayerInputs
from af1.tasks.task import Task

Ask = tuple[int, int, torch.Tensor]  # (wait, transfer, rows): which problems to measure at that cell


@dataclass
class AtWait:
    """One wait's fast-path state: its tables, each row's slots and start state, and how far each row has peeked."""

    kv: TokenLocalKV
    slots_PT: torch.Tensor
    start_P1D: torch.Tensor  # the last token entering block wait+1
    h_P1D: torch.Tensor  # the last token after `depth_P` peek layers
    depth_P: torch.Tensor


class StepCells:
    """One answer step's cells: whether each of some of its problems is right at (wait, transfer) under `base`'s
    ablation and ABP variant (its wait and transfer replaced), with the executor `pick` chooses for each wait."""

    def __init__(
        self, step: StepSetup, base: AF1Config, reference: bool = False, before: StepCells | None = None
    ) -> None:
        self.step, self.base, self.reference, self.before = step, base, reference, before
        self.targets_P = step.kept.answer_ids_P
        self.rivals = sorted(set(self.targets_P.tolist()))[:MAX_RIVALS]  # the answers this step has: digits, mostly
        self.picked: dict[int, tuple[Executor, str | None]] = {}
        self.waits: dict[int, AtWait] = {}  # the fast path's tables, kept for every wait measured
        self.inputs: LayerInputs | None = None

    def executor(self, wait: int) -> tuple[Executor, str | None]:
        if wait not in self.picked:
            config = self.base.model_copy(update={"wait": wait, "transfer": 0})
            self.picked[wait] = pick(self.step.adapter, self.step.kept, config, self.reference)
        return self.picked[wait]

    def screen(self, asks: list[Ask]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per ask: where each row may still be right (a fast row is wrong where a rival surely beats its target), and
        its last state for `certify` (None: already decided exactly, by an executor that gives logits)."""
        out: list[tuple[torch.Tensor, torch.Tensor | None]] = [(torch.zeros(0, dtype=torch.bool), None) for _ in asks]
        fast = [i for i, (w, _, rows) in enumerate(asks) if len(rows) and self.executor(w)[0].name == "fast"]
        for i, h in zip(fast, self._wave([asks[i] for i in fast]), strict=True):
            out[i] = (~rival_wins(self.step.adapter, h, self.targets_P[asks[i][2]], self.rivals), h)
        for i, (wait, transfer, rows) in enumerate(asks):
            if len(rows) and i not in fast:
                config = self.base.model_copy(update={"wait": wait, "transfer": transfer})
                part = replace(self.step, kept=self.step.kept.subset(rows))
                out[i] = (self.executor(wait)[0].logits(part, config).argmax(-1).cpu() == self.targets_P[rows], None)
        return out

    def certify(self, h_RD: torch.Tensor, rows_R: torch.Tensor) -> torch.Tensor:
        """Whether the greedy token of each last state is its row's target [R]; a wrong one's token joins the
        rivals, which screen the rows that come after."""
        if not len(rows_R):
            return torch.zeros(0, dtype=torch.bool)
        token_R = greedy_tokens(self.step.adapter, h_RD)
        right_R = token_R == self.targets_P[rows_R]
        self.rivals = list(dict.fromkeys([*self.rivals, *token_R[~right_R].tolist()]))[:MAX_RIVALS]
        return right_R

    def _wave(self, asks: list[Ask]) -> list[torch.Tensor]:
        """The asked cells' last states [R, D] as one wavefront: each row peeks as deep as its deepest ask (from the
        start where it peeked past one), and each compute tail joins at the layer where its transfer ends."""
        if not asks:
            return []
        adapter, L = self.step.adapter, self.step.adapter.n_layers
        if self.inputs is None:  # every row of a step has the same last position
            self.inputs = last_token_inputs(adapter, self.step.kept.input_ids_PT[:1])
        need: dict[int, torch.Tensor] = {}
        for w, k, rows in asks:
            at = self._at(w)
            if w not in need:
                need[w] = torch.full_like(at.depth_P, -1)
            need[w][rows] = torch.maximum(need[w][rows], torch.tensor(k))
        for w in need:  # peeked past an asked transfer: start again
            at, shallowest = self.waits[w], torch.full_like(need[w], L)
            for ww, k, rows in asks:
                if ww == w:
                    shallowest[rows] = torch.minimum(shallowest[rows], torch.tensor(k))
            behind = (at.depth_P > shallowest).nonzero().flatten()
            at.h_P1D[behind], at.depth_P[behind] = at.start_P1D[behind], 0
        starts: dict[int, list[tuple[int, torch.Tensor]]] = {}  # first compute layer -> (ask, its states)
        for i, (w, k, rows) in enumerate(asks):
            if k == 0:
                starts.setdefault(w + 1, []).append((i, self.waits[w].h_P1D[rows]))
        wave = self.waits[asks[0][0]].h_P1D[:0]
        order: list[int] = []  # the ask of each block of the wave, in its order
        for layer in range(min(need) + 1, L + 1):
            if layer < L:
                self._peek(layer, need)
                for i, (w, k, rows) in enumerate(asks):
                    if k and w + k == layer:
                        starts.setdefault(layer + 1, []).append((i, self.waits[w].h_P1D[rows]))
            for i, h in starts.pop(layer, []):
                wave, order = torch.cat([wave, h]), [*order, i]
            if layer < L and len(wave):  # the context alone, the same for every wait: no row's slots are read
                unread = torch.zeros(len(wave), 1, dtype=torch.long)
                wave = run_last(adapter, self.step.context(), wave, self.inputs, unread, layer, layer + 1, False)
        out = [wave[:0, -1] for _ in asks]
        start = 0
        for i in order:
            out[i], start = wave[start : start + len(asks[i][2]), -1], start + len(asks[i][2])
        return out

    def _peek(self, layer: int, need: dict[int, torch.Tensor]) -> None:
        """One peek layer for every row that must peek through it, of any wait (each reading its own wait's table),
        in one call."""
        parts = []
        for w, need_P in need.items():
            at = self.waits[w]
            depth = layer - w
            if depth >= 1:
                rows = ((at.depth_P == depth - 1) & (need_P >= depth)).nonzero().flatten()
                if len(rows):
                    parts.append((at, rows, at.kv.prefix(layer, at.slots_PT[rows], peek=True)))
        if not parts:
            return
        h = torch.cat([at.h_P1D[rows] for at, rows, _ in parts])
        prefix = tuple(torch.cat([p[j] for _, _, p in parts]) for j in (0, 1))
        plan = LayerPlan(prefix_kv=(prefix[0], prefix[1]), replace_mask=True)
        assert self.inputs is not None
        with attention_plans(self.step.adapter, {layer: plan}):
            h = self.step.adapter.run_layers(h, self.inputs, layer, layer + 1)
        start = 0
        for at, rows, _ in parts:
            at.h_P1D[rows], at.depth_P[rows] = h[start : start + len(rows)], at.depth_P[rows] + 1
            start += len(rows)

    def _at(self, wait: int) -> AtWait:
        if wait not in self.waits:
            config = self.base.model_copy(update={"wait": wait, "transfer": 0})
            earlier = self.before.waits.get(wait) if self.before is not None else None  # its rows, where the same
            kv = self.step.build_local_kv(config, like=earlier.kv if earlier is not None else None)
            ids = self.step.kept.input_ids_PT
            slots = kv.slots(ids)
            dtype = next(self.step.adapter.model.parameters()).dtype
            start = start_state(self.step.adapter, kv, ids, slots, dtype)
            self.waits[wait] = AtWait(kv, slots, start, start.clone(), torch.zeros(len(ids), dtype=torch.long))
        return self.waits[wait]


class Cells:
    """Whether each of some solved problems is right at a cell: every answer step right, a later step run only for
    the problems every earlier one got right. Rows index `kept` (the solved problems whose steps are `steps`)."""

    def __init__(self, kept: Task, steps: list[StepSetup], base: AF1Config, reference: bool = False) -> None:
        order = sorted(range(len(steps)), key=lambda i: steps[i].kept.step or 0)  # first answer tokens first
        self.steps: list[StepCells] = []
        for i in order:  # each step's tables take the rows its layout's step before it holds
            layout = steps[i].kept.part_key[:-1]
            before = next((c for c in reversed(self.steps) if c.step.kept.part_key[:-1] == layout), None)
            self.steps.append(StepCells(steps[i], base, reference, before))
        self.row_in_step: list[torch.Tensor] = []  # per step: each kept row's row in that step, -1 where it has none
        for cells in self.steps:
            where = torch.full((len(kept),), -1, dtype=torch.long)
            where[cells.step.kept.rows_in_parent] = torch.arange(len(cells.step.kept))
            self.row_in_step.append(where)

    def right(self, asks: list[tuple[int, int, list[int]]]) -> list[list[bool]]:
        """Per ask (wait, transfer, rows of `kept`), whether each problem is right at that cell: rival tokens screen
        every step, then the unembedding certifies the survivors step by step (a wrong step closes the problem)."""
        rows = [torch.tensor(r, dtype=torch.long) for _, _, r in asks]
        open_ = [torch.ones(len(r), dtype=torch.bool) for r in rows]
        held: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = [[] for _ in asks]  # (where, step, h)
        for s, (cells, where) in enumerate(zip(self.steps, self.row_in_step, strict=True)):
            here = [(where[r] >= 0) & o for r, o in zip(rows, open_, strict=True)]
            got = cells.screen([(w, k, where[r][h]) for (w, k, _), r, h in zip(asks, rows, here, strict=True)])
            for i, (h_mask, (passed, state)) in enumerate(zip(here, got, strict=True)):
                open_[i][h_mask] = passed
                if state is not None:
                    at = h_mask.nonzero().flatten()[passed]
                    held[i].append((at, torch.full_like(at, s), state[passed]))
        for s, (cells, where) in enumerate(zip(self.steps, self.row_in_step, strict=True)):
            parts = [[(at, h) for at, step, h in pieces if len(at) and int(step[0]) == s] for pieces in held]
            flat = [(i, at, h) for i, pieces in enumerate(parts) for at, h in pieces]
            flat = [(i, at[open_[i][at]], h[open_[i][at]]) for i, at, h in flat]
            if not any(len(at) for _, at, _ in flat):
                continue
            states = torch.cat([h for _, _, h in flat])
            right = cells.certify(states, torch.cat([where[rows[i][at]] for i, at, _ in flat]))
            start = 0
            for i, at, _ in flat:
                open_[i][at] = right[start : start + len(at)]
                start += len(at)
        return [o.tolist() for o in open_]

    def executors(self) -> list[tuple[Executor, str | None]]:
        """The executor of every step at every wait measured (`recorded` says what a result keeps of them)."""
        return [picked for cells in self.steps for picked in cells.picked.values()]
