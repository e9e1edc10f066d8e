"""AF1 measurements: faithfulness, the (wait, transfer) grid, search with a confirmation split, necessity,
alternatives, input styles, transfer of a config, and head pruning of the transfer layers.

Every rate carries its n, a 95 % Wilson interval and the constant-guess baseline on the same
problems (`af1.stats.rate`); every measurement is scored over all answer steps of the task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import (
    CONFIRMED,
    NOT_CONFIRMED,
    Claim,
    adjust,
    capped,
    paired_differs,
    paired_greater,
    rate_above,
    rate_below,
    rate_reaches,
)
from af1.errors import Af1Error
from af1.executors.fast import (
    fast_pruned_logits,
    fast_sweep_wait,
    grid,
    knockout_logits,
    supports,
)
from af1.executors.protocol import af1_logits, choose_executor
from af1.interventions.af1 import ABLATIONS, AF1Config
from af1.interventions.masks import ABP_VARIANTS
from af1.methods.setup import Setup, prepare, setup_executor
from af1.models import LoadedModel
from af1.progress import note, progress
from af1.results import read_json, write_json
from af1.stats import (
    LayoutRate,
    McNemar,
    Rate,
    baseline_warning,
    constant_baseline,
    mcnemar_exact,
    mean_std,
    rate,
    split_indices,
)
from af1.tasks.evaluation import ExecutorChoice, ProblemInputs, Scores, decoder
from af1.tasks.spec import TaskSpec
from af1.tasks.task import ProblemRow

RESAMPLE_SEEDS = 5


def faithfulness(setup: Setup, config: AF1Config, reference: bool = False) -> Scores:
    """Scores of the solved problems under AF1, every answer step under the same intervention."""
    scores = Scores.from_steps(setup.kept, [af1_logits(step, config, reference) for step in setup.steps])
    scores.executor = setup_executor(setup, config, reference)
    return scores


@with_config(ConfigDict(extra="forbid"))
class Faithfulness(TypedDict):
    """Faithfulness on the solved problems with its interval, constant guess and n (each layout's part, for a task
    of several), and the executor that measured it (absent where several configs ran in one batched pass)."""

    faithfulness: float
    faithfulness_ci: list[float]
    faithfulness_baseline: float
    faithfulness_n: int
    faithfulness_by_layout: NotRequired[list[LayoutRate]]
    executor: NotRequired[str]
    fallback_reason: NotRequired[str | None]


def faith_fields(setup: Setup, scores: Scores) -> Faithfulness:
    """Faithfulness, its interval, baseline and n on the solved problems, with the executor that ran it."""
    r = scores.rate(setup.kept)
    fields = Faithfulness(
        faithfulness=r["value"], faithfulness_ci=r["ci"], faithfulness_baseline=r["baseline"], faithfulness_n=r["n"]
    )
    if "by_layout" in r:
        fields["faithfulness_by_layout"] = r["by_layout"]
    if scores.executor is not None:
        fields["executor"], fields["fallback_reason"] = scores.executor["executor"], scores.executor["fallback_reason"]
    return fields


def problem_rows(setup: Setup, intervened: Scores | None = None) -> list[ProblemRow]:
    """Every problem as fed (text and ids), whether the full model solved it, and how it fared under AF1."""
    rows = setup.task.rows()
    under = {}
    if intervened is not None:
        under = {
            id(p): (bool(c), pred)
            for p, c, pred in zip(setup.kept.problems, intervened.correct_P, intervened.predicted_PA, strict=True)
        }
    decode = decoder(setup.lm.tokenizer)
    for i, row in enumerate(rows):
        row["solved"] = bool(setup.base.correct_P[i])
        row["predicted_tokens"] = setup.base.predicted_PA[i]
        row["predicted_text"] = decode(row["predicted_tokens"])
        if intervened is not None:
            hit = under.get(id(setup.task.problems[i]))
            row["right_under_intervention"] = None if hit is None else hit[0]
            row["predicted_tokens_under_intervention"] = None if hit is None else hit[1]
            row["predicted_text_under_intervention"] = None if hit is None else decode(hit[1])
    return rows


def setup_inputs(setup: Setup, **halves: Setup) -> ProblemInputs:
    """The inputs of a result measured on a setup: every evaluated problem, the solved ones, and each further set
    its numbers were measured on (a split's half, `Setup.on`), by name."""
    return ProblemInputs.of(setup.task, setup.base, solved=setup.kept, **{k: h.kept for k, h in halves.items()})


@with_config(ConfigDict(extra="forbid", arbitrary_types_allowed=True))
class AtConfig(Faithfulness):
    """One AF1 configuration measured (`run_result`): its layers and stages, faithfulness with the executor that
    ran it, the mean probability of the correct answer, and every problem with its prediction under AF1."""

    wait: int
    transfer: int
    config: AF1Config
    stages: dict[str, list[int]]
    mean_p_correct: float
    problems: list[ProblemRow]


def run_result(setup: Setup, config: AF1Config, reference: bool = False) -> AtConfig:
    """One AF1 evaluation with every problem listed."""
    config.check(setup.adapter.n_layers, setup.adapter.n_heads)
    scores = faithfulness(setup, config, reference)
    return AtConfig(
        wait=config.wait,
        transfer=config.transfer,
        config=config,
        stages=config.stages(setup.adapter.n_layers),
        **faith_fields(setup, scores),  # with the executor that ran it
        mean_p_correct=scores.mean_p_correct,
        problems=problem_rows(setup, scores),
    )


# --- the grid ------------------------------------------------------------------------------


def _bits(correct: torch.Tensor) -> str:
    return "".join("1" if c else "0" for c in correct.tolist())


def _unbits(bits: str) -> list[bool]:
    return [c == "1" for c in bits]


@with_config(ConfigDict(extra="forbid"))
class CellBits(ExecutorChoice):
    """One measured cell of the grid: right or wrong on each solved problem, in order ("1"/"0"), and its executor."""

    correct: str


@with_config(ConfigDict(extra="forbid"))
class GridCells(TypedDict):
    """What the search reads of a grid: each measured cell's bits over the solved problems ("wait,transfer" ->
    "1"/"0" per problem, in order), the problems' targets and token layouts (None: a task of one), and the config
    every cell shares."""

    cells: dict[str, str]
    targets: list[str]
    kept_layouts: list[int] | None
    config: dict[str, Any]


@with_config(ConfigDict(extra="forbid"))
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
        how = setup_executor(setup, config, reference)
        per_step = []
        for step in setup.steps:
            if choose_executor(step.adapter, step.kept, config, reference)["executor"] != "fast":
                per_step.append(
                    {k: af1_logits(step, config.model_copy(update={"transfer": k}), reference) for k in todo}
                )
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
        r = rate(_unbits(value["correct"]), targets, layouts)
        faith_WX[w + 1, k], (low_WX[w + 1, k], high_WX[w + 1, k]) = r["value"], r["ci"]
    fallbacks = sorted({r for v in done.values() if v["executor"] != "fast" and (r := v["fallback_reason"])})
    executors = {v["executor"] for v in done.values()}
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
        executor=executors.pop() if len(executors) == 1 else "mixed",
        fallback_reasons=fallbacks,
        n_cells=len(cells),
        kept_problems=setup.kept.rows(),
        kept_layouts=setup.kept.layout_P.tolist() if setup.kept.groups else None,
    )


def confirmation(setup: Setup, selection: float, seed: int) -> Setup:
    """The setup restricted to the problems a search did not choose on (the confirmation side of its split of
    `selection`, `seed`): where its config's later analyses are measured, so that nothing is scored on the problems
    that chose it."""
    _, conf = split_indices(len(setup.kept), selection, seed)
    return setup.on(conf)


def has_compute_stage(wait: int, transfer: int, n_layers: int) -> bool:
    """A cell whose transfer window (or wait) reaches the last layer leaves the last token nothing to compute."""
    return wait + transfer < n_layers - 1


@with_config(ConfigDict(extra="forbid"))
class Cell(TypedDict):
    """One (L_wait, L_transfer) cell as the search measures it: faithfulness on the confirmation split (with its
    interval), on the selection split that chose, and whether it may be chosen at all."""

    wait: int
    transfer: int
    faithfulness: float
    faithfulness_ci: list[float]
    faithfulness_selection: float
    faithfulness_selection_ci: list[float]
    eligible: bool
    faithfulness_by_layout: NotRequired[list[LayoutRate]]


@with_config(ConfigDict(extra="forbid"))
class Found(TypedDict):
    """The search's answer (`search`): the chosen cell (None where no cell passes) with its confirmation
    faithfulness, interval and constant guess, its selection faithfulness, the split, the frontier, the best
    eligible cell, and the claim 'an AF1 subgraph at the threshold' decided on the confirmation split."""

    threshold: float
    chosen: bool  # a cell reached the threshold on the selection split (the cell later analyses run at)
    found: bool  # the claim confirmed on the confirmation split
    claim: Claim | None  # None: no cell is eligible
    selection_fraction: float
    split_seed: int
    n_selection: int
    n_confirmation: int
    faithfulness_baseline_selection: float
    faithfulness_baseline: float
    wait: int | None
    transfer: int | None
    faithfulness: float | None
    faithfulness_ci: list[float] | None
    faithfulness_selection: float | None
    faithfulness_selection_ci: list[float] | None
    frontier: list[Cell]
    n_ineligible_no_compute: int
    warnings: list[str]
    stages: NotRequired[dict[str, list[int]]]
    best: NotRequired[Cell]
    best_measured: NotRequired[Cell]  # where no cell is eligible: the best one with a compute stage, judged
    faithfulness_by_layout: NotRequired[list[LayoutRate]]
    grid_cells: int  # cells measured, of the grid's grid_cells_possible ((L_wait, L_transfer) with L_wait >= -1)
    grid_cells_possible: int
    max_transfer_measured: int  # below n_layers: the sweep was capped (max_transfer)


def subgraph_claim(
    correct_conf: list[bool], cell: tuple[int, int], threshold: float, chosen: bool, baseline: float
) -> Claim:
    """'This model has an AF1 subgraph at faithfulness >= threshold', at the search's cell, decided on the
    confirmation split by its Wilson interval; a cell that did not reach the threshold where it was chosen (the best
    eligible one) is never confirmed."""
    w, k = cell
    claim = rate_reaches(
        "af1_subgraph",
        f"an AF1 subgraph at faithfulness >= {threshold} (L_wait {w}, L_transfer {k})",
        correct_conf,
        threshold,
        f"the confirmation split ({len(correct_conf)} solved problems that did not choose the cell)",
        baseline,
    )
    low = claim["ci"][0]
    if low is None or low <= baseline:  # a threshold a constant guess could reach says nothing
        claim = capped(claim, NOT_CONFIRMED, "never confirmed where its interval does not clear the constant guess")
    if chosen:
        return claim
    return capped(claim, NOT_CONFIRMED, "never confirmed where no cell reached the threshold on the selection split")


def search(grid: GridCells, *, n_layers: int, threshold: float, selection: float, seed: int) -> Found:
    """The AF1 subgraph, chosen on a selection split of the solved problems and confirmed on the rest.

    Choice: the largest wait, then the smallest transfer, whose selection faithfulness reaches the
    threshold. Never chosen: cells with no compute stage, and cells whose selection interval does not
    clear the constant-guess baseline. Also the frontier: for every wait, the smallest such transfer.
    The claim (`subgraph_claim`) is decided on the confirmation split alone: `found` only where it is confirmed."""
    if not (0 <= threshold <= 1 and 0 < selection < 1):  # search's Options refuse these first, by name
        raise Af1Error(f"threshold {threshold} must be in [0, 1] and selection {selection} in (0, 1)")
    L = n_layers
    targets = list(grid["targets"])
    layouts = grid["kept_layouts"] or [0] * len(targets)  # the baselines guess per layout
    sel, conf = split_indices(len(targets), selection, seed)
    sel_targets, conf_targets = [targets[i] for i in sel], [targets[i] for i in conf]
    sel_layouts, conf_layouts = [layouts[i] for i in sel], [layouts[i] for i in conf]

    def measure(w: int, k: int) -> Cell | None:
        bits = grid["cells"].get(f"{w},{k}")
        if bits is None:
            return None
        correct = _unbits(bits)
        s = rate([correct[i] for i in sel], sel_targets, sel_layouts)
        c = rate([correct[i] for i in conf], conf_targets, conf_layouts)
        return Cell(
            wait=w,
            transfer=k,
            faithfulness=c["value"],
            faithfulness_ci=c["ci"],
            faithfulness_selection=s["value"],
            faithfulness_selection_ci=s["ci"],
            eligible=has_compute_stage(w, k, L) and s["ci"][0] > s["baseline"],
        )

    measured = {(w, k): m for w in range(-1, L) for k in range(L - w) if (m := measure(w, k)) is not None}
    passing = {wk: m for wk, m in measured.items() if m["eligible"] and m["faithfulness_selection"] >= threshold}
    frontier = [passing[(w, min(k for ww, k in passing if ww == w))] for w in sorted({w for w, _ in passing})]
    base_sel = rate([True] * len(sel), sel_targets, sel_layouts)
    base_conf = rate([True] * len(conf), conf_targets, conf_layouts)
    result = Found(
        threshold=threshold,
        chosen=bool(passing),
        found=False,
        claim=None,
        selection_fraction=selection,
        split_seed=seed,
        n_selection=len(sel),
        n_confirmation=len(conf),
        faithfulness_baseline_selection=base_sel["baseline"],
        faithfulness_baseline=base_conf["baseline"],
        wait=None,
        transfer=None,
        faithfulness=None,
        faithfulness_ci=None,
        faithfulness_selection=None,
        faithfulness_selection_ci=None,
        frontier=frontier,
        n_ineligible_no_compute=sum(1 for w, k in measured if not has_compute_stage(w, k, L)),
        warnings=[],
        grid_cells=len(measured),
        grid_cells_possible=sum(L - w for w in range(-1, L)),
        max_transfer_measured=max((k for _, k in measured), default=0),
    )

    def by_layout(w: int, k: int) -> list[LayoutRate]:
        """The pooled confirmation rate's parts: each token layout's confirmation problems."""
        correct, layout_P = _unbits(grid["cells"][f"{w},{k}"]), grid["kept_layouts"] or []
        out = []
        for g in sorted(set(layout_P)):
            rows = [i for i in conf if layout_P[i] == g]
            if not rows:  # the split put none of this layout's problems on the confirmation side
                continue
            r = rate([correct[i] for i in rows], [targets[i] for i in rows])
            out.append(LayoutRate(layout=g, value=r["value"], n=r["n"], ci=r["ci"], baseline=r["baseline"]))
        return out

    eligible = [m for m in measured.values() if m["eligible"]]
    if eligible:
        best = Cell(**max(eligible, key=lambda m: (m["faithfulness_selection"], m["wait"], -m["transfer"])))
        if grid["kept_layouts"] is not None:
            best["faithfulness_by_layout"] = by_layout(best["wait"], best["transfer"])
        result["best"] = best
    chosen: Cell | None = None
    if passing:
        w = max(w for w, _ in passing)
        k = min(kk for ww, kk in passing if ww == w)
        chosen = passing[(w, k)]
        config = AF1Config(**{**grid["config"], "wait": w, "transfer": k})
        result.update(
            wait=w,
            transfer=k,
            faithfulness=chosen["faithfulness"],
            faithfulness_ci=chosen["faithfulness_ci"],
            faithfulness_selection=chosen["faithfulness_selection"],
            faithfulness_selection_ci=chosen["faithfulness_selection_ci"],
            stages=config.stages(L),
        )
        if grid["kept_layouts"] is not None:
            result["faithfulness_by_layout"] = by_layout(w, k)
    judged = chosen if passing else result.get("best")
    computing = [m for (w, k), m in measured.items() if has_compute_stage(w, k, L)]
    if judged is None and computing:  # nothing eligible: the numbers of the best cell still say how far it is
        judged = result["best_measured"] = Cell(
            **max(computing, key=lambda m: (m["faithfulness_selection"], m["wait"], -m["transfer"]))
        )
    if judged is not None:
        correct = _unbits(grid["cells"][f"{judged['wait']},{judged['transfer']}"])
        cell = (judged["wait"], judged["transfer"])
        claim = subgraph_claim([correct[i] for i in conf], cell, threshold, bool(passing), base_conf["baseline"])
        result.update(claim=claim, found=claim["outcome"] == CONFIRMED)
    note = baseline_warning("faithfulness (confirmation split)", base_conf["baseline"], len(conf))
    if note:
        result["warnings"].append(note)
    return result


@with_config(ConfigDict(extra="forbid"))
class Components(TypedDict):
    """CAMA alone and ABP alone per L_wait (`components`): faithfulness, interval and executor, and the constant
    guess on the same problems."""

    transfer: int
    cama_only: dict[int, float]
    cama_only_ci: dict[int, list[float]]
    cama_only_executor: dict[int, ExecutorChoice | None]
    abp_only: dict[int, float]
    abp_only_ci: dict[int, list[float]]
    abp_only_executor: dict[int, ExecutorChoice | None]
    faithfulness_baseline: float
    threshold: float
    claims: list[Claim]  # each part alone at each L_wait breaks the answer: one family (Holm)


def components(setup: Setup, waits: list[int], *, transfer: int, threshold: float) -> Components:
    """CAMA alone (no attention mask) and ABP alone (no ablation, `transfer` peek layers) per L_wait, each claimed
    to leave the last token answering less often than `threshold` (one-sided exact binomial tests, Holm)."""
    L = setup.adapter.n_layers
    waits = [w for w in waits if 0 <= w < L]

    def per_wait(name: str, make: Callable[[int], AF1Config]) -> tuple[dict[int, Scores], dict[int, Rate]]:
        scores = {w: faithfulness(setup, make(w)) for w in progress(waits, desc=name)}
        return scores, {w: s.rate(setup.kept) for w, s in scores.items()}

    cama, cama_rates = per_wait("cama_only", lambda w: AF1Config(wait=w, abp="none"))
    abp, abp_rates = per_wait(
        "abp_only", lambda w: AF1Config(wait=w, transfer=min(transfer, L - 1 - w), ablation="none")
    )
    baseline = constant_baseline(setup.kept.targets(), setup.kept.layout_P.tolist())
    on = f"the {len(setup.kept)} solved problems"
    claims = [
        rate_below(
            "component_alone",
            f"with {part} alone at L_wait {w}{how}, the last token answers less often than {threshold}",
            s.correct_P.tolist(),
            threshold,
            on,
            baseline,
            subject=f"{part} alone, L_wait {w}",
        )
        for part, how, scored in (("CAMA", " (no attention mask)", cama), ("ABP", " (no ablation)", abp))
        for w, s in scored.items()
    ]
    return Components(
        transfer=transfer,
        cama_only={w: r["value"] for w, r in cama_rates.items()},
        cama_only_ci={w: r["ci"] for w, r in cama_rates.items()},
        cama_only_executor={w: s.executor for w, s in cama.items()},
        abp_only={w: r["value"] for w, r in abp_rates.items()},
        abp_only_ci={w: r["ci"] for w, r in abp_rates.items()},
        abp_only_executor={w: s.executor for w, s in abp.items()},
        faithfulness_baseline=baseline,
        threshold=threshold,
        claims=adjust(claims, "components: each part alone at each L_wait"),
    )


# --- necessity -------------------------------------------------------------------------------


@with_config(ConfigDict(extra="forbid"))
class ShiftedStart(Faithfulness):
    """Faithfulness with the transfer window starting at `start` instead of right after the wait."""

    start: int


@with_config(ConfigDict(extra="forbid"))
class ShiftedTransfer(TypedDict):
    """A found AF1's transfer window moved to every later start, on n problems."""

    wait: int
    transfer: int
    n: int
    by_start: list[ShiftedStart]


@with_config(ConfigDict(extra="forbid"))
class Necessity(TypedDict):
    """Faithfulness with the last token kept from reading the operands in each window of layers, by width (the
    windows' first layers in order), with intervals and the constant guess; and a found AF1's moved transfer window."""

    windows: dict[str, list[float]]
    windows_ci: dict[str, list[list[float]]]
    faithfulness_baseline: float
    claims: list[Claim]  # per window, 'blocking it leaves faithfulness below the threshold': one family (Holm)
    shifted_transfer: NotRequired[ShiftedTransfer]


def necessity(
    setup: Setup,
    *,
    windows: Sequence[int],
    found: AF1Config | None = None,
    found_on: Setup | None = None,
    threshold: float = 0.9,
) -> Necessity:
    """Faithfulness when the last token cannot read the operands in one layer (or a window), and per window the
    claim that blocking it leaves faithfulness below `threshold` (every window one family, Holm).

    Also, inside a found AF1, the transfer window moved to every later start, measured on `found_on` (the
    search's confirmation split) when given.
    """
    L = setup.adapter.n_layers
    per_window: dict[str, list[float]] = {}
    per_window_ci: dict[str, list[list[float]]] = {}
    widths = [w for w in dict.fromkeys(windows) if w <= L]
    sets = [list(range(s, s + width)) for width in widths for s in range(L - width + 1)]
    per_step = [knockout_logits(step.adapter, step.kept, sets, greedy=True) for step in setup.steps]
    scored = [Scores.from_steps(setup.kept, [logits[i] for logits in per_step]) for i in range(len(sets))]
    rates = [s.rate(setup.kept) for s in scored]
    baseline = constant_baseline(setup.kept.targets(), setup.kept.layout_P.tolist())
    claims = [
        rate_below(
            "necessary_window",
            f"kept from reading the other tokens in {_layers_text(s)}, the last token answers less often than "
            f"{threshold}",
            scores.correct_P.tolist(),
            threshold,
            f"the {len(setup.kept)} solved problems",
            baseline,
            subject=_layers_text(s),
        )
        for s, scores in zip(sets, scored, strict=True)
    ]
    for width in widths:
        mine = [r for s, r in zip(sets, rates, strict=True) if len(s) == width]
        per_window[str(width)] = [r["value"] for r in mine]
        per_window_ci[str(width)] = [r["ci"] for r in mine]
    result = Necessity(
        windows=per_window,
        windows_ci=per_window_ci,
        faithfulness_baseline=baseline,
        claims=adjust(claims, "necessity: every blocked window"),
    )
    if found is not None and found.transfer > 0:
        on = found_on or setup
        shifted = []
        for start in range(found.wait + 1, L - found.transfer + 1):
            config = found.model_copy(update={"transfer_start": start})
            shifted.append(ShiftedStart(start=start, **faith_fields(on, faithfulness(on, config))))
        result["shifted_transfer"] = ShiftedTransfer(
            wait=found.wait, transfer=found.transfer, n=len(on.kept), by_start=shifted
        )
    return result


def _layers_text(layers: list[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"


# --- alternatives ----------------------------------------------------------------------------


@with_config(ConfigDict(extra="forbid"))
class Alternative(Faithfulness):
    """One alternative intervention, paired against the configured one on the same problems."""

    mcnemar_vs_configured: McNemar


@with_config(ConfigDict(extra="forbid"))
class Resampled(TypedDict):
    """Resample ablation over several seeds: mean and spread of faithfulness and each seed's pairing (its test
    against the configured one is its claim: each problem's share of seeds right, paired)."""

    faithfulness: float
    faithfulness_std: float
    per_seed: list[Alternative]
    seeds: int


@with_config(ConfigDict(extra="forbid"))
class Configured(Faithfulness):
    """The configured intervention every alternative is paired against."""

    ablation: str
    abp: str


@with_config(ConfigDict(extra="forbid"))
class Alternatives(TypedDict):
    """Every ablation and every ABP variant at one config (`alternatives`), each paired against the configured one."""

    wait: int
    transfer: int
    configured: Configured
    ablations: dict[str, float]
    abp_variants: dict[str, float]
    ablations_detail: dict[str, Alternative | Resampled]
    abp_variants_detail: dict[str, Alternative]
    claims: list[Claim]  # each alternative against the configured intervention: one family (Holm)


def alternatives(
    setup: Setup, config: AF1Config, seeds: int = RESAMPLE_SEEDS, measured_on: str = "the solved problems"
) -> Alternatives:
    """At one config: each ablation with ABP as configured, and each ABP variant with CAMA; every one against
    the configured intervention on the same problems (paired exact McNemar; resample, which runs `seeds` seeds, by
    a paired permutation test of each problem's share of seeds right), the tests adjusted as one family."""
    reference_scores = faithfulness(setup, config)
    reference_correct = reference_scores.correct_P.tolist()
    on = f"{measured_on} ({len(setup.kept)})"
    configured = f"CAMA with ABP {config.abp}" if config.ablation == "cama" else f"{config.ablation} with {config.abp}"
    claims: list[Claim] = []

    def differs(name: str, scores: Scores) -> None:
        statement = f"{name} changes faithfulness from {configured}"
        claims.append(paired_differs("alternative", statement, scores.correct_P.tolist(), reference_correct, on, name))

    def entry(scores: Scores) -> Alternative:
        return Alternative(
            **faith_fields(setup, scores),
            mcnemar_vs_configured=mcnemar_exact(scores.correct_P.tolist(), reference_correct),
        )

    ablations: dict[str, Alternative | Resampled] = {}
    for name in ABLATIONS:
        if name == "resample":  # one paired test of each problem's share of seeds right (not when configured)
            runs = [faithfulness(setup, config.model_copy(update={"ablation": name, "seed": s})) for s in range(seeds)]
            spread = mean_std([r.accuracy for r in runs])
            ablations[name] = Resampled(
                faithfulness=spread["mean"],
                faithfulness_std=spread["std"],
                per_seed=[entry(r) for r in runs],
                seeds=seeds,
            )
            if config.ablation != name:
                share_P = torch.stack([r.correct_P.float() for r in runs]).mean(0).tolist()
                statement = f"ablation resample ({seeds} seeds) changes faithfulness from {configured}"
                reference = [float(c) for c in reference_correct]
                claims.append(
                    paired_greater(
                        "alternative", statement, share_P, reference, on, "ablation resample", alternative="two-sided"
                    )
                )
        else:
            scores = faithfulness(setup, config.model_copy(update={"ablation": name}))
            ablations[name] = entry(scores)
            if name != config.ablation:
                differs(f"ablation {name}", scores)
    variants = {}
    for v in ABP_VARIANTS:
        scores = faithfulness(setup, config.model_copy(update={"abp": v}))
        variants[v] = entry(scores)
        if v != config.abp:
            differs(f"ABP {v}", scores)
    return Alternatives(
        wait=config.wait,
        transfer=config.transfer,
        configured=Configured(ablation=config.ablation, abp=config.abp, **faith_fields(setup, reference_scores)),
        ablations={k: v["faithfulness"] for k, v in ablations.items()},
        abp_variants={k: v["faithfulness"] for k, v in variants.items()},
        ablations_detail=ablations,
        abp_variants_detail=variants,
        claims=adjust(claims, f"alternatives at L_wait {config.wait}, L_transfer {config.transfer}"),
    )


# --- styles and transfer ----------------------------------------------------------------------


@with_config(ConfigDict(extra="forbid"))
class StyleRow(TypedDict):
    """One (input style, operation) of the styles table: its base accuracy and its faithfulness at the config, with
    the problems measured on and their inputs; or why the style could not be measured (`error`)."""

    style: str
    operation: str
    error: NotRequired[str]
    n: NotRequired[int]
    n_solved: NotRequired[int]
    base_accuracy: NotRequired[float]
    base_accuracy_ci: NotRequired[list[float] | None]
    base_accuracy_baseline: NotRequired[float | None]
    measured_on: NotRequired[str]
    faithfulness: NotRequired[float]
    faithfulness_ci: NotRequired[list[float]]
    faithfulness_baseline: NotRequired[float]
    faithfulness_n: NotRequired[int]
    faithfulness_by_layout: NotRequired[list[LayoutRate]]
    executor: NotRequired[str]
    fallback_reason: NotRequired[str | None]
    inputs: NotRequired[dict[str, Any]]  # ProblemInputs, dumped


@with_config(ConfigDict(extra="forbid"))
class StylesTable(TypedDict):
    """The Table-4 analogue (`styles_table`): one row per style and operation at one config."""

    wait: int
    transfer: int
    scoring: str
    rows: list[StyleRow]
    threshold: float
    claims: list[Claim]  # the config keeps the threshold on each measured row: one family (Holm)


def styles_table(
    lm: LoadedModel,
    config: AF1Config,
    base_spec: TaskSpec,
    styles: list[str],
    operations: tuple[str, ...] = ("a+b", "a-b"),
    own: tuple[Setup, Setup, str] | None = None,
    threshold: float = 0.9,
) -> StylesTable:
    """The Table-4 analogue: per style and operation, base accuracy and faithfulness at one config, each row with
    its problems and the ones its faithfulness is measured on. `own` is the task's own cell, already prepared: its
    setup, the problems to measure it on (the search's confirmation half, when the config is the search's, so that
    the row stands beside the search's number on the same problems) and what they are. Each measured row claims
    that the config keeps `threshold` there (one-sided exact binomial tests, adjusted together)."""
    rows = []
    claims = []
    for style in progress(styles, desc="styles"):
        for op in operations:
            spec = base_spec.model_copy(update={"operation": op, "style": style})
            try:
                if own is not None and own[0].spec == spec:
                    setup, on, where = own
                else:
                    setup = prepare(lm, spec)
                    on, where = setup, "the solved problems"
            except Af1Error as exc:
                rows.append(StyleRow(style=style, operation=op, error=str(exc)))
                continue
            described = setup.describe()
            halves = {} if on is setup else {"confirmation": on}
            scores = faithfulness(on, config)
            claims.append(
                rate_above(
                    "style_keeps",
                    f"at L_wait {config.wait}, L_transfer {config.transfer} the last token still answers at least "
                    f"{threshold} of {style} {op}",
                    scores.correct_P.tolist(),
                    threshold,
                    f"{where} ({len(on.kept)})",
                    constant_baseline(on.kept.targets(), on.kept.layout_P.tolist()),
                    subject=f"{style} {op}",
                )
            )
            rows.append(
                StyleRow(
                    style=style,
                    operation=op,
                    n=described.n,
                    n_solved=described.n_solved,
                    base_accuracy=described.base_accuracy,
                    base_accuracy_ci=described.base_accuracy_ci,
                    base_accuracy_baseline=described.base_accuracy_baseline,
                    measured_on=where,
                    **faith_fields(on, scores),
                    inputs=setup_inputs(setup, **halves).model_dump(),
                )
            )
    return StylesTable(
        wait=config.wait,
        transfer=config.transfer,
        scoring=base_spec.scoring,
        rows=rows,
        threshold=threshold,
        claims=adjust(claims, f"styles at L_wait {config.wait}, L_transfer {config.transfer}"),
    )


def map_config(config: AF1Config, from_layers: int, to_layers: int, by: str) -> AF1Config:
    """A config found on one model, for another: the same layers, or the same relative depth."""
    if by == "absolute":
        wait, transfer = config.wait, config.transfer
    elif by == "relative":
        wait = round((config.wait + 1) * to_layers / from_layers) - 1
        transfer = max(1, round(config.transfer * to_layers / from_layers)) if config.transfer else 0
    else:
        raise Af1Error(f"unknown mapping '{by}': absolute or relative")
    wait = min(wait, to_layers - 2)  # a mapped config keeps at least one compute layer
    transfer = max(0, min(transfer, to_layers - 2 - wait))
    return config.model_copy(update={"wait": wait, "transfer": transfer, "transfer_start": None, "pruned_heads": []})


@with_config(ConfigDict(extra="forbid"))
class TransferSource(TypedDict):
    """Where a transferred config comes from: its layers and its model's depth (a study adds which model, whether
    its search chose the cell or it is the best eligible one, whether its claim was confirmed, at what threshold)."""

    wait: int
    transfer: int
    n_layers: int
    model: NotRequired[str | None]
    chosen: NotRequired[bool]
    found: NotRequired[bool]
    threshold: NotRequired[float]


@with_config(ConfigDict(extra="forbid"))
class Mapped(Faithfulness):
    """A config as mapped onto this model, measured; where this model has its own config, the claim that the
    mapped one differs from it on the same problems (its p adjusted over the transfer result's family)."""

    wait: int
    transfer: int
    vs_own: NotRequired[Claim]


@with_config(ConfigDict(extra="forbid"))
class Transferred(TypedDict):
    """A config found on another model measured here (`transfer_config`): by the same layers, by the same relative
    depth, and this model's own config beside them when it has one."""

    source: TransferSource
    absolute: Mapped
    relative: Mapped
    own: NotRequired[Mapped]


def transfer_config(setup: Setup, config: AF1Config, from_layers: int, own: AF1Config | None = None) -> Transferred:
    """Faithfulness on this setup of a config found elsewhere, by absolute layers and by relative depth; with
    `own` (this model's config) also that one and a paired McNemar test of each mapping that differs from it (raw:
    the transfer result adjusts its tests together, `transfer_family`)."""
    own_scores = None if own is None else faithfulness(setup, own)

    def mapped(by: str) -> Mapped:
        to = map_config(config, from_layers, setup.adapter.n_layers, by)
        scores = faithfulness(setup, to)
        out = Mapped(wait=to.wait, transfer=to.transfer, **faith_fields(setup, scores))
        if own_scores is not None and own is not None and (to.wait, to.transfer) != (own.wait, own.transfer):
            out["vs_own"] = paired_differs(
                "transfer",
                f"the config mapped here (L_wait {to.wait}, L_transfer {to.transfer}) differs in faithfulness from "
                f"this model's own (L_wait {own.wait}, L_transfer {own.transfer})",
                scores.correct_P.tolist(),
                own_scores.correct_P.tolist(),
                f"{len(setup.kept)} solved problems",
            )
        return out

    out = Transferred(
        source=TransferSource(wait=config.wait, transfer=config.transfer, n_layers=from_layers),
        absolute=mapped("absolute"),
        relative=mapped("relative"),
    )
    if own is not None and own_scores is not None:
        out["own"] = Mapped(wait=own.wait, transfer=own.transfer, **faith_fields(setup, own_scores))
    return out


def transfer_family(rows: list[Transferred]) -> None:
    """Every mapped config's test against the target's own, adjusted together (Holm), in place."""
    where = [(i, by) for i, row in enumerate(rows) for by in ("absolute", "relative") if "vs_own" in row[by]]
    adjusted = adjust([rows[i][by]["vs_own"] for i, by in where], "transfer")
    for (i, by), claim in zip(where, adjusted, strict=True):
        rows[i][by]["vs_own"] = claim


# --- head pruning -------------------------------------------------------------------------------


def pruned_scores(setup: Setup, config: AF1Config, head_sets: list[list[tuple[int, int]]]) -> list[Scores]:
    """Scores under `config` with each set of transfer heads kept from peeking; the fast path runs all sets at once."""
    if any(supports(s.adapter, s.kept, config) is not None for s in setup.steps):
        return [faithfulness(setup, config.model_copy(update={"pruned_heads": hs})) for hs in head_sets]
    per_step = [
        fast_pruned_logits(step.adapter, step.kept, config, step.local_kv(config), head_sets) for step in setup.steps
    ]
    return [Scores.from_steps(setup.kept, [logits[i] for logits in per_step]) for i in range(len(head_sets))]


@with_config(ConfigDict(extra="forbid"))
class PrunedConfirmation(TypedDict):
    """The pruned set checked on the confirmation split: unpruned and pruned faithfulness, paired (exact McNemar)."""

    unpruned: Faithfulness
    pruned: Faithfulness
    mcnemar: McNemar


@with_config(ConfigDict(extra="forbid"))
class Pruning(TypedDict):
    """Transfer-layer heads kept from peeking one at a time (`prune_heads`): the order, the curves on the selection
    split with intervals and constant guess, the set before the first drop, and its confirmation."""

    wait: int
    transfer: int
    n_transfer_heads: int
    measure: str
    curve: str
    n_selection: int
    n_confirmation: int
    faithfulness_full: float
    faithfulness_full_ci: list[float]
    prune_order: list[list[int]]
    faithfulness_vs_pruned: list[float]
    faithfulness_vs_pruned_ci: list[list[float]]
    faithfulness_selection_baseline: float
    mean_p_correct_vs_pruned: list[float]
    mean_log_p_correct_vs_pruned: list[float]
    keep: float
    n_pruned_before_first_drop: int
    inputs: ProblemInputs
    confirmation: PrunedConfirmation
    claims: list[Claim]  # the pruned set keeps `keep` of the unpruned faithfulness on the confirmation split


def prune_heads(
    setup: Setup,
    config: AF1Config,
    *,
    selection: float,
    seed: int,
    whole_curve: bool,
    keep: float = 0.95,
) -> Pruning:
    """Stop transfer-layer heads peeking one at a time, greedily: each round removes the head whose removal keeps
    the mean log-probability of the correct answer highest (re-ranked after every removal), on a selection split.
    The pruned set just before faithfulness first falls below `keep` of the unpruned is then checked on the
    confirmation split.

    The log-probability (of the whole answer, summed over its steps; `Scores.log_p_correct_P`) is computed in
    float64 from the margins, so it does not saturate: a float32 p rounds to 1.0 once the margin passes about 17
    nats (large models), and every head then ties. Unlike the runner-up logit margin it weighs every rival token
    and stays the probability the earlier measure averaged, on a log scale.

    Each round scores every remaining head, so the whole curve costs H(H+1)/2 configurations for H heads (43,000 for
    Qwen-0.5B's 294 heads of 21 transfer layers); by default the rounds stop at the first drop, which is all the
    pruned set needs, and `whole_curve` goes on to the last head."""
    if config.transfer == 0:
        raise Af1Error("head pruning needs a config with transfer layers (transfer > 0)")
    sel, conf = split_indices(len(setup.kept), selection, seed)
    on_sel, on_conf = setup.on(sel), setup.on(conf)
    heads = [(layer, h) for layer in config.peek_layers() for h in range(setup.adapter.n_heads)]
    unpruned = faithfulness(on_sel, config)
    order: list[tuple[int, int]] = []
    unpruned_rate = unpruned.rate(on_sel.kept)
    faith_curve, p_curve, ci_curve = [unpruned.accuracy], [unpruned.mean_p_correct], [unpruned_rate["ci"]]
    log_p_curve = [unpruned.mean_log_p_correct]
    remaining = list(heads)
    for _ in progress(range(len(heads)), desc="prune heads"):
        scores = pruned_scores(on_sel, config, [[*order, h] for h in remaining])
        best = max(range(len(remaining)), key=lambda i: (scores[i].mean_log_p_correct, -i))
        order.append(remaining.pop(best))
        faith_curve.append(scores[best].accuracy)
        ci_curve.append(scores[best].rate(on_sel.kept)["ci"])
        p_curve.append(scores[best].mean_p_correct)
        log_p_curve.append(scores[best].mean_log_p_correct)
        if not whole_curve and faith_curve[-1] < keep * faith_curve[0]:
            break
    # the last set before the curve first falls below keep x unpruned (a later recovery does not count)
    n_pruned = next((i for i, f in enumerate(faith_curve) if f < keep * faith_curve[0]), len(faith_curve)) - 1
    pruned = config.model_copy(update={"pruned_heads": order[:n_pruned]})
    conf_full, conf_pruned = faithfulness(on_conf, config), faithfulness(on_conf, pruned)
    margin = (1 - keep) * conf_full.accuracy
    broken_P = (conf_full.correct_P & ~conf_pruned.correct_P).tolist()  # right unpruned, wrong pruned
    claims = [
        rate_below(
            "pruned_keeps",
            f"the {n_pruned} heads chosen on the selection half need not peek: kept from peeking, they break fewer "
            f"than {margin:.3f} of the problems ({1 - keep:.0%} of the unpruned faithfulness)",
            broken_P,
            margin,
            f"the confirmation split ({len(conf)} solved problems)",
            None,
            reject=True,
        )
    ]
    claims = claims if n_pruned else []  # nothing pruned: nothing to claim
    return Pruning(
        wait=config.wait,
        transfer=config.transfer,
        n_transfer_heads=len(heads),
        measure="mean log-probability of the correct answer, summed over its steps, float64 (selection split), "
        "re-ranked after every removal",
        curve="every head" if whole_curve else "up to the first drop below keep x unpruned",
        n_selection=len(sel),
        n_confirmation=len(conf),
        faithfulness_full=faith_curve[0],
        faithfulness_full_ci=ci_curve[0],
        prune_order=[list(hd) for hd in order],
        faithfulness_vs_pruned=faith_curve,
        faithfulness_vs_pruned_ci=ci_curve,
        faithfulness_selection_baseline=unpruned_rate["baseline"],  # the constant guess on the selection split
        mean_p_correct_vs_pruned=p_curve,
        mean_log_p_correct_vs_pruned=log_p_curve,
        keep=keep,
        n_pruned_before_first_drop=n_pruned,
        inputs=setup_inputs(setup, selection=on_sel, confirmation=on_conf),
        confirmation=PrunedConfirmation(
            unpruned=faith_fields(on_conf, conf_full),
            pruned=faith_fields(on_conf, conf_pruned),
            mcnemar=mcnemar_exact(conf_pruned.correct_P.tolist(), conf_full.correct_P.tolist()),
        ),
        claims=claims,
    )
