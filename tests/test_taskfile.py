"""Task files: rows and templates, validation with one-line errors, and the studies run from a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from af1 import api
from af1.errors import Af1Error
from af1.experiments import NotApplicable
from af1.methods.counterfactuals import counterfactual
from af1.tasks.files import evaluate_expr, load_items
from af1.tasks.means_sample import distribution_task
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from cli_helpers import run_cli
from conftest import fitted_tiny_model

EXAMPLES = Path(__file__).parent.parent / "examples" / "tasks"


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_the_arithmetic_template_is_the_built_in_task(tokenizer):
    """a+b written as a template (slots and an expression) gives the built-in task's problems and answers."""
    from_file = build_task(TaskSpec(file=str(EXAMPLES / "arithmetic.yaml"), n=50), tokenizer)
    built_in = build_task(TaskSpec(operation="a+b", style="calculate", shots=3), tokenizer)
    assert from_file.spec.shots == 3 and from_file.n_distinct == 97
    answers = {p.prompt.rstrip(" "): p.answer_text.strip() for p in built_in.problems}
    assert all(answers[p.prompt.rstrip(" ")] == p.answer_text.strip() for p in from_file.problems)
    roles = [{"a": "A", "b": "B"}.get(r, r) for r in from_file.layout[from_file.context_len :]]
    assert roles == list(built_in.layout[built_in.context_len :])  # the slots are the operands' positions
    assert evaluate_expr("(a + b) * 2 - c // 3 % 2", {"a": 1, "b": 2, "c": 9}) == 5


def induction_file(tmp_path: Path, words: list[str], extra: str = "") -> Path:
    """A copy task: three different words, the first two again, answered by the third (like induction.yaml)."""
    write(tmp_path, "w.txt", "".join(f"{w}\n" for w in words))
    return write(
        tmp_path,
        "t.yaml",
        "template: '{x} {y} {z} {x} {y}'\nslots: {x: {file: w.txt}, y: {file: w.txt}, z: {file: w.txt}}\n"
        "distinct: true\nanswer: {prefix: ' ', slot: z}\n" + extra,
    )


def test_a_copy_task_answers_with_a_slot_and_keeps_slots_distinct(tmp_path, tokenizer):
    """Induction as a template: a slot repeated in the prompt, the answer a slot's value, no repeated values."""
    path = induction_file(tmp_path, ["cat", "dog", "sun", "tree"])
    _, items = load_items(path)
    assert len(items) == 4 * 3 * 2  # ordered triples of different words
    for item in items:
        x, y, z = (v for _, v in item.slots)
        assert len({x, y, z}) == 3 and item.prompt == f"{x} {y} {z} {x} {y}" and item.answer == f" {z}"
        assert [n for n, _, _ in item.spans] == ["x", "y", "z", "x", "y"]  # both places of a repeated slot
    repeated = write(tmp_path, "r.yaml", path.read_text().replace("distinct: true\n", ""))
    assert len(load_items(repeated)[1]) == 4**3
    task = build_task(TaskSpec(file=str(path)), tokenizer)
    assert task.layout[task.context_len - 1 :] == ("context", "x", "y", "z", "x", "y")


def test_an_expression_reads_the_integer_slots_beside_word_slots(tmp_path):
    """A word slot the answer does not use (a distractor) stands beside the integer slots of the expression."""
    path = write(
        tmp_path,
        "w.yaml",
        "template: '{w}: {a}+{b}='\nslots: {w: {values: [cat, dog]}, a: {values: ['1', '2']}, b: {values: ['3']}}\n"
        "answer: {expr: a + b}\ncounterfactual: {slot: w}\n",
    )
    _, items = load_items(path)
    assert sorted((item.prompt, item.answer) for item in items) == [
        ("cat: 1+3=", "4"),
        ("cat: 2+3=", "5"),
        ("dog: 1+3=", "4"),
        ("dog: 2+3=", "5"),
    ]


def test_the_shipped_examples_load(tokenizer):
    """Every file of examples/tasks builds a task, and the symbolic ones have the problems they say."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        task = build_task(TaskSpec(file=str(path), n_max=40), tokenizer)
        assert len(task) > 0 and task.spec.file_sha256 is not None
    _, induction = load_items(EXAMPLES / "induction.yaml")
    assert len(induction) == 16 * 15 * 14 and all(i.answer == " " + i.prompt.split()[2] for i in induction)
    _, upper = load_items(EXAMPLES / "uppercase.yaml")
    assert [i.answer for i in upper] == [f" {c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]


def test_rows_from_jsonl_and_csv_with_groups(tmp_path, tokenizer):
    write(
        tmp_path,
        "r.jsonl",
        "".join(
            json.dumps({"prompt": f"{i} then", "answer": f" {i + 1}", "group": "up"}) + "\n" for i in range(10, 30)
        ),
    )
    write(tmp_path, "r.csv", "prompt,answer\n" + "".join(f"{i} then, {i + 1}\n" for i in range(10, 30)))
    for rows in ("r.jsonl", "r.csv"):
        spec = TaskSpec(file=str(write(tmp_path, f"{rows}.yaml", f'rows: {rows}\nshots: 2\nprefix: "Count.\\n"\n')))
        task = build_task(spec, tokenizer)
        assert len(task) == 18 and task.input_text(0).startswith("Count.\n")
        assert spec.name == f"{rows}" and spec.file_sha256 is not None
    _, items = load_items(tmp_path / "r.jsonl.yaml")
    assert {i.group for i in items} == {"up"}


def test_rows_keep_newlines_inside_a_field(tmp_path):
    """A quoted CSV field may span lines, and a JSON string may hold a line separator (U+2028)."""
    write(tmp_path, "r.csv", 'prompt,answer\n"Q: 2+2\nA:", 4\n"Q: 3+3\nA:", 6\n')
    write(tmp_path, "r.jsonl", json.dumps({"prompt": "a\u2028b", "answer": " c"}, ensure_ascii=False) + "\n")
    _, items = load_items(write(tmp_path, "c.yaml", "rows: r.csv\n"))
    assert [(i.prompt, i.answer) for i in items] == [("Q: 2+2\nA:", " 4"), ("Q: 3+3\nA:", " 6")]
    _, items = load_items(write(tmp_path, "j.yaml", "rows: r.jsonl\n"))
    assert [(i.prompt, i.answer) for i in items] == [("a\u2028b", " c")]


def test_a_large_rows_file_gets_a_disjoint_means_sample(tmp_path, tokenizer, monkeypatch):
    """Rows without slots share one group: the means sample is disjoint by prompt, not by slot values."""
    import af1.tasks.means_sample as means_sample

    write(
        tmp_path,
        "r.jsonl",
        "".join(json.dumps({"prompt": f"{i} then", "answer": f" {i + 1}"}) + "\n" for i in range(10, 60)),
    )
    spec = TaskSpec(file=str(write(tmp_path, "t.yaml", "rows: r.jsonl\nshots: 1\n")), n=12)
    task = build_task(spec, tokenizer)
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MIN", 30)
    monkeypatch.setattr(means_sample, "MEANS_SAMPLE_MAX", 30)
    sample = distribution_task(spec, tokenizer, task)
    assert sample.origin == "disjoint sample" and len(sample) == 30
    assert not {p.prompt for p in sample.problems} & {p.prompt for p in task.problems}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"t.yaml": "rows: r.csv\n", "r.csv": "prompt,reply\nx,y\n"}, "row 1 has no 'answer' column"),
        ({"t.yaml": "rows: r.jsonl\n", "r.jsonl": ""}, "the rows file is empty"),
        ({"t.yaml": "template: 'a {x}'\nslots: {x: {values: []}}\nanswer: {table: {}}\n"}, "slot 'x' has no values"),
        ({"t.yaml": "template: 'a {x}'\nanswer: {expr: x}\n"}, "slot 'x' has no values"),
        (
            {
                "t.yaml": "rows: r.jsonl\n",
                "r.jsonl": '{"prompt": "p", "answer": " a"}\n{"prompt": "p", "answer": " b"}\n',
            },
            "two answers",
        ),
        ({"t.yaml": "rows: r.csv\ncolour: red\n", "r.csv": "prompt,answer\nx,y\n"}, "colour: unknown key"),
        ({"t.yaml": "template: 'a {x}'\nslots: {x: {values: ['1']}}\nanswer: {expr: 'x ** 2'}\n"}, "is not an integer"),
        (
            {
                "t.yaml": "template: '{w} {x}'\nslots: {w: {values: [cat]}, x: {values: ['1']}}\n"
                "answer: {expr: 'w + x'}\n"
            },
            "'w' is not an integer slot",
        ),
        ({"t.yaml": "rows: r.csv\n"}, "does not exist"),
        ({"t.yaml": "template: 'a {x}'\nslots: {x: {values: ['1']}}\nanswer: {expr: 'x +'}\n"}, "not an expression"),
        ({"t.yaml": "rows: r.csv\n", "r.csv": b"prompt,answer\n\xff,y\n"}, "not UTF-8 text"),
        ({"t.yaml": "template: 'a {x}'\nslots: {x: {values: ['1']}}\nanswer: {slot: y}\n"}, "answer slot 'y' is not"),
        (
            {"t.yaml": "template: 'a {x}'\nslots: {x: {values: ['1']}}\nanswer: {slot: x, expr: x}\n"},
            "exactly one of table, expr or slot",
        ),
        ({"t.yaml": "rows: r.csv\ndistinct: true\n", "r.csv": "prompt,answer\nx,y\n"}, "distinct are for templates"),
        ({"t.yaml": "rows: r.csv\nanswer: {slot: x}\n", "r.csv": "prompt,answer\nx,y\n"}, "gives each prompt and"),
        (
            {
                "t.yaml": "template: 'a {x}'\nslots: {x: {values: ['1']}, y: {values: ['2']}}\nanswer: {slot: x}\n"
                "counterfactual: {slot: y}\n"
            },
            "counterfactual slot 'y' is not a slot of the template",
        ),
    ],
)
def test_bad_task_files_are_one_line_errors(tmp_path, capsys, files, message):
    for name, text in files.items():
        write(tmp_path, name, text)
    code, _, err = run_cli(capsys, "eval", "--task-file", str(tmp_path / "t.yaml"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_answer_that_merges_with_the_prompt_is_refused(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "t.yaml",
        "template: 'The word is {w}'\nslots: {w: {values: [hel, wor]}}\nanswer: {table: {hel: lo, wor: ld}}\n",
    )  # "hel" + "lo" is one token, " hello"
    with pytest.raises(Af1Error, match="merges the end of the prompt"):
        build_task(TaskSpec(file=str(path)), tokenizer)


def test_a_task_file_says_where_its_answers_end(tmp_path, tokenizer):
    """The end checked is the first token of the file's separator after the answer; none without shots, when the
    file turns it off, or when the separator would merge with the answer's last token (" cat" + "s" is " cats")."""
    animals = "template: 'The animal is {w}'\nslots: {w: {values: [a, b, c, d, e, f]}}\nanswer: {table: {a: ' cat', "
    animals += "b: ' dog', c: ' cow', d: ' pig', e: ' hen', f: ' owl'}}\n"

    def end(extra: str, name: str) -> Any:
        return build_task(TaskSpec(file=str(write(tmp_path, name, animals + extra))), tokenizer)

    semicolon = end("shots: 2\nseparator: '; '\n", "semi.yaml")
    assert semicolon.end["checked"] and semicolon.end["stop_tokens"] == {str(tokenizer(";").input_ids[0]): ";"}
    assert all(len(a) == 1 for a in semicolon.answer_tokens) and semicolon.n_steps() == 2
    assert not end("shots: 0\n", "zero.yaml").end["checked"]
    off = end("shots: 2\ncheck_end: false\n", "off.yaml")
    assert not off.end["checked"] and off.n_steps() == 1 and "check_end is false" in off.end["note"]
    merged = end("shots: 2\nseparator: 's'\n", "merged.yaml")
    assert not merged.end["checked"] and "merges" in merged.end["note"] and merged.n_steps() == 1
    assert merged.end_note is not None and "not checked" in merged.end_note


def test_a_counterfactual_that_changes_the_layout_is_refused(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "t.yaml",
        "template: 'Calculate: {a} + 1 = '\nslots: {a: {values: ['1', '2', '3']}}\n"
        "answer: {expr: 'a + 1'}\ncounterfactual: {slot: a, null_value: 'nothing at all here'}\n",
    )
    task = build_task(TaskSpec(file=str(path)), tokenizer)
    with pytest.raises(Af1Error, match="keeps the token layout"):
        counterfactual(task, tokenizer)


def test_the_slot_counterfactual_changes_only_the_slot(tokenizer):
    task = build_task(TaskSpec(file=str(EXAMPLES / "next_letter.yaml")), tokenizer)
    cf = counterfactual(task, tokenizer)
    assert cf.changed_positions and all(task.layout[t] == "letter" for t in cf.changed_positions)
    assert (cf.input_ids_PT != task.input_ids_PT).any(1).all()  # every problem changed


def test_a_repeated_slot_is_replaced_everywhere_by_a_distinct_value(tmp_path, tokenizer):
    """Induction's x stands twice: the counterfactual changes both places to one other word, never to the problem's
    y or z (the task is distinct), drawn per problem rather than one word for all."""
    path = induction_file(tmp_path, ["cat", "dog", "sun", "tree", "car", "book"], "counterfactual: {slot: x}\n")
    task = build_task(TaskSpec(file=str(path)), tokenizer)
    cf = counterfactual(task, tokenizer)
    x_at = [t for t, r in enumerate(task.layout) if r == "x"]
    assert len(x_at) == 2 and cf.changed_positions == x_at
    replacements = set()
    for i, p in enumerate(task.problems):
        new, again = (tokenizer.decode(cf.input_ids_PT[i, t]).strip() for t in x_at)
        assert new == again  # both places, the same word
        assert new not in p.operands  # not its own x, nor its y or z
        replacements.add(new)
    assert len(replacements) > 1
    again = counterfactual(task.subset([5, 0, 3]), tokenizer)  # a problem's draw does not depend on the sample
    assert torch.equal(again.input_ids_PT, cf.input_ids_PT[[5, 0, 3]])


@pytest.fixture(scope="module")
def fitted(tokenizer):
    spec = TaskSpec(file=str(EXAMPLES / "arithmetic.yaml"), n=40)
    return fitted_tiny_model("llama", [spec], tokenizer), spec


@pytest.mark.slow
def test_every_study_runs_from_a_task_file(fitted, tokenizer):
    model, spec = fitted
    from af1.models import LoadedModel, ModelAdapter

    lm = LoadedModel(model, tokenizer, ModelAdapter(model), {"spec": "tiny-fitted"})
    held = api.session(lm)
    evaluated = api.run("eval", held, spec)
    assert evaluated.n_solved == 40 and evaluated.style == "task file" and evaluated.digits is None  # not a+b's
    search = api.run("search", held, spec, threshold=0.5)
    assert search.found is not None and search.n_layers == 3
    studies: list[tuple[str, dict[str, Any]]] = [
        ("necessity", {"windows": [1]}),
        ("alternatives", {}),
        ("prune", {}),
        ("heads", {"k": 2, "draws": 1}),
        ("transfer", {}),
    ]
    for name, options in studies:
        result = api.run(name, held, spec, upstream={"search": {"threshold": 0.5}}, **options)
        assert result.data()
    with pytest.raises(NotApplicable, match="input styles"):
        api.run("styles", held, spec, wait=0, transfer=1)
    tuned = api.run("finetune", held, spec, steps=1, n_train=20, n_val=10, n_eval=10, seeds=1, lrs=[1e-3], k=2)
    assert tuned.heads_chosen_on is not None and tuned.heads_chosen_on["problems"] == "the training rows"
    assert tuned.heads_chosen_on["n_solved"] <= 20 and len(tuned.heads) == 2


def test_means_rows_keep_the_evaluated_constant_prefix(tmp_path, tokenizer):
    """Rows need not share a sample's longer constant prefix: those that do not are left out of the means."""
    from af1.interventions.means import compute_means
    from af1.models import ModelAdapter
    from af1.tasks.means_sample import distribution_task
    from af1.tasks.problems import file_pool
    from af1.tasks.task import tokenize_task

    from conftest import tiny_model

    rows = [{"prompt": f"{word} {i} then", "answer": f" {i + 1}"} for word in ("red", "blue") for i in range(1, 9)]
    write(tmp_path, "r.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    spec = TaskSpec(file=str(write(tmp_path, "t.yaml", "rows: r.jsonl\nshots: 1\n")))
    examples, pool = file_pool(spec)
    red = [p for p in pool if p.prompt.startswith("red")]
    sample = tokenize_task(spec, examples, red, tokenizer)  # a sample whose prompts all open with "red"
    whole = tokenize_task(spec, examples, pool, tokenizer)
    assert sample.context_len > whole.context_len
    means_task = distribution_task(spec, tokenizer, sample)
    assert {p.prompt for p in means_task.problems} == {p.prompt for p in red}
    assert means_task.excluded_other_layouts == len(pool) - len(red)
    means = compute_means(ModelAdapter(tiny_model("llama")), means_task)
    assert means.cond_LTSD.isfinite().all()


def test_attention_shares_count_a_last_slot_once(tokenizer):
    """Induction's last token spells a slot: it is the 'last' group only, so each head's shares add up to 1."""
    from af1.methods.heads.attention import last_query_attention
    from af1.models import ModelAdapter

    from conftest import tiny_model

    task = build_task(TaskSpec(file=str(EXAMPLES / "induction.yaml"), n=8), tokenizer)
    assert task.layout[-1] == "y"
    looks = last_query_attention(ModelAdapter(tiny_model("llama")), task, [(0, 1), (1, 0)])
    for shares in looks.values():
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-5) and shares["last"] > 0
        # no operands in a task file; full scoring also counts the earlier answer tokens
        assert set(shares) == {"slots", "after a slot", "context", "earlier answer tokens", "last", "other"}


def test_a_rows_file_is_a_task_file_by_itself(tmp_path, tokenizer):
    """A .jsonl or .csv of prompt/answer rows needs no description: 3 worked examples from the other rows, full
    scoring, the file's name (issue 28, item 5)."""
    rows = "".join(json.dumps({"prompt": f"{i} then", "answer": f" {i + 1}"}) + "\n" for i in range(10, 30))
    path = write(tmp_path, "counting.jsonl", rows)
    spec = TaskSpec(file=str(path))
    assert (spec.shots, spec.scoring, spec.name) == (3, "full", "counting")
    task = build_task(spec, tokenizer)
    assert len(task.examples) == 3 and len(task) == 17 and task.end is not None and task.end["checked"]
    csv_path = write(tmp_path, "c.csv", "prompt,answer\n" + "".join(f"{i} then, {i + 1}\n" for i in range(10, 30)))
    assert TaskSpec(file=str(csv_path)).name == "c"
    with pytest.raises(Af1Error, match=r"expected a \.yaml, \.yml or \.toml description, or \.jsonl or \.csv rows"):
        TaskSpec(file=str(write(tmp_path, "rows.txt", "x")))


def test_options_given_win_over_the_file_and_defaults_do_not(tmp_path, capsys, cli_on_smollm2):
    """The file's shots stand unless shots are given (in a spec, a plan or on the command line), never overridden
    silently either way."""
    path = write(
        tmp_path,
        "t.yaml",
        "template: '{x} then'\nslots: {x: {values: ['1', '2', '3', '4', '5', '6']}}\n"
        "answer: {expr: 'x + 1', prefix: ' '}\nshots: 2\n",
    )
    assert TaskSpec(file=str(path)).shots == 2
    assert TaskSpec(file=str(path), shots=0).shots == 0
    assert TaskSpec.model_validate(TaskSpec(file=str(path)).model_dump()).shots == 2  # stable through a round trip
    for args, shots in [((), 2), (("--shots", "1"), 1), (("--shots", "0"), 0)]:
        code, out, err = run_cli(capsys, "eval", "--task-file", str(path), "--json", *args)
        assert code == 0, err
        task = json.loads(out)["provenance"]["task"]
        assert task["shots"] == shots and task["name"] == "t" and task["file"] == str(path.resolve())
        assert not {"operation", "style", "digits"} & task.keys()  # what a task file replaces is not claimed


def test_a_task_file_is_read_once_until_it_changes(tmp_path, monkeypatch):
    """The spec's check, the task and the counterfactuals share one read of an unchanged file; an edited file is
    read again (its new content, not the cached one)."""
    import os

    import af1.tasks.files as files

    path = tmp_path / "t.yaml"
    digits = '{values: ["1", "2", "3"]}'
    path.write_text(
        f"name: first\ntemplate: '{{a}}+{{b}}='\nslots: {{a: {digits}, b: {digits}}}\nanswer: {{expr: a + b}}\n"
    )
    parsed = []
    real = files._read_task_file
    monkeypatch.setattr(files, "_read_task_file", lambda p: parsed.append(p) or real(p))
    files._read_once.cache_clear()
    first = files.read_task_file(path)
    assert files.read_task_file(str(path)) is first and len(parsed) == 1
    path.write_text(path.read_text().replace("first", "second"))
    os.utime(path, ns=(1, 1))  # a different modification time even within the clock's resolution
    assert files.read_task_file(path).name == "second" and len(parsed) == 2


def test_a_task_is_read_and_its_layouts_announced_before_the_model_loads(tmp_path, capsys, tokenizer, monkeypatch):
    """Rows whose numbers have 1 and 2 digits make several token layouts: said before any work, with their sizes,
    what is left out and the remedy; a task file's error comes before a model that would fail to load."""
    from conftest import tiny_model

    model_dir = tmp_path / "model"
    tiny_model("llama").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    starts = [*range(1, 10), *range(10, 40), 100, 101, 102]  # 1, 2 and (too few to keep) 3 digits
    rows = "".join(json.dumps({"prompt": f"after {i} comes", "answer": f" {i + 1}"}) + "\n" for i in starts)
    path = write(tmp_path, "next.jsonl", rows)
    code, _, err = run_cli(capsys, "eval", "--model", str(model_dir), "--task-file", str(path))
    notice = next(line for line in err.splitlines() if "token layouts" in line)
    assert code == 0 and notice.startswith("af1: next has ") and "left out" in notice and "largest_layout" in notice
    assert err.index(notice) == 0  # before anything the evaluation says
    import af1.api

    def never(*args, **kwargs):
        raise Af1Error("the model was loaded")

    monkeypatch.setattr(af1.api, "load_model", never)
    bad = write(tmp_path, "bad.csv", "prompt,answer\nx,y\n")
    code, _, err = run_cli(capsys, "eval", "--model", str(model_dir), "--task-file", str(bad), "--shots", "4")
    assert code == 2 and "the model was loaded" not in err and len(err.strip().splitlines()) == 1, err
