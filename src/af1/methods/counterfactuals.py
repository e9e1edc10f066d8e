"""Counterfactual prompts for the heads study: the operator replaced by a null word or symbol, an operand by
another value, or a task file's slot by another of its values, drawn per problem and kept to the same tokens."""

from __future__ import annotations

import dataclasses
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from af1.errors import Af1Error
from af1.tasks.builtin import NAMES, OPERATIONS, prompt_template
from af1.tasks.files import read_task_file, slot_values
from af1.tasks.task import Task

if TYPE_CHECKING:
    from af1.tasks.task import Tokenizer

NOT_OPERANDS = ("context", "const", "bos")  # roles that are not an operand (or a task file's slot)

# Where the operation is named in each style, and the null replacements tried (same token count).
OPERATOR_TEXT = {
    "original": {"+": "+", "-": "-", "*": "*"},
    "calculate": {"+": "+", "-": "-", "*": "*"},
    "code": {"+": "+", "-": "-"},
    "verbal": {"+": "sum", "-": "difference"},
    "question": {"+": "sum", "-": "difference"},
    "instruction": {"+": "add", "-": "subtract"},
    "word": {"+": "Together", "-": "gave"},
}
NULL_SYMBOLS = ("@", "#", "&", "~", "|", "^")
NULL_WORDS = ("nothing", "thing", "stuff", "none", "null", "blank")


@dataclass
class Counterfactual:
    """One counterfactual prompt per problem (same length and positions as its clean prompt), what was put in:
    `replacement` says it in one line, `replacements` per problem (drawn per problem for an operand or a slot), and
    the positions that change in some problem."""

    input_ids_PT: torch.Tensor
    replacement: str
    changed_positions: list[int]  # the positions the counterfactual changes (the operator, an operand or a slot)
    replacements: list[str] = field(default_factory=list)
    kind: str = "operator"  # operator, an operand's name (A, B, ...) or, for a task file, "slot <name>"

    def at_step(self, step: Task) -> Counterfactual:
        """The counterfactual of an answer step (`Task.steps()`): each of its rows' counterfactual prompt followed by
        the same teacher-forced answer tokens as the clean row."""
        rows = step.rows_in_parent
        T = self.input_ids_PT.shape[1]
        ids = torch.cat([self.input_ids_PT[rows], step.input_ids_PT[:, T:]], 1)
        drawn = [self.replacements[i] for i in rows.tolist()] if self.replacements else []
        return dataclasses.replace(self, input_ids_PT=ids, replacements=drawn)

    def rows(self) -> list[dict[str, Any]]:
        """Per problem: the counterfactual's token ids and what was put in (enough to rerun it)."""
        drawn = self.replacements or [self.replacement] * len(self.input_ids_PT)
        return [
            {"counterfactual_input_ids": ids, "replacement": r}
            for ids, r in zip(self.input_ids_PT.tolist(), drawn, strict=True)
        ]


def _spans(
    prompt: str, style: str, operation: str, operands: tuple[int, ...], operand: str | None
) -> list[tuple[int, int]]:
    """Character spans inside the problem's own prompt (not the few-shot prefix) of the operator text, or with
    `operand` of that operand's digits."""
    op = OPERATIONS[operation]
    template = prompt_template(op, style)
    spans, rendered = [], ""
    for literal, name, _, _ in string.Formatter().parse(template):
        for o in set(op.operators) if operand is None else ():
            word = OPERATOR_TEXT[style][o]
            start = 0
            while (k := literal.find(word, start)) >= 0:
                spans.append((len(rendered) + k, len(rendered) + k + len(word)))
                start = k + len(word)
        rendered += literal
        if name:
            value = str(operands[NAMES.index(name)])
            if name == operand:
                spans.append((len(rendered), len(rendered) + len(value)))
            rendered += value
    return spans


def _splice(task: Task, tokenizer: Tokenizer, i: int, spans: list[tuple[int, int]], value: str) -> list[int]:
    """Problem i's whole input (few-shot prefix and the BOS af1 prepends included) with `value` in every span of
    its own prompt."""
    p = task.problems[i]
    offset = len(p.text) - len(p.prompt)
    text = p.text
    for a, b in sorted(spans, reverse=True):  # right to left
        text = text[: offset + a] + value + text[offset + b :]
    return task.encode(text, tokenizer)


def _draw(
    task: Task,
    tokenizer: Tokenizer,
    i: int,
    spans: list[tuple[int, int]],
    candidates: list[str],
    role: str,
) -> tuple[list[int], str, list[int]] | None:
    """The first candidate (in a seeded order per problem: the task's seed and the prompt) that, put in every span,
    keeps the token layout and changes nothing but the `role` positions: (ids, value, changed positions)."""
    candidates = list(candidates)
    random.Random(f"{task.spec.seed}:{task.problems[i].prompt}").shuffle(candidates)
    for value in candidates:
        ids = _splice(task, tokenizer, i, spans, value)
        if len(ids) != task.n_positions:
            continue
        changed = (torch.tensor(ids) != task.input_ids_PT[i]).nonzero().flatten().tolist()
        if all(task.layout[t] == role for t in changed):
            return ids, value, changed
    return None


def _drawn(
    task: Task,
    tokenizer: Tokenizer,
    choices: Callable[[int], tuple[list[tuple[int, int]], list[str], str]],
    role: str,
    replacement: str,
    kind: str,
) -> Counterfactual:
    """Every problem's drawn counterfactual (`_draw`); `choices(i)` gives its spans, its candidates and the error
    to raise when none keeps the layout."""
    rows, drawn, positions = [], [], set()
    for i in range(len(task)):
        spans, candidates, error = choices(i)
        found = _draw(task, tokenizer, i, spans, candidates, role)
        if found is None:
            raise Af1Error(error)
        rows.append(found[0])
        drawn.append(found[1])
        positions |= set(found[2])
    return Counterfactual(torch.tensor(rows), replacement, sorted(positions), drawn, kind)


def slot_counterfactual(task: Task, tokenizer: Tokenizer) -> Counterfactual:
    """A task file's prompts with the slot it names replaced, everywhere it stands, by its null value, or else by
    another of the slot's values that keeps the token layout, changing only that slot's tokens. The value is drawn
    per problem from the file's values, seeded by the task's seed and the prompt alone (so a problem gets the same
    counterfactual in any sample or layout group); in a `distinct` task it is none of the problem's other slot
    values."""

    assert task.spec.file is not None
    described = read_task_file(task.spec.file)
    named = described.counterfactual
    if named is None:
        raise Af1Error(
            f"task file {task.spec.file} names no counterfactual slot (counterfactual: {{slot: ..., null_value: ...}})"
        )
    values = sorted(set(slot_values(task.spec.file, described, named.slot)))

    def choices(i: int) -> tuple[list[tuple[int, int]], list[str], str]:
        p = task.problems[i]
        spans = [(a, b) for n, a, b in p.spans if n == named.slot]
        if not spans:
            raise Af1Error(f"problem {p.prompt!r} has no slot '{named.slot}'")
        own = p.prompt[spans[0][0] : spans[0][1]]
        taken = set(p.operands) if described.distinct else {own}  # a distinct task's other slots stay distinct
        candidates = [named.null_value] if named.null_value is not None else [v for v in values if v not in taken]
        error = f"no value of slot '{named.slot}' keeps the token layout of {p.prompt!r} " + (
            "(its null value has another token length)" if named.null_value is not None else ""
        )
        return spans, candidates, error

    replacement = named.null_value if named.null_value is not None else f"another value of {named.slot}"
    return _drawn(task, tokenizer, choices, named.slot, replacement, f"slot {named.slot}")


def operand_counterfactual(task: Task, tokenizer: Tokenizer, operand: str) -> Counterfactual:
    """A built-in task's prompts with one operand replaced by another value of its range with the same digits that
    keeps the token layout (only that operand's tokens change), drawn per problem like a task file's slot."""
    spec = task.spec
    if operand not in NAMES[: OPERATIONS[spec.operation].n_operands]:
        names = ", ".join(n.lower() for n in NAMES[: OPERATIONS[spec.operation].n_operands])
        raise Af1Error(f"unknown counterfactual '{operand.lower()}' for {spec.operation}: operator or one of {names}")

    def choices(i: int) -> tuple[list[tuple[int, int]], list[str], str]:
        p = task.problems[i]
        own = str(p.operands[NAMES.index(operand)])
        spans = _spans(p.prompt, spec.style, spec.operation, p.operands, operand)
        candidates = [str(v) for v in spec.operand_range if str(v) != own and len(str(v)) == len(own)]
        return spans, candidates, f"no other value of operand {operand.lower()} keeps the token layout of {p.prompt!r}"

    return _drawn(task, tokenizer, choices, operand, f"another value of operand {operand.lower()}", operand)


def counterfactual(task: Task, tokenizer: Tokenizer, kind: str | None = None) -> Counterfactual:
    """The task's prompts with the operator replaced by a null symbol or word that keeps the token layout, or
    (kind an operand's name) that operand replaced per problem (`operand_counterfactual`); a task file replaces
    the slot it names (`slot_counterfactual`)."""
    if task.spec.file is not None:
        if kind not in (None, "operator"):
            raise Af1Error(
                f"counterfactual {kind!r} is for built-in tasks: a task file names its slot "
                "(counterfactual: {slot: ...})"
            )
        return slot_counterfactual(task, tokenizer)
    if kind not in (None, "operator"):
        return operand_counterfactual(task, tokenizer, kind.upper())
    style, operation = task.spec.style, task.spec.operation
    if style not in OPERATOR_TEXT:
        raise Af1Error(f"no counterfactual is defined for style '{style}'")
    symbol = all(len(w) == 1 for w in OPERATOR_TEXT[style].values())
    for null in NULL_SYMBOLS if symbol else NULL_WORDS:
        rows, ok = [], True
        for i, p in enumerate(task.problems):
            ids = _splice(task, tokenizer, i, _spans(p.prompt, style, operation, p.operands, None), null)
            if len(ids) != task.n_positions:
                ok = False
                break
            rows.append(ids)
            if i == 0:
                changed = (torch.tensor(ids) != task.input_ids_PT[0]).nonzero().flatten().tolist()
        if ok:
            cf = torch.tensor(rows)
            diff = (cf != task.input_ids_PT).any(0).nonzero().flatten().tolist()
            if diff == changed and len(diff) > 0:
                return Counterfactual(cf, null, diff, [null] * len(rows), "operator")
    raise Af1Error(f"no null replacement of the operator keeps the token layout of {operation} ({style})")


def counterfactual_problems(
    kept: Task, index: list[int], rows: list[dict[str, Any] | None], prompt: bool = True
) -> list[dict[str, Any]]:
    """Per patched problem (`index` into the solved ones), its counterfactual input and drawn value, or None where
    its layout had none."""
    return [
        {
            "solved_index": i,
            **({"prompt": kept.problems[i].prompt} if prompt else {}),
            **(row or {"counterfactual_input_ids": None}),
        }
        for i, row in zip(index, rows, strict=True)
    ]
