"""`keraunos export`: rollouts, model calls and training rows out of a gateway's ledger, streaming.

To JSON lines, Parquet or a Hugging Face `datasets` dataset, in bounded memory (docs/lifecycle.md#export).
"""
