"""Position + meaning: the additive fit is exact on additive logits; captures and controls run on tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from af1 import Af1Error, ModelAdapter
from af1.methods import positional

from conftest import tiny_model


def synthetic(T: int = 12, n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a, b, c = torch.randn(n, T, generator=g), torch.randn(n, T, generator=g), torch.randn(n, T, generator=g)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    W = (a[:, (i - j).clamp(min=0)] + b[:, i.expand(T, T)] + c[:, j.expand(T, T)]) * (j <= i)
    return W, torch.randn(n, T, T, generator=g)


def test_additive_fit_recovers_additive_logits():
    W, _ = synthetic()
    fit = positional.fit.additive_fit(W, iters=200)
    mask = torch.ones(12, 12, dtype=torch.bool).tril()
    assert torch.allclose(fit[:, mask], W[:, mask], atol=1e-4)
    q = positional.fit.fit_quality(W)
    for key in ("r", "r_row_centred", "r_no_sink"):
        assert torch.allclose(q[key], torch.ones(3), atol=1e-4)


def test_additive_fit_is_poor_on_noise():
    _, noise = synthetic()
    assert positional.fit.fit_quality(noise)["r"].max() < 0.8


def test_rope_unrotate_inverts_the_rotation():
    adapter = ModelAdapter(tiny_model("llama"))
    cos, sin = positional.rope.rope_tables(adapter, 16)
    x = torch.randn(2, 16, 16)
    post = x * cos + positional.rope._rotate_half(x) * sin
    assert torch.allclose(positional.rope.unrotate(post, cos, sin), x, atol=1e-5)


def test_captured_logits_match_eager_attention(tokenizer):
    model = tiny_model("llama", attn="eager")
    adapter = ModelAdapter(model)
    ids = torch.randint(0, 1000, (2, 10))
    logits = positional.fit.capture_logits(adapter, ids)
    attn = model(ids, output_attentions=True, use_cache=False).attentions
    for layer in range(adapter.n_layers):
        probs = torch.softmax(logits[layer].masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), -1e30), -1)
        assert torch.allclose(probs, attn[layer].transpose(0, 1), atol=1e-5)


def test_study_on_a_tiny_model(tokenizer):
    adapter = ModelAdapter(tiny_model("qwen2"))
    result = positional.study.study(
        adapter, tokenizer, positional.study.PositionalConfig(window=32, n_windows=2, n_queries=3)
    )
    assert len(result.r_layer_head) == 3 and all(len(row) == 4 for row in result.r_layer_head)
    assert result.dummy_distance_r2_median is not None and result.band_logit_variance_share is not None
    for key in ("r_mean", "r_median", "r_median_row_centred", "r_median_random_init", "dummy_distance_r2_median"):
        value = getattr(result, key)
        assert value is not None and -1 <= value <= 1
    for control in ("random_init", "norm_matched", "shuffled"):  # each control: plain and row-centred r
        for key in (control, f"{control}_row_centred"):
            (low, high), median = result.median_ci[key], result.distribution[key]["median"]
            assert low is not None and high is not None and median is not None
            assert low <= median + 1e-6 and high >= low
    assert result.window_start == "<|im_start|>"  # the tokenizer's BOS leads every window
    assert set(result.perplexity_vs_swap) == {str(f) for f in positional.perturbation.SWAP_FRACTIONS}
    assert len(result.band_logit_variance_share) == 8
    assert result.median_ci_n_windows == 2 and "over the 2 windows" in result.median_ci_note
    assert any("only 2 windows" in w for w in result.warnings)  # an interval over 2 windows says little


def test_the_default_windows_are_enough_for_an_interval(tokenizer):
    """The shipped chapter cut the default way gives at least MIN_CI_WINDOWS windows (4 of 128 tokens gave
    "0.901 [0.90, 0.90]"); asking for more than the corpus holds is said."""
    adapter = ModelAdapter(tiny_model("llama"))
    config = positional.study.PositionalConfig()
    ids = positional.corpus.corpus_windows(
        adapter, tokenizer, positional.corpus.load_corpus(), config.window, config.n_windows, 1
    )
    assert ids.shape == (config.n_windows, config.window) and config.n_windows >= positional.corpus.MIN_CI_WINDOWS
    assert positional.corpus.window_warnings(config.n_windows, config.n_windows, config.window) == []
    short = positional.corpus.window_warnings(8, 40, 128)
    assert len(short) == 2 and "fewer than the 40 asked for" in short[0] and "only 8 windows" in short[1]
    single = positional.fit.median_ci(torch.rand(3, 4, 1))
    assert all(v != v for v in single)  # one window: no interval (NaN), not a zero-width one


def test_families_without_plain_rope_skip_only_the_rope_analyses(tokenizer):
    adapter = ModelAdapter(tiny_model("gpt2"))
    result = positional.study.study(adapter, tokenizer, positional.study.PositionalConfig(window=16, n_windows=1))
    skipped = result.rope_analyses_skipped
    assert skipped is not None and "rotary" in skipped and result.dummy_distance_r2_median is None
    for key in ("dummy_distance_r2_layer_head", "band_logit_variance_share", "band_key_energy_mean"):
        assert getattr(result, key) is None
    assert len(result.r_layer_head) == 3  # the rest is measured: 3 layers
    assert result.r_median == result.r_median


def test_bad_corpus_and_window(tmp_path, tokenizer):
    adapter = ModelAdapter(tiny_model("llama"))
    with pytest.raises(Af1Error, match="not found"):
        positional.corpus.load_corpus(tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(Af1Error, match="empty"):
        positional.corpus.load_corpus(tmp_path / "empty.txt")
    with pytest.raises(Af1Error, match="longer than the model's context"):
        positional.corpus.corpus_windows(adapter, tokenizer, "some text", 10_000, 1)


def test_swaps_are_adjacent_and_counted():
    import random

    order = positional.perturbation.swap_adjacent(100, 5, random.Random(0))
    assert sorted(order) == list(range(100)) and order[0] == 0
    moved = [i for i, o in enumerate(order) if o != i]
    assert len(moved) == 10 and all(abs(order[i] - i) == 1 for i in moved)  # 5 swaps move 10 tokens


def test_windows_start_like_documents(tokenizer):
    adapter = ModelAdapter(tiny_model("llama"))
    text = positional.corpus.load_corpus()
    ids = positional.corpus.corpus_windows(adapter, tokenizer, text, 16, 3, start_token=7)
    assert ids.shape == (3, 16) and (ids[:, 0] == 7).all()
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[1, 1:].tolist() == plain[15:30]  # consecutive text after each start token


def test_the_no_sink_fit_is_refitted_without_the_sink_column():
    """Logits additive except for a huge first key: the fit over all keys is poor, the refitted one exact."""
    W, _ = synthetic(T=12)
    W = W.clone()
    W[:, 1:, 0] += torch.linspace(5, 50, 11)  # a sink column that no key term of an additive fit explains
    q = positional.fit.fit_quality(W)
    assert torch.allclose(q["r_no_sink"], torch.ones(3), atol=1e-4)
    assert q["r"].max() < 0.999


def test_norm_matched_control_keeps_every_weight_norm():
    adapter = ModelAdapter(tiny_model("llama"))
    control = positional.study.random_init_like(adapter, seed=1, norm_matched=True)
    trained = dict(adapter.model.named_parameters())
    for name, weight in control.model.named_parameters():
        assert float(weight.norm()) == pytest.approx(float(trained[name].norm()), rel=1e-4), name
    name = "model.layers.1.self_attn.q_proj.weight"  # random directions, the trained norm
    assert not torch.equal(dict(control.model.named_parameters())[name], trained[name])


def test_softcapped_logits_are_fitted_where_softmax_sees_them():
    model = tiny_model("gemma2", attn="eager")
    adapter = ModelAdapter(model)
    cap = model.config.attn_logit_softcapping
    assert cap
    ids = torch.randint(0, 1000, (1, 8))
    logits = positional.fit.capture_logits(adapter, ids)
    assert float(logits.abs().max()) <= cap
    attn = model(ids, output_attentions=True, use_cache=False).attentions
    probs = torch.softmax(logits[0].masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -1e30), -1)
    assert torch.allclose(probs, attn[0].transpose(0, 1), atol=1e-5)


def test_norm_matched_control_matches_tensors_initialised_to_zero():
    model = tiny_model("qwen2")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.bias.normal_()  # a "trained" bias, where the initialiser gives zeros
    adapter = ModelAdapter(model)
    control = positional.study.random_init_like(adapter, seed=1, norm_matched=True)
    name = "model.layers.0.self_attn.q_proj.bias"
    trained, drawn = dict(model.named_parameters())[name], dict(control.model.named_parameters())[name]
    assert float(drawn.norm()) == pytest.approx(float(trained.norm()), rel=1e-4) and not torch.equal(drawn, trained)


def test_the_free_key_term_cannot_fail_and_the_held_out_token_term_can():
    """Logits whose key effect is a random number per window and position, not a function of the token: the free
    per-key fit is exact in sample, the token-shared fit on held-out windows is not; where the key effect is the
    token's, the held-out fit is exact too."""
    g = torch.Generator().manual_seed(0)
    N, T, V = 12, 24, 20
    ids = torch.randint(0, V, (N, T), generator=g)
    a, b = torch.randn(T, generator=g), torch.randn(N, T, generator=g)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    position = a[(i - j).clamp(min=0)][None] + b[:, :, None]
    by_token = position + 2 * torch.randn(V, generator=g)[ids][:, None, :]
    by_place = position + 2 * torch.randn(N, 1, T, generator=g)
    mask = (j <= i).expand(N, T, T)
    assert float(positional.fit.fit_quality(by_place * mask)["r_row_centred"].min()) > 0.999  # in sample: exact
    train = torch.arange(0, N, 2)
    held = positional.fit.token_fit_heldout(torch.stack([by_token, by_place]), ids, train)
    assert held.shape == (2, N // 2)
    assert float(held[0].min()) > 0.999 and float(held[1].mean()) < 0.8
    alone = positional.fit.token_fit_heldout(by_token[None], ids, train, with_token=False)
    assert float(alone.mean()) < float(held[0].mean()) - 0.1  # the meaning term adds what position lacks


def test_a_model_with_random_weights_is_not_called_learned(tokenizer):
    """Nothing is there: the 'trained' model is itself random weights, so the learned claim stays silent."""
    adapter = ModelAdapter(tiny_model("llama"))
    result = positional.study.study(
        adapter, tokenizer, positional.study.PositionalConfig(window=16, n_windows=8, n_queries=2)
    )
    held = result.heldout
    assert held is not None and len(held["test_windows"]) == 4 and len(held["random_init_seeds"]) == 5
    assert not set(held["train_windows"]) & set(held["test_windows"])
    claims = {c["kind"]: c for c in held["claims"]}
    assert set(claims) == {"meaning_term", "learned", "learned_at_scale", "word_order"}
    assert claims["learned"]["outcome"] != "confirmed" and claims["learned_at_scale"]["outcome"] != "confirmed"
    assert len(held["r_norm_matched_medians"]) == len(held["random_init_seeds"]) == 5
    low, high = held["r_random_init_range"]  # where one more random model falls, not the seeds' mean
    medians = np.array(held["r_random_init_medians"], dtype=float)
    half = scipy_stats.t.ppf(0.975, 4) * medians.std(ddof=1) * (1 + 1 / 5) ** 0.5
    assert low is not None and high is not None and (high - low) / 2 == pytest.approx(half)
    assert low < min(medians) <= max(medians) < high and held["r_random_init_mean"] == pytest.approx(medians.mean())
    one = positional.study.study(
        adapter, tokenizer, positional.study.PositionalConfig(window=16, n_windows=1, n_queries=2)
    )
    assert one.heldout is None and any("nothing to hold out" in w for w in one.warnings)


def test_a_median_and_its_bootstrap_interval_are_one_statistic():
    """Over an even number of heads the median is the mean of the two middle values, in the spread, the held-out
    estimates and the bootstrap: windows that agree give an interval of zero width at the reported median."""
    r_LH = torch.tensor([[0.1, 0.2], [0.3, 0.9]])  # middle values 0.2 and 0.3
    assert positional.fit.median(r_LH).item() == pytest.approx(0.25)
    assert positional.fit.summary(r_LH)["median"] == pytest.approx(0.25)
    low, high = positional.fit.median_ci(r_LH[..., None].expand(2, 2, 6))
    assert low == pytest.approx(0.25) and high == pytest.approx(0.25)


def test_a_meaning_term_gain_within_float_rounding_is_no_gain():
    """Position alone fits the logits, and the token term's held-out r differs from it by float32 rounding only,
    the same sign in every window: no gain is claimed (read as one, 8 windows alike give a one-sided p of 0.004). A
    real gain, however small against the windows' spread, is still tested."""
    pos_LHN = torch.full((2, 3, 8), 0.5)
    shuffled_LHN = pos_LHN.clone()
    rounding, _ = positional.study.window_claims(pos_LHN + 3e-8, pos_LHN, pos_LHN, shuffled_LHN, "8 windows", 0)
    assert rounding["estimate"] == 0.0 and rounding["p_value"] == 1.0 and rounding["outcome"] == "not confirmed"
    real, _ = positional.study.window_claims(pos_LHN + 1e-3, pos_LHN, pos_LHN, shuffled_LHN, "8 windows", 0)
    assert real["outcome"] == "confirmed" and (real["p_value"] or 1.0) < 0.01
    assert "at least 1 / 256" in real["rule"]  # 8 windows: 2^8 sign flips, the exact floor
    chance, _ = positional.study.window_claims(pos_LHN + 1e-3, pos_LHN, pos_LHN + 1e-3, shuffled_LHN, "8 windows", 0)
    assert chance["outcome"] != "confirmed"  # no more than the same term read with token identities permuted


def test_a_sink_on_the_first_key_is_position_not_meaning():
    """Logits that are a distance term plus a large score on the first key alone (a sink), with no token term: the
    first key's own positional term absorbs it, so the token term adds nothing on held-out windows; and a real token
    term is found, but not when its identities are permuted across the split."""
    gen = torch.Generator().manual_seed(0)
    N, T, V = 8, 12, 5
    ids_NT = torch.randint(0, V, (N, T), generator=gen)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    distance_TT = -0.3 * (i - j).clamp(min=0).float()
    sink_TT = 6.0 * (j == 0).float().expand(T, T)
    logits = (distance_TT + sink_TT).expand(1, N, T, T).clone()
    train = torch.tensor([0, 2, 4, 6])
    with_token = positional.fit.token_fit_heldout(logits, ids_NT, train)
    position = positional.fit.token_fit_heldout(logits, ids_NT, train, with_token=False)
    assert float((with_token - position).abs().max()) < 1e-4 and float(position.min()) > 0.999
    meaning_V = torch.randn(V, generator=gen) * 2
    meant = logits + meaning_V[ids_NT][:, None, :].expand(N, T, T)[None]
    real = positional.fit.token_fit_heldout(meant, ids_NT, train)
    chance = positional.fit.token_fit_heldout(meant, ids_NT, train, permuted=1)
    alone = positional.fit.token_fit_heldout(meant, ids_NT, train, with_token=False)
    assert float(real.min()) > 0.99 and float((real - alone).min()) > 0.05 and float((chance - real).max()) < -0.05
