"""AF1 experiments end to end: tiny models for the logic, SmolLM2 for the measured facts."""

from __future__ import annotations

import json

import pytest
import torch

from af1 import Af1Error, ModelAdapter, experiments
from af1.allforone import AF1Config, reference_logits
from af1.evaluation import Scores
from af1.interventions.means import compute_means
from af1.models import LoadedModel
from af1.report.html import build_report
from af1.tasks import TaskSpec, build_task

from cli_helpers import run_cli
from conftest import tiny_model


@pytest.fixture(scope="module")
def tiny_setup(tokenizer):
    """A tiny random model treated as if it solved every problem (it solves none)."""
    model = tiny_model("llama")
    adapter = ModelAdapter(model)
    spec = TaskSpec(operation="a+b", shots=1, n=10)
    task = build_task(spec, tokenizer)
    all_right = Scores(task.answer_ids_P.clone(), torch.ones(len(task)), torch.ones(len(task), dtype=torch.bool))
    lm = LoadedModel(model, tokenizer, adapter, {"spec": "tiny-llama"})
    return experiments.Setup(lm, spec, task, all_right, task, compute_means(adapter, task))


def test_sweep_fills_the_grid_and_resumes(tiny_setup, tmp_path, monkeypatch):
    state = tmp_path / "sweep.state.json"
    partial = experiments.sweep(tiny_setup, max_transfer=1, state_path=state)
    L = tiny_setup.adapter.n_layers
    assert partial["n_cells"] == sum(min(L - w, 2) for w in range(-1, L))
    calls: list[list[int]] = []
    real = experiments.fast_sweep_wait

    def counting(adapter, task, config, means, todo, **kw):
        calls.append(list(todo))
        return real(adapter, task, config, means, todo, **kw)

    monkeypatch.setattr(experiments, "fast_sweep_wait", counting)
    full = experiments.sweep(tiny_setup, state_path=state)
    assert all(0 not in todo and 1 not in todo for todo in calls)  # finished cells are not recomputed
    grid = full["faithfulness_wait_transfer"]
    for w in range(-1, L):
        for k in range(L + 1):
            assert (grid[w + 1, k] == grid[w + 1, k]) == (k <= L - 1 - w)
    one = reference_logits(tiny_setup.adapter, tiny_setup.kept, AF1Config(wait=0, transfer=1), tiny_setup.means)
    assert grid[1, 1] == Scores.from_logits(one, tiny_setup.kept.answer_ids_P).accuracy


def test_search_takes_largest_wait_then_smallest_transfer():
    L = 4
    faith = torch.full((L + 1, L + 1), float("nan"))
    for w in range(-1, L):
        for k in range(L - w):
            faith[w + 1, k] = 0.5
    faith[2, 2] = 0.95  # wait 1, transfer 2
    faith[2, 1] = 0.92  # wait 1, transfer 1
    faith[1, 1] = 0.99  # wait 0
    sweep = {"faithfulness_wait_transfer": faith, "n_layers": L}
    found = experiments.search(sweep, 0.9)
    assert (found["wait"], found["transfer"]) == (1, 1)
    assert found["stages"] == {"wait": [0, 1], "transfer": [2], "compute": [3]}
    assert experiments.search(sweep, 0.999)["found"] is False
    assert experiments.search(sweep, 0.999)["best"] == {"wait": 0, "transfer": 1, "faithfulness": pytest.approx(0.99)}
    with pytest.raises(Af1Error, match=r"\[0, 1\]"):
        experiments.search(sweep, 1.5)


def test_necessity_alternatives_pruning_and_report(tiny_setup, tmp_path):
    config = AF1Config(wait=0, transfer=1)
    nec = experiments.necessity(tiny_setup, windows=(1, 2), found=config)
    L = tiny_setup.adapter.n_layers
    assert len(nec["windows"]["1"]) == L and len(nec["windows"]["2"]) == L - 1
    assert [s["start"] for s in nec["shifted_transfer"]["by_start"]] == [1, 2]
    alt = experiments.alternatives(tiny_setup, config)
    assert set(alt["ablations"]) == {"cama", "zero", "mean", "resample", "none"}
    assert set(alt["abp_variants"]) == {"af1", "none", "sink", "all-peek"}
    assert alt["ablations"]["cama"] == alt["abp_variants"]["af1"]
    pruning = experiments.prune_heads(tiny_setup, config)
    assert pruning["n_transfer_heads"] == 4 and len(pruning["faithfulness_vs_pruned"]) == 5
    with pytest.raises(Af1Error, match="transfer layers"):
        experiments.prune_heads(tiny_setup, AF1Config(wait=0))
    from af1 import pipeline
    from af1.results import write_json

    sweep = pipeline.sweep_to(tiny_setup, AF1Config(), tmp_path)
    write_json(tmp_path / "search.json", experiments.search(sweep, 0.5))
    write_json(tmp_path / "alternatives.json", alt)
    write_json(tmp_path / "pruning.json", pruning)
    pipeline.pruning_figure(pruning, tmp_path)
    html = build_report(tmp_path).read_text()
    assert "data:image/png;base64," in html and "Alternatives" in html and "Head pruning" in html
    with pytest.raises(Af1Error, match="no af1 results"):
        build_report(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


def test_map_config_by_relative_depth():
    config = AF1Config(wait=14, transfer=2)
    assert experiments.map_config(config, 32, 30, "absolute").wait == 14
    mapped = experiments.map_config(config, 32, 64, "relative")
    assert (mapped.wait, mapped.transfer) == (29, 4)


# --- the real model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_setup(smollm2):
    return experiments.prepare(smollm2, TaskSpec(operation="a+b", shots=3, answer_digits="any"))


def test_smollm2_cama_and_abp_alone_match_the_spec(smol_setup):
    """SPEC.md's facts for SmolLM2, 1-digit a+b=, 3 shots: CAMA ~0.97 at 0 and ~0.73 at 15; ABP needs > 25."""
    parts = experiments.components(smol_setup, [0, 15, 25], transfer=2)
    assert 0.55 < smol_setup.base.accuracy < 0.8
    assert parts["cama_only"][0] >= 0.93
    assert 0.55 <= parts["cama_only"][15] <= 0.85
    assert parts["abp_only"][25] >= 0.9
    assert parts["abp_only"][15] <= 0.3


def test_smollm2_fast_equals_reference(smol_setup):
    for wait, transfer in [(-1, 4), (13, 5), (20, 3), (26, 1)]:
        config = AF1Config(wait=wait, transfer=transfer)
        ref = experiments.af1_logits(smol_setup, config, reference=True)
        fast = experiments.af1_logits(smol_setup, config)
        assert (ref - fast).abs().max() <= 1e-4
        assert torch.equal(ref.argmax(-1), fast.argmax(-1))


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
    for key in ("faithfulness", "n_solved", "base_accuracy", "wait", "transfer", "mean_p_correct", "problems"):
        assert key in result
    assert result["path"] == "fast" and result["stages"]["transfer"] == list(range(16, 22))
    kept = [p for p in result["problems"] if p["solved"]]
    assert len(kept) == result["n_solved"]
    assert result["faithfulness"] == pytest.approx(sum(p["right_under_intervention"] for p in kept) / len(kept))
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


def test_cli_refuses_a_model_that_solves_nothing(capsys, tmp_path, tokenizer):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    code, _, err = run_cli(capsys, "run", "--model", str(tmp_path), "--wait", "0", "--out", str(tmp_path / "o"))
    assert code == 2 and "solves none" in err
    assert not (tmp_path / "o").exists()
