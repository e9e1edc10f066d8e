"""Path patching of every head and MLP, by each definition (wang, direct, total), vs a plain forward pass over the
same problems, side by side in one run."""

from __future__ import annotations

import os

from af1.methods import heads
from af1.methods.counterfactuals import counterfactual
from af1.tasks.evaluation import last_logits

from common import SPEC, best_of, setup, write

os.environ.setdefault("AF1_NO_PROGRESS", "1")


def main() -> None:
    lm, task = setup(SPEC.model_copy(update={"n": 97}))
    cf = counterfactual(task, lm.tokenizer)
    t_forward, _ = best_of(lambda: last_logits(lm.model, task.input_ids_PT, batch_size=64))
    seconds = {"plain_forward": t_forward}
    for path in heads.patching.PATHS:
        seconds[path], _ = best_of(lambda path=path: heads.patching.path_patching(lm.adapter, task, cf, path), repeat=2)
    n_components = lm.adapter.n_layers * (lm.adapter.n_heads + 1)
    data = {
        "components": n_components,
        "seconds": seconds,
        "cost_in_forwards": {path: seconds[path] / t_forward for path in heads.patching.PATHS},
    }
    print(data)
    write("path_patching", lm, task, data)


if __name__ == "__main__":
    main()
