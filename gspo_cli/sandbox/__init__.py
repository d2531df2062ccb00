"""The code sandbox: untrusted Python programs (model completions, tool calls) run in their own
processes with resource limits and, where the machine allows, namespaces (`programs`: running
them; `isolation`: the levels and the wrapper that sets each up; `check`: `python -m
gspo_cli.sandbox.check` prints the level in use). The code task's verifier and the environments
use it; it imports nothing of the package but `errors`."""
