"""`gspo compare`'s tables: `compare` (one row per group, in rich, Markdown, CSV and JSON) and
`differences` (each arm against a baseline, with intervals and verdicts), `sequential` (the
sequential decision of `sweep --until-decided`, beside it), and `notes` (why a
comparison measures nothing). May import `rundata` and `stats`; never `figures` or `report`.
"""
