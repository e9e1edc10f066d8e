"""The task layer: what the model reads and what counts as its answer.

`builtin` (operations, styles, templates), `files` (task files), `spec` (TaskSpec: which problems, how scored),
`problems` (the distribution of a spec), `task` (tokenized problems grouped by token layout, answer steps),
`means_sample` (the problems CAMA averages over), `evaluation` (the unmodified model's scores).
"""
