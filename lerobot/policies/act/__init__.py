"""ACT: the Action Chunking Transformer policy (`ACTConfig`, `ACTPolicy`)."""
