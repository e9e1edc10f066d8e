"""Would an int8 screen of the unembedding narrow the grid's rows as the bfloat16 one does? For each bundled model,
the last state of every layer on 48 demo prompts (the kind of row the grid scores), the number of tokens a rigorous
bound keeps as candidates for the float32 argmax: bfloat16's bound (`af1.executors.greedy`) beside a per-row int8
quantization of the state and of each unembedding row (exact integer products; error by Cauchy-Schwarz per token),
with the state's outlier dimensions moved into the weights by SmoothQuant's scaling (x / c, W * c,
c = max|x|^α / max|W|^(1-α) per dimension; α 0 is none).

    python benchmarks/int8_screen.py
"""

from __future__ import annotations

import os

os.environ.setdefault("AF1_NO_PROGRESS", "1")

import torch

from af1 import load_model
from af1.executors.greedy import F32, SLACK, U, screen_of
from af1.models.adapter import weight_of
from af1.tasks.spec import TaskSpec
from af1.tasks.task import build_task

from common import RESULTS, machine

ALPHAS = (0.0, 0.5, 0.8, 1.0)


def final_states(name: str) -> tuple[torch.Tensor, torch.Tensor, object]:
    """[rows, D] final-normed last states of every layer on 48 demo prompts, the unembedding [V, D], the adapter."""
    lm = load_model(name)
    task = build_task(TaskSpec(operation="a+b", style="calculate", shots=3), lm.tokenizer)
    captured: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _a, out: captured.append((out[0] if isinstance(out, tuple) else out)[:, -1])
        )
        for layer in lm.adapter.layers
    ]
    with torch.no_grad():
        lm.model(input_ids=task.input_ids_PT[:48])
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        x = lm.adapter.final_norm(torch.cat(captured)).float()
    return x, weight_of(lm.adapter.lm_head).float().detach(), lm.adapter


def summary(count_B: torch.Tensor) -> dict[str, float]:
    c = count_B.float()
    return {
        "median": float(c.median()),
        "p90": float(c.quantile(0.9)),
        "share_at_most_64": float((c <= 64).float().mean()),
    }


def bf16_candidates(x: torch.Tensor, adapter) -> torch.Tensor:
    screen = screen_of(adapter.lm_head)
    rounded = x.bfloat16()
    z = (rounded @ screen.w_DV).float()
    norm = x.norm(dim=-1)
    inputs = (
        (rounded.float() - x).norm(dim=-1) * screen.max_norm
        + screen.max_error_norm * norm
        + x.shape[1] * F32 * screen.max_norm * norm * (1 + U)
    )
    high = z.amax(-1)
    bound = SLACK * (inputs + U * (high.abs() + 4 * inputs))
    return (z >= (high - 3 * bound)[:, None]).sum(1)


def int8_candidates(x0: torch.Tensor, W0: torch.Tensor, alpha: float) -> torch.Tensor:
    """Tokens whose logit could still be the largest, bounded per (row, token) around the int8 estimate."""
    c = x0.abs().amax(0).clamp_min(1e-6) ** alpha / W0.abs().amax(0).clamp_min(1e-6) ** (1 - alpha)
    x, W = x0 / c, W0 * c
    s = W.abs().amax(1) / 127
    q = torch.round(W / s[:, None])
    t = x.abs().amax(1) / 127
    p = torch.round(x / t[:, None])
    e, r = (W - s[:, None] * q).norm(dim=1), (x - t[:, None] * p).norm(dim=1)
    z = t[:, None].double() * s[None].double() * (p.double() @ q.double().T)  # the integer products, exactly
    rounding = x0.shape[1] * F32 * x0.norm(dim=1)[:, None] * W0.norm(dim=1)[None]
    bound = SLACK * ((t * p.norm(dim=1) + r)[:, None] * e[None] + r[:, None] * (s * q.norm(dim=1))[None] + rounding)
    floor = (z - bound.double()).amax(1)
    return (z + bound.double() >= floor[:, None]).sum(1)


def main() -> None:
    from af1.results import write_json

    out = {}
    for name in ("smollm2", "qwen0.5b"):
        x, W, adapter = final_states(name)
        out[name] = {
            "rows": len(x),
            "vocabulary": W.shape[0],
            "outlier_ratio": float((x.abs().amax(1) / x.abs().median(1).values).median()),
            "bf16": summary(bf16_candidates(x, adapter)),
            "int8": {str(a): summary(int8_candidates(x, W, a)) for a in ALPHAS},
        }
        print(name, out[name])
    record = {"benchmark": "int8_screen", "machine": machine(), "models": out}
    print(f"wrote {write_json(RESULTS / 'int8_screen.json', record)}")


if __name__ == "__main__":
    main()
