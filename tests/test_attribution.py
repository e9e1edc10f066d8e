"""Attribution patching: the estimate is the directional derivative it claims to be (central differences by full
forwards), zero where nothing changes, and its rank agreement with the exact effects says nothing where there is
none."""

from __future__ import annotations

import pytest
import torch

from af1 import ModelAdapter
from af1.interventions.sites import edit_sites, head_inputs, mlp_output
from af1.methods import heads
from af1.methods.counterfactuals import Counterfactual
from af1.methods.heads.attribution import ESTIMATE, agreement
from af1.models.forward import forward_last
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import tiny_model


@pytest.fixture(scope="module")
def task(tokenizer):
    return build_task(TaskSpec(operation="a+b", n=12, seed=1), tokenizer)


def directional_derivative(adapter, step, cf_ids, sender, eps=1e-2):
    """Per problem of one answer step: d(correct logit)/d(t) at t = 0 with the sender's last-position value moved
    to clean + t (counterfactual - clean), by central differences of full forwards, over |clean logit|."""
    from af1.interventions.sites import record

    layer, which = sender
    site = mlp_output(layer) if which == "mlp" else head_inputs(layer)
    with record(adapter, [site]) as other:
        forward_last(adapter.model, cf_ids)
    moved = other[site][:, -1].clone()
    d = adapter.head_dim
    cols = slice(None) if which == "mlp" else slice(which * d, (which + 1) * d)

    def at(t):
        def fn(x):
            x = x.clone()
            x[:, -1, cols] = x[:, -1, cols] + t * (moved[:, cols] - x[:, -1, cols])
            return x

        with edit_sites(adapter, {site: fn}):
            return forward_last(adapter.model, step.input_ids_PT).double().gather(1, step.answer_ids_P[:, None])[:, 0]

    clean = forward_last(adapter.model, step.input_ids_PT).double().gather(1, step.answer_ids_P[:, None])[:, 0]
    return (at(eps) - at(-eps)) / (2 * eps) / clean.abs()


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_neox", "gpt2", "gptj"])
def test_the_estimate_is_the_gradient_times_the_change_of_every_head_and_mlp(family, task):
    adapter = ModelAdapter(tiny_model(family).double())
    cf = Counterfactual(task.input_ids_PT.flip(0), "", [])
    pp = heads.patching.path_patching(adapter, task, cf, ESTIMATE, batch_size=6)
    assert pp["path"] == ESTIMATE and pp["answer_steps_n"] == {"0": 12, "1": 3}
    for layer, which in [(0, 1), (1, 3), (adapter.n_layers - 1, 0), (0, "mlp"), (2, "mlp")]:
        total, count = torch.zeros(len(task), dtype=torch.float64), torch.zeros(len(task))
        for step in task.steps():
            T = task.n_positions
            cf_ids = torch.cat([cf.input_ids_PT[step.where_P], step.input_ids_PT[:, T:]], 1)
            total[step.where_P] += directional_derivative(adapter, step, cf_ids, (layer, which))
            count[step.where_P] += 1
        expected = float((total / count).mean())
        got = (
            pp["relative_logit_change_mlp_layer"][layer]
            if which == "mlp"
            else pp["relative_logit_change_layer_head"][layer, which]
        )
        assert float(got) == pytest.approx(expected, rel=1e-3, abs=1e-6), (layer, which)


def test_the_estimate_with_itself_is_zero_and_leaves_no_hook_or_gradient(task):
    adapter = ModelAdapter(tiny_model("llama"))
    before = forward_last(adapter.model, task.input_ids_PT)
    pp = heads.patching.path_patching(adapter, task, Counterfactual(task.input_ids_PT, "", []), ESTIMATE)
    for key in ("relative_logit_change_layer_head", "logit_diff_change_layer_head", "relative_logit_change_mlp_layer"):
        assert pp[key].abs().max() == 0, key
    assert torch.equal(forward_last(adapter.model, task.input_ids_PT), before)  # bit-identical after
    assert not any(p.requires_grad for p in adapter.model.parameters())
    assert not torch.is_grad_enabled() or forward_last(adapter.model, task.input_ids_PT).grad_fn is None


def test_rank_agreement_is_one_for_the_same_ranking_and_silent_for_unrelated_ones():
    g = torch.Generator().manual_seed(0)
    effect_PZ = torch.randn(40, 60, generator=g) + torch.linspace(-2, 1, 60)
    same = agreement(effect_PZ, effect_PZ * 3, k=10)
    assert same["spearman"] == pytest.approx(1.0) and same["top_k_shared"] == 1.0 and same["n_ranked"] == 60
    covered = 0
    for seed in range(20):
        a = torch.randn(40, 60, generator=torch.Generator().manual_seed(seed))
        b = torch.randn(40, 60, generator=torch.Generator().manual_seed(100 + seed))
        low, high = agreement(a, b, k=10, seed=seed)["spearman_ci"]
        covered += low <= 0 <= high
    assert covered >= 17  # about 95 % of intervals cover the true rho of 0
    with_nan = effect_PZ.clone()
    with_nan[:, :20] = float("nan")  # layers not measured are left out
    assert agreement(with_nan, effect_PZ, k=10)["n_ranked"] == 40


@pytest.fixture(scope="module")
def held(tmp_path_factory, tokenizer):
    import af1.api

    from conftest import fitted_tiny_model

    root = tmp_path_factory.mktemp("attribution")
    fitted_tiny_model("llama", [SPEC], tokenizer).save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    return af1.api.session(af1.api.load_model(str(root / "m"))), root


SPEC = TaskSpec(operation="a+b", shots=1, n=30)


def test_the_heads_study_checks_attribution_against_exact_patching_on_the_same_problems(held):
    import json

    import af1.api
    from af1.experiments.heads import Result

    session, root = held
    result = af1.api.run(Result, session, SPEC, out_dir=root / "out", k=5, draws=2, attribution=True)
    checked = result.attribution
    assert checked is not None
    a = checked.agreement
    assert a["n"] == checked.n_patched == result.n_solved and a["n_ranked"] == 12 and a["k"] == 5
    assert -1 <= a["spearman_ci"][0] <= a["spearman"] <= a["spearman_ci"][1] <= 1
    assert a["spearman"] > 0.5  # a small random model is nearly linear in one head's output
    assert checked.estimate_seconds > 0 and checked.exact_seconds > 0
    written = json.loads((root / "out" / "heads.json").read_text())["attribution"]
    from af1.experiments import REGISTRY

    section = "".join(REGISTRY["heads"].section(result))
    assert "Attribution patching against exact" in section and section.count('class="af1-plot"') >= 4  # its figure
    assert written["exact_layer_head"] == checked.exact_layer_head and written["exact_path"] == "total"


def test_heads_ranked_by_attribution_are_judged_exactly_on_the_confirmation_part(held):
    import af1.api
    from af1.experiments.heads import Result

    session, root = held
    result = af1.api.run(Result, session, SPEC, out_dir=root / "heads", rank="attribution", k=2, draws=3)
    assert result.path == ESTIMATE and "attribution" in result.split["heads_chosen_on"]
    keys = [c for c in result.claims if c["kind"] == "key_head"]
    assert keys, "the fitted model has key heads to confirm"
    assert [c["subject"] for c in keys] == [f"{layer}.{h}" for layer, h in result.key_heads]
    on = session.setup(SPEC).kept.subset(heads.ranking.problem_split(result.n_solved, (0.5, 0))[1])
    change, keep = (
        heads.patching.layout_path_patching(
            session.lm().adapter, on, session.lm().tokenizer, "wang", "a", contrast=contrast
        )[0]
        for contrast in ("answer", "answer kept")
    )
    rows = [i for i, row in enumerate(change["counterfactual_rows"]) if row and row["control_input_ids"] is not None]
    gap = float(change["counterfactual_gap_problem"][rows].sum())
    for claim in keys:  # the confirmation's numbers are exact path patching's (wang), not the estimate's
        layer, h = map(int, str(claim["subject"]).split("."))
        moved = change["logit_diff_change_problem_layer_head"] - keep["logit_diff_change_problem_layer_head"]
        assert claim["estimate"] == pytest.approx(float(moved[rows, layer, h].sum()) / gap, rel=1e-5)


def test_attribution_on_a_family_without_the_attention_interface_is_a_one_line_error(tmp_path, tokenizer):
    import af1.api
    from af1 import Af1Error
    from af1.experiments.heads import Result

    tiny_model("gptj").save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    held = af1.api.session(af1.api.load_model(str(tmp_path / "m")))
    with pytest.raises(Af1Error, match="path 'total', needs transformers' attention interface"):
        af1.api.run(Result, held, SPEC, out_dir=tmp_path / "out", attribution=True)
    assert not (tmp_path / "out" / "heads.json").exists()  # nothing half-written
