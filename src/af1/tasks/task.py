"""Tokenized tasks: prompts and answers as token ids, grouped by token layout, with each group's constant context.
Context is only what is constant (a document-start token is prepended where the first token varies)."""

from __future__ import annotations

import dataclasses
import itertools
import string
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.tasks.builtin import NAMES, OPERATIONS, SEPARATOR, Operation, prompt_template
from af1.tasks.files import read_task_file
from af1.tasks.problems import Problem, file_pool, problem_pool, sample_problems
from af1.tasks.spec import DEFAULT_N, TaskSpec


class Tokenizer(Protocol):
    """What the task layer reads of a tokenizer (a Hugging Face one, or a test's stand-in): a text's ids and, when
    asked, each token's character span. `document_start` reads its special tokens where it has them."""

    def __call__(self, text: str, /, *, return_offsets_mapping: bool = ...) -> Mapping[str, Any]: ...


@with_config(ConfigDict(extra="forbid"))
class ProblemRow(TypedDict):
    """One problem as it was fed (`Task.rows`): enough to rerun exactly that input; the keys below `layout` are
    filled in by what scored it (the unmodified model, then an intervention)."""

    prompt: str
    input: str
    input_ids: list[int]
    answer: int | str
    answer_text: str
    answer_tokens: list[int]
    stop_token: int | None
    layout: NotRequired[int]  # a task of several token layouts: this problem's
    predicted_tokens: NotRequired[list[int]]
    predicted_text: NotRequired[str]  # the same tokens decoded, for reading
    p_correct: NotRequired[float]
    solved: NotRequired[bool]
    right_under_intervention: NotRequired[bool | None]
    predicted_tokens_under_intervention: NotRequired[list[int] | None]
    predicted_text_under_intervention: NotRequired[str | None]


@with_config(ConfigDict(extra="forbid"))
class BosToken(TypedDict):
    """The document-start token put before every prompt of a task whose first token varies."""

    id: int
    text: str


@with_config(ConfigDict(extra="forbid"))
class AnswerEnd(TypedDict):
    """Whether full scoring checks that the model stops after the answer, with which token (id -> text), or why
    not."""

    checked: bool
    separator: str | None
    stop_tokens: dict[str, str | None] | None  # token id (as JSON writes it) -> its text
    note: str | None


@with_config(ConfigDict(extra="forbid"))
class LayoutRow(TypedDict):
    """One token layout of a task: its size, shape (roles of its tokens) and an example input."""

    layout: int
    n: int
    n_positions: int
    context_len: int
    roles: str
    example_input: str | None
    n_solved: NotRequired[int]


class TaskShape(TypedDict):
    """A built task described (`Task.describe`): spec, layouts, problem and position counts (None for several layouts),
    position roles, BOS, answer lengths (by token count) and the end check."""

    spec: dict[str, Any]  # the TaskSpec as provenance gives it (`TaskSpec.described`)
    layouts: list[LayoutRow]
    scoring: str
    n_problems: int
    n_positions: int | None
    context_len: int | None
    layout: list[str]
    bos_prepended: BosToken | None
    example_input: str | None
    answer_lengths: dict[int, int]
    end: AnswerEnd | None
    excluded_other_layouts: int
    n_distinct: int | None


@dataclass
class Task:
    """Tokenized problems of one token layout, scored in steps: step k reads the prompt and k answer tokens, predicts
    token k (with `stop_tokens`, the end after the last); first-token scoring: step 0 only; `steps()`: each a task."""

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
    end: AnswerEnd | None = None  # whether the end is checked, with which token, or why not (None: not built)

    @property
    def sampling_note(self) -> str | None:
        """Says that a task was sampled to DEFAULT_N because no --n was given; None otherwise."""
        spec = self.spec
        if spec.n is not None or spec.n_max is not None or self.n_distinct is None or self.n_distinct <= DEFAULT_N:
            return None
        return (
            f"{spec.name} has {self.n_distinct} distinct problems; a seeded sample of {DEFAULT_N} is used "
            f"(seed {spec.seed}; n sets another size)"
        )

    @property
    def exclusion_note(self) -> str | None:
        """Says how many problems were left out for their token layout, and why; None when none were."""
        n = self.excluded_other_layouts
        if not n:
            return None
        if self.spec.largest_layout:
            return f"{n} problems left out: largest_layout keeps only the largest token layout"
        return f"{n} problems left out: their token layout is shared by fewer than {MIN_LAYOUT} problems"

    def encode(self, text: str, tokenizer: Tokenizer) -> list[int]:
        """A text's token ids as this task feeds its prompts: the document-start token it prepends (if any), then
        the tokenizer's ids. Counterfactual prompts are encoded here, so that they match the task's own."""
        return ([self.bos[0]] if self.bos is not None else []) + list(tokenizer(text)["input_ids"])

    @property
    def bos_prepended(self) -> BosToken | None:
        """The document-start token put before every prompt, if any (its id and text)."""
        return None if self.bos is None else BosToken(id=self.bos[0], text=self.bos[1])

    @property
    def end_note(self) -> str | None:
        """Says that full scoring does not check where the answer ends, and why; None when it does (or scores the
        first token only)."""
        if self.spec.scoring == "first" or self.end is None or self.end["checked"]:
            return None
        return f'the end of the answer is not checked ({self.end["note"]}): "14" would count for "1"'

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

    def rows(self) -> list[ProblemRow]:
        """Each problem as it was fed: enough to rerun exactly that input (and its layout group, when several)."""
        if self.groups:
            out: dict[int, ProblemRow] = {}  # the groups cover every row once
            for group in self.groups:
                for r, row in zip(group.where_P.tolist(), dataclasses.replace(group, groups=[]).rows(), strict=True):
                    out[r] = {**row, "layout": group.layout_id}
            return [out[r] for r in range(len(self))]
        return [
            ProblemRow(
                prompt=p.prompt,
                input=self.input_text(i),
                input_ids=self.input_ids_PT[i].tolist(),
                answer=p.answer,
                answer_text=p.answer_text,
                answer_tokens=list(self.answer_tokens[i]),
                stop_token=self.stop_tokens[i] if self.stop_tokens else None,
            )
            for i, p in enumerate(self.problems)
        ]

    def layouts(self) -> list[LayoutRow]:
        """Each token layout's size and shape, with an example input; one entry for a task of one layout."""
        return [
            LayoutRow(
                layout=group.layout_id,
                n=len(group),
                n_positions=group.n_positions,
                context_len=group.context_len,
                roles=compact_roles(group.layout),
                example_input=group.input_text(0) if len(group) else None,
            )
            for group in self.groups or [self]
        ]

    def describe(self) -> TaskShape:
        """The task as built: its spec, token layouts, sizes, BOS, answer lengths and end check."""
        return TaskShape(
            spec=self.spec.described(),
            layouts=self.layouts(),
            scoring=self.spec.scoring,
            n_problems=len(self),
            n_positions=None if self.groups else self.n_positions,  # several layouts: see `layouts`
            context_len=None if self.groups else self.context_len,
            layout=list(self.layout),
            bos_prepended=self.bos_prepended,
            example_input=self.input_text(0) if self.problems else None,
            answer_lengths=dict(sorted(Counter(len(a) for a in self.answer_tokens).items())),
            end=self.end,
            excluded_other_layouts=self.excluded_other_layouts,
            n_distinct=self.n_distinct,
        )


def _roles(
    tokenizer: Tokenizer, problem: Problem, operation: Operation | None, style: str
) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of a prompt and the role of each token (which operand or slot it spells, or const)."""
    enc = tokenizer(problem.text, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    start = len(problem.text) - len(problem.prompt)
    spans: list[tuple[str, int, int]] = [(name, start + a, start + b) for name, a, b in problem.spans]
    rendered = ""  # the template rendered so far: where each operand lands in the prompt
    for literal, name, _, _ in string.Formatter().parse(prompt_template(operation, style) if operation else ""):
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


def answer_tokens(tokenizer: Tokenizer, text: str, answer: str, prompt_ids: list[int]) -> tuple[int, ...] | None:
    """Every token the tokenizer emits for `answer` right after `text`, or None if prompt and answer merge."""
    full = tokenizer(text + answer)["input_ids"]
    if full[: len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        return None
    return tuple(int(t) for t in full[len(prompt_ids) :])


def answer_end(spec: TaskSpec) -> str | None:
    """What follows an answer in the task's worked examples (their separator); None when it shows none (no shots, or
    a task file's empty separator): then nothing says where an answer ends."""
    if spec.shots == 0:
        return None
    if spec.file is None:
        return SEPARATOR

    return read_task_file(spec.file).separator or None


def end_tokens(
    spec: TaskSpec,
    problems: list[Problem],
    prompt_ids: list[list[int]],
    answers: list[tuple[int, ...]],
    tokenizer: Tokenizer,
) -> tuple[list[int], AnswerEnd]:
    """Each problem's token after its answer in a worked example (empty when the end is not checked), and whether
    full scoring checks the end, with which token, or why not."""
    separator = answer_end(spec)
    end = AnswerEnd(checked=False, separator=separator, stop_tokens=None, note=None)
    if spec.scoring == "first":
        return [], {**end, "note": "first-token scoring"}
    if not spec.check_end:
        return [], {**end, "note": "turned off: check_end is false"}
    if separator is None:
        return [], {
            **end,
            "note": "no worked example shows what follows an answer (no shots, or an empty separator)",
        }
    stops = []
    for p, ids, a in zip(problems, prompt_ids, answers, strict=True):
        after = answer_tokens(tokenizer, p.text + p.answer_text, separator, [*ids, *a])  # None: merges with the answer
        if after is None:
            note = f"the separator {separator!r} merges with the answer's tokens (e.g. after {p.answer_text!r})"
            return [], {**end, "note": note}
        stops.append(after[0])
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
    spec: TaskSpec, problems: list[Problem], tokenizer: Tokenizer
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
    spec: TaskSpec,
    examples: list[Problem],
    problems: list[Problem],
    tokenizer: Tokenizer,
    like: Task | None = None,
) -> Task:
    """Tokenize and check problems: unambiguous answers, grouped by token layout, each group's constant context. With
    `like`, take that task's layouts, contexts and BOS (a means distribution), leaving out other layouts."""
    problems, encoded, answers, moved = _encode(spec, problems, tokenizer)
    bad = [p for p, a in zip(problems, answers, strict=True) if a is None]
    if bad:
        raise Af1Error(
            "the tokenizer merges the end of the prompt with the answer "
            f"(e.g. {bad[0].text!r} + {bad[0].answer_text!r}): the answer's tokens are ambiguous"
        )
    if like is not None and not (like.end and like.end["checked"]):
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
            [encoded[i] for i in rows],
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
    encoded: list[tuple[list[int], tuple[str, ...]]],
    answers: list[tuple[int, ...]],
    stops: list[int],
    tokenizer: Tokenizer,
    like: Task | None,
) -> Task:
    """Problems of one token layout (`encoded`: each one's ids and the layout's roles): the constant context and,
    when the first token varies, a prepended BOS."""
    input_ids = torch.tensor([ids for ids, _ in encoded], dtype=torch.long)
    prompt_roles = encoded[0][1]
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
                    "give a constant prefix (shots 1 or more, or a style with an instruction such as calculate)"
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


def layouts_summary(task: Task) -> str | None:
    """What a task of several token layouts costs, said before any work: the layouts' sizes, what is left out, and
    the remedy; None for a task of one layout with nothing left out."""
    sizes = [len(g) for g in task.groups] or [len(task)]
    left_out = task.excluded_other_layouts
    if len(sizes) == 1 and not left_out:
        return None
    text = f"{task.spec.name} has {len(sizes)} token layout{'s' * (len(sizes) > 1)} of {', '.join(map(str, sizes))}"
    text += " problems" + (f", {left_out} more left out ({task.exclusion_note})" if left_out else "")
    if len(sizes) > 1:
        text += (
            f": each layout is run and averaged on its own, so the work is about {len(sizes)} times one layout's "
            "and each mean covers its layout's problems only"
        )
    return text + "; numbers of one length (digits) or largest_layout keep a single layout"


def build_task(spec: TaskSpec, tokenizer: Tokenizer) -> Task:
    """Enumerate, tokenize and check the problems of a spec (or read them from its task file)."""
    examples, pool = problem_pool(spec) if spec.file is None else file_pool(spec)
    task = tokenize_task(spec, examples, sample_problems(spec, pool), tokenizer)
    task.n_distinct = len(pool)
    return task
