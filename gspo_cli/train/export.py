"""Export a checkpoint as a Hugging Face model directory: safetensors files of at most
`max_shard_bytes` each (with `model.safetensors.index.json` when there are several), in
float32 or bfloat16, plus the checkpoint's config, generation config and tokenizer.

Streamed: the weights are read from the checkpoint on disk a few tensors at a time, only
those of the file being written, so no process holds more than one output file plus a
quarter of one in the checkpoint's dtype (or one tensor, when a single tensor is larger).
Under torchrun every rank writes its share of the files (file i on rank i mod N).
Parameter names are transformers' saved ("original") names: the model's fused tensors
(e.g. Qwen3-MoE's `experts.gate_up_proj`) are split back as `save_pretrained` does, and
tied weights (the head, when tied to the embedding) are left out.

Sharded checkpoints (torch.distributed.checkpoint) are the main use; a whole-model
checkpoint (already an HF directory) is re-written the same way (e.g. to cast to bf16).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import RunError, SpecError
from gspo_cli.models import lora
from gspo_cli.models.loading import DTYPES
from gspo_cli.train.checkpoint import SHARDED_DIR, STATE_FILE, dcp_reason, is_sharded_checkpoint, replace_dir
from gspo_cli.train.lora_export import export_lora

EXPORT_INFO = "export.json"  # which checkpoint and dtype an exported directory holds
DEFAULT_SHARD_BYTES = 5 * 2**30
_WEIGHT_FILE = re.compile(r"(model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin)$")


@dataclass
class _Weights:
    """A checkpoint's weights without reading them: name -> (shape, dtype), and a reader."""

    entries: dict[str, tuple[tuple[int, ...], torch.dtype]]
    read: Callable[[list[str]], dict[str, torch.Tensor]]
    converted: bool  # names are the model's own (fused experts, tied head): revert on export


def export_checkpoint(
    ckpt: Path,
    out: Path,
    *,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    info: DistInfo = DistInfo(),
    step: int | None = None,
    adapter: bool = False,
) -> Path:
    """Write checkpoint `ckpt` as an HF directory `out` (replaced atomically if it exists), on
    every rank together; returns `out`. `dtype`: "float32" or "bfloat16". A LoRA checkpoint is
    written merged, or as its adapter directory with `adapter` (train/lora_export.py). Bad input (a
    directory that is not a checkpoint, an unknown dtype) is a SpecError; a failed write
    (disk full) a RunError, with `out` left as it was."""
    ckpt, out = Path(ckpt), Path(out)
    if dtype not in ("float32", "bfloat16"):
        raise SpecError(f"--dtype: {dtype!r} is not one of float32, bfloat16")
    if not (ckpt / "config.json").is_file():
        raise SpecError(f"{ckpt}: not a checkpoint (no config.json)")
    if lora.is_adapter_dir(ckpt):  # a LoRA run's: merged, or (adapter) the PEFT adapter directory
        return export_lora(ckpt, out, dtype=dtype, adapter=adapter, step=step) if info.is_main else out
    if adapter:
        raise SpecError(f"--adapter: {ckpt} is not a LoRA checkpoint (no adapter_config.json)")
    weights = _open_weights(ckpt)
    target = DTYPES[dtype]
    model = _meta_model(ckpt)
    files = _plan_files(weights, model, target, max_shard_bytes)
    tmp = out.parent / f".tmp-{out.name}"
    failure = None
    if info.is_main:
        failure = _attempt(out, lambda: _prepare(ckpt, tmp, dtype))
    failure = distributed.broadcast_object(failure, info)
    if failure is None:
        mine = [(i, names) for i, names in enumerate(files) if i % info.world_size == info.rank]
        failure = _attempt(out, lambda: _write_files(weights, model, mine, len(files), target, tmp, max_shard_bytes))
        failure = next((f for f in distributed.gather_objects(failure, info) if f), None)
    if info.is_main and failure is None:
        record = {"checkpoint": ckpt.name, "step": step, "dtype": dtype, "files": len(files)}
        failure = _attempt(out, lambda: _publish(weights, model, files, target, tmp, out, record))
    failure = distributed.broadcast_object(failure, info)
    if failure is not None:
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(failure)
    return out


def _attempt(out: Path, write) -> str | None:
    try:
        write()
    except OSError as err:
        return f"{out}: could not write the export ({err.strerror or err})"
    return None


def _open_weights(ckpt: Path) -> _Weights:
    if is_sharded_checkpoint(ckpt):
        return _dcp_weights(ckpt / SHARDED_DIR)
    return _safetensors_weights(ckpt)


def _dcp_weights(path: Path) -> _Weights:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as err:
        raise RunError(f"{path.parent}: cannot read its sharded state's index ({dcp_reason(err)})") from None
    entries = {
        key.removeprefix("model."): (tuple(m.size), m.properties.dtype)
        for key, m in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

        box = {"model": {n: torch.empty(entries[n][0], dtype=entries[n][1]) for n in names}}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            # no_dist: each process reads its own files' tensors, whatever the others do
            try:
                dcp.load(
                    box,
                    storage_reader=dcp.FileSystemReader(str(path)),
                    planner=DefaultLoadPlanner(allow_partial_load=True),
                    no_dist=True,
                )
            except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
                raise RunError(f"{path.parent}: cannot read its sharded state ({dcp_reason(err)})") from None
        return box["model"]

    return _Weights(entries, read, converted=True)


def _safetensors_weights(ckpt: Path) -> _Weights:
    from safetensors import safe_open

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise SpecError(f"{ckpt}: neither sharded state ({SHARDED_DIR}/) nor safetensors weights")
    where, entries = {}, {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                piece = st.get_slice(name)
                entries[name] = (tuple(piece.get_shape()), _ST_DTYPES[piece.get_dtype()])
                where[name] = f

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        out = {}
        for f in {where[n] for n in names}:
            with safe_open(str(f), "pt") as st:
                out.update({n: st.get_tensor(n) for n in names if where[n] == f})
        return out

    return _Weights(entries, read, converted=False)


_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def _meta_model(ckpt: Path):
    """The checkpoint's architecture on the meta device (no memory): its tied weights and
    the conversions transformers reverts when saving."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ckpt)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _plan_files(weights: _Weights, model, target: torch.dtype, max_bytes: int) -> list[list[str]]:
    """Parameter names per output file, in order, each file at most `max_bytes` in `target`
    (a larger single tensor gets a file of its own)."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) if weights.converted else set()
    names = [n for n in sorted(weights.entries, key=_natural) if n not in tied]
    files: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = _numel(weights.entries[n][0]) * target.itemsize
        if files[-1] and size + nbytes > max_bytes:
            files.append([])
            size = 0
        files[-1].append(n)
        size += nbytes
    return files


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _file_name(i: int, n: int) -> str:
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _saved_names(weights: _Weights, model, names: list[str]) -> list[str]:
    """The names `names` are saved under (after reverting transformers' conversions), computed
    on meta tensors."""
    if not weights.converted:
        return list(names)
    from transformers.core_model_loading import revert_weight_conversion

    meta = {n: torch.empty(weights.entries[n][0], device="meta") for n in names}
    return list(revert_weight_conversion(model, meta))


def _prepare(ckpt: Path, tmp: Path, dtype: str) -> None:
    """Rank 0: a fresh `tmp` with every non-weight file of the checkpoint (config with the
    export's dtype, generation config, tokenizer files)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in ckpt.iterdir():
        if f.is_file() and f.name not in (STATE_FILE, EXPORT_INFO) and not _WEIGHT_FILE.match(f.name):
            shutil.copy2(f, tmp / f.name)
    config = json.loads((tmp / "config.json").read_text())
    config["dtype"] = dtype
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_files(weights: _Weights, model, mine, n_files: int, target, tmp: Path, max_bytes: int) -> None:
    from safetensors.torch import save_file

    for i, names in mine:
        tensors: dict[str, torch.Tensor] = {}
        for group in _read_groups(weights, names, max_bytes // 4):
            for name, t in weights.read(group).items():
                tensors[name] = t.to(target)  # the source-dtype copy goes with `t`
        if weights.converted:
            from transformers.core_model_loading import revert_weight_conversion

            tensors = revert_weight_conversion(model, tensors)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / _file_name(i, n_files)), {"format": "pt"})
        del tensors


def _read_groups(weights: _Weights, names: list[str], budget: int):
    """`names` in runs of at most `budget` bytes in the checkpoint's dtype (one tensor at least)."""
    group, size = [], 0
    for n in names:
        shape, dt = weights.entries[n]
        nbytes = _numel(shape) * dt.itemsize
        if group and size + nbytes > budget:
            yield group
            group, size = [], 0
        group.append(n)
        size += nbytes
    if group:
        yield group


def _publish(weights: _Weights, model, files, target: torch.dtype, tmp: Path, out: Path, record: dict) -> None:
    """Rank 0, after every rank wrote its files: the index, export.json, fsync, and the
    rename that replaces `out`."""
    if len(files) > 1:
        weight_map = {
            saved: _file_name(i, len(files))
            for i, names in enumerate(files)
            for saved in _saved_names(weights, model, names)
        }
        total = sum(_numel(weights.entries[n][0]) for names in files for n in names)
        index = {"metadata": {"total_size": total * target.itemsize}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (tmp / EXPORT_INFO).write_text(json.dumps(record, indent=2) + "\n")
    replace_dir(tmp, out)


def resolve_checkpoint(target: Path, checkpoint: str | None) -> tuple[Path, Path]:
    """(checkpoint directory, default output directory) for `gspo export TARGET
    [--checkpoint step_N]`: TARGET a run directory (its latest complete checkpoint, or the
    named one; output RUN/model) or a checkpoint directory itself (output beside it,
    `<name>-hf`). A missing run, checkpoint or a directory that is neither is a SpecError."""
    from gspo_cli.runs import RunDir
    from gspo_cli.train.checkpoint import valid_checkpoints

    target = Path(target).expanduser()
    if not target.is_dir():
        raise SpecError(f"RUN: no such directory {target}")
    if (target / "checkpoints").is_dir() or (target / "spec.yaml").is_file():
        have = valid_checkpoints(RunDir(target))
        if checkpoint is None:
            if not have:
                raise SpecError(f"RUN: {target} has no complete checkpoint (checkpoints/step_*/)")
            return have[-1], target / "model"
        name = f"step_{int(checkpoint):06d}" if checkpoint.isdigit() else checkpoint
        chosen = target / "checkpoints" / name
        if chosen not in have:
            listed = ", ".join(p.name for p in have) or "none"
            raise SpecError(f"--checkpoint: {target} has no complete checkpoint {name!r} (it has: {listed})")
        return chosen, target / "model"
    if checkpoint is not None:
        raise SpecError(f"--checkpoint: {target} is not a run directory (no checkpoints/)")
    if not ((target / STATE_FILE).is_file() and (target / "config.json").is_file()):
        raise SpecError(f"RUN: {target} is neither a run directory nor a checkpoint (no {STATE_FILE})")
    return target, target.parent / f"{target.name}-hf"


def checkpoint_step(ckpt: Path) -> int | None:
    """The step a checkpoint directory holds (`step_000050` -> 50), None for another name."""
    m = re.fullmatch(r"step_(\d+)", Path(ckpt).name)
    return int(m.group(1)) if m else None
