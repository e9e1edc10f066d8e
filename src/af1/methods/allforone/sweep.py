"""The (L_wait, L_transfer) grid: faithfulness of every cell, each problem's correctness kept as bits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, with_config

from af1.executors.fast import fast_sweep_wait, grid
from af1.executors.protocol import recorded
from af1.interventions.af1 import AF1Config
from af1.methods.setup import Setup, executors
from af1.progress import note, progress
from af1.results import Part, read_json, write_json
from af1.stats import constant_baseline, rate
from af1.tasks.evaluation import ExecutorChoice, Scores
from af1.tasks.task import ProblemRow


def _bits(correct: torch.Tensor) -> str:
    return "".join("1" if c else "0" for c in correct.tolist())


def unbits(bits: str) -> list[bool]:
    return [c == "1" for c in bits]


@with_config(ConfigDict(extra="forbid"))
class CellBits(ExecutorChoice):
    """One measured cell of the grid: right or wrong on each solved problem, in order ("1"/"0"), and its executor."""

    correct: str


class GridCells(Part):
    """What the search reads of a grid: each cell's bits over the solved problems ("wait,transfer" -> "1"/"0" per
    problem), the problems' targets and token layouts (None: a task of one), and the config every cell shares."""

    cells: dict[str, str]
    targets: list[str]
    kept_layouts: list[int] | None
    config: dict[str, Any]


class Grid(GridCells):
    """Faithfulness of every (wait, transfer) cell (`sweep`): rows L_wait -1..L-1, columns L_transfer 0..L, NaN
    where not measured, with 95 % intervals, the constant guess, and which executor measured each cell and why."""

    waits: list[int]
    transfers: list[int]
    faithfulness_wait_transfer: list[list[float | None]]
    ci_low_wait_transfer: list[list[float | None]]
    ci_high_wait_transfer: list[list[float | None]]
    faithfulness_baseline: float
    cell_executors: dict[str, str]
    cell_fallback_reasons: dict[str, str]
    executor: str
    fallback_reasons: list[str]
    n_cells: int
    kept_problems: list[ProblemRow]


def sweep(
    setup: Setup,
    base_config: AF1Config | None = None,
    max_transfer: int | None = None,
    reference: bool = False,
    state_path: Path | None = None,
) -> Grid:
    """Faithfulness of every (wait, transfer) cell, per problem, with intervals; resumable through `state_path`."""
    base_config = base_config or AF1Config()
    L = setup.adapter.n_layers
    cells = grid(L, max_transfer)
    key = {
        "means": [s.means.key for s in setup.steps],
        "config": base_config.model_dump(exclude={"wait", "transfer"}),
        "kept": [p.text for p in setup.kept.problems],
        "reference": reference,
    }
    done: dict[str, CellBits] = {}
    asked = {f"{w},{k}" for w, k in cells}
    if state_path is not None and state_path.is_file():
        state = read_json(state_path)
        if state.get("key") == key:
            done = state["cells"]  # kept whole in the state; only the asked cells make the grid
            note(f"sweep: resumed {len(asked & done.keys())} of its {len(asked)} cells from {state_path}")
    waits = sorted({w for w, _ in cells})
    for w in progress(waits, desc="sweep"):
        todo = [k for ww, k in cells if ww == w and f"{w},{k}" not in done]
        if not todo:
            continue
        config = base_config.model_copy(update={"wait": w, "transfer": 0})
        chosen = executors(setup, config, reference)
        how = recorded(chosen)
        per_step = []
        for step, (executor, _) in zip(setup.steps, chosen, strict=True):
            if executor.name != "fast":
                per_step.append({k: executor.logits(step, config.model_copy(update={"transfer": k})) for k in todo})
            else:
                per_step.append(
                    fast_sweep_wait(
                        step.adapter, step.kept, config, step.means, todo, greedy=True, kv=step.build_local_kv(config)
                    )
                )
        for k in todo:
            scores = Scores.from_steps(setup.kept, [logits[k] for logits in per_step])
            done[f"{w},{k}"] = CellBits(correct=_bits(scores.correct_P), **how)
        if state_path is not None:
            write_json(state_path, {"key": key, "cells": done})
    done = {cell: bits for cell, bits in done.items() if cell in asked}
    targets, layouts = setup.kept.targets(), setup.kept.layout_P.tolist()
    faith_WX = torch.full((L + 1, L + 1), float("nan"))
    low_WX, high_WX = faith_WX.clone(), faith_WX.clone()
    for cell, value in done.items():
        w, k = map(int, cell.split(","))
        r = rate(unbits(value["correct"]), targets, layouts)
        faith_WX[w + 1, k], (low_WX[w + 1, k], high_WX[w + 1, k]) = r["value"], r["ci"]
    fallbacks = sorted({r for v in done.values() if v["executor"] != "fast" and (r := v["fallback_reason"])})
    ran = {v["executor"] for v in done.values()}
    return Grid(
        config=base_config.model_dump(),
        waits=list(range(-1, L)),
        transfers=list(range(L + 1)),
        faithfulness_wait_transfer=faith_WX.tolist(),
        ci_low_wait_transfer=low_WX.tolist(),
        ci_high_wait_transfer=high_WX.tolist(),
        faithfulness_baseline=constant_baseline(targets, layouts),
        targets=targets,
        cells={cell: v["correct"] for cell, v in done.items()},
        cell_executors={cell: v["executor"] for cell, v in done.items()},
        cell_fallback_reasons={cell: r for cell, v in done.items() if (r := v["fallback_reason"])},
        executor=ran.pop() if len(ran) == 1 else "mixed",
        fallback_reasons=fallbacks,
        n_cells=len(cells),
        kept_problems=setup.kept.rows(),
        kept_layouts=setup.kept.layout_P.tolist() if setup.kept.groups else None,
    )
