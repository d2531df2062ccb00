"""The torch-free side: run directories in, tables, figures and reports out. Five layers, lowest
first; a module imports its own layer and the ones below it, never one above, and no two modules
import each other (tests/test_imports.py checks both):

- `rundata`: reading run directories: runs and groups, compute axes and compute-matched values,
  arm settings, sampled responses.
- `stats`: the statistics engine (intervals, decisions, planning, sequential designs, survival,
  stability and collapse, saturation fits, calibration arithmetic); numbers only, no formatting.
- `tables`: `gspo compare` and its differences table, in every format.
- `figures`: `gspo plot` and one module per figure kind, with the shared axes helpers.
- `report`: `gspo report` and one module per section; it composes tables and figures.

Nothing here imports torch or transformers (a test enforces it), nor `gspo_cli.train` or
`gspo_cli.eval`: the commands work on a machine holding nothing but results/.
"""
