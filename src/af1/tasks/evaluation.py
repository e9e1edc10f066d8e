"""Scoring: does the model's greedy prediction give the whole answer (or its first token)?
Right when every step (`Task.steps`) is, p(answer) being their product; with the end checked, "14" is not "1"."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.models.forward import forward_last, forward_tail
from af1.progress import progress, return_freed_memory
from af1.results import Part
from af1.stats import LayoutRate, Rate, rate
from af1.tasks.task import ProblemRow, Task, build_task

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from af1.tasks.spec import TaskSpec
    from af1.tasks.task import Tokenizer

R = TypeVar("R")  # what `per_step` makes of each batch's logits
TRIM_EVERY = 4  # batches between giving freed heap pages back (after every batch it cost 9 % of SmolLM2's evaluation)


@with_config(ConfigDict(extra="forbid"))
class ExecutorChoice(TypedDict):
    """Which executor measured scores under an intervention and, when not the fastest, why the faster could not."""

    executor: str
    fallback_reason: str | None


@dataclass
class Scores:
    """Per-problem outcome of one (possibly intervened) evaluation over every scoring step."""

    predicted_PA: list[list[int]]  # greedy token at each step (teacher forced; the last one the end, where checked)
    p_correct_P: (
        torch.Tensor
    )  # probability of the whole answer and its end (of its first token for first-token scoring)
    correct_P: torch.Tensor  # bool: every step right
    executor: ExecutorChoice | None = None  # under an intervention: which executor ran it and, on a fallback, why
    # log-probability of the whole answer (summed over steps), float64 from the logits: it keeps ranking where
    # p_correct rounds to 1.0 in float32 (large margins); None when only greedy tokens were computed
    log_p_correct_P: torch.Tensor | None = None

    @property
    def accuracy(self) -> float:
        return float(self.correct_P.float().mean()) if len(self.correct_P) else float("nan")

    @property
    def mean_p_correct(self) -> float:
        return float(self.p_correct_P.mean()) if len(self.p_correct_P) else float("nan")

    @property
    def mean_log_p_correct(self) -> float:
        """Mean over problems of the answer's log-probability; NaN without logits."""
        if self.log_p_correct_P is None or not len(self.log_p_correct_P):
            return float("nan")
        return float(self.log_p_correct_P.mean())

    def rate(self, task: Task) -> Rate:
        """Accuracy with its n, 95 % interval and constant-guess baseline; pooled over token layouts (one constant
        guess per layout, which the prompt shows), with each layout's own (`by_layout`)."""
        correct, targets = self.correct_P.tolist(), task.targets()
        pooled = rate(correct, targets, task.layout_P.tolist())
        if task.groups:
            pooled["by_layout"] = []
            for group in task.groups:
                rows = group.where_P.tolist()
                r = rate([correct[i] for i in rows], [targets[i] for i in rows])
                part = LayoutRate(
                    layout=group.layout_id, value=r["value"], n=r["n"], ci=r["ci"], baseline=r["baseline"]
                )
                pooled["by_layout"].append(part)
        return pooled

    def subset(self, index: list[int]) -> Scores:
        return Scores(
            [self.predicted_PA[i] for i in index],
            self.p_correct_P[index],
            self.correct_P[index],
            self.executor,
            None if self.log_p_correct_P is None else self.log_p_correct_P[index],
        )

    @classmethod
    def from_logits(cls, logits_PV: torch.Tensor, answer_ids_P: torch.Tensor) -> Scores:
        """One next-token prediction per problem, from logits [P, V] or from greedy tokens [P] (no probability:
        NaN)."""
        if logits_PV.ndim == 1:
            predicted = logits_PV.cpu()
            nan = torch.full((len(predicted),), float("nan"))
            return cls([[int(t)] for t in predicted], nan, predicted == answer_ids_P.cpu())
        logits_PV = logits_PV.float()
        predicted = logits_PV.argmax(-1).cpu()
        p = torch.softmax(logits_PV, -1).gather(-1, answer_ids_P[:, None].to(logits_PV.device))[:, 0]
        log_p = answer_log_prob(logits_PV, answer_ids_P.to(logits_PV.device)).cpu()
        return cls([[int(t)] for t in predicted], p.cpu(), predicted == answer_ids_P.cpu(), None, log_p)

    @classmethod
    def from_steps(cls, task: Task, step_logits: list[torch.Tensor]) -> Scores:
        """Combine the logits (or greedy tokens) of each step of `task.steps()` into per-problem scores."""
        steps = task.steps()
        return cls.combine(
            task, [cls.from_logits(x, step.answer_ids_P) for step, x in zip(steps, step_logits, strict=True)]
        )

    @classmethod
    def combine(cls, task: Task, step_scores: list[Scores]) -> Scores:
        """Per-problem scores from the scores of each step of `task.steps()`: right when every step is, the
        probabilities multiplied, the log-probabilities summed."""
        P = len(task)
        correct, p = torch.ones(P, dtype=torch.bool), torch.ones(P)
        log_p: torch.Tensor | None = torch.zeros(P, dtype=torch.float64)
        predicted: list[list[int]] = [[] for _ in range(P)]
        for step, s in zip(task.steps(), step_scores, strict=True):
            rows = step.rows_in_parent
            correct[rows] &= s.correct_P
            p[rows] *= s.p_correct_P
            log_p = None if log_p is None or s.log_p_correct_P is None else log_p.index_add(0, rows, s.log_p_correct_P)
            for r, tok in zip(rows.tolist(), s.predicted_PA, strict=True):
                predicted[r].extend(tok)
        return cls(predicted, p, correct, None, log_p)

    @classmethod
    def concat(cls, parts: list[Scores]) -> Scores:
        """Scores of consecutive batches of problems as one."""
        logs = [x.log_p_correct_P for x in parts]
        return cls(
            [row for x in parts for row in x.predicted_PA],
            torch.cat([x.p_correct_P for x in parts]),
            torch.cat([x.correct_P for x in parts]),
            None,
            None if any(x is None for x in logs) else torch.cat([x for x in logs if x is not None]),
        )


def answer_log_prob(logits_PV: torch.Tensor, answer_ids_P: torch.Tensor) -> torch.Tensor:
    """log p(answer) per row [P], float64, as -log(1 + sum of exp(z_other - z_answer)): tells margins apart up to about
    700 nats, where a float32 softmax rounds p to 1.0 / 0.0 past about 17."""
    out = []
    for rows in batches(len(logits_PV), 128):  # float64 rows of a large vocabulary: a few at a time
        z_BV, answer_B1 = logits_PV[rows].double(), answer_ids_P[rows, None]
        rivals_BV = (z_BV - z_BV.gather(-1, answer_B1)).scatter(-1, answer_B1, -float("inf"))
        out.append(-torch.nn.functional.softplus(torch.logsumexp(rivals_BV, -1)))
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


def batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(n, start + batch_size))


@torch.no_grad()
def last_logits(
    model: PreTrainedModel,
    input_ids_PT: torch.Tensor,
    batch_size: int = 64,
    desc: str | None = None,
    context_len: int = 0,
) -> torch.Tensor:
    """Next-token logits at the last position of every prompt, batched; a shared context runs once."""
    chunks = progress(list(batches(len(input_ids_PT), batch_size)), desc)
    out = [forward_last(model, input_ids_PT[sl], context_len) for sl in chunks]
    return torch.cat(out) if out else torch.empty(0)


def evaluate(model: PreTrainedModel, task: Task, batch_size: int = 64) -> Scores:
    """Score the unmodified model: greedy exact match of the whole answer (or its first token), teacher-forced in one
    forward per problem; batches are scored as they come, so memory holds one batch of logits."""
    steps = task.steps()
    scores: list[Scores | None] = [None] * len(steps)
    by_layout: dict[Any, list[int]] = {}
    for i, step in enumerate(steps):
        by_layout.setdefault(step.part_key[:-1], []).append(i)
    for order in by_layout.values():
        done = per_step(model, [steps[i] for i in order], batch_size, Scores.from_logits, Scores.concat, Scores.subset)
        for i, step_scores in zip(order, done, strict=True):
            scores[i] = step_scores
    assert all(x is not None for x in scores), "every answer step is some layout's"
    return Scores.combine(task, [x for x in scores if x is not None])


def all_step_logits(model: PreTrainedModel, steps: list[Task], batch_size: int = 64) -> list[torch.Tensor]:
    """Last-position logits [P_k, V] of consecutive answer steps 0, 1, ... of one token layout, each problem run once
    at its deepest step (`per_step`)."""
    return per_step(model, steps, batch_size, lambda logits_BV, _: logits_BV, torch.cat, lambda x, i: x[i])


@torch.no_grad()
def per_step(
    model: PreTrainedModel,
    steps: list[Task],
    batch_size: int,
    reduce: Callable[[torch.Tensor, torch.Tensor], R],
    join: Callable[[list[R]], R],
    take: Callable[[R, list[int]], R],
) -> list[R]:
    """`reduce(logits [B, V], answer ids [B])` per batch of answer steps 0, 1, ... of one layout, joined per step and
    put in rows' order by `take(value, rows)`; each problem runs once, at its deepest step."""
    rows = [s.rows_in_parent for s in steps]
    where = [{int(r): i for i, r in enumerate(r_k.tolist())} for r_k in rows]
    deepest = {r: k for k, w in enumerate(where) for r in w}
    parts: list[list[tuple[list[int], R]]] = [[] for _ in steps]
    jobs = []
    for d in sorted(set(deepest.values())):
        problems = [r for r, k in deepest.items() if k == d]
        jobs += [(d, problems[sl]) for sl in batches(len(problems), batch_size)]
    for j, (d, problems) in enumerate(progress(jobs, "evaluate")):
        ids = steps[d].input_ids_PT[[where[d][r] for r in problems]]
        tail_BKV = forward_tail(model, ids, steps[d].context_len, d + 1)
        for k in range(d + 1):
            index = [where[k][r] for r in problems]
            parts[k].append((index, reduce(tail_BKV[:, k], steps[k].answer_ids_P[index])))
        del tail_BKV
        if j % TRIM_EVERY == TRIM_EVERY - 1:  # else the RSS grows with n by the freed logits the heap keeps
            return_freed_memory()
    out = []
    for pieces in parts:
        order = [i for index, _ in pieces for i in index]
        out.append(take(join([piece for _, piece in pieces]), sorted(range(len(order)), key=order.__getitem__)))
    return out


@dataclass(frozen=True)
class Evaluated:
    """A task and the unmodified model's scores on it: computed once per model and task, read by every study."""

    task: Task
    base: Scores
    model_id: int  # id() of the model that was scored

    def check(self, model: PreTrainedModel, spec: TaskSpec) -> Evaluated:
        """Itself, when it is this model's evaluation of this spec; reusing another's would be a silent error."""
        if self.model_id != id(model) or self.task.spec != spec:
            raise ValueError("an evaluation of another model or task was passed for reuse")
        return self


def evaluated(model: PreTrainedModel, tokenizer: Tokenizer, spec: TaskSpec, done: Evaluated | None = None) -> Evaluated:
    """Build a spec's task and score the unmodified model on it; `done`, an evaluation already made of the
    same model and spec, is checked and returned instead."""
    if done is not None:
        return done.check(model, spec)
    task = build_task(spec, tokenizer)
    return Evaluated(task, evaluate(model, task), id(model))


def solved(task: Task, scores: Scores) -> Task:
    """The problems the model answers correctly: the set every AF1 measurement is taken on."""
    return task.subset(scores.correct_P.nonzero().flatten())


def require_solved(n_solved: int, spec: TaskSpec) -> None:
    """Interventions are measured on the solved problems: none solved is a one-line error."""
    if n_solved == 0:
        raise Af1Error(f"the model solves none of the {spec.name} problems ({spec.style_name}, {spec.shots} shots)")


def decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """A tokenizer's decoding of one token list, as text."""
    return lambda ids: str(tokenizer.decode(ids))


def problem_rows(task: Task, scores: Scores, decode: Callable[[list[int]], str] | None = None) -> list[ProblemRow]:
    """One row per problem as fed to the model (text and ids), with its greedy answer tokens (and, given the
    tokenizer's `decode`, their text) and whether it is right."""
    rows = task.rows()
    for row, predicted, p, right in zip(
        rows, scores.predicted_PA, scores.p_correct_P.tolist(), scores.correct_P.tolist(), strict=True
    ):
        row["predicted_tokens"], row["p_correct"], row["solved"] = predicted, p, bool(right)
        if decode is not None:
            row["predicted_text"] = decode(predicted)
    return rows


def inputs_sha256(rows: list[ProblemRow]) -> str:
    """A fingerprint of problem rows' exact inputs (token ids, answer tokens, end-of-answer token, in order): equal
    fingerprints mean the same inputs and targets."""
    fed = [[r["input_ids"], r["answer_tokens"], r.get("stop_token")] for r in rows]
    return hashlib.sha256(json.dumps(fed, separators=(",", ":")).encode()).hexdigest()


class TaskDescription(Part):
    """A model evaluated on a task: the model and task, and the base accuracy (a rate: its interval, n and constant
    guess, each layout's part for a task of several); every result about one model on one task carries these."""

    model: str | None = None
    task: str
    style: str
    shots: int
    scoring: str
    n: int
    n_solved: int
    base_accuracy: Rate


class ProblemInputs(BaseModel):
    """A result's exact inputs: every problem once as fed to the model (`problem_rows`), and each measured set as row
    indices, so any problem can be rerun from the JSON. A result's `inputs` is None only in old results."""

    sha256: str  # inputs_sha256 of `problems`
    problems: list[ProblemRow]
    sets: dict[str, list[int]]  # name -> indices into `problems`

    @classmethod
    def of(cls, task: Task, base: Scores, **sets: Task) -> ProblemInputs:
        """`task`'s rows with the unmodified model's `base` scores, and each named subset of it (`Task.subset`)."""
        rows = problem_rows(task, base)
        row_of = {p: i for i, p in enumerate(task.problems)}
        return cls(
            sha256=inputs_sha256(rows),
            problems=rows,
            sets={name: [row_of[p] for p in part.problems] for name, part in sets.items()},
        )


def recorded(
    model: PreTrainedModel, tokenizer: Tokenizer, spec: TaskSpec, rows: Sequence[Mapping[str, Any]]
) -> Evaluated | None:
    """An evaluation read back from its problem rows (`problem_rows`, as stored: perhaps by an older version)
    instead of run again; None when the rows are not exactly this spec's inputs (another tokenizer or version)."""
    task = build_task(spec, tokenizer)
    if len(rows) != len(task):
        return None
    inputs = [(r.get("input_ids"), r.get("answer_tokens"), r.get("stop_token")) for r in rows]
    if inputs != [(r["input_ids"], r["answer_tokens"], r["stop_token"]) for r in task.rows()]:
        return None
    if any(key not in r for r in rows for key in ("predicted_tokens", "p_correct", "solved")):
        return None  # rows of inputs only, or of an older version: evaluated again
    scores = Scores(
        [list(r["predicted_tokens"]) for r in rows],
        torch.tensor([float(r["p_correct"]) for r in rows]),
        torch.tensor([bool(r["solved"]) for r in rows]),
    )
    return Evaluated(task, scores, id(model))
