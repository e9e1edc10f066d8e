"""AF1 on tiny models of every family: exactness of the interventions, fast path = hook path."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from af1 import Af1Error, ModelAdapter
from af1.executors.fast import (
    fast_logits,
    fast_pruned_logits,
    fast_sweep_wait,
    knockout_logits,
    supports,
    token_local_kv,
)
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config
from af1.interventions.attention import attention_plans, check_maskable
from af1.interventions.masks import abp_masks, last_token_knockout
from af1.interventions.means import PositionMeans, compute_means, compute_step_means, means_key
from af1.interventions.sites import record, residual
from af1.models.adapter import weight_of
from af1.tasks.evaluation import last_logits
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import TINY_FAMILIES, tiny_model

TOL = 1e-4


@pytest.fixture(scope="module", params=["prefix", "instruction", "bos", "step1"])
def task(request, tokenizer):
    """A constant few-shot prefix; no shots but a style whose constant instruction is the context (no BOS); no
    prefix at all, so a BOS is prepended as the only context; and the second answer step of full scoring, whose
    last token (the answer's first digit) and one more position vary."""
    if request.param == "prefix":
        return build_task(TaskSpec(operation="a+b", shots=1, n=12, seed=3), tokenizer)
    if request.param == "instruction":
        task = build_task(TaskSpec(operation="a+b", style="calculate", shots=0, n=12, seed=3), tokenizer)
        assert task.bos is None and task.context_len > 1
        return task
    if request.param == "bos":
        task = build_task(TaskSpec(operation="a+b", shots=0, n=12, seed=3), tokenizer)
        assert task.bos is not None and task.context_len == 1
        return task
    step = build_task(TaskSpec(operation="a+b", shots=1, n=40, seed=3), tokenizer).steps()[1]
    assert step.step == 1 and len(step) >= 10
    return step


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def tiny(request, task):
    adapter = ModelAdapter(tiny_model(request.param))
    return adapter, compute_means(adapter, task, batch_size=5)


# the families the fast executor runs: gptj has no attention interface, and the fast executor refuses it
# (`test_executor_choice_names_why_it_is_not_faster`)
FAST_FAMILIES = [family for family in TINY_FAMILIES if family != "gptj"]


@pytest.fixture(scope="module", params=FAST_FAMILIES)
def fast_tiny(request, task):
    adapter = ModelAdapter(tiny_model(request.param))
    return adapter, compute_means(adapter, task, batch_size=5)


def test_no_intervention_is_bit_identical(tiny, task):
    adapter, means = tiny
    plain = last_logits(adapter.model, task.input_ids_PT, batch_size=32)
    assert torch.equal(reference_logits(adapter, task, AF1Config(abp="none"), means), plain)
    with attention_plans(adapter, {}):
        assert torch.equal(last_logits(adapter.model, task.input_ids_PT, batch_size=32), plain)


def outside(means: PositionMeans) -> PositionMeans:
    """The same sums, as if over a copy of the problems: nobody is left out of their own mean."""
    return dataclasses.replace(means, member_hashes=torch.empty(0, dtype=torch.int64))


def test_cama_over_one_problem_changes_nothing(tiny, task):
    adapter, _ = tiny
    one = task.subset([4])
    means = compute_means(adapter, dataclasses.replace(one, context_len=0))  # from full forwards, as the hook path
    plain = last_logits(adapter.model, one.input_ids_PT)
    for wait in range(adapter.n_layers):
        assert torch.equal(reference_logits(adapter, one, AF1Config(wait=wait, abp="none"), outside(means)), plain)


def test_leave_one_out_is_the_mean_of_the_others(tiny, task):
    """A problem inside the means is ablated to the mean of the other problems with its token at each position, or
    where none has it, to the mean of all the others; a problem outside them to the mean of all."""
    adapter, means = tiny
    ids = task.input_ids_PT
    with record(adapter, [residual(1)]) as cache:
        adapter.model(input_ids=ids)
    h_PTD = cache[residual(1)].float()
    for p in (0, 5):
        got = means.replacement(1, ids[p : p + 1], h_PTD[p : p + 1])[0]
        got_mean = means.replacement(1, ids[p : p + 1], h_PTD[p : p + 1], conditional=False)[0]
        others = torch.tensor([q != p for q in range(len(task))])
        assert torch.allclose(got_mean, h_PTD[others].mean(0), atol=1e-5)
        fell_back = means.fallbacks(ids[p : p + 1], task.context_len)[0]
        for t in range(task.context_len, task.n_positions):
            same = others & (ids[:, t] == ids[p, t])
            want = h_PTD[same].mean(0)[t] if same.any() else h_PTD[others].mean(0)[t]
            assert torch.allclose(got[t], want, atol=1e-5)
            assert bool(fell_back[t]) == (not bool(same.any()))
    mean_all = outside(means).replacement(1, ids[:1], h_PTD[:1])[0]
    assert torch.allclose(mean_all, means.conditional(1, ids[:1])[0], atol=1e-6)


@pytest.mark.parametrize("ablation", ["cama", "mean", "zero"])
def test_a_token_the_means_never_saw_gets_the_token_agnostic_mean(tiny, task, ablation):
    """Means over some of the problems only (as a sample can be): a token they never had at a position is ablated
    to the token-agnostic mean there, counted as a fallback, and the fast path equals the hook path."""
    adapter, _ = tiny
    part = task.subset(list(range(len(task) // 2)))
    means = compute_means(adapter, part, batch_size=5)
    unseen = means.unseen(task.input_ids_PT)
    assert unseen.any() and not unseen[: len(part)].any()
    with record(adapter, [residual(0)]) as cache:
        adapter.model(input_ids=task.input_ids_PT)
    h_PTD = cache[residual(0)].float()
    got = means.replacement(0, task.input_ids_PT, h_PTD)
    agnostic = means.replacement(0, task.input_ids_PT, h_PTD, conditional=False)
    never = means.counts(task.input_ids_PT) == 0
    assert torch.equal(got[never], agnostic[never]) and bool(means.fallbacks(task.input_ids_PT, 0)[never].all())
    config = AF1Config(wait=0, transfer=1, ablation=ablation)
    if supports(adapter, task, config) is not None:  # the fast executor refuses it: nothing faster to compare
        assert adapter.family.name == "gptj"
        return
    assert (
        reference_logits(adapter, task, config, means) - fast_logits(adapter, task, config, means)
    ).abs().max() <= TOL


@pytest.mark.parametrize("ablation", ["cama", "mean"])
def test_fast_equals_reference_without_leave_one_out(fast_tiny, task, ablation):
    adapter, means = fast_tiny
    config = AF1Config(wait=0, transfer=1, ablation=ablation)
    ref = reference_logits(adapter, task, config, outside(means))
    assert (ref - fast_logits(adapter, task, config, outside(means))).abs().max() <= TOL
    assert (ref - reference_logits(adapter, task, config, means)).abs().max() > TOL  # leaving out changes logits


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_step_means_in_one_pass_equal_each_step_on_its_own(family, tokenizer):
    """Every answer step's means from one forward per problem (its prompt and every answer token but the last)
    equal the means of each step's own forwards: a causal position never reads later tokens."""
    adapter = ModelAdapter(tiny_model(family))
    steps = build_task(TaskSpec(operation="a+b", shots=1, n=40, seed=3), tokenizer).steps()
    assert len(steps) == 3 and len(steps[2]) < len(steps[1]) == len(steps[0])  # the end is a step of its own
    together = compute_step_means(adapter, steps, batch_size=7)
    for step, one in zip(steps, together, strict=True):
        alone = compute_means(adapter, step, batch_size=5)
        assert (one.sums_LTSD - alone.sums_LTSD).abs().max() <= TOL * max(1.0, float(alone.counts_TS.max()))
        assert torch.equal(one.counts_TS, alone.counts_TS) and torch.equal(one.slot_tokens_TS, alone.slot_tokens_TS)
        assert torch.equal(one.member_hashes, alone.member_hashes) and one.key == alone.key == means_key(adapter, step)


def test_cama_changes_logits_of_a_real_distribution(tiny, task):
    adapter, means = tiny
    plain = last_logits(adapter.model, task.input_ids_PT)
    assert not torch.allclose(reference_logits(adapter, task, AF1Config(wait=0, abp="none"), means), plain)


@pytest.mark.parametrize(
    ("wait", "transfer", "pruned"),
    [(-1, 0, []), (-1, 3, []), (0, 1, []), (0, 2, [(1, 0), (2, 3)]), (1, 0, []), (1, 1, [(2, 1)]), (2, 0, [])],
)
def test_fast_equals_reference(fast_tiny, task, wait, transfer, pruned):
    adapter, means = fast_tiny
    config = AF1Config(wait=wait, transfer=transfer, pruned_heads=pruned)
    ref = reference_logits(adapter, task, config, means)
    fast = fast_logits(adapter, task, config, means)
    assert (ref - fast).abs().max() <= TOL


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_fast_equals_reference_for_other_ablations(fast_tiny, task, ablation):
    adapter, means = fast_tiny
    config = AF1Config(wait=0, transfer=1, ablation=ablation)
    assert (
        reference_logits(adapter, task, config, means) - fast_logits(adapter, task, config, means)
    ).abs().max() <= TOL


def test_fast_moved_window_equals_reference(fast_tiny, task):
    adapter, means = fast_tiny
    config = AF1Config(wait=-1, transfer=1, transfer_start=1)
    assert (
        reference_logits(adapter, task, config, means) - fast_logits(adapter, task, config, means)
    ).abs().max() <= TOL


def test_fast_sweep_equals_single_runs(fast_tiny, task):
    adapter, means = fast_tiny
    for wait in (-1, 0, 1):
        ks = list(range(adapter.n_layers - wait))
        swept = fast_sweep_wait(adapter, task, AF1Config(wait=wait), means, ks, batch_size=5)
        greedy = fast_sweep_wait(adapter, task, AF1Config(wait=wait), means, ks, batch_size=5, greedy=True)
        for k in ks:
            ref = reference_logits(adapter, task, AF1Config(wait=wait, transfer=k), means)
            assert (swept[k] - ref).abs().max() <= TOL
            assert torch.equal(greedy[k], swept[k].argmax(-1))


def test_knockout_equals_reference(tiny, task):
    adapter, _ = tiny
    sets = [[], [0], [1, 2]]
    greedy = knockout_logits(adapter, task, sets, batch_size=5, greedy=True)
    for layers, fast, tokens in zip(sets, knockout_logits(adapter, task, sets, batch_size=5), greedy, strict=True):
        extra = last_token_knockout(task.n_positions, task.context_len, layers)
        ref = reference_logits(adapter, task, AF1Config(abp="none"), None, extra_masks=extra)
        assert (ref - fast).abs().max() <= TOL
        assert torch.equal(tokens, fast.argmax(-1))


def test_fast_pruned_sets_equal_reference(tiny, task):
    adapter, means = tiny
    config = AF1Config(wait=0, transfer=2)
    if supports(adapter, task, config) is not None:  # pruning falls back to one reference run per set there
        assert adapter.family.name == "gptj"
        return
    kv = token_local_kv(adapter, task, config, means)
    sets = [[], [(1, 0)], [(1, 0), (2, 3), (2, 1)]]
    for heads, fast in zip(sets, fast_pruned_logits(adapter, task, config, kv, sets, max_rows=7), strict=True):
        ref = reference_logits(adapter, task, config.model_copy(update={"pruned_heads": heads}), means)
        assert (ref - fast).abs().max() <= TOL


SHARED_CASES = [
    AF1Config(abp="none"),  # the unmodified model
    AF1Config(wait=0, abp="none"),  # CAMA alone
    AF1Config(wait=1, transfer=1, ablation="none"),  # ABP alone
    AF1Config(wait=0, transfer=1, ablation="resample", seed=2),
    AF1Config(wait=1, transfer=1, ablation="zero", abp="sink"),
    AF1Config(wait=0, transfer=1, ablation="mean", abp="all-peek"),
    AF1Config(wait=0, transfer=1, abp="zero-output"),
    AF1Config(wait=0, transfer=2, pruned_heads=[(1, 0), (2, 1)]),
]


@pytest.mark.parametrize("config", SHARED_CASES, ids=lambda c: f"{c.wait}-{c.transfer}-{c.ablation}-{c.abp}")
def test_shared_context_equals_reference(tiny, task, config):
    """The context run once and each problem's suffix on its keys/values = the hook path on whole prompts, for
    every ablation and ABP variant (and the necessity knock-out ANDed in)."""
    from af1.executors.fast import context_kv
    from af1.executors.shared_context import Clean, clean_suffix_states, shared_context_logits, supports_shared

    adapter, means = tiny
    if supports_shared(adapter, task) is not None:
        assert adapter.family.name == "gptj"
        return
    donors = task.subset(list(range(len(task) - 1, -1, -1)))
    ref = reference_logits(adapter, task, config, means, donors=donors)
    shared = shared_context_logits(adapter, task, config, means, batch_size=5, donors=donors)
    assert (ref - shared).abs().max() <= TOL
    ctx = context_kv(adapter, task)
    clean = clean_suffix_states(adapter, task, ctx)
    resumed = shared_context_logits(adapter, task, config, means, 5, donors=donors, ctx=ctx, clean=Clean(clean))
    assert (ref - resumed).abs().max() <= TOL  # resumed from the unmodified run at the first changed block


def test_clean_states_past_the_memory_budget_live_on_disk_and_give_the_same_logits(tiny, task, monkeypatch):
    """AF1_MEMORY_GB below the clean states' size puts them in files: the same states bit for bit, the same
    resumed logits, and a split resumed through its rows equals those rows of the whole."""
    from af1.executors.fast import context_kv
    from af1.executors.shared_context import Clean, clean_suffix_states, shared_context_logits, supports_shared
    from af1.executors.spill import layer_tables

    adapter, means = tiny
    if supports_shared(adapter, task) is not None:
        assert adapter.family.name == "gptj"
        return
    ctx = context_kv(adapter, task)
    config = AF1Config(wait=0, transfer=1, ablation="resample", seed=2)
    in_memory = clean_suffix_states(adapter, task, ctx, batch_size=5)
    resumed = shared_context_logits(adapter, task, config, means, 5, ctx=ctx, clean=Clean(in_memory))
    monkeypatch.setenv("AF1_MEMORY_GB", "1e-9")
    assert layer_tables(2, (3, 4), torch.float32)[1] == "disk"
    on_disk = clean_suffix_states(adapter, task, ctx, batch_size=5)
    assert all(torch.equal(a, b) for a, b in zip(in_memory, on_disk, strict=True))
    assert on_disk[0].untyped_storage().filename is not None and in_memory[0].untyped_storage().filename is None
    assert torch.equal(resumed, shared_context_logits(adapter, task, config, means, 5, ctx=ctx, clean=Clean(on_disk)))
    rows = torch.tensor([4, 0, 2])
    part = shared_context_logits(
        adapter,
        task.subset(rows.tolist()),
        config.model_copy(update={"ablation": "cama"}),
        means,
        5,
        ctx=ctx,
        clean=Clean(on_disk, rows),
    )
    whole = shared_context_logits(adapter, task, config.model_copy(update={"ablation": "cama"}), means, 5, ctx=ctx)
    assert (part - whole[rows]).abs().max() <= TOL


def test_a_bad_memory_budget_is_a_one_line_error(monkeypatch):
    from af1.executors.spill import memory_budget_bytes

    monkeypatch.setenv("AF1_MEMORY_GB", "lots")
    with pytest.raises(Af1Error, match="AF1_MEMORY_GB must be a positive number"):
        memory_budget_bytes()
    monkeypatch.setenv("AF1_MEMORY_GB", "0.5")
    assert memory_budget_bytes() == 2**29


def test_executor_choice_names_why_it_is_not_faster(task):
    from af1.executors.protocol import pick, recorded

    def choice(adapter, config, reference=False):
        return recorded([pick(adapter, task, config, reference)])

    llama = ModelAdapter(tiny_model("llama"))
    assert choice(llama, AF1Config(wait=0, transfer=1)) == {"executor": "fast", "fallback_reason": None}
    how = choice(llama, AF1Config(wait=0, transfer=1, abp="sink"))
    assert how["executor"] == "shared-context" and "ABP variant" in (how["fallback_reason"] or "")
    gptj = ModelAdapter(tiny_model("gptj"))
    how = choice(gptj, AF1Config(wait=0, transfer=1))
    assert how["executor"] == "reference" and "attention interface" in (how["fallback_reason"] or "")
    with pytest.raises(ValueError, match="attention interface"):  # chosen once: the executor never falls back itself
        fast_logits(gptj, task, AF1Config(wait=0, transfer=1), None)
    with pytest.raises(ValueError, match="attention interface"):
        fast_sweep_wait(gptj, task, AF1Config(wait=0), None, [0, 1])
    with pytest.raises(Af1Error, match="out of range"):  # the door to the executors checks the config
        pick(llama, task, AF1Config(wait=9))
    assert choice(llama, AF1Config(), reference=True)["executor"] == "reference"
    both = recorded([pick(llama, task, AF1Config(wait=0, transfer=1)), pick(gptj, task, AF1Config(wait=0, transfer=1))])
    assert both["executor"] == "mixed" and "attention interface" in (both["fallback_reason"] or "")


def test_zero_output_variant_zeroes_what_abp_would_mask(task):
    from af1.interventions.af1 import zeroed_outputs

    n, c = task.n_positions, task.context_len
    zeroed = zeroed_outputs(task, AF1Config(wait=0, transfer=1, abp="zero-output"), n_layers=3)
    assert zeroed == {1: list(range(c, n - 1)), 2: list(range(c, n))}  # the last token keeps its peek layer
    adapter = ModelAdapter(tiny_model("llama"))
    means = compute_means(adapter, task)
    config = AF1Config(wait=0, transfer=1)
    masked = reference_logits(adapter, task, config, means)
    zero = reference_logits(adapter, task, config.model_copy(update={"abp": "zero-output"}), means)
    assert not torch.allclose(masked, zero)
    assert "ABP variant" in str(supports(adapter, task, config.model_copy(update={"abp": "zero-output"})))


def test_non_cama_ablations_replace_the_first_varying_position(task):
    from af1.interventions.af1 import ablation_start

    assert ablation_start(AF1Config(wait=0), task) == task.context_len + 1
    for ablation in ("zero", "mean", "resample"):
        assert ablation_start(AF1Config(wait=0, ablation=ablation), task) == task.context_len


def test_fast_path_coverage():
    adapter = ModelAdapter(tiny_model("gptj"))
    assert "attention interface" in supports(adapter, None, AF1Config())  # type: ignore[arg-type]


def test_abp_attention_pattern(task):
    """wait -1, transfer L: the last row stays causal, other non-context rows see context and themselves."""
    adapter = ModelAdapter(tiny_model("llama", attn="eager"))
    n, c = task.n_positions, task.context_len
    config = AF1Config(wait=-1, transfer=adapter.n_layers)
    from af1.interventions.af1 import af1_intervention

    ids = task.input_ids_PT[:2]
    with af1_intervention(adapter, task, config, None, ids):
        attentions = adapter.model(ids, output_attentions=True, use_cache=False).attentions
    for layer_attn in attentions:
        weights = layer_attn[0, 0]
        assert (weights[n - 1] > 0).all()
        for q in range(c, n - 1):
            seen = (weights[q] > 0).nonzero().flatten().tolist()
            assert seen == [*range(c), q]
        assert torch.allclose(weights[:c, :c], torch.tril(weights[:c, :c]))


def test_masks_follow_the_spec():
    masks = abp_masks(6, 2, wait=0, peek_layers=[1, 2], n_layers=4)
    assert sorted(masks) == [1, 2, 3]
    assert masks[1][0, 5].all() and not masks[3][0, 5, 2:5].any() and masks[3][0, 5, 5]
    assert masks[1][0, 3].tolist() == [True, True, False, True, False, False]
    assert masks[1][0, 1].tolist() == [True, True, False, False, False, False]  # context query: causal
    sink = abp_masks(6, 2, wait=0, peek_layers=[], n_layers=2, variant="sink")
    assert sink[1][0, 3].tolist() == [False, True, False, True, False, False]
    allpeek = abp_masks(6, 2, wait=0, peek_layers=[1], n_layers=2, variant="all-peek")
    assert allpeek[1][0, 3].tolist() == [True, True, True, True, False, False]


def test_means_are_streamed_exactly(tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=20), tokenizer)
    adapter = ModelAdapter(tiny_model("qwen2"))
    means = compute_means(adapter, task, batch_size=3)
    with record(adapter, [residual(1)]) as cache:
        adapter.model(task.input_ids_PT, use_cache=False)
    h = cache[residual(1)]
    t = task.context_len + 2  # B's position
    for token in task.input_ids_PT[:, t].unique():
        rows = task.input_ids_PT[:, t] == token
        ids = task.input_ids_PT[rows][:1]
        assert torch.allclose(means.conditional(1, ids)[0, t], h[rows, t].mean(0), atol=1e-6)
    assert torch.allclose(means.mean_LTD[1], h.mean(0), atol=1e-6)
    assert int(means.counts_TS[t].sum()) == len(task)


def test_means_roundtrip_and_key_check(tmp_path, tokenizer):
    task = build_task(TaskSpec(operation="a+b", n=10), tokenizer)
    adapter = ModelAdapter(tiny_model("llama"))
    means = compute_means(adapter, task)
    path = means.save(tmp_path / "m.safetensors")
    back = PositionMeans.load(path, expected_key=means_key(adapter, task))
    assert torch.equal(back.cond_LTSD, means.cond_LTSD) and back.meta["n_problems"] == 10
    other = ModelAdapter(tiny_model("llama", seed=1))
    with pytest.raises(Af1Error, match="another model or task"):
        PositionMeans.load(path, expected_key=means_key(other, task))
    with pytest.raises(Af1Error, match="cannot read"):
        PositionMeans.load(tmp_path / "missing.safetensors")


def test_the_means_key_sees_every_weight(tokenizer):
    """A model changed far inside one tensor (as fine-tuning a few heads does) gets another means key."""
    task = build_task(TaskSpec(operation="a+b", n=10), tokenizer)
    adapter = ModelAdapter(tiny_model("llama"))
    before = means_key(adapter, task)
    assert means_key(ModelAdapter(tiny_model("llama")), task) == before  # same weights, same key
    weight = weight_of(adapter.o_proj(2))
    assert weight.numel() > 1000
    with torch.no_grad():
        weight.view(-1)[-1] += 1e-3  # the last entry of one layer's o_proj
    assert means_key(adapter, task) != before


def test_resample_is_seeded_and_intervenes(task):
    adapter = ModelAdapter(tiny_model("llama"))
    a = reference_logits(adapter, task, AF1Config(wait=0, ablation="resample", abp="none", seed=1), None)
    b = reference_logits(adapter, task, AF1Config(wait=0, ablation="resample", abp="none", seed=1), None)
    plain = last_logits(adapter.model, task.input_ids_PT)
    assert torch.equal(a, b) and not torch.allclose(a, plain)


def test_config_errors():
    with pytest.raises(Af1Error, match="out of range"):
        AF1Config(wait=5).check(3)
    with pytest.raises(Af1Error, match="past the last layer"):
        AF1Config(wait=0, transfer=3).check(3)
    with pytest.raises(Af1Error, match="not a head of a transfer layer"):
        AF1Config(wait=0, transfer=1, pruned_heads=[(2, 0)]).check(3, 4)
    with pytest.raises(ValueError):
        AF1Config(wait=-2)


def test_flash_attention_is_refused():
    adapter = ModelAdapter(tiny_model("llama"))
    adapter.model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(Af1Error, match="cannot take arbitrary masks"):
        check_maskable(adapter)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_nested_attention_plans_restore_the_outer_plan(family, tokenizer):
    from af1.interventions.attention import LayerPlan, attention_plans
    from af1.interventions.masks import self_and_context

    task = build_task(TaskSpec(operation="a+b", shots=1, n=6, seed=3), tokenizer)
    adapter = ModelAdapter(tiny_model(family))
    n, c = task.n_positions, task.context_len
    only_self = LayerPlan(allowed_BQK=self_and_context(n, c)[None])
    only_first = LayerPlan(allowed_BQK=torch.tril(torch.ones(n, n, dtype=torch.bool))[None] & (torch.arange(n) < c + 1))

    def logits() -> torch.Tensor:
        return last_logits(adapter.model, task.input_ids_PT)

    plain = logits()
    with attention_plans(adapter, {1: only_self}):
        outer = logits()
        with attention_plans(adapter, {1: only_first, 2: only_self}):
            inner = logits()
        assert torch.equal(logits(), outer)  # the outer plan is back on layer 1, layer 2 is plain again
    assert torch.equal(logits(), plain)
    with attention_plans(adapter, {1: only_first, 2: only_self}):
        assert torch.equal(logits(), inner)  # the inner block alone: the same plans, the same logits
    assert not torch.equal(outer, plain) and not torch.equal(inner, outer)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_one_query_attention_is_the_kernel(shared, softcap):
    """The fast path's attention of one query to a prefix and itself = sdpa over the concatenated keys, with key-value
    heads shared by query groups; in bf16 both are within the kernel's rounding of the float32 result."""
    from af1.interventions.attention import one_query_attention

    gen = torch.Generator().manual_seed(0)
    B, H, J, c, d = 5, 6, 2, 7, 8

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 2

    q, k, v = rand(B, H, 1, d), rand(B, J, 1, d), rand(B, J, 1, d)
    prefix = (rand(1 if shared else B, J, c, d), rand(1 if shared else B, J, c, d))

    def joined(dtype: torch.dtype) -> list[torch.Tensor]:  # the prefix and the row's own key (value) in one
        return [torch.cat([p.expand(B, -1, -1, -1), x], 2).to(dtype) for p, x in zip(prefix, (k, v), strict=True)]

    def kernel(dtype: torch.dtype) -> torch.Tensor:
        keys, values = joined(dtype)
        keys, values = keys.repeat_interleave(H // J, 1), values.repeat_interleave(H // J, 1)
        scores = (q.to(dtype).float() @ keys.float().transpose(-1, -2)) * 0.3
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        out = torch.softmax(scores, -1) @ values.float()
        return out.transpose(1, 2).to(dtype)  # [B, 1, H, d]

    exact = kernel(torch.float32)
    mine, _ = one_query_attention(q, k, v, prefix, 0.3, softcap)
    assert mine.shape == (B, 1, H, d) and (mine - exact).abs().max() < 1e-5
    if softcap is None:
        keys, values = joined(torch.float32)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, keys, values, scale=0.3, enable_gqa=True)
        assert (mine - sdpa.transpose(1, 2)).abs().max() < 1e-5
    prefix_half = (prefix[0].bfloat16(), prefix[1].bfloat16())
    half, _ = one_query_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), prefix_half, 0.3, softcap)
    assert half.dtype == torch.bfloat16
    assert ((half.float() - kernel(torch.bfloat16).float()).abs() <= 2**-7 * exact.abs().clamp(min=1)).all()
