"""Mental-math tasks: operations, operand ranges, input styles, few-shot prefixes, tokenization.

A task is a list of problems whose prompts share one constant prefix (the context) and, at
each position, tokens that play the same role (the token layout). The answer of a problem
is the first token the tokenizer emits for the answer after the prompt.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, field_validator

from af1.errors import Af1Error


@dataclass(frozen=True)
class Operation:
    name: str
    operators: tuple[str, ...]

    @property
    def n_operands(self) -> int:
        return len(self.operators) + 1

    def apply(self, operands: tuple[int, ...]) -> int:
        value = operands[0]
        for op, x in zip(self.operators, operands[1:], strict=True):
            value = value + x if op == "+" else value - x if op == "-" else value * x
        return value


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("a+b", ("+",)),
        Operation("a-b", ("-",)),
        Operation("a+b+c", ("+", "+")),
        Operation("a+b-c", ("+", "-")),
        Operation("a-b+c", ("-", "+")),
        Operation("a-b-c", ("-", "-")),
        Operation("a*b", ("*",)),
    )
}

# Input styles of the paper's Table 4 (two-operand + and - only), plus `calculate`, the
# spaced form small models answer best. `{A}`, `{B}` are operands; `{expr}` is the spaced expression.
TWO_OPERAND_STYLES: dict[str, dict[str, str]] = {
    "verbal": {"+": "The sum of {A} and {B} is ", "-": "The difference of {A} and {B} is "},
    "question": {
        "+": "What is the sum of {A} and {B}? Answer: ",
        "-": "What is the difference of {A} and {B}? Answer: ",
    },
    "instruction": {
        "+": "If you add {A} to {B}, you will get ",
        "-": "If you subtract {B} from {A}, you will get ",
    },
    "word": {
        "+": "John has {A} cookies. Jane has {B} cookies. Together they have ",
        "-": "John has {A} cookies. He gave Jane {B} cookies. John now has ",
    },
    "code": {
        "+": "a = {A}; b = {B}; print(a + b) # should print ",
        "-": "a = {A}; b = {B}; print(a - b) # should print ",
    },
}
STYLES: tuple[str, ...] = ("original", "calculate", *TWO_OPERAND_STYLES)
NAMES = "ABCDEFG"


def _template(operation: Operation, style: str) -> str:
    """The prompt template with `{A}`, `{B}`, ... placeholders."""
    fields = [f"{{{NAMES[i]}}}" for i in range(operation.n_operands)]
    if style == "original":
        return "".join(f + op for f, op in zip(fields, operation.operators, strict=False)) + fields[-1] + "="
    if style == "calculate":
        body = " ".join(f"{f} {op}" for f, op in zip(fields, operation.operators, strict=False))
        return f"Calculate: {body} {fields[-1]} = "
    if style not in TWO_OPERAND_STYLES:
        raise Af1Error(f"unknown style '{style}'; choose one of {', '.join(STYLES)}")
    if operation.operators not in (("+",), ("-",)):
        raise Af1Error(f"style '{style}' exists only for a+b and a-b; use original or calculate for {operation.name}")
    return TWO_OPERAND_STYLES[style][operation.operators[0]]


class TaskSpec(BaseModel):
    """Which problems to build: operation, style, operand size, few-shot prefix, sample."""

    operation: str = "a+b"
    style: str = "original"
    digits: int = Field(1, ge=1, le=3)
    shots: int = Field(0, ge=0)
    n: int | None = Field(None, ge=1)
    n_max: int | None = Field(None, ge=1)  # like n, but takes all problems when there are fewer
    seed: int = 0
    allow_negative: bool = False
    answer_digits: Literal["constant", "any"] = "constant"
    largest_layout: bool = False

    @field_validator("operation")
    @classmethod
    def _known_operation(cls, value: str) -> str:
        if value not in OPERATIONS:
            raise ValueError(f"unknown task '{value}'; choose one of {', '.join(OPERATIONS)}")
        return value

    @field_validator("style")
    @classmethod
    def _known_style(cls, value: str) -> str:
        if value not in STYLES:
            raise ValueError(f"unknown style '{value}'; choose one of {', '.join(STYLES)}")
        return value

    @property
    def operand_range(self) -> range:
        if self.operation == "a*b" or self.digits == 1:
            return range(0, 10) if self.operation != "a*b" else range(1, 10)
        return range(10 ** (self.digits - 1), 10**self.digits)


@dataclass(frozen=True)
class Problem:
    operands: tuple[int, ...]
    answer: int
    prompt: str  # the problem alone
    text: str  # few-shot prefix + prompt: what the model reads
    answer_text: str  # what the tokenizer should emit after `text`


def format_prompt(operation: Operation, style: str, operands: tuple[int, ...]) -> str:
    return _template(operation, style).format(**{NAMES[i]: x for i, x in enumerate(operands)})


def enumerate_problems(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, problems): every distinct problem of the spec, sampled deterministically."""
    operation = OPERATIONS[spec.operation]
    _template(operation, spec.style)  # style check before enumerating
    if spec.operation == "a*b" and spec.digits != 1:
        raise Af1Error("a*b uses single-digit factors: use --digits 1")
    pool: list[tuple[tuple[int, ...], int]] = []
    for operands in itertools.product(spec.operand_range, repeat=operation.n_operands):
        value = operation.apply(operands)
        if value >= 0 or spec.allow_negative:
            pool.append((operands, value))
    if spec.answer_digits == "constant":
        counts = Counter(len(str(v)) for _, v in pool)
        keep = max(counts, key=lambda k: (counts[k], -k))
        pool = [p for p in pool if len(str(p[1])) == keep]
    rng = random.Random(spec.seed)
    rng.shuffle(pool)
    if spec.shots >= len(pool):
        raise Af1Error(f"--shots {spec.shots} leaves no problems: the task has {len(pool)} distinct problems")
    shots, rest = pool[: spec.shots], pool[spec.shots :]
    if spec.n is not None:
        if spec.n > len(rest):
            raise Af1Error(
                f"--n {spec.n} is larger than the {len(rest)} distinct problems of {spec.operation} "
                f"(digits={spec.digits}, shots={spec.shots})"
            )
        rest = rest[: spec.n]
    if spec.n_max is not None:
        rest = rest[: spec.n_max]
    examples = [Problem(ops, v, format_prompt(operation, spec.style, ops), "", str(v)) for ops, v in shots]
    prefix = "".join(f"{e.prompt}{e.answer}\n" for e in examples)
    problems = []
    for ops, v in rest:
        prompt = format_prompt(operation, spec.style, ops)
        problems.append(Problem(ops, v, prompt, prefix + prompt, str(v)))
    return examples, problems


@dataclass
class Task:
    """Tokenized problems of one token layout, ready for the model."""

    spec: TaskSpec
    problems: list[Problem]
    input_ids_PT: torch.Tensor  # [problem, position]
    answer_ids_P: torch.Tensor  # [problem]
    context_len: int  # positions 0..context_len-1 are the same in every prompt
    layout: tuple[str, ...]  # role of each position: "context", "const" or an operand name
    examples: list[Problem] = field(default_factory=list)
    answer_moves_space: bool = False
    excluded_other_layouts: int = 0

    @property
    def n_positions(self) -> int:
        return int(self.input_ids_PT.shape[1])

    def __len__(self) -> int:
        return len(self.problems)

    def subset(self, index: list[int] | torch.Tensor) -> Task:
        index = torch.as_tensor(index, dtype=torch.long)
        return dataclasses.replace(
            self,
            problems=[self.problems[i] for i in index.tolist()],
            input_ids_PT=self.input_ids_PT[index],
            answer_ids_P=self.answer_ids_P[index],
        )

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.spec.model_dump(),
            "n_problems": len(self),
            "n_positions": self.n_positions,
            "context_len": self.context_len,
            "layout": list(self.layout),
            "example_prompt": self.problems[0].text if self.problems else None,
            "excluded_other_layouts": self.excluded_other_layouts,
        }


def _roles(tokenizer: Any, problem: Problem, operation: Operation, style: str) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of a prompt and the role of each token (which operand it spells, or const)."""
    enc = tokenizer(problem.text, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    template = _template(operation, style)
    start = len(problem.text) - len(problem.prompt)
    spans: list[tuple[str, int, int]] = []
    rendered = ""  # the template rendered so far: where each operand lands in the prompt
    for literal, name, _, _ in string.Formatter().parse(template):
        rendered += literal
        if name:
            value = str(problem.operands[NAMES.index(name)])
            spans.append((name, start + len(rendered), start + len(rendered) + len(value)))
            rendered += value
    roles = []
    for a, b in offsets:
        hit = [name for name, s, e in spans if a < e and s < b]
        roles.append(hit[0] if hit else "const")
    return ids, tuple(roles)


def answer_token(tokenizer: Any, text: str, answer: str, prompt_ids: list[int]) -> int | None:
    """The first token the tokenizer emits for `answer` right after `text`, or None if they merge."""
    full = tokenizer(text + answer)["input_ids"]
    if full[: len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        return None
    return int(full[len(prompt_ids)])


def build_task(spec: TaskSpec, tokenizer: Any) -> Task:
    """Enumerate, tokenize and check the problems of a spec: one token layout, unambiguous answers."""
    examples, problems = enumerate_problems(spec)
    operation = OPERATIONS[spec.operation]
    moved = False
    encoded = [_roles(tokenizer, p, operation, spec.style) for p in problems]
    answers = [
        answer_token(tokenizer, p.text, p.answer_text, ids) for p, (ids, _) in zip(problems, encoded, strict=True)
    ]
    if any(a is None for a in answers) and all(p.text.endswith(" ") for p in problems):
        # tokenizers that put the space inside the number's token: the prompt ends before the space
        problems = [
            Problem(p.operands, p.answer, p.prompt.rstrip(" "), p.text.rstrip(" "), " " + p.answer_text)
            for p in problems
        ]
        encoded = [_roles(tokenizer, p, operation, spec.style) for p in problems]
        answers = [
            answer_token(tokenizer, p.text, p.answer_text, ids) for p, (ids, _) in zip(problems, encoded, strict=True)
        ]
        moved = True
    bad = [p for p, a in zip(problems, answers, strict=True) if a is None]
    if bad:
        raise Af1Error(
            "the tokenizer merges the end of the prompt with the answer "
            f"(e.g. {bad[0].text!r} + {bad[0].answer_text!r}): the answer's first token is ambiguous"
        )
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (_, roles) in enumerate(encoded):
        groups.setdefault(roles, []).append(i)
    excluded = 0
    if len(groups) > 1:
        sizes = sorted((len(v) for v in groups.values()), reverse=True)
        if not spec.largest_layout:
            raise Af1Error(
                f"the prompts have {len(groups)} different token layouts (group sizes {sizes}); "
                "positions would not be comparable: use --largest-layout to keep the largest group"
            )
        keep = max(groups.values(), key=len)
        excluded = len(problems) - len(keep)
        problems = [problems[i] for i in keep]
        encoded = [encoded[i] for i in keep]
        answers = [answers[i] for i in keep]
    input_ids = torch.tensor([ids for ids, _ in encoded], dtype=torch.long)
    varying = (input_ids != input_ids[:1]).any(0).nonzero().flatten()
    first_varying = int(varying[0]) if len(varying) else input_ids.shape[1] - 1
    context_len = max(1, min(first_varying, input_ids.shape[1] - 1))
    roles = list(encoded[0][1])
    layout = tuple("context" if t < context_len else r for t, r in enumerate(roles))
    return Task(
        spec,
        problems,
        input_ids,
        torch.tensor(answers, dtype=torch.long),
        context_len,
        layout,
        examples,
        moved,
        excluded,
    )


def example_prompt(operation: str, style: str) -> str | None:
    """One example prompt of an operation in a style, or None if the style does not apply."""
    op = OPERATIONS[operation]
    try:
        return format_prompt(op, style, tuple(range(3, 3 + op.n_operands)))
    except Af1Error:
        return None
