"""Named groups of a task's problems, by what a problem is, never how a model does on it: arithmetic `carry`, `carryN`
(digit N from the right carries), `borrow`, `borrowN` (a-b), `size`, `answer_length`; a task file's columns."""

from __future__ import annotations

from collections.abc import Callable

from af1.errors import Af1Error
from af1.tasks.builtin import OPERATIONS
from af1.tasks.problems import Problem
from af1.tasks.spec import TaskSpec

ARITHMETIC = ("carry", "borrow", "size", "answer_length")  # carry and borrow also per digit: carry1, borrow2, ...
Label = Callable[[Problem], str]


def digit(value: int, place: int) -> int:
    return abs(value) // 10**place % 10


def carries(operands: tuple[int, ...], places: int) -> list[bool]:
    """Whether each column of a sum (units first) carries into the next."""
    out, carry = [], 0
    for place in range(places):
        carry = (sum(digit(x, place) for x in operands) + carry) // 10
        out.append(carry > 0)
    return out


def borrows(a: int, b: int, places: int) -> list[bool]:
    """Whether each column of a - b (units first) borrows from the next."""
    out, borrow = [], 0
    for place in range(places):
        borrow = int(digit(a, place) - borrow < digit(b, place))
        out.append(bool(borrow))
    return out


def yes_no(name: str, flags: list[bool]) -> str:
    return name if any(flags) else f"no {name}"


def _arithmetic(spec: TaskSpec, by: str) -> Label:
    operators = OPERATIONS[spec.operation].operators
    places, middle = spec.digits, (spec.operand_range.start + spec.operand_range.stop) / 2
    column = by.removeprefix("carry").removeprefix("borrow")
    place = int(column) - 1 if column.isdigit() and 1 <= int(column) <= places else None
    if by.startswith("carry") and (place is not None or by == "carry") and column_kind(operators) == "carry":
        return lambda p: yes_no(
            "carry", carries(p.operands, places)[slice(place, None if place is None else place + 1)]
        )
    if by.startswith("borrow") and (place is not None or by == "borrow") and column_kind(operators) == "borrow":
        return lambda p: yes_no(  # a - b below zero is written as -(b - a): its columns borrow as b - a does
            "borrow",
            borrows(max(p.operands), min(p.operands), places)[slice(place, None if place is None else place + 1)],
        )
    if by == "size":
        return lambda p: ",".join("small" if x < middle else "large" for x in p.operands)
    if by == "answer_length":
        return lambda p: f"{len(str(p.answer))} characters"
    raise Af1Error(
        f"no grouping {by!r} for {spec.operation} with {places} digits: choose from {', '.join(names(spec, []))}"
    )


def names(spec: TaskSpec, problems: list[Problem]) -> list[str]:
    """The groupings a task has: a task file's columns (those of its first problem), else every arithmetic one
    that applies to its operation."""
    if spec.file is not None:
        return [name for name, _ in problems[0].labels] if problems else []
    kind = column_kind(OPERATIONS[spec.operation].operators)
    columns = [f"{kind}{i}" for i in range(1, spec.digits + 1)] if kind else []
    return [n for n in ARITHMETIC if n not in ("carry", "borrow") or n == kind] + columns


def column_kind(operators: tuple[str, ...]) -> str | None:
    """What a column of the operation does: carry (sums alone), borrow (one subtraction), else neither."""
    return "carry" if set(operators) == {"+"} else "borrow" if operators == ("-",) else None


def labeler(spec: TaskSpec, by: str) -> Label:
    """Each problem's group under the grouping `by`; a one-line error where the task has no such grouping."""
    if spec.file is None:
        return _arithmetic(spec, by)

    def column(p: Problem) -> str:
        values = dict(p.labels)
        if by not in values:
            raise Af1Error(f"the task file has no column {by!r}: its columns are {', '.join(values) or 'none'}")
        return values[by]

    return column


def labels(spec: TaskSpec, problems: list[Problem], by: str) -> list[str]:
    """The group of each problem under the grouping `by`."""
    label = labeler(spec, by)
    return [label(p) for p in problems]


def described(spec: TaskSpec, problems: list[Problem]) -> list[list[str]]:
    """Per problem, its group under every grouping the task has ("carry=no carry", ...): what a problem is, for a
    description of groups found otherwise."""
    every = [[f"{by}={x}" for x in labels(spec, problems, by)] for by in names(spec, problems)]
    return [list(row) for row in zip(*every, strict=True)] if every else [[] for _ in problems]
