"""The shared-context executor against the hook path, side by side, on the configs the fast one does not cover.

CAMA alone and ABP alone (the components study), resample ablation and the sink-masking ABP variant
(the alternatives): each timed on the hook path (whole prompts) and with the constant context run once
(only each problem's suffix); the ratio, max |delta logit| and whether the predictions agree.
"""

from __future__ import annotations

from af1.allforone import AF1Config, reference_logits
from af1.evaluation import last_logits
from af1.fast import context_kv
from af1.interventions.means import compute_means
from af1.shared_context import shared_context_logits

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
    t_context, ctx = best_of(lambda: context_kv(adapter, task), repeat=2)
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
    write(
        "shared_context",
        lm,
        task,
        {
            "plain_forward_seconds": t_forward,
            "context_kv_seconds_once": t_context,
            "context_len": task.context_len,
            "configs": rows,
        },
    )


if __name__ == "__main__":
    main()
