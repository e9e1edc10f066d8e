"""The distribution of a task: every distinct problem of a spec (built-in or from its file) in a seeded order,
the worked examples drawn first, and the evaluated sample taken from the rest."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from af1.errors import Af1Error
from af1.tasks.builtin import OPERATIONS, SEPARATOR, format_prompt, prompt_template
from af1.tasks.files import load_items, split_shots
from af1.tasks.spec import DEFAULT_N, TaskSpec

ENUMERATE_MAX = 1_000_000  # operand tuples beyond this are sampled (seeded, distinct), not enumerated
POOL_SAMPLE = 100_000  # how many then


@dataclass(frozen=True)
class Problem:
    operands: tuple[Any, ...]  # the operands, or a task file's slot values
    answer: int | str
    prompt: str  # the problem alone
    text: str  # few-shot prefix + prompt: what the model reads (after the prepended BOS, if any)
    answer_text: str  # what the tokenizer should emit after `text`
    spans: tuple[tuple[str, int, int], ...] = ()  # a task file's slots: (name, start, end) in the prompt
    labels: tuple[tuple[str, str], ...] = ()  # a task file's columns: each slot's value, a rows file's group


def problem_pool(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, every other distinct problem of the spec in a seeded order): the task distribution."""
    operation = OPERATIONS[spec.operation]
    prompt_template(operation, spec.style)  # style check before enumerating
    if spec.operation == "a*b" and spec.digits != 1:
        raise Af1Error("a*b uses single-digit factors: use digits 1")
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
        raise Af1Error(f"shots {spec.shots} leaves no problems: the task has {len(pool)} distinct problems")
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


def sample_problems(spec: TaskSpec, pool: list[Problem]) -> list[Problem]:
    """The first --n / n_max problems of the seeded pool; DEFAULT_N when neither is given."""
    rest = pool
    if spec.n is None and spec.n_max is None:
        rest = rest[:DEFAULT_N]
    if spec.n is not None:
        if spec.n > len(rest):
            raise Af1Error(
                f"n {spec.n} is larger than the {len(rest)} distinct problems of {spec.name} "
                + (f"(digits={spec.digits}, shots={spec.shots})" if spec.file is None else f"(shots={spec.shots})")
            )
        rest = rest[: spec.n]
    if spec.n_max is not None:
        rest = rest[: spec.n_max]
    return rest


def file_pool(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, every other problem in a seeded order) of a task file."""

    assert spec.file is not None
    described, items = load_items(spec.file)
    shots, rest, prefix = split_shots(described, items, spec.shots, spec.seed)

    def problem(item: Any, text: str) -> Problem:
        values = tuple(v for _, v in item.slots) or ((item.group,) if item.group is not None else ())
        labels = (*item.slots, *((("group", item.group),) if item.group is not None else ()))
        return Problem(values, item.answer, item.prompt, text, item.answer, item.spans, labels)

    return [problem(e, "") for e in shots], [problem(i, prefix + i.prompt) for i in rest]


def problem_identity(spec: TaskSpec, problem: Problem) -> Any:
    """What makes two problems the same: the operands (not the prompt, which may have lost its trailing space), or
    for a task file the prompt without that space (a file's rows need not have slots)."""
    return problem.operands if spec.file is None else problem.prompt.rstrip(" ")
