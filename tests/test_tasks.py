"""Tasks: enumeration, few-shot prefix, answer tokens, layouts, context."""

from __future__ import annotations

import pytest
import torch

from af1 import Af1Error
from af1.tasks import OPERATIONS, STYLES, TaskSpec, build_task, enumerate_problems, example_prompt


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_answers_are_right_and_non_negative(op):
    _, problems = enumerate_problems(TaskSpec(operation=op))
    assert problems
    for p in problems:
        assert p.answer == eval(p.prompt.rstrip("=").replace("=", ""))  # the prompt is the expression
        assert p.answer >= 0
    assert len({len(str(p.answer)) for p in problems}) == 1  # constant answer digit count


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

    def __call__(self, text, return_offsets_mapping=False):
        import re

        pieces = [(m.group(), m.start(), m.end()) for m in re.finditer(r" ?\d|[^\d ]+| ", text)]
        ids = [hash(p) % 1000 for p, _, _ in pieces]
        out = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = [(a, b) for _, a, b in pieces]
        return out


class DigitGluingTokenizer(SpaceMergingTokenizer):
    """A tokenizer that glues '=' to the digit after it: the answer's first token is ambiguous."""

    def __call__(self, text, return_offsets_mapping=False):
        import re

        pieces = [(m.group(), m.start(), m.end()) for m in re.finditer(r"=\d|\d|[^\d=]+|=", text)]
        out = {"input_ids": [hash(p) % 1000 for p, _, _ in pieces]}
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
        out = {"input_ids": [hash(p) % 1000 for p, _, _ in pieces]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(a, b) for _, a, b in pieces]
        return out


def test_mixed_layouts_refused_or_grouped():
    spec = TaskSpec(operation="a+b")
    with pytest.raises(Af1Error, match="different token layouts"):
        build_task(spec, OnePlusTokenizer())
    task = build_task(spec.model_copy(update={"largest_layout": True}), OnePlusTokenizer())
    assert task.excluded_other_layouts == 9  # 1+0 .. 1+8
    assert all(p.operands[0] != 1 for p in task.problems)


def test_subset_keeps_alignment(tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=10), tokenizer)
    sub = task.subset(torch.tensor([3, 5]))
    assert sub.problems == [task.problems[3], task.problems[5]]
    assert torch.equal(sub.answer_ids_P, task.answer_ids_P[[3, 5]])
