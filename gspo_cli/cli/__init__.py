"""The `gspo` command line, one module per command group (`train`, `eval`, `analysis`), assembled
in `app`. Thin: parse, load the spec, call one core function, render, map errors to exit codes."""
