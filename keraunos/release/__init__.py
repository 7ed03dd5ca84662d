"""Safe release of what training produces: today, the anytime-valid decision statistics.

The release package will hold versioned resources (prompt templates, weights references, configs),
releases that move a label from a baseline to a candidate through a paired replay and canary
stages, and the hash-chained audit log (issue 18). What exists now is the pure statistical core in
`keraunos.release.stats`: confidence sequences for rewards and rates, guardrails, the
sample-ratio check, and the promote / rollback / continue decision a release runner will act on.
Nothing here does I/O.
"""
