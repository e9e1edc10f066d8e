"""AF1 measurements end to end: tiny models for the logic, SmolLM2 for the measured facts."""

from __future__ import annotations

import json
import re
from html import escape

import pytest
import torch

from af1 import Af1Error, ModelAdapter
from af1.executors.protocol import REFERENCE, pick, recorded
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config
from af1.methods import allforone
from af1.methods.setup import executors, low_count_positions, make_setup, prepare
from af1.models import LoadedModel
from af1.results import to_json
from af1.stats import with_ci
from af1.study.report import build_report
from af1.tasks.evaluation import Scores
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from cli_helpers import run_cli
from conftest import VOCAB, tiny_model


@pytest.fixture(scope="module")
def tiny_setup(tokenizer):
    """A tiny random model treated as if it solved every problem (it solves none); answers of one and two
    digits and their end (the newline of the worked example), so every measurement runs three scoring steps."""
    model = tiny_model("llama")
    adapter = ModelAdapter(model)
    spec = TaskSpec(operation="a+b", shots=1, n=16)
    task = build_task(spec, tokenizer)
    assert task.n_steps() == 3
    all_right = Scores([list(a) for a in task.answer_tokens], torch.ones(len(task)), torch.ones(len(task)) > 0)
    lm = LoadedModel(model, tokenizer, adapter, {"spec": "tiny-llama"})
    return make_setup(lm, spec, task, all_right, task, cache_means=False)


def test_sweep_fills_the_grid_and_resumes(tiny_setup, tmp_path, monkeypatch):
    state = tmp_path / "sweep.state.json"
    partial = allforone.sweep.sweep(tiny_setup, max_transfer=1, state_path=state)
    L = tiny_setup.adapter.n_layers
    assert partial.n_cells == sum(min(L - w, 2) for w in range(-1, L))
    calls: list[list[int]] = []
    real = allforone.sweep.fast_sweep_wait

    def counting(adapter, task, config, means, todo, **kw):
        calls.append(list(todo))
        return real(adapter, task, config, means, todo, **kw)

    monkeypatch.setattr(allforone.sweep, "fast_sweep_wait", counting)
    full = allforone.sweep.sweep(tiny_setup, state_path=state)
    assert calls and all(0 not in todo and 1 not in todo for todo in calls)  # finished cells are not recomputed
    grid = torch.tensor(full.faithfulness_wait_transfer)
    for w in range(-1, L):
        for k in range(L + 1):
            assert (grid[w + 1, k] == grid[w + 1, k]) == (k <= L - 1 - w)
    # a cell is the full answer's accuracy: every step under the same intervention (reference path)
    config = AF1Config(wait=0, transfer=1)
    steps = [reference_logits(s.adapter, s.kept, config, s.means) for s in tiny_setup.steps]
    one = Scores.from_steps(tiny_setup.kept, steps)
    assert full.cells["0,1"] == "".join("1" if c else "0" for c in one.correct_P.tolist())
    assert grid[1, 1] == one.accuracy and torch.tensor(full.ci_low_wait_transfer)[1, 1] <= one.accuracy
    assert full.executor == "fast" and set(full.cell_executors.values()) == {"fast"}
    assert full.targets == tiny_setup.kept.targets()
    assert full.kept_problems[0]["input_ids"] == tiny_setup.kept.input_ids_PT[0].tolist()
    asked = recorded(executors(tiny_setup, config, reference=True))
    assert asked == {"executor": "reference", "fallback_reason": "asked for (reference)"}
    resample = recorded(executors(tiny_setup, config.model_copy(update={"ablation": "resample"})))
    assert resample["executor"] == "shared-context" and "token-local" in (resample["fallback_reason"] or "")
    calls.clear()  # a capped sweep resumed from the full grid's state returns its own cells only, computing none
    capped = allforone.sweep.sweep(tiny_setup, max_transfer=1, state_path=state)
    assert calls == [] and set(capped.cells) == {f"{w},{k}" for w in range(-1, L) for k in range(min(L - w, 2))}
    assert to_json(capped) == to_json(partial)  # NaN where not measured: compared as JSON (null)


def test_low_counts_of_the_means_are_named(tiny_setup):
    """16 problems: most (position, token) means average fewer than 5 other states, and the setup says where; each
    solved problem is inside the means (the whole grid), so it is left out of them and that is counted."""
    counts = tiny_setup.means.counts_TS
    assert counts.sum(1)[tiny_setup.kept.context_len] == len(tiny_setup.distribution)
    warnings = tiny_setup.describe().warnings
    note = next(w for w in warnings if "fewer than 5 other" in w)
    kept = tiny_setup.steps[0].kept
    thin = low_count_positions(tiny_setup.means, kept)
    low, n_low = thin["positions"], thin["n_problems_low"]
    assert low and str(low) in note and f"for {n_low} of {len(kept)} solved" in note and 0 < n_low <= len(kept)
    assert "own state left out" in note and thin["n_inside"] == len(kept)
    assert all(t > kept.context_len for t in low)  # the first varying position is its own mean: never named
    slots = tiny_setup.means.slots(kept.input_ids_PT)
    others_PT = tiny_setup.means.counts_TS[torch.arange(kept.n_positions)[None], slots] - 1
    assert int((others_PT[:, low] < 5).any(1).sum()) == n_low
    after = others_PT[:, kept.context_len + 1 :]
    assert thin["n_fallback_pairs"] == int((after == 0).sum())
    described = tiny_setup.describe().means_from
    assert described["n_fallback_pairs"] == sum(n["n_fallback_pairs"] for n in described["per_step"])
    if thin["n_fallback_pairs"]:
        assert any("leave-one-out token-agnostic" in w for w in warnings)
    half = tiny_setup.on(list(range(len(kept) // 2)))  # a split counts its own problems
    assert half.means_notes[0] == {
        "layout": 0,
        "step": 0,
        **low_count_positions(tiny_setup.means, half.steps[0].kept),
    }
    assert half.means_notes[0]["n_inside"] == len(kept) // 2


def synthetic_sweep(
    L: int, n: int, cells: dict[tuple[int, int], list[bool]], targets: list[str]
) -> allforone.sweep.GridCells:
    """A sweep's cells as `allforone.sweep.sweep` returns them, with chosen per-problem outcomes (the rest wrong)."""
    bits = {}
    for w in range(-1, L):
        for k in range(L - w):
            bits[f"{w},{k}"] = "".join("1" if c else "0" for c in cells.get((w, k), [False] * n))
    return allforone.sweep.GridCells(targets=targets, cells=bits, config={}, kept_layouts=None)


def test_search_chooses_on_selection_and_confirms_on_the_rest():
    from af1.stats import split_indices

    L, n = 6, 40
    targets = [str(i % 10) for i in range(n)]  # a constant guess scores 0.1
    sel, conf = split_indices(n, 0.5, 0)
    right = [True] * n
    only_selection = [i in sel for i in range(n)]
    cells = {
        (1, 2): right,  # wait 1, transfer 2
        (1, 1): right,  # wait 1, transfer 1: the smaller transfer at the same wait
        (2, 3): right,  # wait 2 + transfer 3 reaches the last layer: no compute stage, never chosen
        (3, 1): only_selection,  # the largest wait that passes on the selection half, poor on the other
        (0, 4): right,
    }
    sweep = synthetic_sweep(L, n, cells, targets)
    found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.9, selection=0.5, seed=0)
    judged = found.judged
    assert found.chosen and found.cell() == (3, 1) and judged is not None
    assert judged["selection"]["value"] == 1.0 and judged["confirmation"]["value"] == 0.0  # the split shows it
    claim = found.claim  # decided on the confirmation split alone: there the cell fails
    assert claim is not None and claim["outcome"] == "rejected" and found.found is False
    assert claim["n"] == len(conf) and claim["estimate"] == 0.0
    assert found.n_selection == len(sel) and found.n_confirmation == len(conf)
    ci = judged["confirmation"]["ci"]
    assert ci[1] is not None and ci[1] < 0.2 and judged["confirmation"]["baseline"] <= 0.25
    assert found.stages == {"wait": [0, 1, 2, 3], "transfer": [4], "compute": [5]}
    assert [(f["wait"], f["transfer"]) for f in found.frontier] == [(3, 1), (1, 1), (0, 4)]
    assert found.exhaustive and found.problem_cells == n * sum(L - w for w in range(-1, L)) == found.problem_cells_grid
    sweep = synthetic_sweep(L, n, {k: v for k, v in cells.items() if k != (3, 1)}, targets)
    found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.9, selection=0.5, seed=0)
    assert found.cell() == (1, 1) and found.judged is not None and found.judged["confirmation"]["value"] == 1.0
    marked = found.marked()  # the chosen cell, as the figures outline it
    assert marked == found.judged and found.config_at(AF1Config()) == AF1Config(wait=1, transfer=1)
    claim = found.claim  # 20 of 20: the exact test above 0.9 has p 0.9^20 = 0.12, so not confirmed at this n
    assert claim is not None and claim["outcome"] == "not confirmed" and found.found is False
    assert claim["n_to_decide"] == next(m for m in range(1, 100) if 0.9**m < 0.025)  # all right: p = 0.9^n
    assert allforone.search.on_grid(sweep, n_layers=L, threshold=0.8, selection=0.5, seed=0).found is True
    assert allforone.search.on_grid(sweep, n_layers=L, threshold=1.0, selection=0.5, seed=0).chosen is True
    halves = synthetic_sweep(L, n, {(1, 1): [i % 3 != 0 for i in range(n)]}, targets)
    nothing = allforone.search.on_grid(halves, n_layers=L, threshold=0.9, selection=0.5, seed=0)
    assert nothing.found is False and nothing.chosen is False and nothing.stages is None
    best = nothing.marked()  # the best eligible cell
    assert best is not None and nothing.cell() == (1, 1) and best["eligible"]
    claim = nothing.claim  # judged at the best cell, on the confirmation split: two in three right there
    assert claim is not None and claim["outcome"] == "rejected" and (claim["ci"][1] or 1) < 0.9
    with pytest.raises(Af1Error, match=r"\[0, 1\]"):
        allforone.search.on_grid(sweep, n_layers=L, threshold=1.5, selection=0.5, seed=0)


def test_search_never_chooses_a_cell_no_better_than_a_constant_guess():
    L, n = 4, 30
    constant = ["7"] * n  # every target the same: a constant guess is right on all of them
    sweep = synthetic_sweep(L, n, {(0, 1): [True] * n}, constant)
    found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.9, selection=0.5, seed=0)
    judged = found.judged
    assert found.found is False and not found.chosen and judged is not None and judged["eligible"] is False
    assert found.marked() is None and found.config_at(AF1Config()) is None
    assert found.claim is not None and found.claim["outcome"] == "not confirmed"  # judged, never confirmed
    assert judged["confirmation"]["baseline"] == 1.0


def test_a_search_that_finds_nothing_still_gives_its_numbers_and_what_it_measured():
    """No cell reaches the threshold and none is eligible: the verdict names the best cell with its interval, n and
    constant guess, and the line on what was measured counts the (problem, cell) pairs against the whole grid."""
    from af1.experiments.search import Result, claim_line, measured_line

    L, n = 6, 18
    targets = [str(i % 10) for i in range(n)]
    third = [i % 3 == 0 for i in range(n)]
    sweep = synthetic_sweep(L, n, {(2, 1): third}, targets)
    found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.9, selection=0.5, seed=0)
    judged = found.judged
    assert not found.chosen and found.marked() is None and judged is not None and found.cell() == (2, 1)
    result = Result.model_construct(**dict(found), n_layers=L)
    line = claim_line(result)
    assert line.startswith("rejected: an AF1 subgraph at faithfulness >= 0.9 (L_wait 2, L_transfer 1)"), line
    assert "n 9; baseline" in line and "judged at the best cell (none is eligible" in line, line
    grid = n * sum(L - w for w in range(-1, L))
    assert measured_line(result).startswith(f"Measured every problem of every cell (the whole grid): {grid:,} ")


def test_the_plain_words_follow_the_claims_outcome():
    """The plain-words verdict says 'as claimed' only for a confirmed claim, 'cannot say' (with the n that would)
    for one not confirmed, 'does not keep' of the judged cell alone for a rejected one, and names the judged cell's
    blocks."""
    from af1.experiments.search import Result, plain_words

    L, n = 6, 200
    targets = [str(i % 10) for i in range(n)]
    said = {}
    for right in ([True] * n, [i % 20 != 0 for i in range(n)], [i % 2 == 0 for i in range(n)]):
        sweep = synthetic_sweep(L, n, {(2, 1): right}, targets)
        found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.9, selection=0.5, seed=0)
        claim = found.claim
        assert claim is not None
        said[claim["outcome"]] = plain_words(Result.model_construct(**dict(found), n_layers=L))
    assert set(said) == {"confirmed", "not confirmed", "rejected"}
    for text in said.values():
        assert "through block 2 nothing specific to the problem reaches the last token" in text
        assert "it reads the other tokens in block 3, then computes the answer alone" in text
        assert re.search(r"always giving the most common answer would score \d+%\)", text)  # the constant guess
    assert said["confirmed"].endswith("at least 90%, as claimed.")
    assert all(said[k].startswith("the search's pick (") for k in ("confirmed", "not confirmed"))  # not unique
    assert "cannot say whether it reaches 90%; about " in said["not confirmed"]
    assert said["rejected"].startswith("the judged cell (through block 2") and "does not keep 90%" in said["rejected"]
    assert said["rejected"].endswith("(other cells are not judged).")
    assert not any("as claimed" in said[k] for k in ("not confirmed", "rejected"))


def test_necessity_without_a_found_af1_is_a_typed_result_that_draws_its_windows_alone(tiny_setup, tmp_path):
    """No AF1 to move the transfer window in: the result says so with `shifted_transfer` null, and the figure draws
    the windows panel only (a declared null field once read as present and crashed the drawing)."""
    from af1.experiments.necessity import Result
    from af1.report import interactive

    nec = allforone.necessity.necessity(tiny_setup, windows=(1,), found=None)
    result = Result.of(tiny_setup.describe(), nec)
    assert result.shifted_transfer is None and result.n_solved == len(tiny_setup.kept)
    assert 'class="af1-plot"' in interactive.necessity_plot(result, result.n_solved)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):  # every field a result writes is declared
        Result.model_validate({**result.data(), "undeclared": 1})


def test_necessity_alternatives_pruning_and_report(tiny_setup, tmp_path):
    config = AF1Config(wait=0, transfer=1)
    nec = allforone.necessity.necessity(tiny_setup, windows=(1, 2), found=config)
    L = tiny_setup.adapter.n_layers
    assert len(nec.windows["1"]) == L and len(nec.windows["2"]) == L - 1
    assert all(r["ci"][0] <= r["value"] <= r["ci"][1] for r in nec.windows["1"])
    assert [c["estimate"] for c in nec.claims] == [r["value"] for r in nec.windows["1"] + nec.windows["2"]]
    assert all(c["family"] == f"necessity: every blocked window: {2 * L - 1} tests, Holm" for c in nec.claims)
    assert all(c["outcome"] != "confirmed" for c in nec.claims if (c["estimate"] or 0.0) >= 0.9)
    from af1.experiments.necessity import Necessity, Result

    claims = [{**c, "outcome": "rejected"} if i % 2 else c for i, c in enumerate(nec.claims)]  # both kinds shown
    assert {c["outcome"] for c in nec.claims} == {"confirmed"}  # a random model: every window breaks it
    page = "".join(Necessity().section(Result.of(tiny_setup.describe(), nec.model_copy(update={"claims": claims}))))
    for c in claims:  # every window's claim in the report with its outcome, the confirmed ones before the fold
        row = f"<td>{c['outcome']}</td><td>{escape(c['statement'])}</td>"
        assert row in page and (c["outcome"] == "confirmed") == (page.index(row) < page.index("<details"))
    shifted = nec.shifted_transfer
    assert shifted is not None and [s["start"] for s in shifted["by_start"]] == [1, 2]
    alt = allforone.alternatives.alternatives(tiny_setup, config)
    assert set(alt.ablations) == {"cama", "zero", "mean", "resample", "none"}
    assert set(alt.abp_variants) == {"af1", "none", "sink", "all-peek", "zero-output"}
    assert alt.ablations["cama"]["faithfulness"] == alt.abp_variants["af1"]["faithfulness"]
    assert alt.abp_variants["af1"]["faithfulness"] == alt.configured["faithfulness"]
    cama = alt.ablations["cama"]
    assert "mcnemar_vs_configured" in cama and cama["mcnemar_vs_configured"]["p_value"] == 1.0
    resample = alt.ablations["resample"]
    assert "per_seed" in resample and resample["seeds"] == 5 and len(resample["per_seed"]) == 5
    per_seed = [r["faithfulness"]["value"] for r in resample["per_seed"]]
    assert resample["faithfulness"]["mean"] == pytest.approx(sum(per_seed) / 5)
    pruning = allforone.prune.prune_heads(tiny_setup, config, selection=0.5, seed=0, whole_curve=True)
    assert pruning.n_transfer_heads == 4 and len(pruning.faithfulness_vs_pruned) == 5
    full = pruning.faithfulness_vs_pruned[0]
    assert full["ci"][1] >= full["value"] and full["n"] == pruning.n_selection
    assert sorted(map(tuple, pruning.prune_order)) == [(1, h) for h in range(4)]
    assert pruning.n_selection + pruning.n_confirmation == len(tiny_setup.kept)
    assert set(pruning.confirmation) == {"unpruned", "pruned", "mcnemar"}
    n_conf = pruning.n_confirmation
    if pruning.n_pruned_before_first_drop:  # the pruned set's claim: the share of problems it breaks, held out
        (kept,) = pruning.claims
        assert kept["kind"] == "pruned_keeps" and kept["n"] == n_conf and kept["measured_on"].startswith("the conf")
        unpruned, pruned = (pruning.confirmation[k]["faithfulness"]["value"] for k in ("unpruned", "pruned"))
        assert (kept["estimate"] or 0.0) >= max(0.0, unpruned - pruned) - 1e-9  # breaks at least the net loss
        assert kept["outcome"] != "confirmed" or (kept["ci"][1] or 1) < 1
    else:
        assert pruning.claims == []
    parts = allforone.components.components(tiny_setup, [0, 1], transfer=1, threshold=0.9)
    assert [c["subject"] for c in parts.claims] == [
        "CAMA alone, L_wait 0",
        "CAMA alone, L_wait 1",
        "ABP alone, L_wait 0",
        "ABP alone, L_wait 1",
    ]
    assert all(c["family"] == "components: each part alone at each L_wait: 4 tests, Holm" for c in parts.claims)
    for c in parts.claims:  # a part that keeps the threshold is never confirmed to break the answer
        assert c["outcome"] != "confirmed" or (c["estimate"] or 0) < 0.9
    with pytest.raises(Af1Error, match="transfer layers"):
        allforone.prune.prune_heads(tiny_setup, AF1Config(wait=0), selection=0.5, seed=0, whole_curve=False)
    from af1.results import write_json

    described = tiny_setup.describe().model_dump()  # what every result measured on the setup carries
    sweep = allforone.sweep.sweep(tiny_setup, AF1Config())
    write_json(tmp_path / "sweep.json", {**described, **sweep.model_dump()})
    found = allforone.search.on_grid(sweep, n_layers=L, threshold=0.5, selection=0.5, seed=0)
    inputs = allforone.faithfulness.setup_inputs(tiny_setup)
    write_json(tmp_path / "search.json", {**described, **found.model_dump(), "config": {}, "inputs": inputs})
    write_json(tmp_path / "alternatives.json", {**described, **alt.model_dump()})
    write_json(tmp_path / "prune.json", {**described, **pruning.model_dump()})  # each experiment's file is <name>.json
    html = build_report(tmp_path).read_text()
    assert "cannot show" not in html
    assert 'class="af1-plot"' in html and "Alternatives" in html and "Head pruning" in html  # interactive figures
    assert "need not peek" in html and "constant guess" in html  # pruning judged by its claim
    for c in alt.claims:  # each alternative's claim with its numbers: the difference and its interval, its n
        assert f"<td>{escape(c['statement'])}</td><td>{with_ci(c['estimate'], c['ci'])}</td><td>{c['n']}</td>" in html
    with pytest.raises(Af1Error, match="no af1 results"):
        build_report(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


def test_each_transfer_claim_is_in_the_report_with_its_numbers(tiny_setup, tmp_path):
    """A config found on a deeper model, mapped here by the same layers and by relative depth, is tested against this
    model's own; the report shows each test as a claim with its difference, interval and n."""
    from af1.experiments.transfer import Result, Transfer

    own = AF1Config(wait=0, transfer=1)
    row = allforone.transfer.transfer_config(tiny_setup, AF1Config(wait=4, transfer=2), 8, own=own)
    allforone.transfer.transfer_family([row])
    result = Result.of(tiny_setup.describe(), target="tiny", rows=[row], n_measured=len(tiny_setup.kept))
    assert [c["family"] for c in result.claims] == ["transfer: 2 tests, Holm"] * 2  # both mappings differ from own
    page = "".join(Transfer().section(result))
    for c in result.claims:
        assert f"<td>{escape(c['statement'])}</td><td>{with_ci(c['estimate'], c['ci'])}</td><td>{c['n']}</td>" in page


def test_a_transfer_measures_each_config_once_and_as_if_alone(tiny_setup, monkeypatch):
    """Across sources (this model's own config on itself, a deeper model's), each config is measured once: the own
    config and the diagonal's mappings, which land on it, are not run again; the rows equal those measured alone."""
    from af1.methods.allforone import transfer

    L = tiny_setup.adapter.n_layers
    own = AF1Config(wait=0, transfer=1)
    sources = [(own, L), (AF1Config(wait=4, transfer=2), 8)]
    alone = [transfer.transfer_config(tiny_setup, config, n, own=own) for config, n in sources]
    runs = []
    measure = transfer.faithfulness
    monkeypatch.setattr(transfer, "faithfulness", lambda setup, at: runs.append(at) or measure(setup, at))
    measured = {}
    shared = [transfer.transfer_config(tiny_setup, config, n, own=own, measured=measured) for config, n in sources]
    assert shared == alone
    mapped = {transfer.map_config(c, n, L, by).model_dump_json() for c, n in sources for by in ("absolute", "relative")}
    assert len(runs) == len(mapped | {own.model_dump_json()}) == len(measured) < 6


def test_greedy_pruning_reranks_after_every_removal(tiny_setup, monkeypatch):
    """Each round scores every remaining head on top of the ones already removed."""
    rounds: list[list[list[tuple[int, int]]]] = []
    real = allforone.prune.pruned_scores

    def spy(setup, config, head_sets):
        rounds.append(head_sets)
        return real(setup, config, head_sets)

    monkeypatch.setattr(allforone.prune, "pruned_scores", spy)
    result = allforone.prune.prune_heads(
        tiny_setup, AF1Config(wait=0, transfer=2), selection=0.5, seed=0, whole_curve=True
    )
    order = [tuple(h) for h in result.prune_order]
    assert [len(r) for r in rounds] == list(range(8, 0, -1))
    for i, sets in enumerate(rounds):
        assert all(s[:i] == order[:i] for s in sets)  # every candidate extends the removals so far


def crafted_scores(task, margin: float, wrong: int = 0) -> Scores:
    """Scores from logits that put the answer `margin` nats above every other token at every step, except the first
    `wrong` problems, whose first step prefers another token by 5 nats."""
    logits = []
    for step in task.steps():
        z_PV = torch.zeros(len(step), VOCAB)
        z_PV[torch.arange(len(step)), step.answer_ids_P] = margin
        if step.step == 0:
            z_PV[torch.arange(wrong), (step.answer_ids_P[:wrong] + 1) % VOCAB] = margin + 5
        logits.append(z_PV)
    return Scores.from_steps(task, logits)


def test_pruning_ranks_past_float32_saturation_and_stops_at_the_first_dip(tiny_setup, monkeypatch):
    """Every candidate's p rounds to 1.0 in float32 (margins of 30+ nats), yet the log-probability ranks the heads;
    and the pruned set is the last before faithfulness first falls below 95 %, not the largest above it after a
    dip (here the curve is 1, 1, 0.5, 1, 1: one head, not four)."""

    def pruned(setup, config, head_sets):
        n = len(head_sets[0])  # the round: heads removed with this candidate
        wrong = len(setup.kept) // 2 if n == 2 else 0
        return [crafted_scores(setup.kept, 30.0 + 5 * hs[-1][1], wrong) for hs in head_sets]

    monkeypatch.setattr(allforone.prune, "pruned_scores", pruned)
    monkeypatch.setattr(
        allforone.prune, "faithfulness", lambda setup, config, reference=False: crafted_scores(setup.kept, 30)
    )
    scores = crafted_scores(tiny_setup.kept, 30.0)
    assert bool((scores.p_correct_P == 1.0).all()) and scores.mean_log_p_correct < 0  # saturated p, not log p
    result = allforone.prune.prune_heads(
        tiny_setup, AF1Config(wait=0, transfer=1), selection=0.5, seed=0, whole_curve=True
    )
    assert [tuple(h) for h in result.prune_order] == [(1, 3), (1, 2), (1, 1), (1, 0)]  # largest margin first
    assert [r["value"] for r in result.faithfulness_vs_pruned] == [1.0, 1.0, pytest.approx(0.5, abs=0.1), 1.0, 1.0]
    assert result.n_pruned_before_first_drop == 1
    assert result.mean_log_p_correct_vs_pruned[1] > result.mean_log_p_correct_vs_pruned[0]
    # by default the rounds stop at the first drop: the same pruned set, two rounds instead of four
    short = allforone.prune.prune_heads(
        tiny_setup, AF1Config(wait=0, transfer=1), selection=0.5, seed=0, whole_curve=False
    )
    assert short.prune_order == result.prune_order[:2] and short.curve.startswith("up to the first drop")
    assert short.faithfulness_vs_pruned == result.faithfulness_vs_pruned[:3]
    assert short.n_pruned_before_first_drop == 1


def test_map_config_by_relative_depth():
    config = AF1Config(wait=14, transfer=2)
    assert allforone.transfer.map_config(config, 32, 30, "absolute").wait == 14
    mapped = allforone.transfer.map_config(config, 32, 64, "relative")
    assert (mapped.wait, mapped.transfer) == (29, 4)
    # SmolLM2's (19, 5) on Qwen's 24 layers: cut so that the last token still computes alone
    cut = allforone.transfer.map_config(AF1Config(wait=19, transfer=5), 30, 24, "absolute")
    assert (cut.wait, cut.transfer) == (19, 3) and allforone.search.has_compute_stage(cut.wait, cut.transfer, 24)
    late = allforone.transfer.map_config(AF1Config(wait=28, transfer=1), 30, 24, "absolute")
    assert (late.wait, late.transfer) == (22, 0) and allforone.search.has_compute_stage(late.wait, late.transfer, 24)


def test_heatmap_marks_the_cells_whose_interval_clears_the_threshold():
    from af1.report.interactive import confident_cells

    low: list[list[float | None]] = [[None] * 5 for _ in range(5)]
    low[0][2], low[3][1], low[2][2] = 0.9375, 0.90625, 0.875  # L_wait -1 / transfer 2, 2 / 1, 1 / 2
    assert confident_cells(low, 0.9) == [(-1, 2), (2, 1)]
    assert confident_cells(low, 0.92) == [(-1, 2)]
    assert confident_cells([[None] * 5], 0.9) == []


def test_a_near_constant_target_among_the_solved_problems_is_warned(tiny_setup):
    from dataclasses import replace

    one = [tiny_setup.task.answer_tokens[0]] * len(tiny_setup.task)  # every problem made to share one answer
    task = replace(tiny_setup.task, answer_tokens=one)
    setup = make_setup(tiny_setup.lm, tiny_setup.spec, task, tiny_setup.base, task, cache_means=False)
    assert any(w.startswith("faithfulness on the solved problems: the target is near constant") for w in setup.warnings)
    assert not any(w.startswith("faithfulness on the solved") for w in tiny_setup.warnings)


# --- the real model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_first(smollm2):
    return prepare(smollm2, TaskSpec(operation="a+b", shots=3, answer_digits="any", scoring="first"))


@pytest.fixture(scope="module")
def smol_setup(smollm2):
    return prepare(smollm2, TaskSpec(operation="a+b", style="calculate", shots=3))


def test_smollm2_cama_and_abp_alone_match_the_spec(smol_first):
    """docs/methods.md's facts (§1) for SmolLM2, 1-digit a+b=, 3 shots, first token: CAMA ~0.97 at 0 and ~0.73 at 15;
    ABP needs > 25."""
    parts = allforone.components.components(smol_first, [0, 15, 25], transfer=2, threshold=0.9)
    assert 0.55 < smol_first.base.accuracy < 0.8
    assert parts.cama_only[0]["value"] >= 0.93
    assert 0.55 <= parts.cama_only[15]["value"] <= 0.85
    assert parts.abp_only[25]["value"] >= 0.9
    assert parts.abp_only[15]["value"] <= 0.3


def test_smollm2_fast_equals_reference(smol_setup):
    """Every answer step (the second one's last token is the answer's first digit; the third checks the end, the
    newline after the worked examples' answers), fast path = hook path."""
    assert len(smol_setup.steps) == 3 and smol_setup.spec.scoring == "full" and smol_setup.task.end["checked"]
    for wait, transfer in [(-1, 4), (20, 3)]:  # no wait, and a late one; every cell on the tiny families
        config = AF1Config(wait=wait, transfer=transfer)
        for step in smol_setup.steps:
            fast_executor, why_not = pick(step.adapter, step.kept, config)
            assert fast_executor.name == "fast", why_not
            ref, fast = REFERENCE.logits(step, config), fast_executor.logits(step, config)
            assert (ref - fast).abs().max() <= 1e-4
            assert torch.equal(ref.argmax(-1), fast.argmax(-1))
    assert smol_setup.distribution.origin == "grid" and len(smol_setup.distribution) == 97


def test_cli_run_json_and_errors(capsys, cli_on_smollm2, tmp_path):
    code, out, _ = run_cli(
        capsys,
        "run",
        "--task",
        "a+b",
        "--style",
        "calculate",
        "--shots",
        "3",
        "--wait",
        "15",
        "--transfer",
        "6",
        "--json",
        "--out",
        str(tmp_path),
    )
    assert code == 0
    result = json.loads(out)
    for key in ("faithfulness", "n_solved", "base_accuracy", "config", "mean_p_correct", "problems"):
        assert key in result
    assert (result["config"]["wait"], result["config"]["transfer"]) == (15, 6)
    assert result["executor"] == "fast" and result["fallback_reason"] is None
    assert result["stages"]["transfer"] == list(range(16, 22)) and result["scoring"] == "full"
    faith = result["faithfulness"]
    low, high = faith["ci"]
    assert low <= faith["value"] <= high and 0 < faith["baseline"] < 0.5 and faith["n"] == result["n_solved"]
    kept = [p for p in result["problems"] if p["solved"]]
    assert len(kept) == result["n_solved"]
    assert faith["value"] == pytest.approx(sum(p["right_under_intervention"] for p in kept) / len(kept))
    assert json.loads((tmp_path / "run.json").read_text())["provenance"]["model"]["sha256"]
    for args, message in [
        (["--wait", "30"], "out of range"),
        (["--wait", "20", "--transfer", "10"], "past the last layer"),
        (["--ablation", "nope"], "ablation"),
    ]:
        code, out, err = run_cli(capsys, "run", "--shots", "3", *args)
        assert code == 2 and message in err and out == ""
    code, _, err = run_cli(capsys, "search", "--threshold", "1.5")
    assert code == 2 and "[0, 1]" in err


@pytest.mark.parametrize("experiment", ["run", "alternatives", "prune", "necessity"])
def test_options_that_depend_on_the_model_are_refused_before_any_evaluation(capsys, monkeypatch, experiment):
    """--wait past the last layer, a negative --transfer or one past the last layer: one line, right after
    loading, before the task is evaluated (that can take minutes on a large model or task)."""
    import af1.experiments.session

    def no_work(*_args, **_kwargs):
        raise AssertionError("the task was evaluated before the options were checked")

    monkeypatch.setattr(af1.experiments.session, "prepare", no_work)
    monkeypatch.setattr(af1.experiments.session, "evaluated", no_work)
    for args, message in [
        (["--wait", "99"], "out of range"),
        (["--wait", "3", "--transfer", "-3"], "transfer"),
        (["--wait", "20", "--transfer", "20"], "past the last layer"),
    ]:
        code, out, err = run_cli(capsys, experiment, "--shots", "3", *args)
        assert code == 2 and message in err and out == "" and "Traceback" not in err, err


def test_cli_refuses_a_model_that_solves_nothing(capsys, tmp_path, tokenizer):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    code, _, err = run_cli(capsys, "run", "--model", str(tmp_path), "--wait", "0", "--out", str(tmp_path / "o"))
    assert code == 2 and "solves none" in err
    assert not (tmp_path / "o").exists()


def test_the_means_store_holds_every_answer_step_and_each_model_apart(tiny_setup, tmp_path, monkeypatch):
    """--means DIR with full scoring: every step written once, read back to the same means and the same
    faithfulness without computing again; another model's means go beside them under their own keys."""
    import af1.interventions.means as means_module

    lm, spec, task = tiny_setup.lm, tiny_setup.spec, tiny_setup.task
    written = make_setup(lm, spec, task, tiny_setup.base, task, means_dir=tmp_path)
    assert len(written.steps) == 3 and len(list(tmp_path.glob("*.safetensors"))) == 3
    computed = lambda adapter, steps, *a: steps and pytest.fail("computed again")  # noqa: E731
    monkeypatch.setattr(means_module, "compute_step_means", computed)
    read = make_setup(lm, spec, task, tiny_setup.base, task, means_dir=tmp_path)
    for a, b, c in zip(tiny_setup.steps, written.steps, read.steps, strict=True):
        assert torch.equal(a.means.sums_LTSD, b.means.sums_LTSD) and torch.equal(b.means.sums_LTSD, c.means.sums_LTSD)
        assert torch.equal(a.means.member_hashes, c.means.member_hashes)
    config = AF1Config(wait=0, transfer=1)
    assert torch.equal(
        allforone.faithfulness.faithfulness(read, config).correct_P,
        allforone.faithfulness.faithfulness(tiny_setup, config).correct_P,
    )
    monkeypatch.undo()
    model = tiny_model("llama", seed=1)
    other = LoadedModel(model, lm.tokenizer, ModelAdapter(model), {})
    theirs = make_setup(other, spec, task, tiny_setup.base, task, means_dir=tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 6
    assert not torch.equal(theirs.steps[0].means.sums_LTSD, read.steps[0].means.sums_LTSD)


def test_run_options_are_validated_once_on_each_path_and_reach_the_unit_as_that_object(
    capsys, tmp_path, tokenizer, monkeypatch
):
    """`af1 run --wait 0 --transfer 1`, `api.run("run", ..., wait=0, transfer=1)` and a plan file: each face makes
    the options once (the CLI and the API with `Options.model_validate`, a plan where it is read), and the object
    that reaches the experiment's body is that one, never a copy validated again on the way."""
    from af1 import api
    from af1.experiments import run as run_module
    from af1.study import expand, load_plan

    from conftest import fitted_tiny_model

    spec = TaskSpec(operation="a+b", shots=1, n=30)
    model = fitted_tiny_model("llama", [spec], tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    made, reached = [], []
    validate, body = run_module.Options.model_validate, run_module.Run.run

    def counting(obj, *args, **kwargs):
        made.append(validate(obj, *args, **kwargs))
        return made[-1]

    def spy(self, inputs, options):
        reached.append(options)
        return body(self, inputs, options)

    monkeypatch.setattr(run_module.Options, "model_validate", counting)
    monkeypatch.setattr(run_module.Run, "run", spy)
    code, _, err = run_cli(
        capsys, "run", "--model", str(tmp_path / "m"), "--shots", "1", "--n", "30", "--wait", "0", "--transfer", "1"
    )
    assert code == 0, err
    assert len(made) == 1 and len(reached) == 1 and reached[0] is made[0]
    made.clear()
    reached.clear()
    lm = LoadedModel(model, tokenizer, ModelAdapter(model), {"spec": "tiny-fitted"})
    api.run("run", lm, spec, wait=0, transfer=1)
    assert len(made) == 1 and len(reached) == 1 and reached[0] is made[0]
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        f"name: once\nmodels: [{{spec: {tmp_path / 'm'}}}]\ntasks: [{{operation: 'a+b', shots: 1, n: 30}}]\n"
        "experiments: {run: {wait: 0, transfer: 1}}\n"
    )
    plan = load_plan(plan_file)
    (unit,) = [u for u in expand(plan) if u.experiment == "run"]
    assert unit.options is plan.experiments.run  # type: ignore[attr-defined]  # the plan's own object, not a copy
