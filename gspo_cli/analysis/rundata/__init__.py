"""Reading run directories, the lowest layer of `analysis`: `runs` (Run, Group, load_runs,
group_runs), `compute` (the step, samples, tokens and wall axes and values at equal compute),
`arm_settings` (what each arm sets), `samples` (the sampled responses for `gspo samples`).

Imports only the files-and-names modules below analysis (`gspo_cli.runs`, `metrics`, `spec`),
never another layer of analysis.
"""
