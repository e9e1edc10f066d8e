"""Neurons of the compute stage: a neuron planted to carry the answer is ranked first and its knock-out is
confirmed against random neurons of its layer; the neurons experiment through the registry."""

from __future__ import annotations

import json

import pytest
import torch

import af1.api
from af1.errors import Af1Error
from af1.experiments.neurons import Result
from af1.interventions.af1 import AF1Config
from af1.methods import heuristics
from af1.methods import neurons as study_neurons
from af1.models import ModelAdapter
from af1.stats import split_indices
from af1.tasks.spec import TaskSpec

from conftest import TINY_FAMILIES, tiny_config, tiny_model

PLANTED = 77  # the neuron of the last layer that carries the answer
TASK = """name: parity
template: "Is {n} even?"
slots:
  n: {values: [%s]}
answer:
  table: {%s}
scoring: first
shots: 1
counterfactual: {slot: n}
"""


def parity_spec(tmp_path) -> TaskSpec:
    numbers = range(10, 62)  # two digits each: one token layout
    table = ", ".join(f'"{n}": "{" yes" if n % 2 == 0 else " no"}"' for n in numbers)
    path = tmp_path / "parity.yaml"
    path.write_text(TASK % (", ".join(f'"{n}"' for n in numbers), table))
    return TaskSpec(file=str(path), n=50)


def planted_model(spec: TaskSpec, tokenizer):
    """A tiny random llama whose answer runs through one neuron of its last layer: the neuron's gate reads a constant
    and its up projection the parity (both fitted by least squares on the last token's MLP input, plainly and under
    AF1(0, 1)), its output is one direction, and the unembedding reads ' yes' and ' no' from that direction alone."""
    from transformers import AutoModelForCausalLM

    from af1.executors.reference import reference_logits
    from af1.interventions.means import compute_means
    from af1.tasks.means_sample import distribution_task
    from af1.tasks.task import build_task

    config = tiny_config("llama")
    config.hidden_size, config.intermediate_size, config.tie_word_embeddings = 128, 256, False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.eval().requires_grad_(False)
    adapter = ModelAdapter(model)
    task = build_task(spec, tokenizer)
    means = compute_means(adapter, distribution_task(spec, tokenizer, task))
    mlp = model.model.layers[-1].mlp
    rows = []
    handle = mlp.register_forward_pre_hook(lambda _m, args: rows.append(args[0][:, -1]))
    try:
        model(input_ids=task.input_ids_PT)
        reference_logits(adapter, task, AF1Config(wait=0, transfer=1), means)
    finally:
        handle.remove()
    x = torch.cat(rows).double()
    yes_P = [str(p.answer).strip() == "yes" for p in task.problems]
    sign = torch.tensor([1.0 if y else -1.0 for y in yes_P], dtype=torch.float64).repeat(2)  # plain rows, AF1 rows
    mlp.gate_proj.weight[PLANTED] = (torch.linalg.pinv(x) @ torch.full_like(sign, 4.0)).float()
    mlp.up_proj.weight[PLANTED] = (torch.linalg.pinv(x) @ sign).float()
    direction = torch.nn.functional.normalize(torch.randn(128), dim=0)
    mlp.down_proj.weight[:, PLANTED] = direction
    yes, no = (tokenizer.encode(w, add_special_tokens=False)[0] for w in (" yes", " no"))
    model.lm_head.weight.zero_()  # ' yes' and ' no' read the direction alone, not so steeply that log p saturates
    model.lm_head.weight[yes], model.lm_head.weight[no] = direction / 2, -direction / 2
    return model


@pytest.fixture(scope="module")
def planted(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("neurons")
    spec = parity_spec(root)
    planted_model(spec, tokenizer).save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    return af1.api.session(af1.api.load_model(str(root / "m"))), spec, root


def test_a_neuron_planted_to_carry_the_answer_is_ranked_first_and_confirmed_against_random_ones(planted):
    held, spec, _ = planted
    setup = held.setup(spec)
    assert len(setup.kept) == 50, "the planted neuron answers every problem"
    sel, conf = split_indices(len(setup.kept), 0.5, 0)
    found = study_neurons.study(
        setup.on(sel), setup.on(conf), AF1Config(wait=0, transfer=1), draws=5, largest=4, measured_on="planted"
    )
    assert found.compute_layers == [2] and found.sizes == [1, 2, 4]
    assert (found.top[0]["layer"], found.top[0]["neuron"]) == (2, PLANTED)
    assert found.faithfulness["value"] == 1.0 and found.half_faithfulness_top == 1
    assert found.top_faithfulness[0]["value"] <= 0.6  # the answer's sign is gone: about a coin's
    assert min(found.random_faithfulness[0]) >= 0.9  # any other neuron of the layer barely matters
    assert found.half_faithfulness_random is None
    tops = {(n["layer"], n["neuron"]) for n in found.top[:4]}
    assert len(found.random_neurons) == 5 and all(len(d) == 4 for d in found.random_neurons)
    assert all(layer == 2 and (layer, j) not in tops for d in found.random_neurons for layer, j in d)  # never a top one
    assert found.verified["n"] == 25 and found.verified["n_ranked"] == 2 * study_neurons.VERIFIED
    assert found.verified["spearman_ci"][0] > 0  # the estimate ranks the exact single-neuron knock-outs
    first = found.claims[0]
    assert first["subject"] == "1" and first["outcome"] == "confirmed"
    assert all(c["family"] == f"{study_neurons.FAMILY}: 3 tests, Holm" for c in found.claims)


def test_no_neuron_knocked_out_is_af1_itself_and_the_fast_path_equals_the_hooks(planted):
    held, spec, _ = planted
    setup = held.setup(spec)
    config = AF1Config(wait=0, transfer=1)
    _, means = study_neurons.attribution_and_means(setup, config, [2])
    plain = study_neurons.faithfulness(setup, config)
    none = study_neurons.knocked_out(setup, config, [], means)
    assert torch.equal(none.correct_P, plain.correct_P) and torch.equal(none.p_correct_P, plain.p_correct_P)
    chosen = [(2, PLANTED), (2, 3), (2, 200)]
    fast = study_neurons.knocked_out(setup, config, chosen, means)
    hooks = study_neurons.knocked_out(setup, config, chosen, means, reference=True)
    assert torch.allclose(fast.p_correct_P, hooks.p_correct_P, atol=1e-5)
    assert torch.equal(fast.correct_P, hooks.correct_P) and not torch.equal(fast.correct_P, plain.correct_P)


def test_the_neurons_experiment_writes_what_it_measured(planted):
    held, spec, root = planted
    result = af1.api.run(Result, held, spec, out_dir=root / "out", wait=0, transfer=1, largest=2, draws=3)
    written = json.loads((root / "out" / "neurons.json").read_text())
    from af1.experiments import REGISTRY

    assert 'class="af1-plot"' in "".join(REGISTRY["neurons"].section(result))  # its figure, drawn from the result
    assert written["top"][0] == json.loads(json.dumps(result.data()["top"][0]))
    assert result.measured_on == "the confirmation part of a seeded split of the solved problems"
    assert result.n_selection + result.n_confirmation == 50 and result.inputs is not None
    with pytest.raises(Af1Error, match="no compute layer"):
        af1.api.run(Result, held, spec, out_dir=root / "none", wait=0, transfer=2)


def test_attribution_runs_on_a_task_file_with_words_for_answers(planted):
    """What the heads study's --attribution runs, on a task file (its slot is the counterfactual); the planted model
    has too few other heads for the study's matched random knock-outs."""
    from af1.methods.heads.compared import estimate_against_exact

    held, spec, _ = planted
    checked = estimate_against_exact(held.lm(), held.setup(spec).kept, None, 3, spec.seed)
    assert checked.counterfactual_kind == "slot n" and checked.n_patched == 50 == checked.agreement["n"]
    assert checked.agreement["n_ranked"] == 12  # 3 layers x 4 heads


def test_eta_squared_is_the_share_the_groups_explain_and_a_pattern_of_the_units_digit_is_tagged_with_it():
    import numpy as np

    result = np.repeat(np.arange(19), 5)
    units = np.sin(result % 10)[None] + 0.01 * np.random.default_rng(0).normal(size=(1, len(result)))
    assert heuristics.eta_squared(units, result % 10)[0] > 0.99
    assert heuristics.eta_squared(np.ones((1, len(result))), result)[0] == 0  # no variance: nothing explained
    noise = np.random.default_rng(1).normal(size=(200, len(result)))
    by_chance = heuristics.eta_squared(noise, result % 10)
    assert 0.05 < float(np.median(by_chance)) < 0.15  # about (groups - 1) / (n - 1) = 9 / 94


def test_the_top_neurons_patterns_over_the_operands(tokenizer, tmp_path):
    from conftest import fitted_tiny_model

    spec = TaskSpec(operation="a+b", shots=1, n=40)
    fitted_tiny_model("llama", [spec], tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    held = af1.api.session(af1.api.load_model(str(tmp_path / "m")))
    setup = held.setup(spec)
    chosen = [(2, 3), (2, 5)]
    made = heuristics.patterns(setup, AF1Config(wait=0, transfer=1), chosen)
    assert [(p["layer"], p["neuron"]) for p in made] == [(2, 3), (2, 5)]
    first = made[0]
    assert len(first["activation"]) == len(first["operands"]) == len(setup.kept)
    assert set(first["explained"]) == set(heuristics.GROUPINGS) == set(first["explained_by_chance"])
    assert all(first["explained"][g] > first["explained_by_chance"][g] for g in first["tags"])
    assert [o[0] + o[1] for o in first["operands"]] == [int(p.answer) for p in setup.kept.problems]


def test_random_neurons_match_the_top_ones_layer_by_layer_and_never_repeat_or_take_a_top_one():
    top = [study_neurons.Neuron(layer=layer, neuron=j, attribution=-1.0) for layer, j in [(3, 0), (3, 1), (5, 3)]]
    seen = set()
    for seed in range(50):
        drawn = study_neurons.matched_random(top, width=4, seed=seed)
        assert [layer for layer, _ in drawn] == [3, 3, 5]
        assert len(set(drawn)) == 3 and not set(drawn) & {(3, 0), (3, 1), (5, 3)}
        seen |= set(drawn)
    assert seen == {(3, 2), (3, 3), (5, 0), (5, 1), (5, 2)}  # every other neuron of those layers, in time
    with pytest.raises(Af1Error, match="no neuron left"):
        study_neurons.matched_random(top, width=2, seed=0)


def test_half_of_the_faithfulness_is_none_where_af1_does_no_better_than_a_constant_guess():
    assert study_neurons.half_size([1, 2, 4], [0.9, 0.5, 0.3], 0.9, 0.1) == 4
    assert study_neurons.half_size([1, 2, 4], [0.9, 0.45, 0.3], 0.9, 0.1) == 2
    assert study_neurons.half_size([1, 2, 4], [0.0, 0.0, 0.0], 0.0, 0.0) is None


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_neurons_site_is_the_input_of_the_mlps_output_projection_on_every_family(family):
    """Moving one neuron by 1 at the last position moves the MLP's output there by exactly that neuron's column of
    the output projection, and nowhere else."""
    from af1.interventions.sites import edit_sites, mlp_output, neurons, record
    from af1.models.adapter import weight_of

    adapter = ModelAdapter(tiny_model(family))
    ids = torch.tensor([[5, 17, 230, 9, 41]])
    with record(adapter, [neurons(1), mlp_output(1)]) as clean:
        adapter.model(input_ids=ids)
    assert clean[neurons(1)].shape == (1, 5, adapter.n_neurons)

    def bump(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, -1, 3] += 1.0
        return x

    with edit_sites(adapter, {neurons(1): bump}), record(adapter, [mlp_output(1)]) as edited:
        adapter.model(input_ids=ids)
    weight = weight_of(adapter.down_proj(1))
    column = weight[3] if adapter.family.conv1d else weight[:, 3]
    moved = edited[mlp_output(1)] - clean[mlp_output(1)]
    assert torch.allclose(moved[0, -1], column, atol=1e-5) and moved[0, :-1].abs().max() == 0
