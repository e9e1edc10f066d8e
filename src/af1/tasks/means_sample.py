"""The problems CAMA averages over: a seeded sample sized by what the means need, disjoint from the evaluated
problems where possible, so that its cost follows the sample and not the grid."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import TYPE_CHECKING, Any

from af1.errors import Af1Error
from af1.tasks.problems import Problem, file_pool, problem_identity, problem_pool
from af1.tasks.spec import TaskSpec
from af1.tasks.task import Task, tokenize_task

if TYPE_CHECKING:
    from af1.tasks.task import Tokenizer

# The CAMA means' sample: disjoint from the evaluated problems where the distribution has enough others, sized so
# that every (position, token) held by at least MEANS_COMMON of the evaluated problems is expected MEANS_MIN_COUNT
# times, within [MEANS_SAMPLE_MIN, MEANS_SAMPLE_MAX]; else the whole distribution (each problem left out of its mean).
MEANS_MIN_COUNT = 10
MEANS_COMMON = 0.01
MEANS_SAMPLE_MIN = 200
MEANS_SAMPLE_MAX = 2_000


def means_sample_size(evaluated: Task) -> int:
    """How many problems the CAMA means need: each (position, token) held by MEANS_COMMON of the evaluated is expected
    MEANS_MIN_COUNT times in a uniform sample this size (clamped to [MEANS_SAMPLE_MIN, MEANS_SAMPLE_MAX])."""
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


def distribution_task(spec: TaskSpec, tokenizer: Tokenizer, evaluated: Task) -> Task:
    """The problems CAMA averages over, in `evaluated`'s layouts: a seeded `means_sample_size` sample disjoint from it,
    topped up to MEANS_MIN_COUNT per layout and step (evaluated ones if no other), or a small distribution whole."""
    examples, pool = problem_pool(spec) if spec.file is None else file_pool(spec)
    size = means_sample_size(evaluated)
    seen = {problem_identity(spec, p) for p in evaluated.problems}
    rest = [p for p in pool if problem_identity(spec, p) not in seen]
    if len(rest) <= size:
        task = tokenize_task(spec, examples, pool, tokenizer, like=evaluated)
        origin = "grid" if spec.file is None else "every row"
    else:
        order = random.Random(spec.seed + 1).sample(rest, len(rest))
        sample, others = order[:size], order[size:]
        inside = [p for p in pool if problem_identity(spec, p) in seen]
        sampled, have = _covered(spec, examples, sample, tokenizer, evaluated)
        extra = _missing_parts(spec, examples, sample, others + inside, tokenizer, evaluated, have)
        task = (
            sampled
            if sampled is not None and not extra
            else tokenize_task(spec, examples, sample + extra, tokenizer, like=evaluated)
        )
        used = {problem_identity(spec, p) for p in extra}
        origin = "sample" if any(problem_identity(spec, p) in used for p in inside) else "disjoint sample"
    for part in [task, *task.groups]:
        part.origin = origin
    return task


def _covered(
    spec: TaskSpec, examples: list[Problem], sample: list[Problem], tokenizer: Tokenizer, like: Task
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
    tokenizer: Tokenizer,
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
    by_identity = {problem_identity(spec, p): p for p in candidates}
    rows = sorted(
        {r for part in pool.steps() if part.part_key in wanted - have for r in part.where_P[:MEANS_MIN_COUNT].tolist()}
    )
    return [by_identity[problem_identity(spec, pool.problems[r])] for r in rows]
