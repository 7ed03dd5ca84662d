"""Example agents shipped with keraunos, importable from the installed package (`keraunos demo` runs
`keraunos.examples.calc`)."""
