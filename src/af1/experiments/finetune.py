"""finetune: train only the chosen heads' slices (precise), against random heads and the full model, from the same
weights; arithmetic accuracy on held-out problems and the text cost (perplexity, next-token accuracy)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from rich.table import Table

from af1 import finetune, heads, positional
from af1.errors import Af1Error
from af1.experiments import base
from af1.report.markup import table_html
from af1.tasks import build_task

VARIANTS = ("base", "precise", "random_heads", "full")


class Options(base.Options):
    heads: str = Field(default="auto", description="auto (path patching) or LAYER.HEAD,LAYER.HEAD,...")
    k: int = Field(default=10, ge=1, description="heads chosen by --heads auto")
    n_train: int = Field(default=400, ge=1, description="training problems")
    n_eval: int = Field(default=200, ge=1, description="held-out evaluation problems")
    steps: int = Field(default=200, ge=1, description="optimiser steps")
    lr: float = Field(default=1e-4, gt=0, description="learning rate")


class Result(base.Result):
    heads: list[list[int]]
    gqa: str
    n_train: int
    n_eval: int
    text_corpus: str = ""
    base: dict
    precise: dict
    random_heads: dict
    full: dict


def parse_heads(text: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """'3.1,10.4' -> [(3, 1), (10, 4)], checked against the model."""
    out = []
    for item in text.split(","):
        layer, _, head = item.strip().partition(".")
        if not (layer.isdigit() and head.isdigit()):
            raise Af1Error(f"--heads takes LAYER.HEAD,... or auto, got {item!r}")
        if not (int(layer) < n_layers and int(head) < n_heads):
            raise Af1Error(f"head {item} is out of range: {n_layers} layers x {n_heads} heads")
        out.append((int(layer), int(head)))
    return out


class Finetune(base.Experiment):
    name = "finetune"
    help = "Train only the chosen heads; compare with full and random-head fine-tuning on math and on text."
    Options = Options
    Result = Result
    task_defaults = {"style": "calculate", "digits": 2}

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        spec = inputs.spec
        lm = inputs.resources.lm()
        n = options.n_train + options.n_eval
        everything = build_task(spec.model_copy(update={"n": None, "n_max": n, "answer_digits": "any"}), lm.tokenizer)
        if n > len(everything):
            raise Af1Error(
                f"{options.n_train} + {options.n_eval} problems asked, the task has {len(everything)}: "
                "use more --digits"
            )
        eval_task = everything.subset(list(range(options.n_eval)))
        train_task = everything.subset(list(range(options.n_eval, n)))
        if options.heads == "auto":
            found = heads.study(lm, spec.model_copy(update={"n": min(100, len(everything))}), k=options.k, draws=1)
            chosen = [(h[0], h[1]) for h in found["top_heads"]]
        else:
            chosen = parse_heads(options.heads, lm.adapter.n_layers, lm.adapter.n_heads)
        text = positional.corpus_windows(lm.adapter, lm.tokenizer, positional.load_corpus(), 128, 8)
        config = finetune.FinetuneConfig(steps=options.steps, lr=options.lr, seed=spec.seed)
        result = finetune.compare(lm.adapter, train_task, eval_task, text, chosen, config, inputs.state_dir)
        return Result(**result, text_corpus=positional.CORPUS_SOURCE)

    def section(self, result: Result, out_dir: Path) -> list[str]:
        data = result.data()
        return [
            "<h2>Precise fine-tuning</h2>",
            f"<p>{len(result.heads)} heads; {result.gqa}. {result.n_train} training problems, {result.n_eval} "
            f"held-out; text measure on {result.text_corpus}.</p>",
            table_html(
                ["variant", "arithmetic accuracy", "perplexity", "next-token accuracy", "trained parameters"],
                [
                    [
                        v,
                        data[v]["arithmetic_accuracy"],
                        data[v]["perplexity"],
                        data[v]["next_token_accuracy"],
                        data[v].get("trained_parameters", 0),
                    ]
                    for v in VARIANTS
                ],
            ),
        ]

    def show(self, result: Result) -> list[Table | str]:
        data = result.data()
        table = Table("variant", "arithmetic accuracy", "perplexity", "next-token accuracy", "trained parameters")
        for name in VARIANTS:
            r = data[name]
            table.add_row(
                name,
                f"{r['arithmetic_accuracy']:.3f}",
                f"{r['perplexity']:.2f}",
                f"{r['next_token_accuracy']:.3f}",
                str(r.get("trained_parameters", 0)),
            )
        return [table]
