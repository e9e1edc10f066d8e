"""Tasks from a file: any prompt with a short answer, as rows (JSONL or CSV) or as a template with named slots.
A task file (YAML or TOML) is validated strictly: unknown keys are refused, and every problem is one line of error."""

from __future__ import annotations

import ast
import csv
import functools
import hashlib
import io
import itertools
import json
import operator
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from af1.config_files import read_mapping
from af1.errors import Af1Error, in_one_line


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlotValues(_Strict):
    """A slot's values: inline, or one per line of a text file (relative to the task file)."""

    values: list[str] | None = None
    file: str | None = None


class Answer(_Strict):
    """A template row's answer: a lookup table keyed by the slot's value ("|"-joined for several slots), an arithmetic
    expression over integer slots such as "a + b", or one slot's value (a copy task: "{x} {y} {z} {x} {y}" → z)."""

    table: dict[str, str] | None = None
    expr: str | None = None
    slot: str | None = None
    prefix: str = ""  # put before every answer, e.g. " " when the prompt ends before the answer's space

    @model_validator(mode="after")
    def _one(self) -> Answer:
        if sum(x is not None for x in (self.table, self.expr, self.slot)) != 1:
            raise ValueError("answer needs exactly one of table, expr or slot")
        return self


class CounterfactualSlot(_Strict):
    """The slot the heads study's counterfactual changes: to another of its values of the same token length, or to
    `null_value` (a value that means nothing for the task)."""

    slot: str
    null_value: str | None = None


class TaskFile(_Strict):
    name: str | None = None
    rows: str | None = None  # JSONL or CSV with prompt and answer columns (optionally group)
    template: str | None = None
    slots: dict[str, SlotValues] = {}
    answer: Answer | None = None
    prefix: str = ""  # a constant text before the shots and every prompt
    shots: int | None = None  # few-shot examples drawn from the other rows (seeded)
    separator: str = "\n"  # after each shot's answer: with shots, full scoring checks that the model stops there
    scoring: Literal["full", "first"] | None = None
    check_end: bool | None = None  # false: full scoring does not check the end (the separator) after the answer
    counterfactual: CounterfactualSlot | None = None
    distinct: bool = False  # the slots of a problem take pairwise different values (no "cat cat cat")

    @model_validator(mode="after")
    def _form(self) -> TaskFile:
        if (self.rows is None) == (self.template is None):
            raise ValueError("a task file has either rows or a template (with slots and an answer)")
        names = [n for _, n, _, _ in string.Formatter().parse(self.template or "") if n]
        if self.template is not None:
            if not names:
                raise ValueError("the template has no {slot}")
            missing = [n for n in names if n not in self.slots]
            if missing:
                raise ValueError(f"the template's slot '{missing[0]}' has no values")
            if self.answer is None:
                raise ValueError("a template task needs an answer (table, expr or slot)")
            if self.answer.slot is not None and self.answer.slot not in names:
                raise ValueError(f"the answer slot '{self.answer.slot}' is not a slot of the template")
        if self.rows is not None and (self.answer is not None or self.slots or self.distinct):
            raise ValueError("a rows file gives each prompt and answer: answer, slots and distinct are for templates")
        if self.counterfactual is not None and self.counterfactual.slot not in names:
            raise ValueError(f"the counterfactual slot '{self.counterfactual.slot}' is not a slot of the template")
        if self.shots is not None and self.shots < 0:
            raise ValueError("shots must be >= 0")
        return self


@dataclass(frozen=True)
class Item:
    """One problem of a file: its prompt, answer, group, and the slot values and their character spans."""

    prompt: str
    answer: str
    group: str | None = None
    slots: tuple[tuple[str, str], ...] = ()
    spans: tuple[tuple[str, int, int], ...] = ()


ROWS_DEFAULTS: dict[str, Any] = {"shots": 3, "scoring": "full"}  # a rows file given as the task file itself


def read_task_file(path: str | Path) -> TaskFile:
    """Parse and validate a task file (a bad one is one line); a .jsonl or .csv of prompt/answer rows is one by itself
    (3 examples from the other rows, full scoring). Cached per process while the file is unchanged (frozen value)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return _read_task_file(path)  # the error says what is wrong with it
    return _read_once(str(path), str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_once(path: str, resolved: str, size: int, mtime_ns: int) -> TaskFile:
    """`_read_task_file` keyed by the file's path (as given, for its messages, and resolved), size and modification
    time: a changed file is read again."""
    return _read_task_file(Path(path))


def _read_task_file(path: Path) -> TaskFile:
    if path.suffix in (".jsonl", ".csv"):
        if not path.is_file():
            raise Af1Error(f"no such task file: {path}")
        return TaskFile(rows=path.name, name=path.stem, **ROWS_DEFAULTS)
    if path.suffix not in (".yaml", ".yml", ".toml"):
        raise Af1Error(f"task file {path}: expected a .yaml, .yml or .toml description, or .jsonl or .csv rows")
    data = read_mapping(path, "task file")
    try:
        return TaskFile.model_validate(data)
    except ValidationError as exc:
        raise Af1Error(f"task file {path}: {in_one_line(exc)}") from None


def file_digest(path: str | Path, task: TaskFile) -> str:
    """sha256 of a task file (`task`, as read) and every file it reads: a changed file is another task."""
    path = Path(path)
    h = hashlib.sha256(path.read_bytes())
    for name in sorted(_read_files(task)):
        target = path.parent / name
        if target.is_file():
            h.update(target.read_bytes())
    return h.hexdigest()


def _read_files(task: TaskFile) -> list[str]:
    return [f for f in [task.rows, *(s.file for s in task.slots.values())] if f]


def load_items(path: str | Path) -> tuple[TaskFile, list[Item]]:
    """The file's validated description and its problems, in file order; duplicates with one answer are kept
    once, a prompt with two answers is an error."""
    path = Path(path)
    task = read_task_file(path)
    items = _rows(path, task) if task.rows is not None else _template_items(path, task)
    if not items:
        raise Af1Error(f"task file {path}: it has no problems")
    seen: dict[str, str] = {}
    unique = []
    for item in items:
        if item.prompt in seen:
            if seen[item.prompt] != item.answer:
                raise Af1Error(
                    f"task file {path}: the prompt {item.prompt!r} has two answers "
                    f"({seen[item.prompt]!r} and {item.answer!r})"
                )
            continue
        seen[item.prompt] = item.answer
        unique.append(item)
    return task, unique


def _rows(path: Path, task: TaskFile) -> list[Item]:
    assert task.rows is not None
    rows_path = path.parent / task.rows
    if not rows_path.is_file():
        raise Af1Error(f"task file {path}: its rows file {rows_path} does not exist")
    records: list[dict[str, Any]] = []
    text = _text(rows_path)
    if rows_path.suffix == ".jsonl":
        for n, line in enumerate(text.split("\n"), 1):  # JSON strings may hold U+2028 etc., never a raw newline
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise Af1Error(f"{rows_path}: line {n} is not JSON") from None
                if not isinstance(record, dict):
                    raise Af1Error(f"{rows_path}: line {n} is not a JSON object")
                records.append(record)
    elif rows_path.suffix == ".csv":
        try:  # quoted fields may hold newlines (a multi-line prompt)
            records = list(csv.DictReader(io.StringIO(text, newline="")))
        except csv.Error as exc:
            raise Af1Error(f"{rows_path}: not valid CSV ({exc})") from None
    else:
        raise Af1Error(f"{rows_path}: rows are read from .jsonl or .csv files")
    if not records:
        raise Af1Error(f"{rows_path}: the rows file is empty")
    items = []
    for n, record in enumerate(records, 1):
        for column in ("prompt", "answer"):
            if not isinstance(record.get(column), str) or record[column] == "":
                raise Af1Error(f"{rows_path}: row {n} has no '{column}' column (rows need prompt and answer)")
        group = record.get("group")
        items.append(Item(record["prompt"], record["answer"], None if group in (None, "") else str(group)))
    return items


def _text(path: Path) -> str:
    """A rows or values file as UTF-8 text (whatever the machine's locale); another encoding is one line."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise Af1Error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def slot_values(path: str | Path, task: TaskFile, name: str) -> list[str]:
    """Every value a template's slot takes, as the task file at `path` gives them (inline, then its values file)."""
    path, slot = Path(path), task.slots[name]
    values = list(slot.values or [])
    if slot.file is not None:
        source = path.parent / slot.file
        if not source.is_file():
            raise Af1Error(f"task file {path}: the values file {source} of slot '{name}' does not exist")
        values += [line.rstrip("\n") for line in _text(source).splitlines() if line.strip()]
    if not values:
        raise Af1Error(f"task file {path}: the slot '{name}' has no values")
    return values


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate_expr(expr: str, values: dict[str, int]) -> int:
    """An arithmetic expression over integer slots (+ - * // % and parentheses), without running Python."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        raise ValueError(f"'{ast.unparse(node)}' is not an integer slot, an integer or + - * // %")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"'{expr}' is not an expression") from None
    return walk(tree)


def _template_items(path: Path, task: TaskFile) -> list[Item]:
    assert task.template is not None and task.answer is not None
    parts = list(string.Formatter().parse(task.template))
    names = list(dict.fromkeys(n for _, n, _, _ in parts if n))
    values = {n: slot_values(path, task, n) for n in names}
    items = []
    for combo in itertools.product(*(values[n] for n in names)):
        if task.distinct and len(set(combo)) < len(combo):
            continue  # a repeated value is not a problem of a task whose slots differ
        chosen = dict(zip(names, combo, strict=True))
        prompt, spans = "", []
        for literal, name, _, _ in parts:
            prompt += literal
            if name:
                spans.append((name, len(prompt), len(prompt) + len(chosen[name])))
                prompt += chosen[name]
        answer = answer_of(path, task.answer, names, chosen)
        if answer is None:
            continue  # a combination the table does not answer is not a problem of the task
        items.append(Item(prompt, task.answer.prefix + answer, None, tuple(chosen.items()), tuple(spans)))
    return items


def answer_of(path: str | Path, answer: Answer, names: list[str], chosen: dict[str, str]) -> str | None:
    """A template row's answer for these slot values (without its prefix); None where a table does not answer it."""
    if answer.table is not None:
        return answer.table.get("|".join(chosen[n] for n in names))
    if answer.slot is not None:
        return chosen[answer.slot]
    assert answer.expr is not None
    try:
        integers = {n: int(v) for n, v in chosen.items() if re.fullmatch(r"-?\d+", v.strip())}  # others: words
        return str(evaluate_expr(answer.expr, integers))
    except ValueError as exc:
        raise Af1Error(f"task file {path}: answer expr: {exc}") from None
    except ZeroDivisionError:
        raise Af1Error(f"task file {path}: answer expr divides by zero for {chosen}") from None


def split_shots(task: TaskFile, items: list[Item], shots: int, seed: int) -> tuple[list[Item], list[Item], str]:
    """(shots, problems, the constant text before each prompt): `shots` rows drawn (seeded) as examples, the rest
    in a seeded order."""
    if shots >= len(items):
        raise Af1Error(f"shots {shots} leaves no problems: the task file has {len(items)} rows")
    order = list(items)
    random.Random(seed).shuffle(order)
    examples, rest = order[:shots], order[shots:]
    prefix = task.prefix + "".join(f"{e.prompt}{e.answer}{task.separator}" for e in examples)
    return examples, rest, prefix
