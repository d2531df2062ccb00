"""Reward models (`task.rewards[].model`): a Hugging Face sequence-classification model that
scores prompt + completion, called with TRL's reward-function convention.

The text it reads: with a chat template, the prompt's messages (a standard prompt becomes one
user message) and the completion as an assistant message, rendered by its own tokenizer's
template; without one, prompt text + completion text. Tokenised without special tokens (as
TRL's GRPOTrainer does: a template writes its own), truncated on the left to `max_length`
tokens, padded on the right in batches of `batch_size`. The score is logit 0 of the model's
head, pooled at the last token that is not the pad token (transformers' pooling, the one
reward models are trained with); a head with several labels gives its first.

It is checked when the rewards are resolved (before the policy) and loaded then when the caller
gives the spec's model settings (training); a task built without them (a sweep's identity check,
`gspo eval`) loads it at its first scoring. Eval mode, no gradients, never trained.

Under torchrun, placement `every_rank` loads a copy in every process, each scoring its own
rows; `rank0` loads it in rank 0 alone, which scores every process's rows (gathered, then
scattered back) at the same point of each step's scoring.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.files import files_digest
from gspo_cli.hub import hub_revision

# Set while rank 0 scores alone (evaluation): no collective, the rows are its own.
_ALONE = contextvars.ContextVar("reward_model_alone", default=False)
# Loaded (model, tokenizer) by (where, device, dtype): every task built from the same rewards
# (training, each evaluation set) shares one copy.
_LOADED: dict[tuple[str, str, str], tuple[Any, Any]] = {}


@contextlib.contextmanager
def scoring_alone():
    """Within: reward models score the rows they are given in this process (rank 0 evaluating
    alone), never gathering from the other ranks."""
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


def _rank_world() -> tuple[int, int]:
    """(rank, world size) as torchrun describes them (set before the process group exists)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def locate(path: str, where: str) -> tuple[str, Path | None]:
    """(what from_pretrained reads, its local directory or None for a hub id). SpecError when a
    local path does not exist or is not a model directory."""
    local = Path(path).expanduser()
    if local.exists() or path.startswith((".", "/", "~")) or path.count("/") != 1:
        if not local.is_dir():
            raise SpecError(
                f"{where}: no such directory {path}" if not local.exists() else f"{where}: {path} is a file"
            )
        if not (local / "config.json").is_file():
            raise SpecError(f"{where}: {path} has no config.json (not a Hugging Face model directory)")
        return str(local.resolve()), local.resolve()
    return path, None


def check_classifier(config: dict, path: str, where: str) -> None:
    """SpecError naming the architectures found unless `config` (config.json) is a
    sequence-classification model's."""
    archs = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        found = ", ".join(map(str, archs)) if archs else f"no architectures (model_type {config.get('model_type')})"
        raise SpecError(
            f"{where}: {path} is not a sequence-classification model (config.json: {found}); a reward model is "
            "an AutoModelForSequenceClassification, e.g. one trained with TRL's RewardTrainer"
        )


def _hub_config(path: str, where: str) -> dict:
    from gspo_cli.hub import hub_reachable

    # Without a network the hub client retries for ~30 s: ask the hub once, briefly, as the
    # policy's loading does, and read the local cache only when it cannot be reached.
    offline = not hub_reachable()
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, local_files_only=offline).to_dict()
    except Exception as err:  # noqa: BLE001 - no network, unknown id: one line
        first = (str(err).splitlines() or [""])[0]
        raise SpecError(f"{where}: cannot read the config of {path} ({type(err).__name__}: {first})") from None


def weights_digest(path: str, local: Path | None) -> str:
    """16 hex digits of sha256 over a local directory's file names and bytes; for a hub id,
    hub:<id>@<revision in the local cache> (no network)."""
    if local is None:
        revision = hub_revision(path)
        return f"hub:{path}" + (f"@{revision}" if revision else "")  # not cached: the id alone
    return "dir:" + files_digest(sorted(f for f in local.iterdir() if f.is_file()))


def _device(device: str) -> str:
    """`cuda` under torchrun: this process's own GPU (LOCAL_RANK), as the policy's."""
    if device == "cuda" and _rank_world()[1] > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def _load(what: str, device: str, dtype: str, where: str):
    """(model, tokenizer) of `what` on `device` in `dtype`, eval mode, no gradients; loaded
    once per process."""
    key = (what, device, dtype)
    if key in _LOADED:
        return _LOADED[key]
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gspo_cli.hub import hub_reachable

    offline = not Path(what).is_dir() and not hub_reachable()  # a hub id without a network: the cache
    try:
        tokenizer = AutoTokenizer.from_pretrained(what, local_files_only=offline)
        model = AutoModelForSequenceClassification.from_pretrained(
            what, dtype=getattr(torch, dtype), local_files_only=offline
        )
        model.to(device)
    except Exception as err:  # noqa: BLE001 - a broken or unreachable model: one line
        first = (str(err).splitlines() or [""])[0]
        raise SpecError(f"{where}: cannot load {what} ({type(err).__name__}: {first})") from None
    model.eval().requires_grad_(False)
    text_cfg = model.config.get_text_config()
    pad = text_cfg.pad_token_id
    if pad is None:  # the head pools at the last token that is not the pad: it must know the pad
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        text_cfg.pad_token_id = pad if pad is not None else 0
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    _LOADED[key] = (model, tokenizer)
    return model, tokenizer


class RewardModel:
    """A reward function (TRL's convention) backed by a sequence-classification model."""

    def __init__(self, cfg: Any, where: str, device: str | None = None, dtype: str | None = None):
        """`cfg`: a RewardModelConfig; `device`/`dtype`: the spec's model.device / model.dtype
        (used where `cfg` leaves them out; None: a copy this process has already loaded, else
        cpu / float32). SpecError (one line) when the path is missing or not a classifier."""
        self.cfg, self.where = cfg, where
        self.what, self.local = locate(cfg.path, where)
        config = json.loads((self.local / "config.json").read_text()) if self.local else _hub_config(cfg.path, where)
        check_classifier(config, cfg.path, where)
        self.placement = cfg.placement
        self.digest = weights_digest(self.what, self.local)
        rank, world = _rank_world()
        self.holder = self.placement == "every_rank" or world <= 1 or rank == 0
        self.device, self.dtype = cfg.device or device, cfg.dtype or dtype
        self.model = self.tokenizer = None
        self.broken: str | None = None  # rank0 placement: why scoring failed (no collective after it)
        # Loaded now when the caller says where (training, before the policy) or a copy is here
        # already (an evaluation set's task); else at the first scoring (an identity check of a
        # sweep never loads it).
        if self.holder and (self.device and self.dtype or any(k[0] == self.what for k in _LOADED)):
            self.load()

    def load(self) -> None:
        """Load (or share) this process's copy: on `device` in `dtype`, where left out the copy
        already loaded for this path, else cpu / float32."""
        if self.device is None or self.dtype is None:
            have = next((k for k in _LOADED if k[0] == self.what), None)
            self.device = self.device or (have[1] if have else "cpu")
            self.dtype = self.dtype or (have[2] if have else "float32")
        self.device = _device(self.device)
        self.model, self.tokenizer = _load(self.what, self.device, self.dtype, self.where)

    # Text ------------------------------------------------------------------------------

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """What the model reads for each row (see the module docstring)."""
        tok = self.tokenizer
        out = []
        for p, c in zip(prompts, completions):
            if getattr(tok, "chat_template", None):
                messages = list(p) if isinstance(p, list) else [{"role": "user", "content": str(p)}]
                answer = c if isinstance(c, list) else [{"role": "assistant", "content": str(c)}]
                out.append(tok.apply_chat_template(messages + list(answer), tokenize=False))
            else:
                out.append(_plain(p) + _plain(c))
        return out

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, its last `max_length` kept (truncated on the left)."""
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [list(x)[-self.cfg.max_length :] for x in ids]

    # Scoring ---------------------------------------------------------------------------

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        """Logit 0 of each sequence, `batch_size` at a time (longest first), right-padded."""
        import torch

        from gspo_cli.algorithms.precision import upcast

        pad = self.model.config.get_text_config().pad_token_id
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        scores: list[float] = [0.0] * len(ids)
        bs = self.cfg.batch_size
        with torch.no_grad():
            for start in range(0, len(order), bs):
                rows = order[start : start + bs]
                width = max(len(ids[i]) for i in rows)
                input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for j, i in enumerate(rows):
                    input_ids[j, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                    mask[j, : len(ids[i])] = 1
                out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device))
                for j, v in zip(rows, upcast(out.logits[:, 0]).tolist()):
                    scores[j] = v
        return scores

    def score_local(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float | None]:
        if not self.holder:  # rank0 placement, another rank evaluating alone: no verdict here
            return [None] * len(completions)
        if self.model is None:
            self.load()
        return self.score_ids(self.encode(self.texts(prompts, completions)))

    def __call__(self, prompts, completions, completion_ids=None, trainer_state=None, **columns):
        if self.placement == "rank0" and not _ALONE.get():
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                if self.broken:  # every rank knows: no rank waits for a gather that will not come
                    raise RuntimeError(self.broken)
                got = gathered_scores(self.score_local, list(prompts), list(completions), dist)
                if isinstance(got, str):
                    self.broken = got
                    raise RuntimeError(got)
                return got
        return self.score_local(prompts, completions)


def gathered_scores(score, prompts: list, completions: list, dist) -> list:
    """Every rank's rows gathered to rank 0, scored there by `score(prompts, completions)` in
    one call, and each rank's scores scattered back to it (every rank calls this together). When
    scoring fails on rank 0, every rank gets its error's first line (a str) instead of scores."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list | None = [None] * world if rank == 0 else None
    dist.gather_object((prompts, completions), gathered, dst=0)
    parts: list | None = None
    if rank == 0:
        flat_p = [p for ps, _ in gathered for p in ps]
        flat_c = [c for _, cs in gathered for c in cs]
        try:
            flat = score(flat_p, flat_c)
        except Exception as err:  # noqa: BLE001 - said on every rank, not a hang on the others
            parts = [f"on rank 0: {type(err).__name__}: {(str(err).splitlines() or [''])[0]}"] * world
        else:
            parts, at = [], 0
            for ps, _ in gathered:
                parts.append(flat[at : at + len(ps)])
                at += len(ps)
    box: list = [None]
    dist.scatter_object_list(box, parts, src=0)
    return box[0]


def _plain(x: Any) -> str:
    """A prompt or completion as text: a message list's contents joined, else str."""
    if isinstance(x, list):
        return "".join(str(m.get("content", "")) for m in x)
    return str(x)
