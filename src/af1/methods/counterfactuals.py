"""Counterfactual prompts for the heads study: the operator replaced by a null word or symbol, an operand by
another value, or a task file's slot by another of its values, drawn per problem and kept to the same tokens."""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from af1.errors import Af1Error
from af1.methods.replacements import Slots, answer_ids, draw_pair, splice
from af1.tasks.builtin import NAMES, OPERATIONS, prompt_template
from af1.tasks.files import answer_of as file_answer
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
    """One counterfactual prompt per problem, same positions: what was put in (`replacements`), what changed, each
    answer (None: a null operator or value defines none) and the answer-keeping `control`."""

    input_ids_PT: torch.Tensor
    replacement: str
    changed_positions: list[int]  # the positions the counterfactual changes (the operator, an operand or a slot)
    replacements: list[str] = field(default_factory=list)
    kind: str = "operator"  # operator, an operand's name (A, B, ...) or, for a task file, "slot <name>"
    answer_ids: list[tuple[int, ...] | None] = field(default_factory=list)
    control: list[list[int] | None] = field(default_factory=list)  # per problem: the answer-keeping prompt's ids

    def at_step(self, step: Task) -> Counterfactual:
        """The counterfactual of an answer step (`Task.steps()`): each of its rows' counterfactual prompt followed by
        the same teacher-forced answer tokens as the clean row."""
        rows = step.rows_in_parent.tolist()
        T = self.input_ids_PT.shape[1]
        ids = torch.cat([self.input_ids_PT[rows], step.input_ids_PT[:, T:]], 1)
        return dataclasses.replace(
            self,
            input_ids_PT=ids,
            replacements=[self.replacements[i] for i in rows] if self.replacements else [],
            answer_ids=[self.answer_ids[i] for i in rows] if self.answer_ids else [],
            control=[self.control[i] for i in rows] if self.control else [],
        )

    @property
    def defines_answers(self) -> bool:
        """Whether some problem's counterfactual has a known answer other than its own (`contrast_P`)."""
        return any(a is not None for a in self.answer_ids)

    def contrast_P(self, step: Task) -> tuple[torch.Tensor, torch.Tensor]:
        """At an answer step (this counterfactual `at_step` it): each row's counterfactual answer token r' and whether
        it is defined there (a known answer long enough whose token differs from the clean answer's r)."""
        k = step.step or 0
        r_P = step.answer_ids_P
        tokens, defined = r_P.clone(), torch.zeros(len(r_P), dtype=torch.bool)
        for j, a in enumerate(self.answer_ids or [None] * len(r_P)):
            if a is not None and len(a) > k and a[k] != int(r_P[j]):
                tokens[j], defined[j] = a[k], True
        return tokens, defined

    def controlled(self) -> Counterfactual | None:
        """The answer-keeping counterfactual (before `at_step`) contrasted with this one's answers; rows without a
        control keep this prompt and leave the paired claims. None where no problem has one."""
        if not any(c is not None for c in self.control):
            return None
        rows = zip(self.control, self.input_ids_PT, strict=True)
        ids = [torch.tensor(c) if c is not None else row for c, row in rows]
        return dataclasses.replace(self, input_ids_PT=torch.stack(ids), kind=f"{self.kind} (answer kept)", control=[])

    def rows(self) -> list[dict[str, Any]]:
        """Per problem: the counterfactual's token ids, what was put in, its answer's tokens and the answer-keeping
        control's ids (enough to rerun it)."""
        P = len(self.input_ids_PT)
        drawn = self.replacements or [self.replacement] * P
        answers = self.answer_ids or [None] * P
        controls = self.control or [None] * P
        return [
            {
                "counterfactual_input_ids": ids,
                "replacement": r,
                "counterfactual_answer_ids": None if a is None else list(a),
                "control_input_ids": c,
            }
            for ids, r, a, c in zip(self.input_ids_PT.tolist(), drawn, answers, controls, strict=True)
        ]


def _spans(style: str, operation: str, operands: tuple[int, ...], operand: str | None) -> list[tuple[int, int]]:
    """Character spans inside the problem's own prompt (not the few-shot prefix) of the operator text, or with
    `operand` of that operand's digits."""
    op = OPERATIONS[operation]
    template = prompt_template(op, style)
    spans, rendered = [], ""
    for literal, name, _, _ in string.Formatter().parse(template):
        for o in set(op.operators) if operand is None else ():
            found = re.finditer(re.escape(OPERATOR_TEXT[style][o]), literal)
            spans += [(len(rendered) + m.start(), len(rendered) + m.end()) for m in found]
        rendered += literal
        if name:
            value = str(operands[NAMES.index(name)])
            if name == operand:
                spans.append((len(rendered), len(rendered) + len(value)))
            rendered += value
    return spans


def _changed(ids: list[int], row: torch.Tensor) -> list[int]:
    """The positions where a counterfactual row's ids differ from the clean row's."""
    return (torch.tensor(ids) != row).nonzero().flatten().tolist()


def _null(task: Task, rows: list[list[int]], null: str, kind: str) -> Counterfactual:
    """The same null text put in every problem: no answer defined, no answer-keeping control."""
    cf = torch.tensor(rows)
    positions = (cf != task.input_ids_PT).any(0).nonzero().flatten().tolist()
    return Counterfactual(cf, null, positions, [null] * len(rows), kind, [None] * len(rows), [])


def _drawn(task: Task, tokenizer: Tokenizer, slots_of: Callable[[int], Slots], name: str, kind: str) -> Counterfactual:
    """Every problem's `draw_pair` for `name`; a problem none keeps the layout of is an error."""
    rows, drawn, answers, controls, positions = [], [], [], [], set()
    for i in range(len(task)):
        found = draw_pair(task, tokenizer, i, slots_of(i), name)
        if found is None:
            raise Af1Error(f"no other value of {name} keeps the token layout of {task.problems[i].prompt!r}")
        rows.append(found.ids)
        drawn.append(", ".join(f"{n}={v}" for n, v in found.values.items()))
        answers.append(answer_ids(task, tokenizer, i, found.answer))
        controls.append(found.control)
        positions |= set(_changed(found.ids, task.input_ids_PT[i]))
    what = f"another value of {name}, with its answer-keeping control where one keeps the layout"
    return Counterfactual(torch.tensor(rows), what, sorted(positions), drawn, kind, answers, controls)


def slot_counterfactual(task: Task, tokenizer: Tokenizer) -> Counterfactual:
    """A task file's prompts with its slot replaced everywhere: by its null value (no answer), or by another value drawn
    per problem with an answer-keeping control (`draw_pair`; `distinct`: none reused)."""
    assert task.spec.file is not None
    described = read_task_file(task.spec.file)
    named = described.counterfactual
    if named is None:
        raise Af1Error(
            f"task file {task.spec.file} names no counterfactual slot (counterfactual: {{slot: ..., null_value: ...}})"
        )
    if named.null_value is not None:
        return _null_slot(task, tokenizer, named.slot, named.null_value)
    names = list(dict.fromkeys(n for p in task.problems for n, _, _ in p.spans))
    values = {n: sorted(set(slot_values(task.spec.file, described, n))) for n in names}
    answer = described.answer

    def slots_of(i: int) -> Slots:
        p = task.problems[i]
        if not any(n == named.slot for n, _, _ in p.spans):
            raise Af1Error(f"problem {p.prompt!r} has no slot '{named.slot}'")
        own = dict(zip(names, map(str, p.operands), strict=True))

        def answer_of(new: dict[str, str]) -> str | None:
            if answer is None:
                return None
            found = file_answer(task.spec.file or "", answer, names, new)
            return None if found is None else answer.prefix + found

        spans = {n: [(a, b) for m, a, b in p.spans if m == n] for n in names}
        # a distinct task's slots stay distinct: no slot takes a value another slot of the problem holds
        candidates = {n: [v for v in values[n] if not described.distinct or v not in own.values()] for n in names}
        return Slots(own, spans, candidates, answer_of)

    return _drawn(task, tokenizer, slots_of, named.slot, f"slot {named.slot}")


def _null_slot(task: Task, tokenizer: Tokenizer, slot: str, null: str) -> Counterfactual:
    """The slot replaced by its null value in every problem (no answer defined)."""
    rows = []
    for i, p in enumerate(task.problems):
        spans = [(a, b, null) for n, a, b in p.spans if n == slot]
        if not spans:
            raise Af1Error(f"problem {p.prompt!r} has no slot '{slot}'")
        ids = splice(task, tokenizer, i, spans)
        if len(ids) != task.n_positions or any(task.layout[t] != slot for t in _changed(ids, task.input_ids_PT[i])):
            raise Af1Error(
                f"no value of slot '{slot}' keeps the token layout of {p.prompt!r} "
                "(its null value has another token length)"
            )
        rows.append(ids)
    return _null(task, rows, null, f"slot {slot}")


def operand_counterfactual(task: Task, tokenizer: Tokenizer, operand: str) -> Counterfactual:
    """A built-in task's prompts with one operand replaced per problem by another of the same digits that keeps the
    token layout, with an answer-keeping control (`draw_pair`)."""
    spec = task.spec
    operation = OPERATIONS[spec.operation]
    names = list(NAMES[: operation.n_operands])
    if operand not in names:
        raise Af1Error(
            f"unknown counterfactual '{operand.lower()}' for {spec.operation}: operator or one of "
            + ", ".join(n.lower() for n in names)
        )

    def slots_of(i: int) -> Slots:
        p = task.problems[i]
        own = {n: str(v) for n, v in zip(names, p.operands, strict=True)}
        spans = {n: _spans(spec.style, spec.operation, p.operands, n) for n in names}
        candidates = {n: [str(v) for v in spec.operand_range if len(str(v)) == len(own[n])] for n in names}

        def answer_of(new: dict[str, str]) -> str | None:
            value = operation.apply(tuple(int(new[n]) for n in names))
            return str(value) if value >= 0 or spec.allow_negative else None

        return Slots(own, spans, candidates, answer_of)

    return _drawn(task, tokenizer, slots_of, operand, operand)


def counterfactual(task: Task, tokenizer: Tokenizer, kind: str | None = None) -> Counterfactual:
    """The task's prompts with the operator replaced by a null symbol or word keeping the token layout, an operand
    replaced per problem, or a task file's slot (`slot_counterfactual`)."""
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
        rows = []
        for i, p in enumerate(task.problems):
            spans = _spans(style, operation, p.operands, None)
            rows.append(splice(task, tokenizer, i, [(a, b, null) for a, b in spans]))
            if len(rows[-1]) != task.n_positions:
                break
        else:  # every problem kept its length: the null is used where every problem changes where the first does
            found = _null(task, rows, null, "operator")
            if found.changed_positions and found.changed_positions == _changed(rows[0], task.input_ids_PT[0]):
                return found
    raise Af1Error(f"no null replacement of the operator keeps the token layout of {operation} ({style})")


def defines_answers(task: Task, tokenizer: Tokenizer, kind: str | None) -> bool:
    """Whether the counterfactual of `kind` gives some problem (first token layout) an answer of its own: an operand or
    an answer-changing slot does; a null operator or value, or an unread slot, does not."""
    if task.spec.file is None and kind in (None, "operator"):
        return False
    try:
        return counterfactual(task.groups[0] if task.groups else task, tokenizer, kind).defines_answers
    except Af1Error:  # no counterfactual at all: path patching says why
        return False


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
