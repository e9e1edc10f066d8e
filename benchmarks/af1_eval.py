"""One AF1 config: the fast executor vs a plain forward pass and vs the hook-based AF1, side by side; and the cost
of full-answer scoring (every answer token) against first-token scoring of the same problems."""

from __future__ import annotations

import os

os.environ.setdefault("AF1_NO_PROGRESS", "1")

from af1.executors.fast import context_kv, fast_logits, token_local_kv
from af1.executors.reference import reference_logits
from af1.interventions.af1 import AF1Config
from af1.interventions.means import compute_means
from af1.models.forward import forget_contexts
from af1.tasks.evaluation import last_logits
from af1.tasks.task import build_task

from common import SPEC, best_of, setup, write


def main() -> None:
    lm, task = setup()
    adapter = lm.adapter
    means = compute_means(adapter, task)  # shared by both sides, not timed
    config = AF1Config(wait=14, transfer=2)
    t_forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64))

    def cold(fn):  # the context computed anew: a model's first config of a task
        forget_contexts(lm.model)
        return fn()

    t_fast, fast = best_of(lambda: cold(lambda: fast_logits(adapter, task, config, means)), repeat=9)
    t_ctx, _ = best_of(lambda: cold(lambda: context_kv(adapter, task)), repeat=9)
    t_fast_shared, _ = best_of(lambda: fast_logits(adapter, task, config, means), repeat=9)  # context computed
    t_ref, ref = best_of(lambda: reference_logits(adapter, task, config, means))
    t_tables, _ = best_of(lambda: token_local_kv(adapter, task, config, means, context_kv(adapter, task)), repeat=9)
    full = build_task(SPEC.model_copy(update={"scoring": "full"}), lm.tokenizer)
    steps = [(step, compute_means(adapter, step)) for step in full.steps()]

    def scored(steps_: list) -> None:
        for step, m in steps_:
            c = context_kv(adapter, step)
            fast_logits(adapter, step, config, m, kv=token_local_kv(adapter, step, config, m, c))

    t_first, _ = best_of(lambda: scored(steps[:1]), repeat=9)
    t_full, _ = best_of(lambda: scored(steps), repeat=9)
    data = {
        "config": config.model_dump(),
        "seconds": {
            "plain_forward": t_forward,
            "fast": t_fast,
            "fast_context_shared": t_fast_shared,
            "context_once": t_ctx,
            "reference": t_ref,
            "fast_tables_only": t_tables,
            "first_token_scoring": t_first,
            "full_answer_scoring": t_full,
        },
        "speedup_vs_forward": t_forward / t_fast,
        "speedup_vs_forward_context_shared": t_forward / t_fast_shared,
        "speedup_vs_reference": t_ref / t_fast,
        "flop_ratio_bound": (adapter.n_layers - config.wait) / (adapter.n_layers * task.n_positions),
        "max_abs_logit_diff": float((fast - ref).abs().max()),
        "same_predictions": bool((fast.argmax(-1) == ref.argmax(-1)).all()),
        "full_answer_steps": [len(step) for step, _ in steps],
        "full_over_first_token_cost": t_full / t_first,
    }
    print({k: v for k, v in data.items() if k != "config"})
    write("af1_eval", lm, task, data)


if __name__ == "__main__":
    main()
