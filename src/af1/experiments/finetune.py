"""finetune: train only the chosen heads; compare with full and random-head fine-tuning on held-out arithmetic and on
text (perplexity, next-token accuracy), from the same weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field
from rich.table import Table

from af1.errors import Af1Error
from af1.experiments import base, costs
from af1.methods import finetune, heads, positional
from af1.report.markup import Tab, claims_html, claims_lines
from af1.tasks.evaluation import Evaluated, ProblemInputs, evaluate, evaluated, solved
from af1.tasks.task import AnswerEnd, build_task

SHOTS_TOKENS = 20  # the worked examples' tokens a fine-tuning row adds to its prompt (its cost)


class Options(base.Options):
    heads: str = Field(
        default="auto",
        description="auto (path patching on the 1-digit task of the same operation and style: other problems, "
        "varied first tokens; for a task file, on its training rows) or LAYER.HEAD,LAYER.HEAD,...",
    )
    k: int = Field(default=10, ge=1, description="heads chosen by --heads auto")
    n_train: int = Field(default=400, ge=1, description="training problems")
    n_val: int = Field(default=100, ge=1, description="validation problems (each variant's learning rate)")
    n_eval: int = Field(default=200, ge=1, description="held-out evaluation problems")
    steps: int = Field(default=200, ge=1, description="optimiser steps")
    lrs: list[float] = Field(default_factory=lambda: [1e-5, 1e-4, 1e-3], description="learning rates tried")
    seeds: int = Field(
        default=5,
        ge=1,
        description="runs per variant at its chosen learning rate (the claims' unit: 5 and 5 runs reach p 1/252)",
    )
    random_draws: int = Field(
        default=5,
        ge=1,
        description="random head sets (seeded draws from the heads not chosen), draw i trained with the i-th seed "
        "(cycling) at the learning rate chosen on the first: mean ± std over draws",
    )


class Result(base.Result, finetune.compare.Compared):
    """Fine-tuning's part (`finetune.compare.Compared`) with where the heads were chosen, the text corpus and the
    exact inputs."""

    heads_chosen_on: dict[str, Any] | None = None
    answer_end: AnswerEnd | None = None  # whether the end of the answer is trained and checked, or why not
    text_corpus: str = ""
    inputs: ProblemInputs | None = None  # sets: train, validation, evaluation (predictions: the base model's)


def parse_heads(text: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """'3.1,10.4' -> [(3, 1), (10, 4)], checked against the model."""
    out = []
    for item in text.split(","):
        layer, _, head = item.strip().partition(".")
        if not (layer.isdigit() and head.isdigit()):
            raise Af1Error(f"heads takes LAYER.HEAD,... or auto, got {item!r}")
        if not (int(layer) < n_layers and int(head) < n_heads):
            raise Af1Error(f"head {item} is out of range: {n_layers} layers x {n_heads} heads")
        out.append((int(layer), int(head)))
    return out


class Finetune(base.Experiment):
    name = "finetune"
    Options = Options
    Result = Result
    small = {"heads": "0.1", "n_train": 6, "n_val": 4, "n_eval": 6, "steps": 2, "lrs": [1e-4], "seeds": 1}
    cost = costs.Cost(slowdown=1.5)
    task_defaults = {"style": "calculate", "digits": 2, "shots": 3}  # worked examples: the end of an answer is checked

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        """Three variants per learning rate, then seeds of each and random draws: forward and backward."""
        runs = 3 * len(options.lrs) + 2 * options.seeds + options.random_draws
        t = s.on
        tokens = float(options.steps) * finetune.train.FinetuneConfig().batch_size * (t.suffix + t.steps + SHOTS_TOKENS)
        return runs * 3 * tokens * s.model.layers, runs * 3 * tokens, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        spec = inputs.spec
        lm = inputs.resources.lm()
        if options.heads == "auto" and spec.file is None and spec.digits == 1:
            raise Af1Error(
                "--heads auto chooses the heads on the 1-digit problems: fine-tune on --digits 2 or more, "
                "or give --heads LAYER.HEAD,..."
            )
        n_eval, n_val = options.n_eval, options.n_val
        n = options.n_train + n_val + n_eval
        everything = build_task(  # every answer token trained and scored, whatever --scoring says
            spec.model_copy(update={"n": None, "n_max": n, "answer_digits": "any", "scoring": "full"}), lm.tokenizer
        )
        if n > len(everything):
            raise Af1Error(
                f"{options.n_train} + {n_val} + {n_eval} problems asked, the task has {len(everything)}: "
                + ("use more --digits" if spec.file is None else "use smaller --n-train, --n-val or --n-eval")
            )
        eval_task = everything.subset(list(range(n_eval)))
        val_task = everything.subset(list(range(n_eval, n_eval + n_val)))
        train_task = everything.subset(list(range(n_eval + n_val, n)))
        problems = ProblemInputs.of(  # before any training: the base model's predictions
            everything,
            evaluate(lm.model, everything),
            train=train_task,
            validation=val_task,
            evaluation=eval_task,
        )
        chosen_on = None
        if options.heads == "auto":  # built-in: other problems whose first answer tokens vary (1-digit operands)
            if spec.file is None:
                heads_spec = spec.model_copy(update={"digits": 1, "n": None, "scoring": "full"})
                done = evaluated(lm.model, lm.tokenizer, heads_spec)
                on = "other problems: the 1-digit task of the same operation and style"
            else:  # a file: its training rows, never the validation or evaluation ones
                heads_spec = train_task.spec
                done = Evaluated(train_task, evaluate(lm.model, train_task), id(lm.model))
                on = "the training rows"
            found = heads.ranking.choose_heads(lm, done, options.k)  # every answer step of all its solved problems
            chosen = found["top_heads"]
            chosen_on = {
                "task": heads_spec.model_dump(),
                "problems": on,
                "n_solved": found["n_solved"],
                "path": found["path"],
                "scoring": found["scoring"],
                "inputs": ProblemInputs.of(done.task, done.base, solved=solved(done.task, done.base)).model_dump(),
            }
        else:
            chosen = parse_heads(options.heads, lm.adapter.n_layers, lm.adapter.n_heads)
        text = positional.corpus.corpus_windows(lm.adapter, lm.tokenizer, positional.corpus.load_corpus(), 128, 8)
        config = finetune.train.FinetuneConfig(steps=options.steps, seed=spec.seed)
        result = finetune.compare.compare(
            lm.adapter,
            finetune.compare.Problems(train_task, val_task, eval_task),
            text,
            chosen,
            config,
            finetune.compare.Grid(
                tuple(options.lrs), tuple(range(spec.seed, spec.seed + options.seeds)), options.random_draws
            ),
            inputs.state_dir,
        )
        return Result.of(
            result,
            heads_chosen_on=chosen_on,
            answer_end=everything.end,
            text_corpus=positional.corpus.CORPUS_SOURCE,
            inputs=problems,
            warnings=[everything.end_note] if everything.end_note else [],
        )

    def section(self, result: Result) -> list[str]:
        return [
            "<h2>Precise fine-tuning</h2>",
            f"<p>{len(result.heads)} heads; {result.gqa}. {result.n_train} training problems, {result.n_val} "
            f"validation problems (each variant's learning rate), {result.n_eval} held-out (constant guess "
            f"{result.arithmetic_baseline}); every answer token trained and scored, {end_text(result.answer_end)}; "
            "text measure on "
            f"{result.text_corpus}. Mean ± std over seeds (random heads: over "
            f"{result.random_heads.get('draws', 1)} seeded draws of heads, none of the chosen ones).</p>",
            *(t.html() for t in self.tables(result)),
            *(
                f"<p class='note'>{v}: the chosen learning rate {r['lr']} is the grid's edge "
                f"({min(result.lr_grid)} to {max(result.lr_grid)}): a wider grid may do better.</p>"
                for v, r in variants(result).items()
                if r.get("lr_at_edge")
            ),
            claims_html(result.claims),
        ]

    def tables(self, result: Result) -> list[Tab]:
        headers = ["variant", "lr", "arithmetic accuracy", "perplexity", "next-token accuracy", "trained parameters"]
        return [Tab(headers, [row(r, v) for v, r in variants(result).items()])]

    def show(self, result: Result) -> list[Table | str]:
        edges = [v for v, r in variants(result).items() if r.get("lr_at_edge")]
        edge = [f"learning rate at the grid's edge for {', '.join(edges)}: a wider grid may do better"] if edges else []
        return [
            *(t.rich() for t in self.tables(result)),
            *edge,
            *claims_lines(result.claims, "claims (one family, Holm)"),
        ]


def end_text(end: AnswerEnd | None) -> str:
    """Whether the end of the answer is trained and checked, in words."""
    if end is None:
        return "whether the end of the answer is trained and checked is not recorded"
    if end["checked"]:
        return f"and the end of the answer (the token after it, {end['separator']!r}, trained and checked)"
    return f"but not the end of the answer ({end['note']})"


def variants(result: Result) -> dict[str, Mapping[str, Any]]:
    """The base model's measures and each tuned variant's, by name."""
    return {"base": result.base, "precise": result.precise, "random_heads": result.random_heads, "full": result.full}


def row(r: Mapping[str, Any], name: str) -> list[Any]:
    """One variant: its learning rate and each measure as mean ± std over seeds (the base model: one value)."""

    def cell(key: str, fmt: str) -> str:
        spread = f" ± {r[key + '_std']:{fmt}}" if key + "_std" in r else ""
        return f"{r[key]:{fmt}}{spread}"

    return [
        name,
        "-" if r.get("lr") is None else f"{r['lr']:g}",
        cell("arithmetic_accuracy", ".3f"),
        cell("perplexity", ".2f"),
        cell("next_token_accuracy", ".3f"),
        r.get("trained_parameters", 0),
    ]
