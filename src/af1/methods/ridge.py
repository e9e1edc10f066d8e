"""Ridge regression whose penalty each output chooses by its exact leave-one-out error: what the probes fit."""

from __future__ import annotations

import math

import torch

ALPHAS = tuple(10.0**k for k in range(-2, 6))  # ridge penalties: each output picks one by leave-one-out


def ridge_predict(
    train_PD: torch.Tensor, targets_PO: torch.Tensor, test_PD: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge on standardized features, each output's penalty chosen among ALPHAS by exact leave-one-out error: the test
    rows' predictions [P, O] and each output's leave-one-out mean squared error [O] (how far to trust it)."""
    mean, std = train_PD.mean(0), train_PD.std(0).clamp_min(1e-8)
    x = (train_PD - mean) / std
    y_mean = targets_PO.mean(0)
    y = targets_PO - y_mean
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    uty = u.T @ y
    best_O = torch.zeros(y.shape[1], dtype=torch.long)
    loo_O = torch.full((y.shape[1],), math.inf, dtype=y.dtype)
    for i, alpha in enumerate(ALPHAS):
        shrink = s**2 / (s**2 + alpha)
        leverage = (u**2 @ shrink + 1 / len(x)).clamp_max(1 - 1e-9)  # the intercept's share included
        loo = ((y - u @ (shrink[:, None] * uty)) / (1 - leverage)[:, None]).pow(2).mean(0)
        better = loo < loo_O
        best_O[better], loo_O[better] = i, loo[better]
    alphas_O = torch.tensor(ALPHAS, dtype=x.dtype)[best_O]
    weights_DO = vh.T @ ((s[:, None] / (s[:, None] ** 2 + alphas_O[None])) * uty)
    return ((test_PD - mean) / std) @ weights_DO + y_mean, loo_O
