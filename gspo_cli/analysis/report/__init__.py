"""`gspo report` and what is written from the same numbers: `build` (the report: the paper's
findings, checked), one module per section (`collapse`, `compute`, `differences`, `ratio`,
`rewards`, `testable`, `tools`), `tune` (`gspo tune`'s report) and `calibration` (compare's
verdicts measured on A/A pseudo-experiments). The top layer of `analysis`: it composes `tables`
and `figures` and may import every layer below; nothing in analysis imports it.
"""
