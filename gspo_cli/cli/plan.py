"""`gspo plan`: the memory a spec's run will need, per phase, per device and per host, before
any queue wait. Reads the spec, the model's config.json and any reward model's config.json and
safetensors headers only: no weights, no GPU."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Annotated, Optional

import typer

from gspo_cli.cli.common import _fail, err_console
from gspo_cli.errors import GspoError, SpecError

UNITS = {"": 10**9, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, option: str) -> int:
    """Bytes from "80GB", "141 GB", "96GiB", "1TB" or a bare number of GB. 1 GB = 1e9 bytes,
    1 GiB = 2**30. Anything else is a SpecError naming `option`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS or float(m.group(1)) <= 0:
        raise SpecError(f"{option}: {text!r} is not a size (e.g. 80GB, 141GB, 96GiB, 1TB)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


def plan(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="experiment spec (YAML)")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs (training processes) per node")] = 1,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="nodes")] = 1,
    gpu_memory: Annotated[
        Optional[str], typer.Option("--gpu-memory", metavar="SIZE", help="memory of one GPU, e.g. 80GB")
    ] = None,
    host_memory: Annotated[
        Optional[str], typer.Option("--host-memory", metavar="SIZE", help="memory of one node, e.g. 1TB")
    ] = None,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config", metavar="PATH", help="the model's config.json (or its directory) instead of model.name's"
        ),
    ] = None,
    prompt_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--prompt-tokens", min=1, help="longest prompt in tokens (default: measured for built-in models, else 512)"
        ),
    ] = None,
    set_: Annotated[
        Optional[list[str]], typer.Option("--set", "-s", metavar="KEY.PATH=VALUE", help="override a spec field")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Memory per phase (load, rollout, pi_old, update, checkpoint) per GPU and per host, and
    whether it fits, as `gspo train` runs the spec (with FSDP: a full shard, bf16 all-gathers;
    log-probs in 64 MiB chunks; per-rank checkpoints). Below the table, each phase's terms.

    Refuses (exit 2, one line) what `gspo train` would refuse in that world before loading a model:
    rollout.staleness with several processes, batches that do not divide over them, a built-in
    model's prompts past its positions. Memory only warns: a run whose plan does not fit can
    still be started.

    Example: `gspo plan experiments/gpu_qwen3_moe.yaml --gpus 8 --gpu-memory 80GB`
    """
    from gspo_cli.plan import Hardware, model_shape, plan_memory
    from gspo_cli.plan.shapes import builtin_prompt_tokens
    from gspo_cli.plan.suggest import largest_micro_batch_tokens
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.train.preflight import planned

    try:
        hw = Hardware(
            gpus_per_node=gpus,
            nodes=nodes,
            gpu_bytes=None if gpu_memory is None else parse_size(gpu_memory, "--gpu-memory"),
            host_bytes=None if host_memory is None else parse_size(host_memory, "--host-memory"),
        )
        spec = load_spec(spec_path, set_)
        planned(spec, gpus * nodes)  # what training would refuse in that world, refused here too
        shape, warnings = model_shape(spec, config)
        if prompt_tokens is None:
            builtin = spec.model.name.startswith("builtin:") and config is None
            prompt_tokens = builtin_prompt_tokens(spec) if builtin else 512
            if not builtin:
                warnings.append("prompt length assumed 512 tokens (--prompt-tokens to change)")
    except GspoError as err:
        _fail(err)
    sharded = plan_memory(shape, spec, hw, prompt_tokens=prompt_tokens)
    fit = largest_micro_batch_tokens(shape, spec, hw, prompt_tokens)
    if as_json:
        # The JSON keeps the `before` layout (an unsharded load, whole logits) as it always had.
        before = plan_memory(shape, spec, hw, prompt_tokens=prompt_tokens, layout="before")
        plans = {"sharded": sharded, "before": before}
        out = _as_dict(plans, shape, spec, prompt_tokens, warnings)
        typer.echo(json.dumps({**out, "largest_micro_batch_tokens": fit}, indent=2))
        return
    _render(sharded, shape, spec, prompt_tokens)
    width = _width()
    if fit is not None:
        T = prompt_tokens + spec.rollout.max_new_tokens
        typer.echo(
            _wrap(
                f"largest train.micro_batch_tokens that fits: {fit} ({fit // T} rows of {T} tokens per forward"
                + (
                    ", the whole local batch: no budget needed)"
                    if fit // T >= spec.rollout.batch_size // hw.world
                    else ")"
                ),
                width,
            )
        )
    problems = [f"does not fit: {line}" for line in sharded.problems(_remedies(spec, hw))]
    for w in warnings + sharded.notes + problems:
        err_console.print(_wrap(f"warning: {w}", width), markup=False, highlight=False, soft_wrap=True)


def _remedies(spec, hw) -> dict[str, str]:
    """Per phase, the spec field that shrinks what the phase adds (said when it does not fit)."""
    out = {p: "its own part shrinks with train.micro_batch_tokens (rows per forward)" for p in ("pi_old", "update")}
    if spec.rollout.engine == "hf":
        rows = max(1, spec.rollout.batch_size // hw.world)
        now = min(spec.rollout.sample_rows or rows, rows)
        out["rollout"] = f"its own part shrinks with rollout.sample_rows (rows sampled at once; now {now} per process)"
    return out


NBSP = "\u00a0"
WIDTH = 100  # the widest line `gspo plan` prints (narrower on a narrower terminal)


def _width() -> int:
    return max(60, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))


def _wrap(text: str, width: int, indent: str = "  ") -> str:
    """`text` filled to `width`, a size never split from its unit ("1.4 GB")."""
    text = re.sub(r"(\d) ([KMGT]?B)\b", "\\1" + NBSP + "\\2", text)
    filled = textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return filled.replace(NBSP, " ")


def _table(header: list[str], rows: list[list[str]], width: int) -> list[str]:
    """Plain columns two spaces apart; the last column wraps under itself to stay within `width`."""
    cols = list(zip(header, *rows, strict=True))
    widths = [max(map(len, c)) for c in cols[:-1]]
    lead = sum(widths) + 2 * len(widths)
    last = max(20, width - lead)
    out = []
    for row in [header, *rows]:
        cells = textwrap.wrap(row[-1], last, break_long_words=False) or [""]
        first = "  ".join(v.rjust(w) if v[:1].isdigit() else v.ljust(w) for v, w in zip(row, widths))
        out.append(f"{first}  {cells[0]}".rstrip())
        out += [" " * lead + c for c in cells[1:]]
    return out


def _render(plan, shape, spec, prompt_tokens: int) -> None:
    from gspo_cli.plan.memory import count, gb

    hw = plan.hardware
    width = _width()
    gpu = plan.device_kind == "cuda"
    dev = "GPU" if gpu else "process"
    lines = [
        f"{spec.model.name}: {shape.model_type}, {count(shape.total_params())} parameters "
        f"({count(shape.active_params())} active), {gb(4 * shape.total_params())} in fp32",
        f"{hw.world} process{'es' if hw.world > 1 else ''} ({hw.nodes} node{'s' if hw.nodes > 1 else ''} x "
        f"{hw.gpus_per_node}), model.sharding {spec.model.sharding}, model.dtype {spec.model.dtype}, "
        f"prompt {prompt_tokens} + response {spec.rollout.max_new_tokens} tokens",
        f"Per {dev}: the busiest rank"
        + ("" if gpu else " (model.device cpu: its share of host memory)")
        + (f", against {gb(hw.gpu_bytes)}" if hw.gpu_bytes else " (--gpu-memory to check the fit)")
        + "; per host: rank 0's node"
        + (f", against {gb(hw.host_bytes)}." if hw.host_bytes else " (--host-memory to check the fit)."),
    ]
    typer.echo("\n".join(_wrap(line, width) for line in lines) + "\n")
    rows = []
    for ph in plan.phases:
        d_ok, h_ok = plan.fits(ph)
        rows.append(
            [
                ph.name,
                gb(ph.device_total),
                _verdict(d_ok),
                gb(ph.host_total),
                _verdict(h_ok),
                ph.dominant(transient=True),
            ]
        )
    header = ["phase", f"per {dev}", "fits", "per host", "fits", "largest term beyond weights, gradients, AdamW"]
    typer.echo("\n".join(_table(header, rows, width)) + "\n")
    for ph in plan.phases:
        # a size never splits from its unit (textwrap breaks at ASCII whitespace only)
        terms = "; ".join(f"{name} {gb(b).replace(' ', NBSP)}" for name, b in ph.device if b)
        typer.echo(_wrap(f"{ph.name}: {terms}", width).replace(NBSP, " "))
    typer.echo(_wrap(_host_terms(plan), width).replace(NBSP, " "))


def _host_terms(plan) -> str:
    """The per-host column's terms: those every phase has (the processes' runtime; a CPU run's
    per-process figures), then what each phase adds."""
    from gspo_cli.plan.fit import HOST_SHARE
    from gspo_cli.plan.memory import gb

    def size(b: int) -> str:
        return gb(b).replace(" ", NBSP)

    common = [t for t in plan.phases[0].host if all(t in ph.host for ph in plan.phases)]
    parts = [f"{name} {size(b)}" for name, b in common]
    share = next((n for n, _ in plan.phases[0].host if n.startswith(HOST_SHARE)), None)
    if share:  # model.device cpu: the host holds its processes, each the per-process column's figure
        parts.append(f"{share} (the per-process column{' x their count' if not share.endswith(' 1 process') else ''})")
    own = []
    for ph in plan.phases:
        extra = [f"{n} {size(b)}" for n, b in ph.host if (n, b) not in common and not n.startswith(HOST_SHARE)]
        if extra:
            own.append(f"{ph.name} adds {'; '.join(extra)}")
    return f"per host, every phase: {' + '.join(parts)}" + (f"; {'; '.join(own)}" if own else "")


def _as_dict(plans, shape, spec, prompt_tokens: int, warnings: list[str]) -> dict:
    def one(p) -> dict:
        return {
            "phases": [
                {
                    "phase": ph.name,
                    "device_bytes": ph.device_total,
                    "host_bytes": ph.host_total,
                    "device_fits": p.fits(ph)[0],
                    "host_fits": p.fits(ph)[1],
                    "largest_device_term": ph.dominant(),
                    "largest_transient_device_term": ph.dominant(transient=True),
                    "largest_host_term": ph.dominant("host"),
                    "device_terms": dict(ph.device),
                    "host_terms": dict(ph.host),
                }
                for ph in p.phases
            ],
            "problems": p.problems(),
            "notes": p.notes,
        }

    hw = plans["sharded"].hardware
    return {
        "model": spec.model.name,
        "model_type": shape.model_type,
        "params": shape.total_params(),
        "active_params": shape.active_params(),
        "world": hw.world,
        "gpu_bytes": hw.gpu_bytes,
        "host_bytes": hw.host_bytes,
        "prompt_tokens": prompt_tokens,
        "warnings": warnings,
        # JSON keys as they were: "today" holds the `before` layout (the earlier unsharded load).
        "layouts": {"sharded": one(plans["sharded"]), "today": one(plans["before"])},
    }
