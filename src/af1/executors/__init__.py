"""How an AF1 configuration is computed: `protocol` (the Executor protocol and the ordered list), `fast`,
`shared_context`, `reference` (hooks), the per-step inputs they share (`step`) and the greedy screen (`greedy`)."""
