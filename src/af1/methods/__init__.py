"""The science of the three studies, with no CLI or report in it: `allforone` (faithfulness, the grid, search,
necessity, alternatives, styles, transfer, pruning) on a `setup`, `heads` (path patching, key heads, knock-outs)
with its `counterfactuals`, `positional` (position + meaning of attention logits) and `finetune`."""
