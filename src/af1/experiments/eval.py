"""eval: base accuracy of a model on a task: every answer token (or the first), with n, its 95 % interval, the
constant-guess baseline and every problem."""

from __future__ import annotations

import html
from typing import Any

from af1.experiments import base, costs
from af1.report.markup import Tab, layout_tab
from af1.stats import Paired, baseline_warning, mcnemar_exact, rate_text
from af1.tasks.evaluation import decoder, problem_rows
from af1.tasks.task import ProblemRow, TaskShape


class Options(base.Options):
    pass


class Result(base.TaskFields):
    digits: int | None = 1  # None for a task file
    mean_p_correct: float | None = None
    task_layout: TaskShape
    problems: list[ProblemRow] = []


class Eval(base.Experiment):
    name = "eval"
    Options = Options
    Result = Result
    small = {}
    cost = costs.Cost(slowdown=0.5, slowdown_without_bf16=1.2, memory_factor=1.3)

    def evaluation_rows(self, result: dict[str, Any]) -> list[dict[str, Any]] | None:
        return result.get("problems")

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, L = s.on, s.model.layers
        return t.n * (t.suffix + t.steps - 1) * L, t.n * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        spec = inputs.spec
        lm = inputs.resources.lm()
        done = inputs.resources.evaluated(spec)
        task, scores = done.task, done.base
        r = scores.rate(task)
        note = baseline_warning(f"base accuracy ({spec.scoring} scoring)", r["baseline"], r["n"])
        return Result(
            model=lm.info.get("spec"),
            task=spec.name,
            style=spec.style_name,
            shots=spec.shots,
            digits=spec.digits if spec.file is None else None,
            scoring=spec.scoring,
            n=len(task),
            n_solved=r["k"],
            base_accuracy=r,
            mean_p_correct=scores.mean_p_correct,
            warnings=[w for w in (task.sampling_note, task.exclusion_note, task.end_note, note) if w],
            task_layout=task.describe(),
            problems=problem_rows(task, scores, decoder(lm.tokenizer)),
        )

    def tables(self, result: Result) -> list[Tab]:
        r = result
        return [
            Tab(
                ["task", "style", "shots", "scoring", "n", "solved", "base accuracy [95 % CI]", "constant guess"],
                [
                    [
                        r.task,
                        r.style,
                        r.shots,
                        r.scoring,
                        r.n,
                        r.n_solved,
                        rate_text(r.base_accuracy),
                        r.base_accuracy["baseline"],
                    ]
                ],
            ),
            layout_tab("Base accuracy", result.base_accuracy.get("by_layout"), result.task_layout["layouts"]),
        ]

    def section(self, result: Result) -> list[str]:
        return [f"<h2>Base accuracy on <code>{html.escape(result.task)}</code></h2>", *super().section(result)]

    def overview(self, finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
        """Per task, every two models' base accuracy paired on the same problems (exact McNemar)."""
        by_task: dict[str, list[base.Finished]] = {}
        for f in finished:
            by_task.setdefault(f.task, []).append(f)
        pairs, parts = [], []
        for label, runs in by_task.items():
            for i, a in enumerate(runs):
                for b in runs[i + 1 :]:
                    test = paired(a.result, b.result)
                    if test is None:
                        continue
                    pairs.append({"task": label, "models": [a.model, b.model], **test})
                    parts.append(
                        f"<p>Base accuracy of {html.escape(a.model)} and {html.escape(b.model)} on the same "
                        f"{test['n']} problems of <code>{html.escape(label)}</code>: solved by {html.escape(a.model)} "
                        f"only {test['only_first']}, by {html.escape(b.model)} only {test['only_second']}, McNemar p "
                        f"{test['p_value']:.2g} (descriptive: no claim is made of it).</p>"
                    )
        return {"base_accuracy_paired": pairs}, (["<h2>Base accuracy, paired</h2>", *parts] if parts else [])


def paired(a: Result, b: Result) -> Paired | None:
    """Two models' base accuracy on the same problems, paired (exact McNemar); None when their problems differ."""

    if [(p["prompt"], p["answer"]) for p in a.problems] != [(p["prompt"], p["answer"]) for p in b.problems]:
        return None
    test = mcnemar_exact([p.get("solved") is True for p in a.problems], [p.get("solved") is True for p in b.problems])
    return Paired(n=len(a.problems), **test)
