"""The built-in GRPO trainer: one process, one device (CPU or one GPU), Hugging Face causal LMs."""
