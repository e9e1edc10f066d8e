"""The task layer: what the model reads and what counts as its answer.
`builtin`, `files`, `spec` (which problems, how scored), `problems`, `task`, `means_sample`, `evaluation`."""
