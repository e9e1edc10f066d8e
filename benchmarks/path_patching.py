"""Path patching of every head and MLP vs a plain forward pass over the same problems, side by side."""

from __future__ import annotations

import os

from af1 import heads
from af1.evaluation import last_logits

from common import SPEC, best_of, setup, write

os.environ.setdefault("AF1_NO_PROGRESS", "1")


def main() -> None:
    lm, task = setup(SPEC.model_copy(update={"n": 97}))
    cf = heads.counterfactual(task, lm.tokenizer)
    t_forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64))
    t_pp, _ = best_of(lambda: heads.path_patching(lm.adapter, task, cf), repeat=2)
    n_components = lm.adapter.n_layers * (lm.adapter.n_heads + 1)
    data = {
        "components": n_components,
        "seconds": {"plain_forward": t_forward, "path_patching": t_pp},
        "cost_in_forwards": t_pp / t_forward,
    }
    print(data)
    write("path_patching", lm, task, data)


if __name__ == "__main__":
    main()
