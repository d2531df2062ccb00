"""`gspo export` of a LoRA run's checkpoint (adapter_config.json, adapter_model.safetensors,
lora_base.json): the merged model (the frozen base with the adapters merged into its weights,
an ordinary Hugging Face directory) or, with `adapter=True`, the adapter directory in PEFT's
format (`PeftModel.from_pretrained(base, DIR)` reads it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gspo_cli.errors import RunError
from gspo_cli.models import lora
from gspo_cli.train.checkpoint import STATE_FILE, replace_dir

EXPORT_INFO = "export.json"
_ADAPTER_FILES = (lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, lora.BASE_FILE)


def export_lora(ckpt: Path, out: Path, *, dtype: str, adapter: bool, step: int | None) -> Path:
    """Write LoRA checkpoint `ckpt` to `out` (replaced atomically): merged in `dtype`, or the
    adapters as they are (`adapter`). A base that is not the one trained on is a SpecError."""
    base = str(lora.adapter_base(ckpt)["base"])
    lora.check_base(ckpt, base)
    tmp = out.parent / f".tmp-{out.name}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if adapter:
            for f in ckpt.iterdir():  # adapters, tokenizer and config: everything but the trainer state
                if f.is_file() and f.name not in (STATE_FILE, EXPORT_INFO):
                    shutil.copy2(f, tmp / f.name)
        else:
            _write_merged(ckpt, base, tmp, dtype)
        record = {"checkpoint": ckpt.name, "step": step, "dtype": dtype, "lora": "adapter" if adapter else "merged"}
        (tmp / EXPORT_INFO).write_text(json.dumps(record, indent=2) + "\n")
        replace_dir(tmp, out)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"{out}: could not write the export ({err.strerror or err})") from None
    return out


def _write_merged(ckpt: Path, base: str, tmp: Path, dtype: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gspo_cli.models.loading import DTYPES, quiet_transformers

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)  # merged in float32, then cast
    model = lora.merge_adapters(model, ckpt).to(DTYPES[dtype])
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(ckpt)).save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text())
    config["dtype"] = dtype
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
