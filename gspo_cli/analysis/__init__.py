"""The torch-free side: run directories as tables (`rundata`), `compare`, `plot` and `report`.
Nothing here imports torch or transformers (a test enforces it)."""
