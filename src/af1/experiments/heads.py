"""heads: heads and MLPs that carry the arithmetic: path patching, key heads, knockout, where they look, overlap.
With a counterfactual; top-k against matched random-k knockout, the MLP logit lens, placement against AF1's stages."""

from __future__ import annotations

import html
from typing import Any, Literal

from pydantic import Field
from rich.table import Table
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.experiments.search import searched, searched_config
from af1.methods import allforone, heads
from af1.report import interactive
from af1.report.markup import Tab, figure_html, table_html
from af1.stats import rate_text, with_ci
from af1.tasks.builtin import FILE_STYLE
from af1.tasks.evaluation import ProblemInputs, solved
from af1.tasks.spec import TaskSpec


class Options(base.GatedOptions):
    path: Literal["wang", "direct", "total"] = Field(
        default="wang",
        description="wang: other heads frozen, MLPs recompute; direct: the sender's direct path only; total: "
        "everything downstream recomputes",
    )
    rank: Literal["exact", "attribution"] = Field(
        default="exact",
        description="how heads are chosen on the selection part: exact path patching by `path`, or attribution "
        "patching (its first-order estimate of 'total': one forward and backward, cheaper the larger the model); "
        "the confirmation part's knock-outs and key-head claims stay exact. An estimate can miss a saturating head "
        "(SmolLM2's strongest ranks last): --attribution compares both",
    )
    metric: Literal["share", "relative", "logit_diff"] = Field(
        default="share",
        description="share: heads by the share of the way they move (correct - the counterfactual's answer) towards "
        "the counterfactual run's, key heads claimed against the answer-keeping control (a counterfactual with no "
        "answer, the operator's, falls back to relative and claims no key head); relative: the relative change of "
        "the correct logit; logit_diff: the change of (correct - top wrong) over the clean difference (both "
        "descriptive)",
    )
    threshold: float | None = Field(
        default=None,
        description="where a head is key: a share above it (default 0.05), a relative or logit_diff change below it "
        "(default -0.05)",
    )
    k: int | None = Field(
        default=None, ge=1, description="heads knocked out, top-k vs random-k (default: 10, at most a quarter)"
    )
    draws: int = Field(
        default=39,
        ge=1,
        description="random draws of k heads (from the heads not chosen, matched on place and ablation size); the "
        "top set's rank among them decides the claim with the problems' test: 39 draws reach p 0.025",
    )
    counterfactual: str | None = Field(
        default=None,
        description="built-in tasks: an operand, a, b, ... (replaced per problem by another value of the same token "
        "length, another operand redrawn so that the positions match an answer-keeping control) or operator (a "
        "null symbol or word: no answer, so no key-head claim); a task file replaces the slot it names. It ranks "
        "the key and top heads that are knocked out and compared with AF1 (default: a)",
    )
    rank_both: bool = Field(
        default=True,
        description="built-in tasks: also path-patch with the other counterfactual (the operator beside an operand, "
        "operand a beside the operator) on the same selection part, to show both rankings side by side (path "
        "patching only: about doubles its time, no knock-outs)",
    )
    selection: float = Field(
        default=0.5, gt=0, lt=1, description="share of solved problems heads are chosen on (without a search)"
    )
    split_seed: int = Field(default=0, description="seed of that split (without a search; else the search's)")
    compare: list[str] = Field(default_factory=list, description="other TASK or TASK:STYLE to compare key heads with")
    attribution: bool = Field(
        default=False,
        description="also rank every head by attribution patching and by exact activation patching (path 'total', "
        "which it approximates) on every solved problem, and compare: Spearman's rho with its interval, the top-k "
        "overlap, the time each took",
    )


class Placement(TypedDict):
    """A top head and the AF1 stage its layer belongs to (the search's config)."""

    layer: int
    head: int
    stage: str


class Result(base.Result, heads.study.HeadsStudy):
    """The heads study's part (`heads.study.HeadsStudy`) with, where a search found a cell, the top heads' AF1
    stages and the key heads against AF1's transfer layers, and the exact inputs."""

    placement: list[Placement] | None = None
    af1_consistency: heads.consistency.Consistency | None = None
    attribution: heads.compared.Ranked | None = None  # --attribution
    inputs: ProblemInputs | None = None  # clean; sets: solved, confirmation (AF1 rows)


def compare_specs(spec: TaskSpec, items: list[str]) -> list[TaskSpec]:
    """The other tasks `compare` names (TASK or TASK:STYLE), each like `spec` otherwise; arithmetic, even beside a
    task file."""
    others = []
    for item in items:
        op, _, style = item.partition(":")
        fields = {**spec.model_dump(), "operation": op, "style": style or spec.style, "file": None}
        others.append(TaskSpec.model_validate({**fields, "file_sha256": None}))
    return others


class Heads(base.Experiment):
    name = "heads"
    Options = Options
    Result = Result
    small = {"k": 2, "draws": 2}
    cost = costs.Cost(slowdown=1.33, memory_factor=2.0)

    def uses(self) -> tuple[str, ...]:
        return (base.SEARCH,)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, L, half, draws = s.on, s.model.layers, s.half, options.draws
        ranked = 4 * half * t.step_tokens() * L if options.rank == "attribution" else costs.patching(s.model, t, half)
        patch = ranked * (2 if options.rank_both and not s.from_file else 1)  # a task file ranks once
        compared = sum(costs.patching(s.model, o, o.n / 2) + o.n * (o.suffix + o.steps) * L for o in s.others)
        knockouts = (draws + 2) * half * t.step_tokens() * L
        consistency = 14 * half * t.steps * (L - 1 - max(s.found.wait, 0)) if s.found.transfer else 0
        means = t.n * t.step_tokens() * L
        rows = t.n * t.steps + (draws + 2) * half * t.steps + sum(o.n * o.steps for o in s.others)
        checked = 0.0
        if options.attribution:  # the estimate (clean forward and backward, counterfactual forward), then exact
            solved = s.found.solved
            checked = 4 * solved * t.step_tokens() * L + costs.patching(s.model, t, solved)
            rows += solved * t.steps * (2 + s.model.heads)
        return patch + compared + knockouts + consistency + means + checked, rows, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        spec = inputs.spec
        lm = inputs.resources.lm()
        n_heads = lm.adapter.n_layers * lm.adapter.n_heads
        k = options.k or min(10, n_heads // 4)
        if not 1 <= k <= n_heads // 2:
            raise Af1Error(f"k {k} is out of range: the model has {n_heads} heads, and random-k draws need k others")
        if options.attribution and (reason := lm.adapter.no_attention_interface()) is not None:
            exact = heads.compared.EXACT
            raise Af1Error(f"the exact counterpart, path '{exact}', needs transformers' attention interface ({reason})")
        others = compare_specs(spec, options.compare)
        kind = options.counterfactual or (None if spec.file is not None else "a")
        if spec.file is not None and kind not in (None, "operator"):
            raise Af1Error(
                f"counterfactual {kind!r}: a task file names the slot it replaces (counterfactual: {{slot: ...}})"
            )
        second = None
        if spec.file is None and options.rank_both:
            second = "a" if kind == "operator" else "operator"
        search = searched(inputs)
        split, split_from = (options.selection, options.split_seed), heads.ranking.OWN_SPLIT
        if search is not None:  # the search's split: the heads are chosen on its selection half only
            split, split_from = (search.selection_fraction, search.split_seed), "the search's split"
        done = inputs.resources.evaluated(spec)
        settings = heads.ranking.Settings(
            threshold=options.threshold,
            k=k,
            draws=options.draws,
            path=options.path,
            metric=options.metric,
            split=split,
            split_from=split_from,
            kind=kind,
            ranked_by=options.rank,
        )
        study = heads.study.study(lm, spec, settings, second_kind=second, compare_specs=others, done=done)
        config = searched_config(search) if search is not None else None  # None: no search, or no cell
        kept = solved(done.task, done.base)
        sel, conf = heads.ranking.problem_split(len(kept), split)  # heads chosen on the first, tested on the second
        sets = {"solved": kept, "selection": kept.subset(sel), "confirmation": kept.subset(conf)}
        result = Result.of(study, inputs=ProblemInputs.of(done.task, done.base, **sets))
        if options.attribution:
            result.attribution = heads.compared.estimate_against_exact(lm, kept, kind, k, spec.seed)
        if search is not None and config is not None:  # where the top heads sit among the AF1 stages
            stages = config.stages(lm.adapter.n_layers)
            result.placement = [
                Placement(layer=h[0], head=h[1], stage=next(s for s, layers in stages.items() if h[0] in layers))
                for h in result.top_heads
            ]
            if config.transfer > 0:
                on = allforone.search.confirmation(
                    inputs.resources.setup(spec), search.selection_fraction, search.split_seed
                )
                peek = heads.consistency.Chosen(
                    key=result.key_heads,
                    top=result.top_heads,
                    counterfactual=f"{result.counterfactual_kind} ({result.counterfactual})",
                    draws=options.draws,
                )
                result.af1_consistency = heads.consistency.consistency(on, config, peek)
                result.claims, result.confirmed_key_heads = heads.study.decide(
                    [*result.claims, *result.af1_consistency["claims"]]
                )
        return result

    def overview(self, finished: list[base.Finished]) -> tuple[dict[str, Any], list[str]]:
        """Per model and pair of tasks: how many of the top heads by path patching are the same."""
        by_model: dict[str, dict[str, list[list[int]]]] = {}
        n_heads: dict[str, int] = {}  # per model, heads a layer
        for f in finished:
            by_model.setdefault(f.model, {})[f.task] = f.result.top_heads
            n_heads[f.model] = len(f.result.relative_logit_change_layer_head[0])  # heads a layer
        rows = []
        for model, by_task in by_model.items():
            tasks = sorted(by_task)
            for i, a in enumerate(tasks):
                for b in tasks[i + 1 :]:
                    shared = heads.ranking.overlap(by_task[a], by_task[b], n_heads[model])
                    rows.append({"model": model, "task_a": a, "task_b": b, **shared})
        parts = []
        if rows:
            parts.append(
                "<h2>The same heads across tasks?</h2><p>Per model, the share of the top heads by path patching "
                "that two tasks have in common (top-k overlap), beside what the second's top heads redrawn at random "
                "within their own layers share with the first on average, and the chance of sharing as many or more "
                "that way (p, descriptive: no claim is made of it).</p>"
            )
            parts.append(
                table_html(
                    ["model", "task", "task", "k", "top-k overlap", "by chance", "p (descriptive)"],
                    [
                        [
                            r["model"],
                            r["task_a"],
                            r["task_b"],
                            r["k"],
                            r["top_k_overlap"],
                            r["top_k_overlap_chance"],
                            f"{r['top_k_overlap_p']:.2g}",
                        ]
                        for r in rows
                    ],
                )
            )
        return {"heads_overlap": rows}, parts

    def tables(self, result: Result) -> list[Tab]:
        split = result.split
        named = [f"{layer}.{h}" for layer, h in result.top_heads]
        summary = [
            [
                f"heads past {result.threshold:.0%} by the {result.metric} metric (selection part)",
                f"{len(result.key_heads)} of {result.n_heads} ({result.key_head_share:.1%})",
            ],
            ["key heads confirmed (confirmation part)", heads_text(result.confirmed_key_heads) or "none"],
            ["heads chosen on / tested on", f"{split['n_selection']} / {split['n_confirmation']} solved problems"],
        ]
        tabs = [Tab(["measure", "value"], summary), knockout_tab(result.knockout)]
        second = result.second_counterfactual
        if second and "top_heads" in second:
            ranked = [
                [i + 1, a, f"{b[0]}.{b[1]}"] for i, (a, b) in enumerate(zip(named, second["top_heads"], strict=False))
            ]
            title = (
                f"Top heads by each counterfactual on the same {split['n_selection']} selection problems (the second: "
                f"path patching only; the key heads, knock-outs and AF1 consistency use the first). Top-{len(named)} "
                f"overlap {second['top_k_overlap']:.2f} (redrawn within their layers: "
                f"{second['top_k_overlap_chance']:.2f} on average; Monte Carlo p {second['top_k_overlap_p']:.2g}, "
                "descriptive: not a claim, not adjusted)"
            )
            used = f"{result.counterfactual_kind} ({result.counterfactual}), used"
            other = f"{second['counterfactual_kind']} ({second['counterfactual']})"
            tabs.append(Tab(["rank", used, other], ranked, title=title))
        else:
            tabs.append(Tab(["rank", "top heads"], [[i + 1, h] for i, h in enumerate(named)]))
        if looks := result.attention_of_top_heads:
            kinds = [k for k in next(iter(looks.values())) if any(v.get(k) for v in looks.values())]  # no 0 column
            title = (
                "Where the top heads look: the share of each head's attention from the last position on each kind of "
                'token (per problem the mean over its scored answer steps, then the mean over problems; "after an '
                'operand" is the token that follows one, an operator, "=" or a word)'
            )
            tabs.append(
                Tab(["head (layer.head)", *kinds], [[h, *(v[k] for k in kinds)] for h, v in looks.items()], title)
            )
        if c := result.af1_consistency:
            tabs.append(consistency_tab(c, result.confirmed_key_heads))
        if result.placement:
            stages = [[f"{p['layer']}.{p['head']}", p["stage"]] for p in result.placement]
            tabs.append(
                Tab(["head (layer.head)", "stage"], stages, "The top heads against the AF1 stages of the search")
            )
        if result.overlap:
            k = result.knockout["k"]
            rows = [
                [
                    o["task"],
                    o["style"],
                    o.get("key_heads_jaccard", o.get("error", "")),
                    o.get("top_k_overlap", ""),
                    o.get("top_k_overlap_chance", ""),
                    f"{o['top_k_overlap_p']:.2g}" if "top_k_overlap_p" in o else "",
                ]
                for o in result.overlap
            ]
            tabs.append(
                Tab(
                    ["other task", "style", "key-head Jaccard", f"top-{k} overlap", "by chance", "p (descriptive)"],
                    rows,
                )
            )
        return tabs

    def section(self, result: Result) -> list[str]:
        scored = result.path_patching_scoring
        counterfactual = "slot" if result.style == FILE_STYLE else result.counterfactual_kind
        parts = [
            "<h2>Heads by path patching: chosen on one part, judged on the other</h2>",
            f"<p>{result.model} on <code>{html.escape(result.task)}</code> ({result.style}), counterfactual "
            f"{counterfactual} <code>{html.escape(result.counterfactual)}</code>, {result.n_solved} solved problems, "
            f"split in two ({html.escape(result.split['from'])}): heads are chosen on the selection part and tested on "
            f"the confirmation part. Path patching ({result.path}) scores {html.escape(scored['definition'])} "
            f"(constant guess of what it scores {scored['constant_guess']:.2f}).</p>",
            *(f"<p>{html.escape(line)}</p>" for line in reading(result)),
            *super().section(result),
        ]

        def figures() -> str:
            looks = (
                interactive.attention_plot(result.attention_over_tokens)
                if result.attention_over_tokens
                else "<p class='note'>No head was chosen, so there is no attention per token to show.</p>"
            )
            return interactive.heads_map(result) + interactive.mlp_plot(result) + looks

        parts.append(figure_html(figures))
        return parts + (attribution_section(result.attribution) if result.attribution else [])

    def show(self, result: Result) -> list[Table | str]:
        checked = [attribution_tab(result.attribution).rich()] if result.attribution else []
        return [*reading(result), *super().show(result), *checked]


def attribution_section(ranked: heads.compared.Ranked) -> list[str]:
    """--attribution: how well the first-order estimate ranks every head against exact activation patching,
    with the time each took, the heads it misses and both maps."""
    speed = ranked.exact_seconds / max(ranked.estimate_seconds, 1e-9)
    return [
        "<h2>Attribution patching against exact activation patching (path patching by `total`)</h2>",
        f"<p>Every head's relative change of the correct logit when its output at the last position takes the "
        f"counterfactual's ({html.escape(ranked.counterfactual_kind)}: {html.escape(ranked.counterfactual)}), "
        f"on the same {ranked.n_patched} solved problems: estimated to first order (one forward and backward) and "
        f"measured exactly (path '{ranked.exact_path}': everything downstream recomputes). The estimate took "
        f"{ranked.estimate_seconds:.1f} s, the exact one {ranked.exact_seconds:.1f} s ({speed:.1f} times as long). "
        "The interval of rho resamples the problems.</p>",
        f"<p>{html.escape(strongest(ranked))}</p>",
        figure_html(lambda: interactive.attribution_plot(ranked)),
        attribution_tab(ranked).html(),
    ]


def attribution_tab(ranked: heads.compared.Ranked) -> Tab:
    """The estimate's ranking against the exact one: rho with its interval, the top k shared, the time each took."""
    a = ranked.agreement
    rho = with_ci(a["spearman"], a["spearman_ci"])
    header = ["heads", "problems", "Spearman's rho [95 % CI]", f"top {a['k']} shared", "estimate (s)", "exact (s)"]
    return Tab(header, [[a["n_ranked"], a["n"], rho, a["top_k_shared"], ranked.estimate_seconds, ranked.exact_seconds]])


def strongest(ranked: heads.compared.Ranked, k: int = 3) -> str:
    """The exact ranking's top k heads with their estimates and ranks by the estimate: where a first-order estimate
    misses a strong (saturating) head, it shows here."""
    exact, estimate = (
        {(layer, h): v for layer, row in enumerate(m) for h, v in enumerate(row) if v is not None}
        for m in (ranked.exact_layer_head, ranked.estimate_layer_head)
    )
    by_estimate = {head: i + 1 for i, head in enumerate(sorted(estimate, key=lambda head: estimate[head]))}
    parts = [
        f"{layer}.{h} ({exact[layer, h]:+.4f}; estimated {estimate[layer, h]:+.4f}, rank {by_estimate[layer, h]} of "
        f"{len(estimate)} by the estimate)"
        for layer, h in sorted(exact, key=lambda head: exact[head])[:k]
    ]
    return f"The {k} heads with the strongest exact effect: " + ", ".join(parts) + "."


def heads_text(named: list[list[int]]) -> str:
    return " ".join(f"{layer}.{h}" for layer, h in named)


def reading(result: Result) -> list[str]:
    """What the tables cannot say: why there is no second ranking."""
    second = result.second_counterfactual
    if second and "error" in second:
        return [f"No second counterfactual ({second['counterfactual_kind']}): {second['error']}"]
    return []


def consistency_tab(c: heads.consistency.Consistency, confirmed: list[list[int]]) -> Tab:
    """Faithfulness with the transfer layers' heads peeking or not: the key heads, all, none, random matched sets."""
    chosen = c["key_heads_in_transfer_layers"]
    title = (
        f"Against AF1 ({c['config'].cell}; transfer layers {c['transfer_layers']}, "
        f"{c['n_transfer_heads']} heads, of which {len(chosen)} chosen as key heads on the selection half, "
        f"{sum(h in confirmed for h in chosen)} of them confirmed on the other): faithfulness on {c['n']} problems "
        f"({c['measured_on']}) when in the transfer layers"
    )
    rows = [
        [
            r["variant"],
            r["peeking"],
            rate_text(r["faithfulness"]),
            r["baseline"] if "baseline" in r else r["faithfulness"]["baseline"],
            f"{r['mcnemar_vs_all']['p_value']:.2g}" if r["mcnemar_vs_all"] else "-",
        ]
        for r in c["rows"]
    ]
    headers = ["in the transfer layers", "heads peeking", "faithfulness [95 % CI]", "constant guess", "McNemar p (raw)"]
    return Tab(headers, rows, title)


def knockout_tab(ko: heads.knockouts.Knockout) -> Tab:
    """The top heads knocked out against matched random sets, on the confirmation problems."""
    scored, top = f"accuracy ({ko['scoring']} answer) on {ko['n']} confirmation problems", ko["accuracy_top_k"]
    random = (
        f"{ko['k']} random heads of the same layers and key/value groups ({len(ko['accuracy_random_k'])} draws: "
        f"mean ± std; {ko['top_rank_among_random']} leave as few right as the top set or fewer)"
    )
    return Tab(
        ["knockout (mean ablation, leave-one-out)", f"{scored} (constant guess {top['baseline']:.2f})"],
        [
            [f"top {ko['k']} heads", rate_text(top)],
            [random, rate_text(ko["accuracy_random_k_spread"])],
            ["none", ko["base_accuracy"]],
        ],
    )
