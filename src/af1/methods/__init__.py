"""The science of the three studies, no CLI or report in it: `allforone` (faithfulness, grid, search, necessity,
alternatives, styles, transfer, pruning) on a `setup`; `heads` with `counterfactuals`; `positional`; `finetune`."""
