"""Mental-math tasks: operations, operand ranges, input styles, few-shot prefixes, tokenization.

A task is a list of problems whose prompts share one constant prefix (the context) and, at
each position, tokens that play the same role (the token layout). Prompts of several layouts
make a task of several groups, one per layout, each with its own context and measured on its own.
The answer of a problem is every token the tokenizer emits for it after the prompt; it is scored whole (teacher
forcing) or, as an option, by its first token. Where the task shows what follows an answer (the separator of its
worked examples), full scoring also checks that the model stops there: one more step whose target is the first token
of the separator ("14" is not the answer "1"). Context is only ever what is constant: when
the first token varies, the tokenizer's document-start token is prepended and recorded.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator

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
FILE_STYLE = "task file"  # the style results give a task file's problems (its template is its own)
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


Scoring = Literal["full", "first"]
SEPARATOR = "\n"  # what follows each worked example's answer in a built-in task's few-shot prefix
# The CAMA means' sample: disjoint from the evaluated problems where the distribution has enough others, sized so
# that every (position, token) held by at least MEANS_COMMON of the evaluated problems is expected MEANS_MIN_COUNT
# times, within [MEANS_SAMPLE_MIN, MEANS_SAMPLE_MAX]; else the whole distribution (each problem left out of its mean).
MEANS_MIN_COUNT = 10
MEANS_COMMON = 0.01
MEANS_SAMPLE_MIN = 200
MEANS_SAMPLE_MAX = 2_000
DEFAULT_N = 1_000  # without --n, a task of more distinct problems is sampled to this size (the paper's)
ENUMERATE_MAX = 1_000_000  # operand tuples beyond this are sampled (seeded, distinct), not enumerated
POOL_SAMPLE = 100_000  # how many then


class TaskSpec(BaseModel):
    """Which problems to build and how to score them: operation, style, operands, few-shot prefix, sample."""

    operation: str = "a+b"
    style: str = "original"
    digits: int = Field(default=1, ge=1, le=3)
    shots: int = Field(default=0, ge=0)
    n: int | None = Field(default=None, ge=1)
    n_max: int | None = Field(default=None, ge=1)  # like n, but takes all problems when there are fewer
    seed: int = 0
    allow_negative: bool = False
    answer_digits: Literal["auto", "constant", "any"] = "auto"  # auto: any for full scoring, constant for first
    scoring: Scoring = "full"
    check_end: bool = True  # full scoring also checks that the model stops after the answer (see `answer_end`)
    largest_layout: bool = False
    file: str | None = None  # a task file (`af1.taskfile`): its rows or template replace operation and style
    file_sha256: str | None = None  # of the file and what it reads, filled in: a changed file is another task
    _file_name: str | None = PrivateAttr(default=None)  # the task file's name, read with it

    @model_validator(mode="after")
    def _read_file(self) -> TaskSpec:
        if self.file is not None:
            from af1.taskfile import file_digest, read_task_file

            object.__setattr__(self, "file", str(Path(self.file).resolve()))  # any worker finds it, whatever its cwd
            task = read_task_file(self.file)
            digest = file_digest(self.file, task)
            if self.file_sha256 is not None and self.file_sha256 != digest:
                raise ValueError(f"task file {self.file} changed since this task was described (sha256 differs)")
            object.__setattr__(self, "file_sha256", digest)
            if task.shots is not None:
                object.__setattr__(self, "shots", task.shots)
            if task.scoring is not None:
                object.__setattr__(self, "scoring", task.scoring)
            if task.check_end is not None:
                object.__setattr__(self, "check_end", task.check_end)
            self._file_name = task.name or Path(self.file).stem
        return self

    @property
    def name(self) -> str:
        """What the task is called in tables: the operation, or the task file's name (its stem by default)."""
        return self.operation if self._file_name is None else self._file_name

    @property
    def style_name(self) -> str:
        """The input style in results and tables: a task file has none of the built-in ones (its template says)."""
        return self.style if self.file is None else FILE_STYLE

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

    @property
    def constant_answer_digits(self) -> bool:
        """Keep one answer digit count: only for first-token scoring, where the first digit must mean one thing."""
        return self.answer_digits == "constant" or (self.answer_digits == "auto" and self.scoring == "first")


@dataclass(frozen=True)
class Problem:
    operands: tuple[Any, ...]  # the operands, or a task file's slot values
    answer: int | str
    prompt: str  # the problem alone
    text: str  # few-shot prefix + prompt: what the model reads (after the prepended BOS, if any)
    answer_text: str  # what the tokenizer should emit after `text`
    spans: tuple[tuple[str, int, int], ...] = ()  # a task file's slots: (name, start, end) in the prompt


def format_prompt(operation: Operation, style: str, operands: tuple[int, ...]) -> str:
    return _template(operation, style).format(**{NAMES[i]: x for i, x in enumerate(operands)})


def problem_pool(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, every other distinct problem of the spec in a seeded order): the task distribution."""
    operation = OPERATIONS[spec.operation]
    _template(operation, spec.style)  # style check before enumerating
    if spec.operation == "a*b" and spec.digits != 1:
        raise Af1Error("a*b uses single-digit factors: use --digits 1")
    pool: list[tuple[tuple[int, ...], int]] = []
    for operands in operand_tuples(spec.operand_range, operation.n_operands, spec.seed):
        value = operation.apply(operands)
        if value >= 0 or spec.allow_negative:
            pool.append((operands, value))
    if spec.constant_answer_digits:
        counts = Counter(len(str(v)) for _, v in pool)
        keep = max(counts, key=lambda k: (counts[k], -k))
        pool = [p for p in pool if len(str(p[1])) == keep]
    rng = random.Random(spec.seed)
    rng.shuffle(pool)
    if spec.shots >= len(pool):
        raise Af1Error(f"--shots {spec.shots} leaves no problems: the task has {len(pool)} distinct problems")
    shots, rest = pool[: spec.shots], pool[spec.shots :]
    examples = [Problem(ops, v, format_prompt(operation, spec.style, ops), "", str(v)) for ops, v in shots]
    prefix = "".join(f"{e.prompt}{e.answer}{SEPARATOR}" for e in examples)
    problems = []
    for ops, v in rest:
        prompt = format_prompt(operation, spec.style, ops)
        problems.append(Problem(ops, v, prompt, prefix + prompt, str(v)))
    return examples, problems


def operand_tuples(values: range, n_operands: int, seed: int) -> Iterable[tuple[int, ...]]:
    """Every operand tuple, or a seeded sample of POOL_SAMPLE distinct ones when there are more than
    ENUMERATE_MAX (3-digit a+b+c has 729 million)."""
    total = len(values) ** n_operands
    if total <= ENUMERATE_MAX:
        return itertools.product(values, repeat=n_operands)
    picks = sorted(random.Random(seed).sample(range(total), POOL_SAMPLE))
    return [tuple(values[(i // len(values) ** k) % len(values)] for k in reversed(range(n_operands))) for i in picks]


def enumerate_problems(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, problems): the distribution sampled deterministically (see `sample_problems`)."""
    examples, pool = problem_pool(spec)
    return examples, sample_problems(spec, pool)


def sample_problems(spec: TaskSpec, pool: list[Problem]) -> list[Problem]:
    """The first --n / n_max problems of the seeded pool; DEFAULT_N when neither is given."""
    rest = pool
    if spec.n is None and spec.n_max is None:
        rest = rest[:DEFAULT_N]
    if spec.n is not None:
        if spec.n > len(rest):
            raise Af1Error(
                f"--n {spec.n} is larger than the {len(rest)} distinct problems of {spec.name} "
                + (f"(digits={spec.digits}, shots={spec.shots})" if spec.file is None else f"(shots={spec.shots})")
            )
        rest = rest[: spec.n]
    if spec.n_max is not None:
        rest = rest[: spec.n_max]
    return rest


@dataclass
class Task:
    """Tokenized problems of one token layout, ready for the model.

    A task is scored in steps: step k reads the prompt and the first k answer tokens and must
    predict answer token k (teacher forcing, equal to greedy exact match). Where the end is checked
    (`stop_tokens`), a problem whose answer has k tokens must at step k predict the token that ends it.
    First-token scoring has step 0 only. `steps()` gives each step as a task of its own (`step` set),
    whose rows are the problems with a target at step k.
    """

    spec: TaskSpec
    problems: list[Problem]
    input_ids_PT: torch.Tensor  # [problem, position]
    answer_tokens: list[tuple[int, ...]]  # every token of each answer, as the tokenizer emits them after the prompt
    context_len: int  # positions 0..context_len-1 are the same in every prompt
    layout: tuple[str, ...]  # role of each position: "context", "const", an operand name or "answer<k>"
    prompt_roles: tuple[str, ...]  # roles of the prompt's own tokens (no BOS, no context marking)
    examples: list[Problem] = field(default_factory=list)
    answer_moves_space: bool = False
    excluded_other_layouts: int = 0
    bos: tuple[int, str] | None = None  # the special token prepended because the first token varies: (id, text)
    step: int | None = None  # set on the tasks `steps()` returns
    index_P: torch.Tensor | None = None  # a step's rows in the task it came from; a layout group's in the whole
    origin: str = "sample"  # "sample" (evaluated problems), "grid" or "disjoint sample" (a means distribution)
    n_distinct: int | None = None  # distinct problems of the spec (besides the few-shot ones), when known
    # several token layouts: one task per layout, whose index_P are its rows here (see `union`); the whole task's
    # input_ids_PT are then right-padded with PAD and only its `steps()`, one layout each, are ever run
    groups: list[Task] = field(default_factory=list)
    layout_id: int = 0  # which of the evaluated task's layout groups this is (kept by subsets and distributions)
    # each row's first token after its answer in a worked example: one more step of full scoring (the model must
    # stop there); empty when the end is not checked. Kept apart from answer_tokens, which stay the answer itself
    stop_tokens: list[int] = field(default_factory=list)
    end: dict[str, Any] = field(default_factory=dict)  # whether the end is checked, with which token, or why not

    @property
    def sampling_note(self) -> str | None:
        """Says that a task was sampled to DEFAULT_N because no --n was given; None otherwise."""
        spec = self.spec
        if spec.n is not None or spec.n_max is not None or self.n_distinct is None or self.n_distinct <= DEFAULT_N:
            return None
        return (
            f"{spec.name} has {self.n_distinct} distinct problems; a seeded sample of {DEFAULT_N} is used "
            f"(seed {spec.seed}; --n sets another size)"
        )

    @property
    def exclusion_note(self) -> str | None:
        """Says how many problems were left out for their token layout, and why; None when none were."""
        n = self.excluded_other_layouts
        if not n:
            return None
        if self.spec.largest_layout:
            return f"{n} problems left out: --largest-layout keeps only the largest token layout"
        return f"{n} problems left out: their token layout is shared by fewer than {MIN_LAYOUT} problems"

    @property
    def end_note(self) -> str | None:
        """Says that full scoring does not check where the answer ends, and why; None when it does (or scores the
        first token only)."""
        if self.spec.scoring == "first" or self.end.get("checked", True):
            return None
        return f'the end of the answer is not checked ({self.end.get("note")}): "14" would count for "1"'

    @property
    def n_positions(self) -> int:
        return int(self.input_ids_PT.shape[1])

    def answer_only(self) -> Task:
        """The same problems scored on their answer's tokens alone (no end-of-answer step): what the heads study
        ranks heads by (the arithmetic, not the newline after it)."""
        return dataclasses.replace(self, stop_tokens=[], groups=[g.answer_only() for g in self.groups])

    @property
    def scored_tokens(self) -> list[tuple[int, ...]]:
        """Each row's targets, step by step: its answer's tokens, then the token that ends it where that is checked."""
        if not self.stop_tokens:
            return self.answer_tokens
        return [(*a, s) for a, s in zip(self.answer_tokens, self.stop_tokens, strict=True)]

    @property
    def answer_ids_P(self) -> torch.Tensor:
        """The next-token target of every row: scored token `step` (the answer's first for a whole task)."""
        k = self.step or 0
        return torch.tensor([a[k] for a in self.scored_tokens], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.problems)

    @property
    def where_P(self) -> torch.Tensor:
        """Rows of this piece (a layout group or an answer step) in the task it belongs to."""
        if self.index_P is None:
            raise ValueError("a whole task is not a piece of another")
        return self.index_P

    @property
    def rows_in_parent(self) -> torch.Tensor:
        """Rows of this piece in the task it belongs to; a whole task's own rows."""
        return self.index_P if self.index_P is not None else torch.arange(len(self))

    @property
    def part_key(self) -> tuple[Any, ...]:
        """Which piece of a task this is: its prompt's token layout and its answer step."""
        return (self.prompt_roles, self.bos, self.step)

    @property
    def layout_P(self) -> torch.Tensor:
        """Each row's layout group (`layout_id`; all 0 for a task of one layout)."""
        out = torch.zeros(len(self), dtype=torch.long)
        for group in self.groups:
            out[group.where_P] = group.layout_id
        return out

    def subset(self, index: list[int] | torch.Tensor) -> Task:
        index = torch.as_tensor(index, dtype=torch.long)
        rows = index.tolist()
        groups = []
        if self.groups:
            new_row = {r: n for n, r in enumerate(rows)}
            for group in self.groups:
                mine = sorted((new_row[r], j) for j, r in enumerate(group.where_P.tolist()) if r in new_row)
                if mine:
                    sub = group.subset([j for _, j in mine])
                    sub.index_P = torch.tensor([n for n, _ in mine], dtype=torch.long)
                    groups.append(sub)
        return dataclasses.replace(
            self,
            problems=[self.problems[i] for i in rows],
            input_ids_PT=self.input_ids_PT[index],
            answer_tokens=[self.answer_tokens[i] for i in rows],
            stop_tokens=[self.stop_tokens[i] for i in rows] if self.stop_tokens else [],
            index_P=None if self.index_P is None else self.index_P[index],
            groups=groups,
        )

    def n_steps(self) -> int:
        if self.groups:
            return max(g.n_steps() for g in self.groups)
        if self.step is not None or self.spec.scoring == "first" or not self.answer_tokens:
            return 1
        return max(len(a) for a in self.scored_tokens)

    def steps(self) -> list[Task]:
        """The next-token predictions that score this task, each a task of one token layout (per layout group, then
        per answer step); each step's index_P are its rows in this task."""
        if self.step is not None:
            return [self]
        if self.groups:
            return [
                dataclasses.replace(part, index_P=group.where_P[part.where_P])
                for group in self.groups
                for part in dataclasses.replace(group, index_P=None).steps()
            ]
        out = []
        scored = self.scored_tokens
        for k in range(self.n_steps()):
            rows = [i for i, a in enumerate(scored) if len(a) > k]
            appended = torch.tensor([list(scored[i][:k]) for i in rows], dtype=torch.long)
            out.append(
                dataclasses.replace(
                    self,
                    problems=[self.problems[i] for i in rows],
                    input_ids_PT=torch.cat([self.input_ids_PT[rows], appended.view(len(rows), k)], 1),
                    answer_tokens=[self.answer_tokens[i] for i in rows],
                    stop_tokens=[self.stop_tokens[i] for i in rows] if self.stop_tokens else [],
                    layout=self.layout + tuple(f"answer{j}" for j in range(k)),
                    step=k,
                    index_P=torch.tensor(rows, dtype=torch.long),
                )
            )
        return out

    def targets(self) -> list[str]:
        """What a problem must produce: the whole answer and, where checked, its end (full scoring), or its first
        token (first-token scoring); a step's: its target token."""
        if self.spec.scoring == "first" or self.step is not None:
            k = self.step or 0
            return [str(a[k]) for a in self.scored_tokens]
        return [" ".join(map(str, a)) for a in self.scored_tokens]

    def input_text(self, i: int) -> str:
        """The exact text fed to the model for problem i: the prepended BOS, the few-shot prefix, the prompt."""
        for group in self.groups:
            if i in group.where_P.tolist():
                return group.input_text(group.where_P.tolist().index(i))
        return (self.bos[1] if self.bos else "") + self.problems[i].text

    def rows(self) -> list[dict[str, Any]]:
        """Each problem as it was fed: enough to rerun exactly that input (and its layout group, when several)."""
        if self.groups:
            out: list[dict[str, Any]] = [{} for _ in range(len(self))]
            for group in self.groups:
                for r, row in zip(group.where_P.tolist(), dataclasses.replace(group, groups=[]).rows(), strict=True):
                    out[r] = {**row, "layout": group.layout_id}
            return out
        return [
            {
                "prompt": p.prompt,
                "input": self.input_text(i),
                "input_ids": self.input_ids_PT[i].tolist(),
                "answer": p.answer,
                "answer_text": p.answer_text,
                "answer_tokens": list(self.answer_tokens[i]),
                "stop_token": self.stop_tokens[i] if self.stop_tokens else None,
            }
            for i, p in enumerate(self.problems)
        ]

    def layouts(self) -> list[dict[str, Any]]:
        """Each token layout's size and shape, with an example input; one entry for a task of one layout."""
        return [
            {
                "layout": group.layout_id,
                "n": len(group),
                "n_positions": group.n_positions,
                "context_len": group.context_len,
                "roles": compact_roles(group.layout),
                "example_input": group.input_text(0) if len(group) else None,
            }
            for group in self.groups or [self]
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.spec.model_dump(),
            "layouts": self.layouts(),
            "scoring": self.spec.scoring,
            "n_problems": len(self),
            "n_positions": None if self.groups else self.n_positions,  # several layouts: see `layouts`
            "context_len": None if self.groups else self.context_len,
            "layout": list(self.layout),
            "bos_prepended": None if self.bos is None else {"id": self.bos[0], "text": self.bos[1]},
            "example_input": self.input_text(0) if self.problems else None,
            "answer_lengths": dict(sorted(Counter(len(a) for a in self.answer_tokens).items())),
            "end": self.end,
            "excluded_other_layouts": self.excluded_other_layouts,
            "n_distinct": self.n_distinct,
        }


def _roles(
    tokenizer: Any, problem: Problem, operation: Operation | None, style: str
) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of a prompt and the role of each token (which operand or slot it spells, or const)."""
    enc = tokenizer(problem.text, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    start = len(problem.text) - len(problem.prompt)
    spans: list[tuple[str, int, int]] = [(name, start + a, start + b) for name, a, b in problem.spans]
    rendered = ""  # the template rendered so far: where each operand lands in the prompt
    for literal, name, _, _ in string.Formatter().parse(_template(operation, style) if operation else ""):
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


def answer_tokens(tokenizer: Any, text: str, answer: str, prompt_ids: list[int]) -> tuple[int, ...] | None:
    """Every token the tokenizer emits for `answer` right after `text`, or None if prompt and answer merge."""
    full = tokenizer(text + answer)["input_ids"]
    if full[: len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        return None
    return tuple(int(t) for t in full[len(prompt_ids) :])


def answer_token(tokenizer: Any, text: str, answer: str, prompt_ids: list[int]) -> int | None:
    """The first token the tokenizer emits for `answer` right after `text`, or None if they merge."""
    tokens = answer_tokens(tokenizer, text, answer, prompt_ids)
    return None if tokens is None else tokens[0]


def answer_end(spec: TaskSpec) -> str | None:
    """What follows an answer in the task's worked examples (their separator); None when it shows none (no shots, or
    a task file's empty separator): then nothing says where an answer ends."""
    if spec.shots == 0:
        return None
    if spec.file is None:
        return SEPARATOR
    from af1.taskfile import read_task_file

    return read_task_file(spec.file).separator or None


def stop_token(
    tokenizer: Any, text: str, answer: str, separator: str, prompt_ids: list[int], answer_ids: tuple[int, ...]
) -> int | None:
    """The first token the tokenizer emits for `separator` after `text` + `answer`, or None when it merges with the
    answer (the answer's own tokens would change)."""
    head = list(prompt_ids) + list(answer_ids)
    full = tokenizer(text + answer + separator)["input_ids"]
    if full[: len(head)] != head or len(full) == len(head):
        return None
    return int(full[len(head)])


def end_tokens(
    spec: TaskSpec, problems: list[Problem], prompt_ids: list[list[int]], answers: list[tuple[int, ...]], tokenizer: Any
) -> tuple[list[int], dict[str, Any]]:
    """Each problem's token after its answer in a worked example (empty when the end is not checked), and whether
    full scoring checks the end, with which token, or why not."""
    separator = answer_end(spec)
    end: dict[str, Any] = {"checked": False, "separator": separator, "stop_tokens": None, "note": None}
    if spec.scoring == "first":
        return [], {**end, "note": "first-token scoring"}
    if not spec.check_end:
        return [], {**end, "note": "turned off: --no-check-end"}
    if separator is None:
        return [], {
            **end,
            "note": "no worked example shows what follows an answer (no shots, or an empty separator)",
        }
    stops = []
    for p, ids, a in zip(problems, prompt_ids, answers, strict=True):
        stop = stop_token(tokenizer, p.text, p.answer_text, separator, ids, a)
        if stop is None:
            note = f"the separator {separator!r} merges with the answer's tokens (e.g. after {p.answer_text!r})"
            return [], {**end, "note": note}
        stops.append(stop)
    decode = getattr(tokenizer, "decode", None)
    texts = {str(t): decode([t]) if decode else None for t in sorted(set(stops))}
    return stops, {**end, "checked": True, "stop_tokens": texts}


def document_start(tokenizer: Any) -> tuple[int, str] | None:
    """The special token that starts a document for this tokenizer: its BOS; else `<|endoftext|>`, which GPT-2,
    Pythia, GPT-J and Qwen put between training documents; else its EOS; None if it has none of them."""
    if getattr(tokenizer, "bos_token_id", None) is not None:
        return int(tokenizer.bos_token_id), str(tokenizer.bos_token)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if "<|endoftext|>" in vocab:
        return int(vocab["<|endoftext|>"]), "<|endoftext|>"
    if getattr(tokenizer, "eos_token_id", None) is not None:
        return int(tokenizer.eos_token_id), str(tokenizer.eos_token)
    return None


def _encode(
    spec: TaskSpec, problems: list[Problem], tokenizer: Any
) -> tuple[list[Problem], list[tuple[list[int], tuple[str, ...]]], list[tuple[int, ...] | None], bool]:
    operation = OPERATIONS[spec.operation] if spec.file is None else None
    encoded = [_roles(tokenizer, p, operation, spec.style) for p in problems]
    answers = [
        answer_tokens(tokenizer, p.text, p.answer_text, ids) for p, (ids, _) in zip(problems, encoded, strict=True)
    ]
    if any(a is None for a in answers) and all(p.text.endswith(" ") for p in problems):
        # tokenizers that put the space inside the number's token: the prompt ends before the space
        problems = [
            Problem(p.operands, p.answer, p.prompt.rstrip(" "), p.text.rstrip(" "), " " + p.answer_text, p.spans)
            for p in problems
        ]
        encoded = [_roles(tokenizer, p, operation, spec.style) for p in problems]
        answers = [
            answer_tokens(tokenizer, p.text, p.answer_text, ids) for p, (ids, _) in zip(problems, encoded, strict=True)
        ]
        return problems, encoded, answers, True
    return problems, encoded, answers, False


def compact_roles(layout: tuple[str, ...]) -> str:
    """A layout as one line: 'context*25 a a const b const' (runs of context and BOS counted)."""
    words: list[str] = []
    for role, run in itertools.groupby(layout):
        n = len(list(run))
        words += [f"{role}*{n}"] if role in ("context", "bos") and n > 1 else [role] * n
    return " ".join(words)


MIN_LAYOUT = 5  # a layout shared by fewer evaluated problems is left out: its CAMA means would be over almost none
PAD = -1  # pads the whole-task ids of a task of several layouts: not a token, so running them fails loudly


def tokenize_task(
    spec: TaskSpec, examples: list[Problem], problems: list[Problem], tokenizer: Any, like: Task | None = None
) -> Task:
    """Tokenize and check problems: unambiguous answers, grouped by token layout, each group's constant context.

    Prompts of several layouts become one task of several groups (`Task.groups`), each measured on its own;
    --largest-layout keeps the largest group. With `like`, the problems take that task's layouts, contexts and
    prepended BOS (a means distribution); problems of other layouts are left out."""
    problems, encoded, answers, moved = _encode(spec, problems, tokenizer)
    bad = [p for p, a in zip(problems, answers, strict=True) if a is None]
    if bad:
        raise Af1Error(
            "the tokenizer merges the end of the prompt with the answer "
            f"(e.g. {bad[0].text!r} + {bad[0].answer_text!r}): the answer's tokens are ambiguous"
        )
    if like is not None and not like.end.get("checked"):
        stops, end = [], like.end  # a means distribution is scored as the evaluated task is
    else:
        stops, end = end_tokens(spec, problems, [i for i, _ in encoded], [tuple(a or ()) for a in answers], tokenizer)
        if like is not None and not stops:
            raise Af1Error(f"the evaluated task checks the answer's end but its distribution cannot: {end['note']}")
    by_roles: dict[tuple[str, ...], list[int]] = {}
    for i, (_, roles) in enumerate(encoded):
        by_roles.setdefault(roles, []).append(i)

    def build(rows: list[int], like_group: Task | None) -> Task:
        task = _layout_task(
            spec,
            examples,
            [problems[i] for i in rows],
            [encoded[i][0] for i in rows],
            encoded[rows[0]][1],
            [tuple(answers[i] or ()) for i in rows],
            [stops[i] for i in rows] if stops else [],
            tokenizer,
            like_group,
        )
        task.answer_moves_space, task.end = moved, end
        return task

    if like is not None:
        built = []
        for target in like.groups or [like]:
            rows = by_roles.get(target.prompt_roles, [])
            if not rows:
                raise Af1Error("no problem of the task distribution has the evaluated problems' token layout")
            built.append(build(rows, target))
            built[-1].layout_id = target.layout_id
        kept = sum(len(t) + t.excluded_other_layouts for t in built)
        return union(built, len(problems) - kept) if like.groups else _excluding(built[0], len(problems) - kept)
    groups = sorted(by_roles.values(), key=lambda rows: (-len(rows), rows[0]))
    if len(groups) == 1:
        return build(groups[0], None)
    if spec.largest_layout:
        return _excluding(build(groups[0], None), len(problems) - len(groups[0]))
    large = [rows for rows in groups if len(rows) >= MIN_LAYOUT]
    if not large:
        raise Af1Error(
            f"the prompts have {len(groups)} different token layouts, none shared by {MIN_LAYOUT} or more problems "
            f"(group sizes {[len(r) for r in groups]}): CAMA's means would be over almost nothing"
        )
    left_out = len(problems) - sum(map(len, large))
    if len(large) == 1:
        return _excluding(build(large[0], None), left_out)
    built = [build(rows, None) for rows in large]
    for n, task in enumerate(built):
        task.layout_id = n
    order = {i: n for n, i in enumerate(sorted(i for rows in large for i in rows))}  # rows in the sample's order
    for task, rows in zip(built, large, strict=True):
        task.index_P = torch.tensor([order[i] for i in rows], dtype=torch.long)
    return union(built, left_out)


def _excluding(task: Task, n: int) -> Task:
    task.excluded_other_layouts += n
    return task


def union(groups: list[Task], excluded: int = 0) -> Task:
    """One task of several token layouts from one task per layout (each group's index_P: its rows in the union,
    or, when unset, the groups' rows one after another)."""
    start = 0
    for group in groups:
        if group.index_P is None:
            group.index_P = torch.arange(start, start + len(group))
        start += len(group)
    P, T = start, max(g.n_positions for g in groups)
    ids_PT = torch.full((P, T), PAD, dtype=torch.long)
    problems: list[Any] = [None] * P
    answers: list[Any] = [None] * P
    stops: list[Any] = [None] * P
    for group in groups:
        ids_PT[group.where_P, : group.n_positions] = group.input_ids_PT
        for j, r in enumerate(group.where_P.tolist()):
            problems[r], answers[r] = group.problems[j], group.answer_tokens[j]
            stops[r] = group.stop_tokens[j] if group.stop_tokens else None
    first = groups[0]
    return Task(
        first.spec,
        problems,
        ids_PT,
        answers,
        min(g.context_len for g in groups),
        (),
        (),
        first.examples,
        first.answer_moves_space,
        excluded + sum(g.excluded_other_layouts for g in groups),
        first.bos if all(g.bos == first.bos for g in groups) else None,
        origin=first.origin,
        groups=groups,
        stop_tokens=stops if all(s is not None for s in stops) else [],
        end=first.end,
    )


def _layout_task(
    spec: TaskSpec,
    examples: list[Problem],
    problems: list[Problem],
    ids: list[list[int]],
    prompt_roles: tuple[str, ...],
    answers: list[tuple[int, ...]],
    stops: list[int],
    tokenizer: Any,
    like: Task | None,
) -> Task:
    """Problems of one token layout: the constant context and, when the first token varies, a prepended BOS."""
    input_ids = torch.tensor(ids, dtype=torch.long)
    bos = like.bos if like is not None else None
    excluded = 0
    # an operand's token is never context, even when a small sample happens to hold it constant
    first_operand = next((t for t, r in enumerate(prompt_roles) if r != "const"), len(prompt_roles))
    if like is None:
        varying = (input_ids != input_ids[:1]).any(0).nonzero().flatten()
        if first_operand == 0 or (len(varying) and int(varying[0]) == 0):  # no constant token to keep as context
            bos = document_start(tokenizer)
            if bos is None:
                raise Af1Error(
                    "the first token varies across problems and the tokenizer has no BOS to prepend: "
                    "give a constant prefix (--shots 1 or more, or --style with an instruction such as calculate)"
                )
    if bos is not None:
        input_ids = torch.cat([torch.full((len(input_ids), 1), bos[0], dtype=torch.long), input_ids], 1)
    roles = (("bos",) if bos is not None else ()) + prompt_roles
    if like is not None:
        context_len = like.context_len
        # rows of a file need not share the evaluated sample's longer constant prefix: those that do not are not
        # in its distribution (built-in tasks always share it: an operand is never context)
        same = (input_ids[:, :context_len] == like.input_ids_PT[:1, :context_len]).all(1)
        if not bool(same.any()):
            raise Af1Error("no problem of the task distribution shares the evaluated problems' constant prefix")
        if not bool(same.all()):
            kept = same.nonzero().flatten().tolist()
            excluded = len(problems) - len(kept)
            problems, answers = [problems[i] for i in kept], [answers[i] for i in kept]
            stops = [stops[i] for i in kept] if stops else []
            input_ids = input_ids[same]
    else:
        varying = (input_ids != input_ids[:1]).any(0).nonzero().flatten()
        first_varying = int(varying[0]) if len(varying) else input_ids.shape[1] - 1
        first_varying = min(first_varying, first_operand + (1 if bos is not None else 0))
        context_len = max(1, min(first_varying, input_ids.shape[1] - 1))
    layout = tuple("context" if t < context_len else r for t, r in enumerate(roles))
    return Task(
        spec,
        problems,
        input_ids,
        answers,
        context_len,
        layout,
        prompt_roles,
        examples,
        excluded_other_layouts=excluded,
        bos=bos,
        stop_tokens=stops,
    )


def file_pool(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, every other problem in a seeded order) of a task file."""
    from af1.taskfile import load_items, split_shots

    assert spec.file is not None
    described, items = load_items(spec.file)
    shots, rest, prefix = split_shots(described, items, spec.shots, spec.seed)

    def problem(item: Any, text: str) -> Problem:
        values = tuple(v for _, v in item.slots) or ((item.group,) if item.group is not None else ())
        return Problem(values, item.answer, item.prompt, text, item.answer, item.spans)

    return [problem(e, "") for e in shots], [problem(i, prefix + i.prompt) for i in rest]


def build_task(spec: TaskSpec, tokenizer: Any) -> Task:
    """Enumerate, tokenize and check the problems of a spec (or read them from its task file)."""
    examples, pool = problem_pool(spec) if spec.file is None else file_pool(spec)
    task = tokenize_task(spec, examples, sample_problems(spec, pool), tokenizer)
    task.n_distinct = len(pool)
    return task


def _identity(spec: TaskSpec, problem: Problem) -> Any:
    """What makes two problems the same: the operands (not the prompt, which may have lost its trailing space), or
    for a task file the prompt without that space (a file's rows need not have slots)."""
    return problem.operands if spec.file is None else problem.prompt.rstrip(" ")


def means_sample_size(evaluated: Task) -> int:
    """How many problems the CAMA means need: every (position, token) that at least MEANS_COMMON of the evaluated
    problems hold at a varying position of their prompt or answer is expected MEANS_MIN_COUNT times in a uniform
    sample of this size (clamped to [MEANS_SAMPLE_MIN, MEANS_SAMPLE_MAX])."""
    shares = []
    for group in evaluated.groups or [evaluated]:
        P = len(evaluated)
        columns = [group.input_ids_PT[:, t].tolist() for t in range(group.context_len, group.n_positions)]
        depth = max((len(a) for a in group.answer_tokens), default=0)
        columns += [[a[k] for a in group.answer_tokens if len(a) > k] for k in range(depth)]
        for column in columns:
            shares += [n / P for n in Counter(column).values() if n / P >= MEANS_COMMON]
    if not shares:
        return MEANS_SAMPLE_MAX
    return max(MEANS_SAMPLE_MIN, min(MEANS_SAMPLE_MAX, math.ceil(MEANS_MIN_COUNT / min(shares))))


def distribution_task(spec: TaskSpec, tokenizer: Any, evaluated: Task) -> Task:
    """The problems CAMA averages over: a seeded sample of `means_sample_size` problems disjoint from the evaluated
    ones, topped up with MEANS_MIN_COUNT problems of each layout and answer step the sample missed (evaluated ones
    only where no other problem has it: each is left out of its own mean), or the whole distribution where it has
    no more than that many others; the evaluated task's layouts. Its cost follows the sample, not the grid."""
    examples, pool = problem_pool(spec) if spec.file is None else file_pool(spec)
    size = means_sample_size(evaluated)
    seen = {_identity(spec, p) for p in evaluated.problems}
    rest = [p for p in pool if _identity(spec, p) not in seen]
    if len(rest) <= size:
        task = tokenize_task(spec, examples, pool, tokenizer, like=evaluated)
        origin = "grid" if spec.file is None else "every row"
    else:
        order = random.Random(spec.seed + 1).sample(rest, len(rest))
        sample, others = order[:size], order[size:]
        inside = [p for p in pool if _identity(spec, p) in seen]
        sampled, have = _covered(spec, examples, sample, tokenizer, evaluated)
        extra = _missing_parts(spec, examples, sample, others + inside, tokenizer, evaluated, have)
        task = (
            sampled
            if sampled is not None and not extra
            else tokenize_task(spec, examples, sample + extra, tokenizer, like=evaluated)
        )
        used = {_identity(spec, p) for p in extra}
        origin = "sample" if any(_identity(spec, p) in used for p in inside) else "disjoint sample"
    for part in [task, *task.groups]:
        part.origin = origin
    return task


def _covered(
    spec: TaskSpec, examples: list[Problem], sample: list[Problem], tokenizer: Any, like: Task
) -> tuple[Task | None, set[Any]]:
    """The sample tokenized in `like`'s layouts and the (layout, answer step) keys it holds; None and nothing when it
    has no problem of some layout."""
    try:
        task = tokenize_task(spec, examples, sample, tokenizer, like=like)
    except Af1Error:  # a layout the sample has no problem of
        return None, set()
    return task, {part.part_key for part in task.steps()}


def _missing_parts(
    spec: TaskSpec,
    examples: list[Problem],
    sample: list[Problem],
    candidates: list[Problem],
    tokenizer: Any,
    like: Task,
    have: set[Any] | None = None,
) -> list[Problem]:
    """Up to MEANS_MIN_COUNT candidates (in their order) for each layout and answer step of `like` that the sample
    has no problem of (`have`: the sample's, when already known); tokenizing only, no forward."""
    wanted = {part.part_key for part in like.steps()}
    if have is None:
        have = _covered(spec, examples, sample, tokenizer, like)[1]
    if wanted <= have:
        return []
    pool = tokenize_task(spec, examples, candidates, tokenizer, like=like)
    by_identity = {_identity(spec, p): p for p in candidates}
    rows = sorted(
        {r for part in pool.steps() if part.part_key in wanted - have for r in part.where_P[:MEANS_MIN_COUNT].tolist()}
    )
    return [by_identity[_identity(spec, pool.problems[r])] for r in rows]


def example_prompt(operation: str, style: str) -> str | None:
    """One example prompt of an operation in a style, or None if the style does not apply."""
    op = OPERATIONS[operation]
    try:
        return format_prompt(op, style, tuple(range(3, 3 + op.n_operands)))
    except Af1Error:
        return None
