"""Tasks: enumeration, few-shot prefix, answer tokens, layouts, context."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from af1 import Af1Error
from af1.tasks.builtin import OPERATIONS, STYLES, example_prompt
from af1.tasks.means_sample import (
    MEANS_COMMON,
    MEANS_MIN_COUNT,
    MEANS_SAMPLE_MAX,
    MEANS_SAMPLE_MIN,
    _missing_parts,
    distribution_task,
    means_sample_size,
)
from af1.tasks.problems import Problem, problem_pool, sample_problems
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task


def enumerate_problems(spec: TaskSpec) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples, problems): the distribution sampled as a task samples it."""
    examples, pool = problem_pool(spec)
    return examples, sample_problems(spec, pool)


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_answers_are_right_and_non_negative(op):
    _, problems = enumerate_problems(TaskSpec(operation=op, scoring="first"))
    assert problems
    for p in problems:
        assert p.answer == eval(p.prompt.rstrip("=").replace("=", ""))  # the prompt is the expression
        assert int(p.answer) >= 0
    assert len({len(str(p.answer)) for p in problems}) == 1  # first-token scoring: constant answer digit count
    _, every = enumerate_problems(TaskSpec(operation=op))  # full scoring keeps answers of every digit count
    assert len(every) >= len(problems) and {p.answer for p in every} >= {p.answer for p in problems}


def test_full_scoring_steps_are_teacher_forced(tokenizer):
    task = build_task(TaskSpec(operation="a+b", shots=2, check_end=False), tokenizer)
    assert task.spec.scoring == "full" and {len(a) for a in task.answer_tokens} == {1, 2}
    steps = task.steps()
    assert [s.step for s in steps] == [0, 1]
    assert len(steps[0]) == len(task) and len(steps[1]) == sum(int(p.answer) >= 10 for p in task.problems)
    assert steps[1].index_P is not None
    for row, i in enumerate(steps[1].index_P.tolist()):
        p = task.problems[i]
        # step 1 reads the prompt and the answer's first digit, and must predict the second
        assert steps[1].input_ids_PT[row].tolist() == tokenizer(p.text + str(p.answer)[0]).input_ids
        assert tokenizer.decode([int(steps[1].answer_ids_P[row])]) == str(p.answer)[1]
    assert steps[1].layout[-1] == "answer0" and steps[1].context_len == task.context_len
    assert task.targets()[0] == " ".join(map(str, task.answer_tokens[0]))
    first = build_task(TaskSpec(operation="a+b", shots=2, scoring="first"), tokenizer)
    assert len(first.steps()) == 1 and first.targets() == [str(int(t)) for t in first.answer_ids_P]
    assert first.end is not None and first.end["checked"] is False  # first-token scoring: not a full answer
    assert first.end_note is None


def test_full_scoring_checks_that_the_answer_ends(tokenizer):
    """With worked examples, the token after their answers ("\n") is one more step: the model must stop there."""
    task = build_task(TaskSpec(operation="a+b", shots=2), tokenizer)
    newline = tokenizer("\n").input_ids[0]
    assert task.end == {"checked": True, "separator": "\n", "stop_tokens": {str(newline): "\n"}, "note": None}
    assert task.stop_tokens == [newline] * len(task) and task.end_note is None
    assert {len(a) for a in task.answer_tokens} == {1, 2}  # the answer itself is unchanged
    steps = task.steps()
    assert [s.step for s in steps] == [0, 1, 2] and len(steps[1]) == len(task)
    assert steps[1].index_P is not None
    for row, i in enumerate(steps[1].index_P.tolist()):
        p = task.problems[i]
        assert steps[1].input_ids_PT[row].tolist() == tokenizer(p.text + str(p.answer)[0]).input_ids
        # a one-digit answer must end after its digit, a two-digit one go on with its second digit
        assert tokenizer.decode([int(steps[1].answer_ids_P[row])]) == (str(p.answer) + "\n")[1]
    assert len(steps[2]) == sum(int(p.answer) >= 10 for p in task.problems)
    assert (steps[2].answer_ids_P == newline).all() and steps[2].layout[-2:] == ("answer0", "answer1")
    assert task.targets()[0] == " ".join(map(str, (*task.answer_tokens[0], newline)))
    row = task.rows()[0]
    assert row["answer_tokens"] == list(task.answer_tokens[0]) and row["stop_token"] == newline
    sub = task.subset([0, 1])
    assert sub.stop_tokens == [newline] * 2 and sub.scored_tokens == [(*a, newline) for a in sub.answer_tokens]
    zero = build_task(TaskSpec(operation="a+b", style="calculate"), tokenizer)  # no shots: no separator shown
    assert zero.end is not None and zero.end["checked"] is False and "no worked example" in (zero.end["note"] or "")
    assert zero.n_steps() == 2 and zero.end_note is not None and "not checked" in zero.end_note


def test_varying_first_token_gets_a_bos_never_context(tokenizer):
    task = build_task(TaskSpec(operation="a+b", style="original", shots=0), tokenizer)
    assert task.bos == (tokenizer.bos_token_id, tokenizer.bos_token)
    assert (task.input_ids_PT[:, 0] == tokenizer.bos_token_id).all() and task.context_len == 1
    assert (task.input_ids_PT[:, 1] != task.input_ids_PT[0, 1]).any()  # the first operand is not context
    assert task.layout[:2] == ("context", "A") and task.rows()[0]["input"].startswith(tokenizer.bos_token)
    assert task.rows()[0]["input_ids"] == task.input_ids_PT[0].tolist()
    with_prefix = build_task(TaskSpec(operation="a+b", style="calculate", shots=0), tokenizer)
    assert with_prefix.bos is None and with_prefix.context_len > 1  # a constant instruction is context enough
    for t in (task, with_prefix):  # the one way a text becomes ids (counterfactuals use it): the prompts' own
        assert [t.encode(p.text, tokenizer) for p in t.problems] == t.input_ids_PT.tolist()


def test_no_bos_to_prepend_is_a_one_line_error():
    class NoSpecials(SpaceMergingTokenizer):
        bos_token_id = None

    with pytest.raises(Af1Error, match="shots 1 or more") as info:
        build_task(TaskSpec(operation="a+b"), NoSpecials())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("style", ["original", "verbal"])  # verbal ends in a space some tokenizers move
def test_means_distribution_is_a_disjoint_sample_sized_for_its_counts_or_the_grid(tokenizer, monkeypatch, style):
    import af1.tasks.means_sample as means_sample

    spec = TaskSpec(operation="a+b", digits=2, n=30, shots=1, style=style)
    task = build_task(spec, tokenizer)
    size = means_sample_size(task)
    assert MEANS_SAMPLE_MIN <= size <= MEANS_SAMPLE_MAX
    sample = distribution_task(spec, tokenizer, task)
    assert sample.origin == "disjoint sample" and len(sample) == size < 90 * 90 - 1
    assert not {p.operands for p in sample.problems} & {p.operands for p in task.problems}
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MIN", 9000)  # more than the grid holds besides the evaluated ones
    grid = distribution_task(spec, tokenizer, task)
    assert grid.origin == "grid" and len(grid) == 90 * 90 - 1 and grid.context_len == task.context_len
    assert {p.operands for p in task.problems} <= {p.operands for p in grid.problems}


def test_means_sample_missing_an_answer_step_is_topped_up_not_the_grid(tokenizer, monkeypatch):
    """A sample without some layout or answer step gets MEANS_MIN_COUNT problems of it, never the whole grid."""
    import af1.tasks.means_sample as means_sample

    spec = TaskSpec(operation="a+b", digits=2, n=40, shots=1)
    task = build_task(spec, tokenizer)
    assert max(len(a) for a in task.answer_tokens) == 3  # some sums have three digits: one more answer step
    examples, pool = problem_pool(spec)
    small = [p for p in pool if len(p.answer_text.strip()) < 3 and p not in task.problems][:5]
    large = [p for p in pool if len(p.answer_text.strip()) == 3 and p not in task.problems]
    extra = _missing_parts(spec, examples, small, large, tokenizer, task)
    assert len(extra) == MEANS_MIN_COUNT and all(len(p.answer_text.strip()) == 3 for p in extra)
    assert _missing_parts(spec, examples, small + extra, large, tokenizer, task) == []
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MIN", 1)
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MAX", 1)
    sample = distribution_task(spec, tokenizer, task)
    assert sample.origin == "disjoint sample" and len(sample) <= 1 + 4 * MEANS_MIN_COUNT
    assert {s.part_key for s in task.steps()} <= {s.part_key for s in sample.steps()}
    assert not {p.operands for p in sample.problems} & {p.operands for p in task.problems}


def test_means_sample_size_follows_the_rarest_common_token(tokenizer):
    """Each (position, token) held by at least 1 % of the evaluated problems is expected MEANS_MIN_COUNT times."""
    import math

    task = build_task(TaskSpec(operation="a+b", digits=2, n=200, shots=1), tokenizer)
    shares = []
    for t in range(task.context_len, task.n_positions):
        _, counts = task.input_ids_PT[:, t].unique(return_counts=True)
        shares += [c / len(task) for c in counts.tolist() if c / len(task) >= MEANS_COMMON]
    for k in range(max(len(a) for a in task.answer_tokens)):
        column = [a[k] for a in task.answer_tokens if len(a) > k]
        shares += [column.count(x) / len(task) for x in set(column) if column.count(x) / len(task) >= 0.01]
    want = max(MEANS_SAMPLE_MIN, min(MEANS_SAMPLE_MAX, math.ceil(MEANS_MIN_COUNT / min(shares))))
    assert means_sample_size(task) == want and min(shares) < 0.1


def test_means_sample_is_disjoint_when_the_prompts_lost_their_trailing_space(tokenizer, monkeypatch):
    """Tokenizers that put the space inside the number's token strip it from the evaluated prompts."""
    import dataclasses

    import af1.tasks.means_sample as means_sample

    spec = TaskSpec(operation="a+b", digits=2, n=30, shots=1, style="verbal")
    task = build_task(spec, tokenizer)
    stripped = [dataclasses.replace(p, prompt=p.prompt.rstrip(" ")) for p in task.problems]
    evaluated = dataclasses.replace(task, problems=stripped)
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MIN", 8000)  # nearly the whole pool: a leak would show
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MAX", 8000)
    sample = distribution_task(spec, tokenizer, evaluated)
    assert sample.origin == "disjoint sample" and len(sample) == 8000
    assert not {p.operands for p in sample.problems} & {p.operands for p in task.problems}


def test_negative_results_when_asked():
    _, problems = enumerate_problems(TaskSpec(operation="a-b", allow_negative=True, answer_digits="any"))
    assert len(problems) == 100 and min(p.answer for p in problems) == -9


def test_sampling_is_deterministic_and_shots_are_left_out():
    spec = TaskSpec(operation="a+b", digits=2, shots=3, n=50, seed=7)
    ex1, p1 = enumerate_problems(spec)
    ex2, p2 = enumerate_problems(spec)
    assert p1 == p2 and ex1 == ex2
    assert not {e.operands for e in ex1} & {p.operands for p in p1}
    prefix = "".join(f"{e.prompt}{e.answer}\n" for e in ex1)
    assert all(p.text == prefix + p.prompt for p in p1)
    _, p3 = enumerate_problems(spec.model_copy(update={"seed": 8}))
    assert p3 != p1


def test_too_many_problems_and_bad_shots():
    with pytest.raises(Af1Error, match="larger than"):
        enumerate_problems(TaskSpec(operation="a+b", n=10_000))
    with pytest.raises(ValueError):
        TaskSpec(shots=-1)
    with pytest.raises(ValueError, match="unknown task"):
        TaskSpec(operation="a/b")
    with pytest.raises(ValueError, match="unknown style"):
        TaskSpec(style="poem")
    with pytest.raises(Af1Error, match="only for a\\+b and a-b"):
        enumerate_problems(TaskSpec(operation="a+b+c", style="verbal"))


def test_every_style_has_an_example():
    for style in STYLES:
        assert example_prompt("a+b", style)
        assert example_prompt("a-b", style)
    assert example_prompt("a+b+c", "word") is None


@pytest.mark.parametrize("style", STYLES)
def test_build_task_layout_and_answers(tokenizer, style):
    task = build_task(TaskSpec(operation="a+b", style=style, shots=2), tokenizer)
    ids = task.input_ids_PT
    c = task.context_len
    assert (ids[:, :c] == ids[:1, :c]).all()  # context is constant
    assert (ids[:, c] != ids[0, c]).any()  # and the next position varies
    assert task.layout[:c] == ("context",) * c and "A" in task.layout and "B" in task.layout
    for i, p in enumerate(task.problems[:10]):
        full = tokenizer(p.text + p.answer_text).input_ids
        assert full[: ids.shape[1]] == ids[i].tolist() and full[ids.shape[1]] == task.answer_ids_P[i]
        assert tokenizer.decode([int(task.answer_ids_P[i])]).strip() == str(p.answer)[0]


def test_two_digit_answer_first_token_is_leading_digit(tokenizer):
    task = build_task(TaskSpec(operation="a+b", digits=2, n=20, style="calculate"), tokenizer)
    assert [tokenizer.decode([int(t)]) for t in task.answer_ids_P] == [str(p.answer)[0] for p in task.problems]


class SpaceMergingTokenizer:
    """A tokenizer whose numbers carry their leading space, like GPT-2's: ' 7' is one token."""

    bos_token_id, bos_token = 1000, "<s>"

    def __call__(self, text, return_offsets_mapping=False):
        import re

        pieces = [(m.group(), m.start(), m.end()) for m in re.finditer(r" ?\d|[^\d ]+| ", text)]
        ids = [hash(p) % 1000 for p, _, _ in pieces]
        out: dict[str, Any] = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = [(a, b) for _, a, b in pieces]
        return out


class DigitGluingTokenizer(SpaceMergingTokenizer):
    """A tokenizer that glues '=' to the digit after it: the answer's first token is ambiguous."""

    def __call__(self, text, return_offsets_mapping=False):
        import re

        pieces = [(m.group(), m.start(), m.end()) for m in re.finditer(r"=\d|\d|[^\d=]+|=", text)]
        out: dict[str, Any] = {"input_ids": [hash(p) % 1000 for p, _, _ in pieces]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(a, b) for _, a, b in pieces]
        return out


def test_trailing_space_moves_into_the_answer():
    task = build_task(TaskSpec(operation="a+b", style="verbal"), SpaceMergingTokenizer())
    assert task.answer_moves_space
    assert all(p.answer_text.startswith(" ") and not p.text.endswith(" ") for p in task.problems)


def test_ambiguous_first_answer_token_is_refused():
    with pytest.raises(Af1Error, match="ambiguous"):
        build_task(TaskSpec(operation="a+b", style="original"), DigitGluingTokenizer())


class OnePlusTokenizer(SpaceMergingTokenizer):
    """A tokenizer with a token for '1+': prompts with A = 1 have one token fewer."""

    def __call__(self, text, return_offsets_mapping=False):
        import re

        pieces = [(m.group(), m.start(), m.end()) for m in re.finditer(r"1\+|\d|[^\d]", text)]
        out: dict[str, Any] = {"input_ids": [hash(p) % 1000 for p, _, _ in pieces]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(a, b) for _, a, b in pieces]
        return out


def test_mixed_layouts_grouped_or_the_largest_kept():
    spec = TaskSpec(operation="a+b")
    grouped = build_task(spec, OnePlusTokenizer())
    assert [len(g) for g in grouped.groups] == [90, 10] and grouped.excluded_other_layouts == 0
    assert all(p.operands[0] == 1 for p in grouped.groups[1].problems)
    task = build_task(spec.model_copy(update={"largest_layout": True}), OnePlusTokenizer())
    assert task.excluded_other_layouts == 10  # 1+0 .. 1+9 (full scoring keeps the two-digit answer 10)
    assert all(p.operands[0] != 1 for p in task.problems)


def test_subset_keeps_alignment(tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=10), tokenizer)
    sub = task.subset(torch.tensor([3, 5]))
    assert sub.problems == [task.problems[3], task.problems[5]]
    assert torch.equal(sub.answer_ids_P, task.answer_ids_P[[3, 5]])


def test_large_tasks_are_sampled_to_the_papers_size_and_say_so(tokenizer):
    """Without --n a task of more than DEFAULT_N distinct problems is sampled (seeded) and the task says so."""
    from af1.tasks.spec import DEFAULT_N

    task = build_task(TaskSpec(operation="a+b", digits=2), tokenizer)
    assert len(task) == DEFAULT_N and task.n_distinct == 8100
    note = str(task.sampling_note)
    assert "8100 distinct problems" in note and "n sets another size" in note
    again = build_task(TaskSpec(operation="a+b", digits=2), tokenizer)
    assert [p.prompt for p in again.problems] == [p.prompt for p in task.problems]
    assert build_task(TaskSpec(operation="a+b", digits=2, n=1500), tokenizer).sampling_note is None
    small = build_task(TaskSpec(operation="a+b"), tokenizer)
    assert len(small) == 100 and small.sampling_note is None


def test_huge_operand_spaces_are_sampled_not_enumerated():
    """3-digit a+b+c has 729 million operand tuples: the pool is a seeded sample of distinct ones."""
    from af1.tasks.problems import POOL_SAMPLE

    spec = TaskSpec(operation="a+b+c", digits=3)
    _, problems = enumerate_problems(spec)
    assert len(problems) == 1000
    assert all(100 <= x <= 999 for p in problems for x in p.operands)
    assert all(p.answer == sum(p.operands) for p in problems)
    _, again = enumerate_problems(spec)
    assert [p.operands for p in again] == [p.operands for p in problems]
    from af1.tasks.problems import problem_pool

    _, pool = problem_pool(spec)
    assert len({p.operands for p in pool}) == len(pool) == POOL_SAMPLE


def test_an_operand_held_constant_by_a_small_sample_is_not_context(tokenizer):
    """Every sampled problem has a = 3: the token of a is still an operand, so context ends before it."""
    from af1.tasks.problems import problem_pool
    from af1.tasks.task import tokenize_task

    spec = TaskSpec(operation="a+b", shots=1)
    examples, pool = problem_pool(spec)
    same_a = [p for p in pool if p.operands[0] == 3][:5]
    task = tokenize_task(spec, examples, same_a, tokenizer)
    first_operand = task.layout.index("A")
    assert task.context_len == first_operand and task.layout[: task.context_len] == ("context",) * first_operand
    bare = TaskSpec(operation="a+b")  # no prefix: the first token is an operand, so a BOS is prepended
    task = tokenize_task(bare, [], [p for p in problem_pool(bare)[1] if p.operands[0] == 3][:5], tokenizer)
    assert task.bos is not None and task.context_len == 1
