"""Per-problem draws of replacement values for counterfactual prompts: seeded, kept to the same tokens, each with its
answer and, where one exists, a matched answer-keeping control that changes the same positions."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from af1.tasks.task import Task, answer_tokens

if TYPE_CHECKING:
    from af1.tasks.task import Tokenizer


def splice(task: Task, tokenizer: Tokenizer, i: int, edits: list[tuple[int, int, str]]) -> list[int]:
    """Problem i's whole input with each (start, end, value) of its own prompt replaced."""
    p = task.problems[i]
    offset = len(p.text) - len(p.prompt)
    text = p.text
    for a, b, value in sorted(edits, reverse=True):  # right to left
        text = text[: offset + a] + value + text[offset + b :]
    return task.encode(text, tokenizer)


@dataclass
class Slots:
    """What can be replaced in one problem: its named values (operands or a task file's slots), each one's
    character spans in the prompt and candidate values, and the answer any values would have (None: none)."""

    values: dict[str, str]
    spans: dict[str, list[tuple[int, int]]]
    candidates: dict[str, list[str]]
    answer: Callable[[dict[str, str]], str | None]


class _Drawer:
    """Seeded draws of one problem's replacements (the task's seed and the prompt alone, so a problem gets the same
    counterfactual in any sample or layout group) that keep the token layout and change only the replaced roles."""

    def __init__(self, task: Task, tokenizer: Tokenizer, i: int, slots: Slots):
        self.task, self.tokenizer, self.i, self.slots = task, tokenizer, i, slots
        self.seed = f"{task.spec.seed}:{task.problems[i].prompt}"

    def order(self, name: str, values: list[str]) -> list[str]:
        values = list(values)
        random.Random(f"{self.seed}:{name}").shuffle(values)
        return values

    def ids(self, new: dict[str, str]) -> list[int] | None:
        """The prompt with these values, if it keeps the token layout and changes only their roles' positions."""
        edits = [(a, b, v) for name, v in new.items() for a, b in self.slots.spans[name]]
        ids = splice(self.task, self.tokenizer, self.i, edits)
        if len(ids) != self.task.n_positions:
            return None
        changed = (torch.tensor(ids) != self.task.input_ids_PT[self.i]).nonzero().flatten().tolist()
        return ids if changed and all(self.task.layout[t] in new for t in changed) else None

    def first(self, name: str, keep: bool, fixed: dict[str, str]) -> tuple[dict[str, str], list[int]] | None:
        """The first value of `name` (other than its own) that, with `fixed`, keeps the answer (keep) or changes it
        to a defined one, and keeps the layout."""
        own = self.slots.answer(self.slots.values)
        for v in self.order(name, [c for c in self.slots.candidates[name] if c != self.slots.values[name]]):
            new = {**fixed, name: v}
            answer = self.slots.answer({**self.slots.values, **new})
            if answer is None or (answer == own) != keep:
                continue
            if (ids := self.ids(new)) is not None:
                return new, ids
        return None


@dataclass
class Drawn:
    """One problem's counterfactual: the new values, the prompt's ids, its answer and its answer-keeping control."""

    values: dict[str, str]
    ids: list[int]
    answer: str | None
    control: list[int] | None


def draw_pair(task: Task, tokenizer: Tokenizer, i: int, slots: Slots, name: str) -> Drawn | None:
    """Problem i's counterfactual for `name` and its answer-keeping control (`name` alone where its values both keep and
    change the answer, else with another slot; else no control). None: no value keeps the token layout."""
    drawer = _Drawer(task, tokenizer, i, slots)
    keep, change = drawer.first(name, True, {}), drawer.first(name, False, {})
    if keep is not None and change is not None:
        return Drawn(change[0], change[1], slots.answer({**slots.values, **change[0]}), keep[1])
    if change is not None:
        for v in drawer.order(name, [c for c in slots.candidates[name] if c != slots.values[name]]):
            for other in drawer.order("others", [n for n in slots.values if n != name]):
                paired = drawer.first(other, True, {name: v})
                changed = drawer.first(other, False, {name: v}) if paired is not None else None
                if paired is not None and changed is not None:
                    answer = slots.answer({**slots.values, **changed[0]})
                    return Drawn(changed[0], changed[1], answer, paired[1])
        return Drawn(change[0], change[1], slots.answer({**slots.values, **change[0]}), None)
    if keep is not None:
        return Drawn(keep[0], keep[1], None, None)  # no value changes the answer: none to move towards
    for v in drawer.order(name, [c for c in slots.candidates[name] if c != slots.values[name]]):
        if (ids := drawer.ids({name: v})) is not None:  # no value has an answer (a table's gap): none defined
            return Drawn({name: v}, ids, None, None)
    return None


def answer_ids(task: Task, tokenizer: Tokenizer, i: int, answer: str | None) -> tuple[int, ...] | None:
    """The tokens `answer` would have after problem i's prompt, written as its own answer is (the same leading
    space); None: no answer, or one that merges with the prompt."""
    if answer is None:
        return None
    p = task.problems[i]
    lead = p.answer_text[: len(p.answer_text) - len(p.answer_text.lstrip(" "))]
    return answer_tokens(tokenizer, p.text, lead + answer.lstrip(" "), list(tokenizer(p.text)["input_ids"]))
