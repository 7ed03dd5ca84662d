"""How the ledger writes event data as bytes and reads it back, and the `format=triplet` projection.

Both backends store events through this package: plain events as exact JSON (`_plain`), model calls
in a compact binary layout that stores a call of a multi-turn rollout as a delta on the previous
call of its attempt (`_model_request`, read back by `_decode`, log probs by column in `_columns`)
or, on SQLite until compacted, as the JSON texts the proxy already had (`_wire`); stored rows are
decoded by `_event_rows`. `_triplet` trims decoded calls to the triplet view and `_triplet_delta`
sends its prompts as deltas (`delta=1`). Pure: no I/O.
"""

from keraunos.ledger.codec._decode import (
    decode_model_request,
    decode_model_request_arrays,
    decode_model_request_context,
    decode_model_request_triplet,
)
from keraunos.ledger.codec._model_request import CallContext, encode_model_request
from keraunos.ledger.codec._plain import CodecError, decode_json, encode_json

__all__ = [
    "CallContext",
    "CodecError",
    "decode_json",
    "decode_model_request",
    "decode_model_request_arrays",
    "decode_model_request_context",
    "decode_model_request_triplet",
    "encode_json",
    "encode_model_request",
]
