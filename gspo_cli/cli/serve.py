"""`gspo vllm-server`: a vLLM server set up for `rollout.engine: vllm-server`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from gspo_cli.cli.common import _fail, err_console
from gspo_cli.errors import GspoError


def vllm_server(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="the experiment spec the server will sample for")],
    vllm_args: Annotated[
        Optional[list[str]], typer.Argument(metavar="[-- VLLM_ARGS...]", help="more `vllm serve` arguments, after --")
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", metavar="KEY.PATH=VALUE", help="override a spec field (repeatable)"),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP port (the spec's rollout.server.url points here)")] = 8000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the command and exit")] = False,
) -> None:
    """Start a vLLM server that samples for `rollout.engine: vllm-server`.

    It serves the spec's model (a built-in model is cold-started into the cache first, as
    `gspo train` would) in the spec's dtype. Runs in the foreground until stopped; needs vLLM
    in this Python.

    The settings the trainer relies on are set: token ids in and out, the sampled tokens'
    log-probs (temperature applied), the model's generation config ignored, vLLM's
    weight-update endpoints with the `gspo` weight-transfer backend, and for a spec with an r3
    arm the routed experts (GPU only).

    Example: `gspo vllm-server exp.yaml --port 8000 -- --tensor-parallel-size 2`
    """
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")  # before import_vllm sets its in-process defaults
    try:
        from gspo_cli.models import resolve_model_source
        from gspo_cli.rollout.vllm_settings import (
            check_cpu_head_dim,
            import_vllm,
            route_capture_kwargs,
            vllm_platform_is_cpu,
        )
        from gspo_cli.spec.loading import load_spec
        from gspo_cli.tasks import make_task

        spec = load_spec(spec_path, set_)
        vllm = import_vllm()
        source = resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=err_console.print)
        on_cpu = vllm_platform_is_cpu()
        if on_cpu:
            from transformers import AutoConfig

            check_cpu_head_dim(AutoConfig.from_pretrained(source))
        routes = any(a.routing_replay == "r3" for a in spec.arms)
        if routes:  # one line where capture cannot work (a CPU vLLM, Model Runner V2 turned off)
            route_capture_kwargs(vllm, on_cpu, {}, engine="vllm-server")
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    except GspoError as err:
        _fail(err)
    argv = server_argv(source, spec.model.dtype, host, port, on_cpu, routes) + list(vllm_args or [])
    if on_cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, as the colocated engine on CPU
    if dry_run:
        typer.echo("VLLM_SERVER_DEV_MODE=1 " + " ".join(_quoted(a) for a in argv))
        return
    err_console.print(
        f"vLLM server for {spec.name}: http://{host}:{port} (model {source})", markup=False, highlight=False
    )
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def server_argv(model_dir: str, dtype: str, host: str, port: int, on_cpu: bool, routes: bool = False) -> list[str]:
    """The command line of vLLM's OpenAI server as `rollout.engine: vllm-server` needs it;
    `routes`: it returns the experts every position was routed to (r3; prefix caching on)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--host", host, "--port", str(port), "--dtype", dtype, "--seed", "0"]
    argv += ["--skip-tokenizer-init", "--enable-scale-out"]  # token ids in and out (/inference/v1/generate)
    argv += ["--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    argv += ["--weight-transfer-config", json.dumps({"backend": "gspo"})]
    if on_cpu:
        argv += ["--enforce-eager"]  # no torch.compile warm-up on CPU, as the colocated engine
    if routes:
        argv += ["--enable-return-routed-experts", "--enable-prefix-caching"]
    return argv


def _quoted(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " {}\"") else arg
