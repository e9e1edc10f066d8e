"""Models placed by an accelerate device map: every intervention follows the placement.

This machine has no GPU, so the placement here is a CPU map with layers and the unembedding
offloaded to disk: accelerate then wraps every part in its device hooks (as on a multi-GPU
map) and keeps offloaded weights on the meta device until they run.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from af1.errors import Af1Error
from af1.executors.fast import fast_logits
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config
from af1.interventions.means import compute_means, means_key
from af1.interventions.sites import fixed_attention
from af1.methods import allforone, heads
from af1.methods.counterfactuals import counterfactual
from af1.methods.finetune.train import FinetuneConfig, train
from af1.methods.setup import prepare
from af1.models import load_model
from af1.models.adapter import execution_device
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from cli_helpers import run_cli
from conftest import fitted_tiny_model

pytestmark = pytest.mark.slow  # placement through accelerate: seconds per model

SPEC = TaskSpec(operation="a+b", shots=1, n=30)
PLACEMENT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.norm": "cpu",
    "lm_head": "disk",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer, monkeypatch_module):
    """The same tiny model loaded whole and through the placement map."""
    path = tmp_path_factory.mktemp("placed") / "llama"
    monkeypatch_module.setenv("AF1_CACHE_DIR", str(path.parent / "cache"))
    model = fitted_tiny_model("llama", [SPEC], tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_model(str(path)), load_model(str(path), device_map=PLACEMENT)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_placement_is_real(pair):
    whole, placed = pair
    assert not whole.adapter.sharded and placed.adapter.sharded
    offloaded = set(placed.adapter.offloaded())
    assert "lm_head" in offloaded and "model.layers.1.self_attn.o_proj" in offloaded
    assert all(name == "lm_head" or name.startswith("model.layers.1.") for name in offloaded)
    assert placed.adapter.layers[1].self_attn.o_proj.weight.device.type == "meta"
    assert placed.info["device_map"]["model.layers.1"] == "disk"
    assert [execution_device(layer) for layer in placed.adapter.layers] == [torch.device("cpu")] * 3


def test_layer_loop_keeps_accelerates_hooks(pair):
    _, placed = pair
    before = [layer.__dict__["forward"] for layer in placed.adapter.layers]
    ids = torch.tensor([[1, 2, 3, 4]])
    placed.adapter.layer_inputs(ids)
    assert [layer.__dict__["forward"] for layer in placed.adapter.layers] == before
    assert torch.equal(placed.adapter.forward(ids), placed.model(ids).logits)
    attention = [placed.adapter.attention(i) for i in range(placed.adapter.n_layers)]
    own = [a.__dict__.get("forward") for a in attention]
    with fixed_attention(placed.adapter, {i: torch.zeros(1, 4, placed.adapter.hidden_size) for i in range(3)}):
        assert all(a.__dict__["forward"] is not f for a, f in zip(attention, own, strict=True))
    assert [a.__dict__.get("forward") for a in attention] == own and own[1] is not None  # accelerate's hook is back
    assert torch.equal(placed.adapter.forward(ids), placed.model(ids).logits)


def test_every_intervention_matches_the_whole_model(pair, tokenizer):
    whole, placed = pair
    task = build_task(SPEC, tokenizer)
    ids = task.input_ids_PT
    assert torch.equal(placed.model(ids).logits, whole.model(ids).logits)
    assert means_key(placed.adapter, task) == means_key(whole.adapter, task)  # offloaded weights are read too
    means = compute_means(whole.adapter, task)
    placed_means = compute_means(placed.adapter, task)
    assert torch.equal(placed_means.cond_LTSD, means.cond_LTSD)
    for config in (AF1Config(wait=0, transfer=1), AF1Config(wait=1, transfer=1, ablation="mean", abp="sink")):
        expected = reference_logits(whole.adapter, task, config, means)
        assert torch.equal(reference_logits(placed.adapter, task, config, means), expected)
    config = AF1Config(wait=0, transfer=1)  # the fast executor's case (it refuses the ABP variant above)
    assert torch.equal(
        fast_logits(placed.adapter, task, config, means), fast_logits(whole.adapter, task, config, means)
    )
    cf = counterfactual(task, tokenizer)
    for path in heads.patching.PATHS:
        a, b = (
            heads.patching.path_patching(whole.adapter, task, cf, path),
            heads.patching.path_patching(placed.adapter, task, cf, path),
        )
        assert a.keys() == b.keys() and all(
            a[k] == b[k] if isinstance(a[k], str | float | dict) else torch.equal(a[k], b[k]) for k in a
        )
    lens, whole_lens = heads.lens.mlp_logit_lens(placed.adapter, task), heads.lens.mlp_logit_lens(whole.adapter, task)
    assert lens is not None and whole_lens is not None and torch.equal(lens, whole_lens)
    setup = prepare(placed, SPEC)
    assert setup.base.accuracy == 1.0
    sweep = allforone.sweep.sweep(setup, max_transfer=1)
    whole_sweep = allforone.sweep.sweep(prepare(whole, SPEC), max_transfer=1)
    assert torch.equal(
        torch.tensor(sweep.faithfulness_wait_transfer).nan_to_num(-1),
        torch.tensor(whole_sweep.faithfulness_wait_transfer).nan_to_num(-1),
    )


def test_bfloat16_placed_and_whole_agree(pair, tokenizer):
    """The dtype large models load in: the same numbers whole and placed, and fast = reference."""
    path = pair[0].info["path"]
    whole, placed = load_model(path, dtype="bfloat16"), load_model(path, dtype="bfloat16", device_map=PLACEMENT)
    assert next(placed.model.parameters()).dtype == torch.bfloat16
    task = build_task(SPEC, tokenizer)
    # fp32 means, cast to the layer's dtype when they replace states; as if over other problems (no leave-one-out):
    # a problem's own bf16 state differs by an ulp between the fast path's shared-context forward and the hook
    # path's whole prompt, which this fitted model amplifies (leave-one-out fast = reference: tests/test_af1.py)
    means = dataclasses.replace(compute_means(whole.adapter, task), member_hashes=torch.empty(0, dtype=torch.int64))
    config = AF1Config(wait=0, transfer=1)
    expected = reference_logits(whole.adapter, task, config, means)
    assert torch.equal(reference_logits(placed.adapter, task, config, means), expected)
    fast = fast_logits(placed.adapter, task, config, means)
    assert torch.equal(fast, fast_logits(whole.adapter, task, config, means))  # the placement changes no bit
    # The fast path's one-query attention rounds its bf16 output other than sdpa does (both within one ulp of float32),
    # and this fitted tiny model amplifies one ulp into whole logits: so both are held to the float32 reference.
    truth = reference_logits(pair[0].adapter, task, config, means)
    # The argmaxes are no measure here: this fitted model turns bf16 rounding into logit changes of up to 17 in both
    # paths, so 18 or 23 of 30 agree with float32 depending on the machine's kernels (a fresh venv gave 18 and 23
    # where an earlier one gave counts a tenth apart). What is held: the error on the tokens that compete for the
    # prediction (float32's top 10 per problem; 1.61 vs 1.55 logits here) and over the whole vocabulary.
    top = truth.topk(10, -1).indices
    near = [(x.gather(-1, top) - truth.gather(-1, top)).abs().mean().item() for x in (fast, expected)]
    error = [(x - truth).abs().mean().item() for x in (fast, expected)]
    assert near[0] < 1.25 * near[1] and error[0] < 1.5 * error[1] and max(error) < 2e-3
    assert prepare(placed, SPEC).base.accuracy == prepare(whole, SPEC).base.accuracy > 0.3


def test_fine_tuning_refuses_offloaded_weights(pair, tokenizer):
    _, placed = pair
    with pytest.raises(Af1Error, match="offload"):
        train(placed.adapter, build_task(SPEC, tokenizer), FinetuneConfig(steps=1), None)


def test_execution_devices_come_from_the_hooks():
    """A multi-GPU map read without GPUs: each part's device is its hook's execution device."""
    layers = [torch.nn.Linear(2, 2) for _ in range(3)]
    for layer, device in zip(layers, [0, 1, "cpu"], strict=True):
        layer._hf_hook = SimpleNamespace(execution_device=device)  # pyright: ignore
    assert [execution_device(m) for m in layers] == [
        torch.device("cuda:0"),
        torch.device("cuda:1"),
        torch.device("cpu"),
    ]
    assert execution_device(torch.nn.Linear(2, 2)) == torch.device("cpu")


def test_cli_device_map_errors_and_auto(capsys, pair):
    code, out, err = run_cli(capsys, "eval", "--device-map", "everywhere")
    assert code == 2 and err.startswith("af1: error: unknown device map 'everywhere'") and out == ""
    _, placed = pair
    path = placed.info["path"]
    code, out, err = run_cli(
        capsys, "eval", "--model", path, "--device-map", "auto", "--shots", "1", "--n", "30", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["base_accuracy"]["value"] == 1.0
