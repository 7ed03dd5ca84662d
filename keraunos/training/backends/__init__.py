"""Training backends: what turns training rows into a policy update.

`torch` is the built-in one (one process, one device, Hugging Face `transformers` models). Import
the backend's package directly; this package imports nothing on its own.
"""
