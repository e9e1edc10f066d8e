"""The constant context run once, side by side with whole prompts: the shared-context AF1 executor on the configs
the fast one does not cover, and the forwards of the other studies.

CAMA alone and ABP alone (the components study), resample ablation and the sink-masking ABP variant
(the alternatives): each timed on the hook path (whole prompts) and with the constant context run once
(only each problem's suffix); the ratio, max |delta logit| and whether the predictions agree. Then
base evaluation, position means, head means and a knockout of 10 heads (`af1.models.forward`): each with the
context's cache and with every position run, the ratio and the largest difference of what they return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from af1.executors.fast import context_kv
from af1.executors.reference import reference_logits
from af1.executors.shared_context import shared_context_logits
from af1.interventions.af1 import AF1Config
from af1.interventions.heads import head_sums
from af1.interventions.means import compute_means
from af1.methods.heads.knockouts import knocked_step
from af1.models.forward import forget_contexts
from af1.tasks.evaluation import last_logits
from af1.tasks.task import Task

from common import best_of, setup, write

CONFIGS = {
    "CAMA alone (wait 15)": AF1Config(wait=15, abp="none"),
    "ABP alone (wait 25, transfer 2)": AF1Config(wait=25, transfer=2, ablation="none"),
    "resample + ABP (wait 19, transfer 5)": AF1Config(wait=19, transfer=5, ablation="resample"),
    "CAMA + ABP masking the sink (wait 19, transfer 5)": AF1Config(wait=19, transfer=5, abp="sink"),
}


def main() -> None:
    lm, task = setup()
    adapter = lm.adapter
    means = compute_means(adapter, task)
    t_forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64), repeat=2)

    def cold_context():  # computed anew, as a model's first config of a task does
        forget_contexts(lm.model)
        return context_kv(adapter, task)

    t_context, ctx = best_of(cold_context, repeat=2)
    rows = {}
    for name, config in CONFIGS.items():
        t_ref, ref = best_of(lambda config=config: reference_logits(adapter, task, config, means), repeat=2)
        t_shared, shared = best_of(
            lambda config=config: shared_context_logits(adapter, task, config, means, ctx=ctx), repeat=2
        )
        rows[name] = {
            "config": config.model_dump(),
            "reference_seconds": t_ref,
            "shared_context_seconds": t_shared,
            "speedup": t_ref / t_shared,
            "max_abs_logit_difference": float((ref - shared).abs().max()),
            "same_predictions": bool((ref.argmax(-1) == shared.argmax(-1)).all()),
        }
        print(f"{name}: {t_ref:.2f} s -> {t_shared:.2f} s ({t_ref / t_shared:.1f}x)")
    full = dataclasses.replace(task, context_len=0)  # the same task said to share nothing
    heads = [(layer, 0) for layer in range(0, adapter.n_layers, 3)]
    z_sums = head_sums(adapter, full)
    forwards: dict[str, Callable[[Task], torch.Tensor]] = {
        "base evaluation": lambda t: last_logits(lm.model, t.input_ids_PT, 64, context_len=t.context_len),
        "position means (CAMA)": lambda t: compute_means(adapter, t).cond_LTSD,
        "head means": lambda t: torch.stack([s.mean(layer) for s in [head_sums(adapter, t)] for layer in s.sums]),
        "knockout of 10 heads": lambda t: knocked_step(adapter, t, [heads], z_sums)[0].p_correct_P,
    }
    other = {}
    for name, fn in forwards.items():
        t_full, a = best_of(lambda fn=fn: fn(full), repeat=2)
        t_shared, b = best_of(lambda fn=fn: fn(task), repeat=2)
        other[name] = {
            "whole_prompts_seconds": t_full,
            "shared_context_seconds": t_shared,
            "speedup": t_full / t_shared,
            "max_abs_difference": float((a - b).abs().max()),
        }
        print(f"{name}: {t_full:.2f} s -> {t_shared:.2f} s ({t_full / t_shared:.1f}x)")
    write(
        "shared_context",
        lm,
        task,
        {
            "plain_forward_seconds": t_forward,
            "context_kv_seconds_once": t_context,
            "context_len": task.context_len,
            "configs": rows,
            "forwards": other,
        },
    )


if __name__ == "__main__":
    main()
