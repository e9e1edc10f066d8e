"""Probes of the last token: a planted linear or circular feature is found where it is planted and nowhere else,
the claims stay silent where AF1 and its control hold the same, and the experiment runs end to end on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
import torch

import af1.api
from af1.interventions.af1 import AF1Config
from af1.methods import probes
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from conftest import fitted_tiny_model


def planted(values: list[int], blocks: int, width: int, at: int, seed: int, circles: bool = False) -> torch.Tensor:
    """Noise states [P, blocks, width]; at block `at` the value written along one direction (or, with `circles`, on
    the circles of periods 10 and 100 along four)."""
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(len(values), blocks, width, generator=g, dtype=torch.float64)
    v = torch.tensor(values, dtype=torch.float64)
    if circles:
        angles = [2 * math.pi * v / 10, 2 * math.pi * v / 100]
        code = torch.stack([f(a) for a in angles for f in (torch.cos, torch.sin)], 1)
        states[:, at, :4] += 10 * code
    else:
        states[:, at, 0] += 5 * v
    return states


def test_a_value_planted_in_one_block_is_read_there_and_nowhere_else():
    values = [i % 10 for i in range(120)]
    made, right = probes.curves(planted(values, 4, 16, at=2, seed=0), {"a": values}, 5, 0, probes.PERIODS)
    by_kind = {c["kind"]: c for c in made}
    linear = by_kind["linear"]
    assert linear["above_chance"] == [False, False, True, False] and probes.first_above_chance(linear) == 2
    assert linear["accuracy"][2] > 0.9 and max(linear["shuffled"]) < 0.4 and linear["majority"] == 0.1
    assert not any(by_kind["fourier"]["above_chance"][i] for i in (0, 1, 3))  # a line is not a circle, but no noise
    assert right["a", "fourier"].shape == (120, 4)


def test_a_value_on_circles_is_read_by_the_fourier_probe_and_missed_by_the_linear_one():
    values = [(7 * i) % 100 for i in range(300)]
    made, _ = probes.curves(planted(values, 2, 12, at=1, seed=1, circles=True), {"a": values}, 5, 0, probes.PERIODS)
    by_kind = {c["kind"]: c for c in made}
    assert by_kind["fourier"]["accuracy"][1] > 0.8
    assert by_kind["linear"]["accuracy"][1] < 0.3


def test_a_transfer_claim_is_made_where_af1_adds_a_value_and_rarely_where_nothing_differs():
    """Against its control, the claim that a value is read better under AF1 is confirmed in at most 2 of 20 seeds
    where both conditions hold nothing of it (a one-sided 2.5 % test, Holm over the family), and in every seed where
    AF1's state after the transfer block holds it and the control's does not."""
    config = AF1Config(wait=0, transfer=1)
    made = planted_made = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(100 + seed)
        values = torch.randint(0, 10, (40,), generator=g).tolist()
        targets = {"a": values, "answer": [(v * 3) % 10 for v in values]}

        noise = [torch.randn(40, 3, 24, generator=g, dtype=torch.float64) for _ in range(2)]
        right = [probes.curves(x, targets, 5, seed, probes.PERIODS)[1] for x in noise]
        claims = probes.stage_claims(list(targets), right[0], right[1], config, "noise")
        made += any(c["outcome"] == "confirmed" and c["kind"] == "probe_transferred" for c in claims)
        carried = noise[0].clone()
        carried[:, 1, 0] += 5 * torch.tensor(values, dtype=torch.float64)  # after block 1, the transfer block
        planted = probes.curves(carried, targets, 5, seed, probes.PERIODS)[1]
        claims = probes.stage_claims(list(targets), planted, right[1], config, "planted")
        linear_a = next(c for c in claims if c["subject"] == "a" and "linear probe" in c["statement"])
        planted_made += linear_a["outcome"] == "confirmed"
    assert made <= 2 and planted_made == 20


def test_the_targets_are_the_operands_the_answer_and_its_digits(tokenizer):
    task = build_task(TaskSpec(operation="a+b", shots=1, n=40), tokenizer)
    found = probes.labels(task)
    assert list(found) == ["a", "b", "answer", "answer digit 1", "answer digit 2"]
    for i, p in enumerate(task.problems):
        assert found["a"][i] + found["b"][i] == found["answer"][i] == int(p.answer)
        assert found["answer digit 1"][i] == found["answer"][i] % 10


SPEC = TaskSpec(operation="a+b", shots=1, n=40)


@pytest.fixture(scope="module")
def probed(tmp_path_factory, tokenizer):
    from af1.experiments.probes import Result

    root = tmp_path_factory.mktemp("probes")
    fitted_tiny_model("llama", [SPEC], tokenizer, n_layers=4).save_pretrained(root / "m")
    tokenizer.save_pretrained(root / "m")
    held = af1.api.session(af1.api.load_model(str(root / "m")))
    result = af1.api.run(Result, held, SPEC, out_dir=root / "out", wait=1, transfer=1, folds=4)
    return result, root / "out", held


def test_under_af1_the_cama_block_keeps_only_the_leave_one_out_trace_of_each_problem(probed):
    """CAMA writes into every problem's last token at L_wait the mean of the other problems' states there: what
    still varies from problem to problem is 1/(n - 1) of its own state, so the spread across problems shrinks by
    about n - 1 against the unmodified model's at that block (and a standardizing probe may still read it)."""
    result, _, held = probed
    setup = held.setup(SPEC)
    plain = probes.last_token_states(setup, None)[:, 1]
    under = probes.last_token_states(setup, AF1Config(wait=1, transfer=1))[:, 1]
    n_means = setup.steps[0].means.n_problems
    ratio = float(under.std(0).norm() / plain.std(0).norm())
    assert abs(ratio - 1 / (n_means - 1)) < 0.2 / (n_means - 1)
    assert torch.equal(probes.last_token_states(setup, None), probes.last_token_states(setup, None))  # no state kept
    assert result.n_probed == 40 and result.config is not None and result.config.cell == "L_wait 1, L_transfer 1"
    kinds = [c["kind"] for c in result.claims]
    assert kinds == 2 * ["probe_transferred", "probe_transferred", "probe_transferred", "probe_computed"]  # each probe
    assert [c["target"] for c in result.no_transfer] == [c["target"] for c in result.under_af1]  # the control
    assert all(c["family"] == "probes under AF1: 8 tests, Holm" and c["n"] == 40 for c in result.claims)


def test_the_probes_json_reads_back_as_written(probed):
    result, out, _ = probed
    written = json.loads((out / "probes.json").read_text())
    from af1.experiments import REGISTRY

    assert 'class="af1-plot"' in "".join(REGISTRY["probes"].section(result))  # its figure, drawn from the result
    assert written["under_af1"] == json.loads(json.dumps(result.data()["under_af1"]))
    from af1.experiments.probes import Result

    del written["provenance"]
    assert Result.model_validate(written).under_af1 == result.under_af1


def test_the_probes_section_and_terminal_show_the_same_table(probed):
    from af1.experiments import REGISTRY

    result, _, _ = probed
    experiment = REGISTRY["probes"]
    page = "".join(experiment.section(result))
    assert "What the last token holds" in page and "first block read above chance" in page and "af1-plot" in page
    shown = experiment.show(result)
    assert any(isinstance(s, str) and s.startswith("Operand a after block 2") for s in shown)
    (tab,) = experiment.tables(result)
    terminal = next(s for s in shown if not isinstance(s, str))
    assert [c.header for c in terminal.columns] == tab.headers and all(h in page for h in tab.headers)


def test_too_few_problems_to_probe_is_a_one_line_error(probed):
    from af1.errors import Af1Error

    setup = probed[2].setup(TaskSpec(operation="a+b", shots=1, n=8))
    with pytest.raises(Af1Error, match="too few to probe in 5 folds"):
        probes.probes(setup, None, folds=5, seed=0, measured_on="the solved problems")
