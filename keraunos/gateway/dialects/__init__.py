"""APIs the proxy serves by conversion to chat completions: Anthropic Messages, OpenAI Responses.

`base` holds the seam (`Dialect`, `StreamTranslator`); each API is one module of pure functions.
"""
