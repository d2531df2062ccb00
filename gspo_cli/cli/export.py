"""`gspo export`: a run's checkpoint as a Hugging Face model directory (safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gspo_cli.cli.common import _fail, err_console
from gspo_cli.errors import GspoError


def export(
    run: Annotated[Path, typer.Argument(help="run directory (its latest checkpoint) or a checkpoint directory")],
    checkpoint: Annotated[
        Optional[str], typer.Option("--checkpoint", help="the run's checkpoint to export, e.g. step_000050 or 50")
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (exact master weights) or bfloat16")] = "float32",
    out: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="output directory (default: RUN/model; replaced if present)")
    ] = None,
    max_shard_gb: Annotated[float, typer.Option("--max-shard-gb", help="largest safetensors file, in GB")] = 5.0,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="LoRA runs: the adapter directory (PEFT's format), not the merged model")
    ] = False,
) -> None:
    """Write a checkpoint as a Hugging Face directory that transformers and vLLM load: config,
    tokenizer and safetensors files of at most --max-shard-gb each. Streamed: the weights are
    read a file's worth at a time, so a sharded checkpoint of a model no single process could
    hold exports on one host; under torchrun each process writes its share of the files.

    A LoRA run (model.lora) exports the base with its adapters merged, or with --adapter the
    adapter directory (adapter_config.json, adapter_model.safetensors) for PEFT.

    Example: `gspo export results/quickstart/gspo/seed0 --dtype bfloat16`
    """
    try:
        from gspo_cli import distributed
        from gspo_cli.train.export import checkpoint_step, export_checkpoint, resolve_checkpoint

        ckpt, default_out = resolve_checkpoint(run, checkpoint)
        info = distributed.setup()
        dest = export_checkpoint(
            ckpt,
            out or default_out,
            dtype=dtype,
            max_shard_bytes=max(1, int(max_shard_gb * 1e9)),
            info=info,
            step=checkpoint_step(ckpt),
            adapter=adapter,
        )
    except GspoError as err:
        _fail(err)
    if info.is_main:
        err_console.print(f"exported {ckpt} ({dtype}) to {dest}", markup=False, highlight=False, soft_wrap=True)
        typer.echo(str(dest))
