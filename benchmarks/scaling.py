"""How time and memory grow with the number of problems and with the model (issue 26): for each model and n, one
fresh process measures, in order, a plain forward of the n prompts, the evaluation, the CAMA means (their seeded
sample), one AF1 configuration, the grid and the heads study, each as wall time and the process's peak RSS so far.
Every stage's time is also given as a ratio to the plain forward of the same problems in the same process.

    python benchmarks/scaling.py                       # SmolLM2 and Qwen-0.5B, n 100..3000, and a tiny model
    python benchmarks/scaling.py --models smollm2 --ns 100 300

The task is the issue's: 2-digit a+b, `calculate`, 3 shots, full answers. The grid (max transfer 2) and the heads
study grow with the solved problems at many forwards each, so they run only up to --grid-max-n / --heads-max-n.
A random-weight model solves nothing, so only its plain forward and evaluation are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AF1_NO_PROGRESS", "1")

RESULTS = Path(__file__).parent / "results"
CONFIGS = {"smollm2": (19, 4), "qwen0.5b": (15, 1)}  # each model's searched cell on the demo task
TINY = "tiny-llama"


def load(name: str) -> Any:
    """A bundled model, or a tiny random-weight Llama with SmolLM2's tokenizer (the size axis' small end)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from af1 import load_model
    from af1.models.adapter import ModelAdapter
    from af1.models.loading import LoadedModel

    if name != TINY:
        return load_model(name)
    smol = load_model("smollm2")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(smol.tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(config).eval()
    info = {"spec": TINY, "description": "random weights, 4 layers, D 64"}
    return LoadedModel(model, smol.tokenizer, ModelAdapter(model), info)


def measure_one(name: str, n: int, grid: bool, heads: bool) -> dict[str, Any]:
    """Every stage on one model and n, in this process: seconds, peak RSS so far, ratio to the plain forward."""
    from af1.experiments.heads import Options as HeadsOptions
    from af1.interventions.af1 import AF1Config
    from af1.methods import heads as heads_method
    from af1.methods.allforone.faithfulness import faithfulness
    from af1.methods.allforone.sweep import sweep
    from af1.methods.setup import make_setup
    from af1.progress import max_rss_mb, peak_memory
    from af1.tasks.evaluation import evaluated, last_logits
    from af1.tasks.means_sample import distribution_task
    from af1.tasks.spec import TaskSpec

    t0 = time.perf_counter()
    lm = load(name)
    stages: dict[str, dict[str, float]] = {}
    rss_loaded = max_rss_mb()
    load_seconds = time.perf_counter() - t0
    spec = TaskSpec(operation="a+b", digits=2, n=n, style="calculate", shots=3)

    def timed(stage: str, fn: Any) -> Any:
        with peak_memory() as peak:
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
        stages[stage] = {"seconds": seconds, "peak_rss_mb": max_rss_mb(), "own_peak_rss_mb": peak[0].mb}
        return out

    done = timed("eval", lambda: evaluated(lm.model, lm.tokenizer, spec))
    task = done.task
    timed("plain_forward", lambda: last_logits(lm.model, task.input_ids_PT, context_len=task.context_len))
    n_solved = int(done.base.correct_P.sum())
    dist = distribution_task(spec, lm.tokenizer, task)
    if n_solved >= 2:  # the means (one forward per sampled problem) are those of the solved problems' steps
        setup = timed("means", lambda: make_setup(lm, spec, task, done.base, dist, cache_means=False))
        wait, transfer = CONFIGS.get(name, (0, 1))
        timed("one_config", lambda: faithfulness(setup, AF1Config(wait=wait, transfer=transfer)))
        if grid:
            timed("grid", lambda: sweep(setup, AF1Config(), max_transfer=2))
        if heads:
            o = HeadsOptions()  # the heads study's defaults, with 3 random sets
            split = (o.selection, o.split_seed)
            timed(
                "heads",
                lambda: heads_method.study.study(
                    lm,
                    spec,
                    heads_method.ranking.Settings(
                        threshold=o.threshold,
                        k=10,
                        draws=3,
                        path=o.path,
                        metric=o.metric,
                        split=split,
                        split_from=heads_method.ranking.OWN_SPLIT,
                        kind=o.counterfactual,
                    ),
                    second_kind=None,  # the benchmark times one ranking
                    compare_specs=[],
                    done=done,
                ),
            )
    forward = stages["plain_forward"]["seconds"]
    for stage in stages.values():
        stage["over_plain_forward"] = stage["seconds"] / forward
    return {
        "model": name,
        "n": n,
        "n_solved": n_solved,
        "n_means_problems": len(dist),
        "tokens_per_prompt": task.n_positions,
        "layers": lm.adapter.n_layers,
        "parameters_m": sum(p.numel() for p in lm.model.parameters()) / 1e6,
        "load_seconds": load_seconds,
        "rss_after_load_mb": rss_loaded,
        "stages": stages,
    }


def run_child(name: str, n: int, grid: bool, heads: bool) -> dict[str, Any]:
    """One measurement in a fresh process, so its peak RSS is its own."""
    args = (
        [sys.executable, __file__, "--one", name, str(n)]
        + (["--grid"] if grid else [])
        + (["--heads"] if heads else [])
    )
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"model": name, "n": n, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    """Seconds and peak RSS against n, one line per model and stage (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"smollm2": "-", "qwen0.5b": "--", TINY: ":"}
    stages = ["plain_forward", "eval", "means", "one_config", "grid", "heads"]
    colors = {stage: plt.get_cmap("tab10")(i) for i, stage in enumerate(stages)}
    for model in dict.fromkeys(r["model"] for r in rows if "stages" in r):
        mine = sorted((r for r in rows if r["model"] == model and "stages" in r), key=lambda r: r["n"])
        for stage in stages:
            pts = [(r["n"], r["stages"][stage]) for r in mine if stage in r["stages"]]
            if not pts:
                continue
            ns = [p[0] for p in pts]
            kw = {"color": colors[stage], "linestyle": styles.get(model, "-"), "marker": "o", "markersize": 3}
            ax_t.plot(ns, [p[1]["seconds"] for p in pts], label=f"{model} {stage}", **kw)
            ax_m.plot(ns, [p[1].get("own_peak_rss_mb", p[1]["peak_rss_mb"]) for p in pts], **kw)
    for ax, label in ((ax_t, "wall seconds"), (ax_m, "peak RSS of the stage, MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("problems (n)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=6, ncol=2)
    fig.suptitle("af1 cost against n (2-digit a+b, calculate, 3 shots; 2 CPU cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description="How time and memory grow with n and the model.")
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen0.5b", TINY])
    parser.add_argument("--ns", nargs="+", type=int, default=[100, 300, 1000, 3000])
    parser.add_argument("--grid-max-n", type=int, default=300)
    parser.add_argument("--heads-max-n", type=int, default=100)
    parser.add_argument("--max-n", nargs="*", default=["qwen0.5b=1000"], help="MODEL=N: a model's largest n")
    parser.add_argument("--out", default="scaling", help="the results' name: benchmarks/results/OUT.json and .png")
    parser.add_argument(
        "--merge", action="store_true", help="keep OUT.json's other rows (same machine): add or replace these only"
    )
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--grid", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--heads", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.grid, args.heads)))
        return
    from af1.results import read_json, write_json

    from common import machine

    caps = {k: int(v) for k, v in (item.split("=") for item in args.max_n)}
    rows = []
    for model in args.models:
        for n in args.ns:
            if n > caps.get(model, n):
                continue
            row = run_child(model, n, n <= args.grid_max_n, n <= args.heads_max_n)
            rows.append({**row, "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv])})
            print(
                json.dumps({k: v for k, v in row.items() if k != "stages"}),
                {s: round(v["seconds"], 1) for s, v in row.get("stages", {}).items()},
            )
    RESULTS.mkdir(exist_ok=True)
    if args.merge and (RESULTS / f"{args.out}.json").is_file():
        measured = {(r["model"], r["n"]) for r in rows}
        kept = [r for r in read_json(RESULTS / f"{args.out}.json")["rows"] if (r["model"], r["n"]) not in measured]
        order = {m: i for i, m in enumerate([TINY, "smollm2", "qwen0.5b"])}
        rows = sorted(kept + rows, key=lambda r: (order.get(r["model"], len(order)), r["n"]))
    figure(rows, RESULTS / f"{args.out}.png")
    data = {
        "benchmark": "scaling",
        "task": "a+b, 2 digits, calculate, 3 shots, full answers (end checked)",
        "machine": "per row (a merged file may hold rows of several machines: compare ratios, not seconds)",
        "grid": "max transfer 2, only for n <= --grid-max-n",
        "heads": "path patching (wang, the operator counterfactual, one ranking) + knock-outs (top 10, 3 random sets), "
        "n <= --heads-max-n",
        "rss": "peak_rss_mb: the measuring process's peak RSS after each stage (stages run in the order listed; "
        "monotone); own_peak_rss_mb: the stage's own peak (the high-water mark reset at its start; what it holds "
        "from earlier stages, the model first, included)",
        "rows": rows,
    }
    print(f"wrote {write_json(RESULTS / f'{args.out}.json', data)}")


if __name__ == "__main__":
    main()
