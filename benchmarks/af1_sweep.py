"""The whole (L_wait, L_transfer) grid: fast sweep vs the hook-based path over the same cells; and the grid under
full-answer scoring (every answer token) against first-token scoring of the same problems.

`--reference-cells all` runs the hook-based path on every cell (about half an hour on 2 CPU
cores); the default runs it on every cell of a few L_wait rows spread over the depth and
scales its measured per-cell time to the grid (both numbers are recorded).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("AF1_NO_PROGRESS", "1")

import torch

from af1.executors.fast import grid
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config
from af1.methods import allforone
from af1.methods.setup import make_setup
from af1.tasks.evaluation import Scores, last_logits
from af1.tasks.task import build_task

from common import SPEC, best_of, setup, write


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference-cells", choices=["all", "sample"], default="sample")
    args = parser.parse_args()
    lm, task = setup()
    adapter = lm.adapter
    scores = Scores([[int(t)] for t in task.answer_ids_P], torch.ones(len(task)), torch.ones(len(task)) > 0)
    s = make_setup(lm, task.spec, task, scores, task, cache_means=False)  # every problem, solved or not
    means = s.means
    L = adapter.n_layers
    cells = grid(L)
    t_forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64))
    t0 = time.perf_counter()
    fast = torch.tensor(allforone.sweep.sweep(s).faithfulness_wait_transfer)
    t_fast = time.perf_counter() - t0
    full = build_task(SPEC.model_copy(update={"scoring": "full"}), lm.tokenizer)  # the same problems, every token
    all_right = Scores([list(a) for a in full.answer_tokens], torch.ones(len(full)), torch.ones(len(full)) > 0)
    s_full = make_setup(lm, full.spec, full, all_right, full, cache_means=False)
    t0 = time.perf_counter()
    allforone.sweep.sweep(s_full)
    t_full = time.perf_counter() - t0
    waits = list(range(-1, L)) if args.reference_cells == "all" else [-1, L // 2, L - 2]
    ref_cells = [(w, k) for w, k in cells if w in waits]
    t0 = time.perf_counter()
    mismatches = []
    for w, k in ref_cells:
        logits = reference_logits(adapter, task, AF1Config(wait=w, transfer=k), means)
        value = Scores.from_logits(logits, task.answer_ids_P).accuracy
        if value != float(fast[w + 1, k]):
            mismatches.append({"wait": w, "transfer": k, "reference": value, "fast": float(fast[w + 1, k])})
    t_ref_measured = time.perf_counter() - t0
    t_ref_grid = t_ref_measured * len(cells) / len(ref_cells)
    data = {
        "n_cells": len(cells),
        "reference_cells": len(ref_cells),
        "reference_cells_mode": args.reference_cells,
        "seconds": {
            "plain_forward": t_forward,
            "fast_grid": t_fast,
            "reference_measured": t_ref_measured,
            "reference_grid": t_ref_grid,
            "fast_grid_full_answer": t_full,
        },
        "full_answer_steps": [len(step) for step in full.steps()],
        "full_over_first_token_cost": t_full / t_fast,
        "cost_in_forwards_full_answer": t_full / t_forward,
        "speedup_vs_reference": t_ref_grid / t_fast,
        "cost_in_forwards": t_fast / t_forward,
        "faithfulness_identical_on_reference_cells": not mismatches,
        "mismatches": mismatches,
    }
    print({k: v for k, v in data.items() if k != "mismatches"})
    write("af1_sweep", lm, task, data)


if __name__ == "__main__":
    main()
