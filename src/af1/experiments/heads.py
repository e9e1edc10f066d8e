"""heads: the arithmetic heads (path patching with a counterfactual operator), key heads, top-k against random-k
knockout, where the top heads look, the MLP logit lens, overlap with other tasks, placement against AF1's stages."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.table import Table

from af1 import heads
from af1.errors import Af1Error
from af1.experiments import base
from af1.report.markup import ci_text, image_html, table_html, with_ci
from af1.tasks import TaskSpec


class Options(base.GatedOptions):
    threshold: float = Field(default=-0.05, description="relative logit change that makes a key head")
    k: int | None = Field(
        default=None, ge=1, description="heads knocked out, top-k vs random-k (default: 10, at most a quarter)"
    )
    draws: int = Field(default=5, ge=1, description="random draws of k heads")
    compare: list[str] = Field(default_factory=list, description="other TASK or TASK:STYLE to compare key heads with")


class Result(base.Result):
    model: str | None = None
    task: str
    style: str
    n_solved: int
    n_heads: int
    threshold: float
    counterfactual: str
    key_heads: list[list[int]]
    key_head_share: float
    top_heads: list[list[int]]
    knockout: dict
    attention_of_top_heads: dict = {}
    overlap: list[dict] = []
    placement: list[dict] | None = None


class Heads(base.Experiment):
    name = "heads"
    help = "Heads and MLPs that carry the arithmetic: path patching, key heads, knockout, where they look, overlap."
    Options = Options
    Result = Result
    figure = "heads.png"

    def needs(self, options: Options) -> tuple[str, ...]:
        return ("search",) if options.require_found else ()

    def uses(self) -> tuple[str, ...]:
        return ("search",)

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        base.check_found(inputs, options)
        spec = inputs.spec
        lm = inputs.resources.lm()
        n_heads = lm.adapter.n_layers * lm.adapter.n_heads
        k = options.k or min(10, n_heads // 4)
        if not 1 <= k <= n_heads // 2:
            raise Af1Error(f"--k {k} is out of range: the model has {n_heads} heads, and random-k draws need k others")
        others = []
        for item in options.compare:
            op, _, style = item.partition(":")
            others.append(TaskSpec.model_validate({**spec.model_dump(), "operation": op, "style": style or spec.style}))
        result = Result(
            **heads.study(lm, spec, options.threshold, k, options.draws, others, done=inputs.resources.evaluated(spec))
        )
        search = inputs.one("search")
        config = base.searched_config(search) if search is not None else None
        if config is not None:  # where the top heads sit among the AF1 stages
            stages = config.stages(lm.adapter.n_layers)
            result.placement = [
                {"layer": h[0], "head": h[1], "stage": next(s for s, layers in stages.items() if h[0] in layers)}
                for h in result.top_heads
            ]
        return result

    def overview(self, finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
        """Per model and pair of tasks: how many of the top heads by path patching are the same."""
        by_model: dict[str, dict[str, list[list[int]]]] = {}
        for f in finished:
            by_model.setdefault(f.model, {})[f.task] = f.result.top_heads
        rows = []
        for model, by_task in by_model.items():
            tasks = sorted(by_task)
            for i, a in enumerate(tasks):
                for b in tasks[i + 1 :]:
                    rows.append({"model": model, "task_a": a, "task_b": b, **heads.overlap(by_task[a], by_task[b])})
        parts = []
        if rows:
            parts.append(
                "<h2>The same heads across tasks?</h2><p>Per model, the share of the top heads by path patching "
                "that two tasks have in common (top-k overlap).</p>"
            )
            parts.append(
                table_html(
                    ["model", "task", "task", "k", "top-k overlap"],
                    [[r["model"], r["task_a"], r["task_b"], r["k"], r["top_k_overlap"]] for r in rows],
                )
            )
        return {"heads_overlap": rows}, parts

    def draw(self, result: Result, out_dir: Path, inputs: base.Inputs) -> Path:
        from af1.report import figures  # matplotlib: only when drawing

        return figures.heads_figures(result.data(), out_dir / "heads.png")

    def section(self, result: Result, out_dir: Path) -> list[str]:
        ko = result.knockout
        parts = [
            "<h2>Arithmetic heads</h2>",
            f"<p>{result.model} on <code>{html.escape(result.task)}</code> ({result.style}), counterfactual operator "
            f"<code>{html.escape(result.counterfactual)}</code>, {result.n_solved} solved problems. "
            f"{len(result.key_heads)} of {result.n_heads} heads ({result.key_head_share:.1%}) change the correct "
            f"logit by less than {result.threshold:.0%} through their direct path.</p>",
            table_html(
                [
                    "knockout (mean ablation)",
                    f"first-token accuracy on {ko['n']} solved problems (constant guess {ko['accuracy_baseline']:.2f})",
                ],
                [
                    [f"top {ko['k']} heads", with_ci(ko["accuracy_top_k"], ko["accuracy_top_k_ci"])],
                    [f"{ko['k']} random heads (mean of {len(ko['accuracy_random_k'])})", ko["accuracy_random_k_mean"]],
                    ["none", ko["base_accuracy"]],
                ],
            ),
        ]
        looks = result.attention_of_top_heads
        if looks:
            parts.append(
                table_html(
                    ["head (layer.head)", *next(iter(looks.values())).keys()],
                    [[h, *v.values()] for h, v in looks.items()],
                )
            )
        if result.placement:
            parts.append("<p>The top heads against the AF1 stages of the model's search:</p>")
            parts.append(
                table_html(
                    ["head (layer.head)", "stage"],
                    [[f"{p['layer']}.{p['head']}", p["stage"]] for p in result.placement],
                )
            )
        if result.overlap:
            parts.append(
                table_html(
                    ["other task", "style", "key-head Jaccard", f"top-{ko['k']} overlap"],
                    [
                        [
                            o["task"],
                            o["style"],
                            o.get("key_heads_jaccard", o.get("error", "")),
                            o.get(f"top_{ko['k']}_overlap", ""),
                        ]
                        for o in result.overlap
                    ],
                )
            )
        parts.append(image_html(out_dir, "heads.png"))
        return parts

    def show(self, result: Result) -> list[Table | str]:
        ko = result.knockout
        table = Table("measure", "value")
        table.add_row(
            "heads past the threshold", f"{len(result.key_heads)} of {result.n_heads} ({result.key_head_share:.1%})"
        )
        table.add_row(
            f"first-token accuracy, top {ko['k']} heads mean-ablated (n {ko['n']}, constant guess "
            f"{ko['accuracy_baseline']:.2f})",
            ci_text(ko["accuracy_top_k"], ko["accuracy_top_k_ci"]),
        )
        table.add_row(
            f"accuracy, {ko['k']} random heads (mean ± std)",
            f"{ko['accuracy_random_k_mean']:.3f} ± {ko['accuracy_random_k_std']:.3f}",
        )
        return [table]
