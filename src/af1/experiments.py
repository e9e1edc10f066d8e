"""AF1 measurements: faithfulness, the (wait, transfer) grid, search, necessity, alternatives,
input styles, transfer of a config, and head pruning of the transfer layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from af1.allforone import ABLATIONS, AF1Config, reference_logits
from af1.api import problem_rows, require_solved
from af1.errors import Af1Error
from af1.evaluation import Scores, evaluate, solved
from af1.fast import (
    ProblemKV,
    TokenLocalKV,
    context_kv,
    fast_logits,
    fast_sweep_wait,
    grid,
    knockout_logits,
    supports,
    token_local_kv,
)
from af1.interventions.attention import check_maskable
from af1.interventions.masks import ABP_VARIANTS
from af1.interventions.means import PositionMeans, cached_means, means_key
from af1.models import LoadedModel, ModelAdapter
from af1.progress import progress
from af1.results import read_json, write_json
from af1.tasks import Task, TaskSpec, build_task


@dataclass
class Setup:
    """A model and a task, measured: base scores, the solved problems, the position means."""

    lm: LoadedModel
    spec: TaskSpec
    task: Task
    base: Scores
    kept: Task
    means: PositionMeans
    tables: dict[Any, Any] = field(default_factory=dict, repr=False)  # fast-path caches, see `local_kv`

    def context(self) -> ProblemKV:
        """The context's keys/values, computed once per setup."""
        if "context" not in self.tables:
            self.tables["context"] = context_kv(self.adapter, self.kept)
        return self.tables["context"]

    def local_kv(self, config: AF1Config) -> TokenLocalKV:
        """Token-local keys/values after `wait`; they depend only on wait and ablation, so repeated configs
        (pruning, alternatives, moved windows) share them."""
        key = (config.wait, config.ablation)
        if key not in self.tables:
            self.tables[key] = token_local_kv(self.adapter, self.kept, config, self.means, self.context())
        return self.tables[key]

    @property
    def adapter(self) -> ModelAdapter:
        return self.lm.adapter

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.lm.info.get("spec"),
            "task": self.spec.operation,
            "style": self.spec.style,
            "n": len(self.task),
            "n_solved": len(self.kept),
            "base_accuracy": self.base.accuracy,
            "n_layers": self.adapter.n_layers,
            "n_heads": self.adapter.n_heads,
            "context_len": self.task.context_len,
            "n_positions": self.task.n_positions,
        }


def prepare(lm: LoadedModel, spec: TaskSpec, means_path: str | Path | None = None) -> Setup:
    """Build the task, keep the solved problems, and get the position means (cached).

    Refuses attention kernels that cannot take masks before any work is done."""
    check_maskable(lm.adapter)
    task = build_task(spec, lm.tokenizer)
    base = evaluate(lm.model, task)
    require_solved(int(base.correct_P.sum()), spec)
    if means_path is not None:
        means = PositionMeans.load(means_path, expected_key=means_key(lm.adapter, task))
    else:
        means = cached_means(lm.adapter, task)
    return Setup(lm, spec, task, base, solved(task, base), means)


def af1_logits(setup: Setup, config: AF1Config, reference: bool = False) -> torch.Tensor:
    """Logits of the solved problems under AF1: the fast executor unless asked or unsupported."""
    if reference:
        return reference_logits(setup.adapter, setup.kept, config, setup.means, desc="AF1 (reference)")
    if supports(setup.adapter, setup.kept, config) is not None:
        return fast_logits(setup.adapter, setup.kept, config, setup.means)  # falls back to the reference path
    return fast_logits(setup.adapter, setup.kept, config, setup.means, kv=setup.local_kv(config))


def faithfulness(setup: Setup, config: AF1Config, reference: bool = False) -> Scores:
    return Scores.from_logits(af1_logits(setup, config, reference), setup.kept.answer_ids_P)


def run_result(setup: Setup, config: AF1Config, reference: bool = False) -> dict[str, Any]:
    """One AF1 evaluation with every problem listed."""
    config.check(setup.adapter.n_layers, setup.adapter.n_heads)
    scores = faithfulness(setup, config, reference)
    right = dict(zip(setup.kept.problems, scores.correct_P.tolist(), strict=True))
    problems = problem_rows(setup.task, setup.base.correct_P, [right.get(p) for p in setup.task.problems])
    return {
        **setup.describe(),
        "wait": config.wait,
        "transfer": config.transfer,
        "config": config.model_dump(),
        "stages": config.stages(setup.adapter.n_layers),
        "faithfulness": scores.accuracy,
        "mean_p_correct": scores.mean_p_correct,
        "path": "reference" if reference or supports(setup.adapter, setup.kept, config) else "fast",
        "problems": problems,
    }


# --- the grid ------------------------------------------------------------------------------


def sweep(
    setup: Setup,
    base_config: AF1Config | None = None,
    max_transfer: int | None = None,
    reference: bool = False,
    state_path: Path | None = None,
) -> dict[str, Any]:
    """Faithfulness of every (wait, transfer) cell; resumable through `state_path`."""
    base_config = base_config or AF1Config()
    L = setup.adapter.n_layers
    cells = grid(L, max_transfer)
    key = {
        "means": setup.means.key,
        "config": base_config.model_dump(exclude={"wait", "transfer"}),
        "n_solved": len(setup.kept),
    }
    done: dict[str, float] = {}
    if state_path is not None and state_path.is_file():
        state = read_json(state_path)
        if state.get("key") == key:
            done = state["cells"]
    waits = sorted({w for w, _ in cells})
    for w in progress(waits, desc="sweep"):
        todo = [k for ww, k in cells if ww == w and f"{w},{k}" not in done]
        if not todo:
            continue
        config = base_config.model_copy(update={"wait": w, "transfer": 0})
        if reference or supports(setup.adapter, setup.kept, config):
            logits = {
                k: reference_logits(setup.adapter, setup.kept, config.model_copy(update={"transfer": k}), setup.means)
                for k in todo
            }
        else:
            logits = fast_sweep_wait(setup.adapter, setup.kept, config, setup.means, todo, ctx=setup.context())
        for k, lg in logits.items():
            done[f"{w},{k}"] = Scores.from_logits(lg, setup.kept.answer_ids_P).accuracy
        if state_path is not None:
            write_json(state_path, {"key": key, "cells": done})
    faith_WK = torch.full((L + 1, L + 1), float("nan"))
    for cell, value in done.items():
        w, k = map(int, cell.split(","))
        faith_WK[w + 1, k] = value
    return {
        **setup.describe(),
        "config": base_config.model_dump(),
        "waits": list(range(-1, L)),
        "transfers": list(range(L + 1)),
        "faithfulness_wait_transfer": faith_WK,
        "n_cells": len(cells),
        "path": "reference" if reference else "fast",
    }


def search(sweep_result: dict[str, Any], threshold: float = 0.9) -> dict[str, Any]:
    """The AF1 subgraph: the largest wait, then the smallest transfer, with faithfulness >= threshold."""
    if not 0 <= threshold <= 1:
        raise Af1Error(f"--threshold must be in [0, 1], got {threshold}")
    faith = sweep_result["faithfulness_wait_transfer"]
    if not isinstance(faith, torch.Tensor):  # read back from JSON: unmeasured cells are null
        faith = torch.tensor([[float("nan") if v is None else v for v in row] for row in faith])
    L = int(sweep_result["n_layers"])
    found = None
    for w in range(L - 1, -2, -1):
        for k in range(0, L - w):
            value = float(faith[w + 1, k])
            if value == value and value >= threshold:
                found = (w, k, value)
                break
        if found:
            break
    result: dict[str, Any] = {"threshold": threshold, "found": found is not None}
    cells = [(float(faith[w + 1, k]), w, k) for w in range(-1, L) for k in range(L - w)]
    cells = [c for c in cells if c[0] == c[0]]  # measured cells only
    if cells:
        value, w, k = max(cells, key=lambda c: (c[0], c[1], -c[2]))
        result["best"] = {"wait": w, "transfer": k, "faithfulness": value}
    if found:
        w, k, value = found
        config = AF1Config(**{**sweep_result.get("config", {}), "wait": w, "transfer": k})
        result.update(wait=w, transfer=k, faithfulness=value, stages=config.stages(L))
    return result


def components(setup: Setup, waits: list[int], transfer: int = 2) -> dict[str, Any]:
    """CAMA alone (no attention mask) and ABP alone (no ablation, `transfer` peek layers) per L_wait."""
    L = setup.adapter.n_layers
    waits = [w for w in waits if 0 <= w < L]
    cama = {w: faithfulness(setup, AF1Config(wait=w, abp="none")).accuracy for w in progress(waits, desc="CAMA alone")}
    abp = {
        w: faithfulness(setup, AF1Config(wait=w, transfer=min(transfer, L - 1 - w), ablation="none")).accuracy
        for w in progress(waits, desc="ABP alone")
    }
    return {**setup.describe(), "transfer": transfer, "cama_only": cama, "abp_only": abp}


# --- necessity -------------------------------------------------------------------------------


def necessity(setup: Setup, windows: tuple[int, ...] = (1, 2, 4), found: AF1Config | None = None) -> dict[str, Any]:
    """Faithfulness when the last token cannot read the operands in one layer (or a window).

    Also, inside a found AF1, the transfer window moved to every later start.
    """
    L = setup.adapter.n_layers
    answers = setup.kept.answer_ids_P
    per_window: dict[str, list[float]] = {}
    for width in windows:
        sets = [list(range(s, s + width)) for s in range(L - width + 1)]
        logits = knockout_logits(setup.adapter, setup.kept, sets)
        per_window[str(width)] = [Scores.from_logits(lg, answers).accuracy for lg in logits]
    result: dict[str, Any] = {**setup.describe(), "windows": per_window}
    if found is not None and found.transfer > 0:
        shifted = []
        for start in range(found.wait + 1, L - found.transfer + 1):
            config = found.model_copy(update={"transfer_start": start})
            shifted.append({"start": start, "faithfulness": faithfulness(setup, config).accuracy})
        result["shifted_transfer"] = {"wait": found.wait, "transfer": found.transfer, "by_start": shifted}
    return result


# --- alternatives ----------------------------------------------------------------------------


def alternatives(setup: Setup, config: AF1Config) -> dict[str, Any]:
    """At one config: each ablation with ABP as configured, and each ABP variant with CAMA."""
    ablations = {a: faithfulness(setup, config.model_copy(update={"ablation": a})).accuracy for a in ABLATIONS}
    variants = {v: faithfulness(setup, config.model_copy(update={"abp": v})).accuracy for v in ABP_VARIANTS}
    return {
        **setup.describe(),
        "wait": config.wait,
        "transfer": config.transfer,
        "ablations": ablations,
        "abp_variants": variants,
    }


# --- styles and transfer ----------------------------------------------------------------------


def styles_table(
    lm: LoadedModel,
    config: AF1Config,
    base_spec: TaskSpec,
    styles: list[str],
    operations: tuple[str, ...] = ("a+b", "a-b"),
) -> dict[str, Any]:
    """The Table-4 analogue: per style and operation, base accuracy and faithfulness at one config."""
    rows = []
    for style in progress(styles, desc="styles"):
        for op in operations:
            spec = base_spec.model_copy(update={"operation": op, "style": style})
            row: dict[str, Any] = {"style": style, "operation": op}
            try:
                setup = prepare(lm, spec)
            except Af1Error as exc:
                row.update(error=str(exc))
                rows.append(row)
                continue
            row.update(
                base_accuracy=setup.base.accuracy,
                n=len(setup.task),
                n_solved=len(setup.kept),
                faithfulness=faithfulness(setup, config).accuracy,
            )
            rows.append(row)
    return {"wait": config.wait, "transfer": config.transfer, "rows": rows}


def map_config(config: AF1Config, from_layers: int, to_layers: int, by: str) -> AF1Config:
    """A config found on one model, for another: the same layers, or the same relative depth."""
    if by == "absolute":
        wait, transfer = config.wait, config.transfer
    elif by == "relative":
        wait = round((config.wait + 1) * to_layers / from_layers) - 1
        transfer = max(1, round(config.transfer * to_layers / from_layers)) if config.transfer else 0
    else:
        raise Af1Error(f"unknown mapping '{by}': absolute or relative")
    wait = min(wait, to_layers - 1)
    transfer = min(transfer, to_layers - 1 - wait)
    return config.model_copy(update={"wait": wait, "transfer": transfer, "transfer_start": None, "pruned_heads": []})


def transfer_config(setup: Setup, config: AF1Config, from_layers: int) -> dict[str, Any]:
    """Faithfulness on this setup of a config found elsewhere, by absolute layers and by relative depth."""
    out = {
        **setup.describe(),
        "source": {"wait": config.wait, "transfer": config.transfer, "n_layers": from_layers},
    }
    for by in ("absolute", "relative"):
        mapped = map_config(config, from_layers, setup.adapter.n_layers, by)
        out[by] = {
            "wait": mapped.wait,
            "transfer": mapped.transfer,
            "faithfulness": faithfulness(setup, mapped).accuracy,
        }
    return out


# --- head pruning -------------------------------------------------------------------------------


def prune_heads(setup: Setup, config: AF1Config) -> dict[str, Any]:
    """Rank transfer-layer heads by the faithfulness drop when each alone stops peeking; prune in that order."""
    if config.transfer == 0:
        raise Af1Error("head pruning needs a config with transfer layers (--transfer > 0)")
    full = faithfulness(setup, config).accuracy
    heads = [(layer, h) for layer in config.peek_layers() for h in range(setup.adapter.n_heads)]
    single = {}
    for head in progress(heads, desc="rank heads"):
        single[head] = faithfulness(setup, config.model_copy(update={"pruned_heads": [head]})).accuracy
    order = sorted(heads, key=lambda hd: (-single[hd], hd))  # least important first
    curve = [full]
    for i in progress(range(1, len(order) + 1), desc="prune heads"):
        curve.append(faithfulness(setup, config.model_copy(update={"pruned_heads": order[:i]})).accuracy)
    return {
        **setup.describe(),
        "wait": config.wait,
        "transfer": config.transfer,
        "n_transfer_heads": len(heads),
        "faithfulness_full": full,
        "single_head_drop": [{"layer": hd[0], "head": hd[1], "drop": full - single[hd]} for hd in heads],
        "prune_order": [list(hd) for hd in order],
        "faithfulness_vs_pruned": curve,
        "max_pruned_at_95pct": max(i for i, f in enumerate(curve) if f >= 0.95 * full),
    }
