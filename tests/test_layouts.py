"""Prompts of several token layouts: grouped, each layout measured with its own means, rates pooled with each n."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config
from af1.methods import allforone, heads
from af1.methods.finetune.train import answer_batch
from af1.methods.setup import make_setup, prepare
from af1.models import LoadedModel, ModelAdapter
from af1.stats import constant_baseline
from af1.tasks.evaluation import evaluate, evaluated, problem_rows, recorded
from af1.tasks.means_sample import distribution_task
from af1.tasks.spec import TaskSpec
from af1.tasks.task import MIN_LAYOUT, PAD, build_task

from cli_helpers import run_cli
from conftest import fitted_tiny_model

SHORT = ["1", "2", "3", "4", "5", "6", "7"]  # one token each: layout "a"
LONG = ["12", "13", "14", "15", "16"]  # two tokens each: layout "a a"


def template(tmp_path: Path, name: str, a: list[str]) -> TaskSpec:
    text = (
        f"name: {name}\ntemplate: 'Calculate: {{a}} + {{b}} = '\n"
        f"slots:\n  a: {{values: {json.dumps(a)}}}\n  b: {{values: ['1', '2', '3']}}\n"
        "answer:\n  expr: 'a + b'\ncounterfactual:\n  slot: b\n"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return TaskSpec(file=str(path))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, tokenizer):
    """A task of two layouts, the same problems as two one-layout tasks, and a tiny model fitted to all of them."""
    tmp = tmp_path_factory.mktemp("layouts")
    spec = template(tmp, "mixed", SHORT + LONG)
    short, long = template(tmp, "short", SHORT), template(tmp, "long", LONG)
    model = fitted_tiny_model("llama", [spec], tokenizer)
    lm = LoadedModel(model, tokenizer, ModelAdapter(model), {"spec": "tiny-fitted"})
    return lm, spec, short, long


def by_prompt(task, values) -> dict[str, Any]:
    return {p.prompt: v for p, v in zip(task.problems, values, strict=True)}


def test_problems_are_grouped_by_layout(mixed, tokenizer):
    _, spec, short, long = mixed
    task = build_task(spec, tokenizer)
    assert [len(g) for g in task.groups] == [21, 15] and task.excluded_other_layouts == 0
    assert [g.n_positions for g in task.groups] == [task.groups[0].n_positions, task.groups[0].n_positions + 1]
    for group, alone in zip(task.groups, (build_task(short, tokenizer), build_task(long, tokenizer)), strict=True):
        assert {p.prompt for p in group.problems} == {p.prompt for p in alone.problems}
        assert group.layout == alone.layout and group.context_len == alone.context_len
    rows = task.rows()
    assert all("layout" in r for r in rows)
    assert [r.get("layout") for r in rows] == task.layout_P.tolist() and {r.get("layout") for r in rows} == {0, 1}
    for i, row in enumerate(rows):  # each row is fed as its own layout's ids, never the padding
        assert PAD not in row["input_ids"] and row["input"] == task.input_text(i)
        assert row["input_ids"] == tokenizer(row["input"])["input_ids"]
    seen = torch.zeros(len(task), dtype=torch.long)
    for part in task.steps():  # every row once per answer step it has, in one piece of one layout
        assert PAD not in part.input_ids_PT
        seen[part.where_P] += 1
    assert seen.tolist() == [len(a) for a in task.answer_tokens]
    sub = task.subset([30, 2, 17, 5])
    assert [p.prompt for p in sub.problems] == [task.problems[i].prompt for i in (30, 2, 17, 5)]
    assert [r["input_ids"] for r in sub.rows()] == [rows[i]["input_ids"] for i in (30, 2, 17, 5)]
    assert task.describe()["context_len"] is None  # no one context: each layout's is in `layouts`


def test_small_layouts_are_left_out_and_largest_layout_keeps_one(tmp_path, tokenizer):
    spec = template(tmp_path, "few", [*SHORT, "12"])  # 3 problems of the two-token layout
    task = build_task(spec, tokenizer)
    assert not task.groups and len(task) == 21 and task.excluded_other_layouts == 3 < MIN_LAYOUT
    largest = build_task(
        template(tmp_path, "both", SHORT + LONG).model_copy(update={"largest_layout": True}), tokenizer
    )
    assert not largest.groups and len(largest) == 21 and largest.excluded_other_layouts == 15
    assert task.exclusion_note == "3 problems left out: their token layout is shared by fewer than 5 problems"
    assert largest.exclusion_note is not None and "largest_layout keeps only" in largest.exclusion_note
    assert build_task(template(tmp_path, "one", SHORT), tokenizer).exclusion_note is None
    with pytest.raises(Af1Error, match="none shared by 5 or more"):
        build_task(template(tmp_path, "tiny", ["1", "12"]), tokenizer)


def test_the_evaluation_says_what_it_left_out(mixed, tmp_path):
    from af1 import api

    lm = mixed[0]
    result = api.run("eval", lm, template(tmp_path, "few", [*SHORT, "12"]))
    assert result.n == 21 and "3 problems left out" in " ".join(result.warnings)


def test_means_come_from_each_layouts_own_problems(mixed, tokenizer):
    _, spec, _, _ = mixed
    task = build_task(spec, tokenizer)
    dist = distribution_task(spec, tokenizer, task)
    assert [g.layout_id for g in dist.groups] == [0, 1]
    for group, mine in zip(dist.groups, task.groups, strict=True):
        assert group.prompt_roles == mine.prompt_roles and group.context_len == mine.context_len
        assert {p.prompt for p in group.problems} == {p.prompt for p in mine.problems}


def close(a: dict[str, float], b: dict[str, float]) -> bool:
    """Every problem of `a` is in `b` with the same probability of its answer (to float error)."""
    return all(abs(v - b[k]) < 1e-5 for k, v in a.items())


def test_pooled_rates_are_each_layouts_own_measurement(mixed):
    """AF1 scores of the two-layout task are, problem for problem, a one-layout setup's on that layout's problems
    and means (the probability of the answer, on every executor); the pooled rate counts every problem once with
    each layout's n. (A file of one layout's rows gives the same means up to summation order, which this fitted
    model amplifies: so the one-layout setups here take the same distribution rows.)"""
    lm, spec, short, long = mixed
    whole = prepare(lm, spec)
    base = by_prompt(whole.task, whole.base.p_correct_P.tolist())
    for alone_spec in (short, long):  # base scores need no means: equal to a file of one layout's rows
        alone = prepare(lm, alone_spec)
        assert close(by_prompt(alone.task, alone.base.p_correct_P.tolist()), base)
    singles = [
        make_setup(
            lm,
            spec,
            replace(group, index_P=None),
            whole.base.subset(group.where_P.tolist()),
            replace(dist, index_P=None),
        )
        for group, dist in zip(whole.task.groups, whole.distribution.groups, strict=True)
    ]
    configs = [
        AF1Config(wait=1, transfer=0),  # fast executor; faithfulness 0.14 and 0 on this model
        AF1Config(wait=0, transfer=1),
        AF1Config(wait=0, transfer=1, ablation="mean", abp="sink"),  # shared-context executor
        AF1Config(wait=0, transfer=1, ablation="resample"),  # donors drawn from the row's own layout
    ]
    for config in configs:
        scores = allforone.faithfulness.faithfulness(whole, config)
        got = by_prompt(whole.kept, scores.p_correct_P.tolist())
        for single in singles:
            assert close(
                by_prompt(single.kept, allforone.faithfulness.faithfulness(single, config).p_correct_P.tolist()), got
            )
        pooled = scores.rate(whole.kept)
        assert "by_layout" in pooled
        assert [r["n"] for r in pooled["by_layout"]] == [21, 15]
        assert pooled["k"] == sum(round(r["value"] * r["n"]) for r in pooled["by_layout"])
        for part, group in zip(pooled["by_layout"], whole.kept.groups, strict=True):  # each with its own baseline
            assert part["layout"] == group.layout_id and part["baseline"] == constant_baseline(group.targets())
        # the pooled baseline guesses per layout (the prompt shows it): sum of n_g * b_g over n
        n_b = sum(r["n"] * r["baseline"] for r in pooled["by_layout"])
        assert pooled["baseline"] == pytest.approx(n_b / pooled["n"])
    assert allforone.faithfulness.faithfulness(whole, configs[0]).rate(whole.kept).get("by_layout", [])[0]["value"] > 0
    half = whole.on(list(range(0, len(whole.kept), 2)))  # a split keeps each row's own layout's means
    got = by_prompt(whole.kept, allforone.faithfulness.faithfulness(whole, configs[0]).p_correct_P.tolist())
    assert close(by_prompt(half.kept, allforone.faithfulness.faithfulness(half, configs[0]).p_correct_P.tolist()), got)


def test_the_evaluation_reads_back_and_lists_layouts(mixed):
    lm, spec, _, _ = mixed
    done = evaluated(lm.model, lm.tokenizer, spec)
    again = recorded(lm.model, lm.tokenizer, spec, problem_rows(done.task, done.base))
    assert again is not None and again.base.correct_P.tolist() == done.base.correct_P.tolist()
    assert evaluate(lm.model, done.task).correct_P.tolist() == done.base.correct_P.tolist()


def test_heads_are_patched_per_layout_and_pooled_by_n(mixed, tokenizer):
    lm, spec, short, long = mixed
    kept = prepare(lm, spec).kept
    pp, _ = heads.patching.layout_path_patching(lm.adapter, kept, tokenizer, "direct")
    parts = []
    for alone in kept.groups:  # each layout alone (a problem's counterfactual is drawn from the same file's values)
        assert {p.prompt for p in alone.problems} in [
            {p.prompt for p in prepare(lm, s).kept.problems} for s in (short, long)
        ]
        part, _ = heads.patching.layout_path_patching(lm.adapter, alone, tokenizer, "direct")
        parts.append((len(alone), part["relative_logit_change_layer_head"]))
    expected = (parts[0][0] * parts[0][1] + parts[1][0] * parts[1][1]) / (parts[0][0] + parts[1][0])
    assert torch.allclose(pp["relative_logit_change_layer_head"], expected, atol=1e-6)
    means = heads.knockouts.head_sums_by_step(lm.adapter, kept)
    assert set(means) == {part.part_key for part in kept.steps()}
    (knocked,) = heads.knockouts.knockouts(lm.adapter, kept, [[(0, 0), (1, 1)]], means)
    assert len(knocked.correct_P) == len(kept)


def test_fine_tuning_batches_keep_each_rows_own_length(mixed, tokenizer):
    _, spec, _, _ = mixed
    task = build_task(spec, tokenizer)
    index = [0, 1, 2, 3, 30, 31]
    ids, labels = answer_batch(task, index)
    rows = task.rows()
    for row, i in enumerate(index):
        prompt, answer = rows[i]["input_ids"], rows[i]["answer_tokens"]
        n = len(prompt)
        assert ids[row, : n + len(answer)].tolist() == prompt + answer
        assert labels[row, n - 1 : n - 1 + len(answer)].tolist() == answer
        assert int((labels[row] != -100).sum()) == len(answer)


def test_the_command_line_shows_each_layout(mixed, tmp_path, monkeypatch, capsys):
    lm, spec, _, _ = mixed
    import af1.api

    monkeypatch.setattr(af1.api, "load_model", lambda *a, **k: lm)
    code, out, _ = run_cli(capsys, "eval", "--model", "smollm2", "--task-file", str(spec.file), "--out", str(tmp_path))
    assert code == 0 and "per token layout" in out and "constant guess" in out
    result = json.loads((tmp_path / "eval.json").read_text())
    assert [r["n"] for r in result["base_accuracy"]["by_layout"]] == [21, 15]
    assert [r["n"] for r in result["task_layout"]["layouts"]] == [21, 15]
    described = result["task_layout"]["spec"]  # a task file's spec names the file, not a built-in task or style
    assert described["file"] == str(spec.file) and not {"operation", "style", "digits"} & set(described)


def test_a_layout_without_a_counterfactual_is_left_out_of_path_patching(mixed, tokenizer, tmp_path):
    """A null value of one token keeps only the one-token layout's shape: the other layout is left out, and said."""
    lm, spec, _, _ = mixed
    text = Path(str(spec.file)).read_text().replace("slot: b\n", "slot: a\n  null_value: '9'\n")
    (tmp_path / "null.yaml").write_text(text)
    kept = prepare(lm, TaskSpec(file=str(tmp_path / "null.yaml"))).kept
    pp, _ = heads.patching.layout_path_patching(lm.adapter, kept, tokenizer, "direct")
    assert pp.get("layouts_patched") == [{"layout": 0, "n": len(kept.groups[0])}]
    assert [s["layout"] for s in pp.get("layouts_not_patched", [])] == [1]
    alone, _ = heads.patching.layout_path_patching(lm.adapter, kept.groups[0], tokenizer, "direct")
    assert torch.allclose(pp["relative_logit_change_layer_head"], alone["relative_logit_change_layer_head"])


def test_the_search_reports_each_layouts_confirmation_rate(mixed):
    """The search's pooled confirmation rate is its layouts' parts; a split holding one layout runs that layout's
    pieces only."""
    from af1 import api

    lm, spec, _, _ = mixed
    held = api.session(lm)
    search = api.run("search", held, spec, threshold=0.5)
    assert search.judged is not None
    parts = search.judged["confirmation"].get("by_layout") or []
    assert sum(p["n"] for p in parts) == search.n_confirmation and {p["layout"] for p in parts} == {0, 1}
    setup = held.setup(spec)
    only_short = setup.on(setup.kept.groups[0].where_P.tolist())
    assert [s.kept.layout_id for s in only_short.steps] == [0] * len(only_short.steps)
    config = AF1Config(wait=1, transfer=0)
    got = by_prompt(setup.kept, allforone.faithfulness.faithfulness(setup, config).p_correct_P.tolist())
    assert close(
        by_prompt(only_short.kept, allforone.faithfulness.faithfulness(only_short, config).p_correct_P.tolist()), got
    )


def test_the_heads_study_runs_on_a_task_of_several_layouts(mixed, tmp_path, monkeypatch, capsys):
    """Path patching per layout writes which layouts it patched: fields its result declares (an undeclared one
    was refused, so the heads study failed on every task of several layouts)."""
    lm, spec, _, _ = mixed
    import af1.api

    monkeypatch.setattr(af1.api, "load_model", lambda *a, **k: lm)
    args = ["heads", "--model", "smollm2", "--task-file", str(spec.file), "--out", str(tmp_path), "--draws", "2"]
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    result = json.loads((tmp_path / "heads.json").read_text())
    assert [r["layout"] for r in result["layouts_patched"]] == [0, 1] and result["layouts_not_patched"] == []
    assert sum(r["n"] for r in result["layouts_patched"]) == result["split"]["n_selection"]
