"""Built-in tiny models: a character tokenizer trained on the task's text, a Qwen3 /
Qwen3-MoE network built from a config, and a short supervised cold start on the task's
reference solutions. Nothing here touches the network."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3MoeConfig

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.environments import split_tool_output
from gspo_cli.errors import SpecError
from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig
from gspo_cli.tasks import Task
from gspo_cli.tasks.base import TOKENIZER_SPECIALS, character_vocabulary

BUILTIN_KINDS = ("tiny-moe", "tiny-dense")
SPECIALS = list(TOKENIZER_SPECIALS)
# Bumped whenever the recipe below changes, so stale cached models are never reused.
# 2: the cold start trains with COLD_START_THREADS threads; numerics recorded and in the key.
RECIPE_VERSION = "2"
# torch's intra-op thread count sets the reduction order of the cold start's matmuls, and the
# cold-started model (and every RL result starting from it) depends on it: built with 1 thread
# the quickstart's held-out avg@4 at step 0 was 0.074, with 2 threads 0.217. The cold start
# therefore always trains with this many threads, whatever the cores or OMP_NUM_THREADS
# (2 threads also run on one core); 2 is what the documented figures were measured with.
COLD_START_THREADS = 2
# A long cold start (minutes on a loaded 2-core box) says how far it is at least this often.
PROGRESS_S = 30.0


def build_numerics() -> dict:
    """What besides the recipe decides a cold start's bits on this machine: the thread count
    it trains with and the CPU instruction set torch dispatches its kernels to (AVX2, AVX512,
    ...). Part of the cache key and of cold_start.json."""
    return {"threads": COLD_START_THREADS, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


@contextmanager
def fixed_threads(n: int):
    """torch runs intra-op work on `n` threads inside the block; the caller's count is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cache_root() -> Path:
    return Path(os.environ.get("GSPO_CACHE_DIR", Path.home() / ".cache" / "gspo-cli"))


def build_tokenizer(corpus: str) -> PreTrainedTokenizerFast:
    """One token per character. The vocabulary is every printable ASCII character plus any
    other character in `corpus`, so unseen-but-typeable text still round-trips."""
    vocab = {tok: i for i, tok in enumerate(character_vocabulary(corpus))}
    # BPE with no merges is a character tokenizer that saves and loads as a normal HF one.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_config(kind: str, size: BuiltinModelConfig, tokenizer) -> Qwen3Config | Qwen3MoeConfig:
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.hidden_size // size.num_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=size.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if kind == "tiny-dense":
        return Qwen3Config(**common)
    return Qwen3MoeConfig(
        **common,
        num_experts=size.num_experts,
        num_experts_per_tok=size.experts_per_token,
        moe_intermediate_size=size.moe_intermediate_size,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )


def cache_key(kind: str, size: BuiltinModelConfig, cold: ColdStartConfig, task: Task) -> str:
    blob = json.dumps(
        {
            "kind": kind,
            "size": size.model_dump(),
            "cold": cold.model_dump(),
            "task": task.data_fingerprint(),  # changes with the data, exclusions included
            "recipe": RECIPE_VERSION,
            "torch": torch.__version__,
            "numerics": build_numerics(),  # an entry built with other threads or kernels is another model
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


COMPLETE_MARK = "cold_start.json"  # written last: an entry without it was never finished


def builtin_model_dir(kind: str, size: BuiltinModelConfig, cold: ColdStartConfig, task: Task, log=print) -> Path:
    """Path of the cold-started model for these settings, building it on first use. A cache
    entry is published whole (built in a temporary directory, checked, renamed); an
    incomplete one (e.g. a tokenizer without weights, left by an older version) is rebuilt,
    never returned."""
    target = cache_root() / "models" / f"{kind}-{cache_key(kind, size, cold, task)}"
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Parallel jobs (a sweep's first runs) wait for one builder instead of each spending the
    # cold start; the lock is advisory and released by the OS if the builder dies.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(target):
            return target
        if target.exists():
            log(f"cold start: {target} is incomplete (no weights or unfinished); rebuilding it")
            _remove_entry(target)
        return _build_into(target, kind, size, cold, task, log)


def is_complete(entry: Path) -> bool:
    """Whether a cache entry holds everything a load needs: config, tokenizer, weights, and
    the mark its builder writes last."""
    return (
        (entry / COMPLETE_MARK).is_file()
        and (entry / "config.json").is_file()
        and (entry / "tokenizer.json").is_file()
        and any(entry.glob("*.safetensors"))
    )


def _remove_entry(entry: Path) -> None:
    aside = entry.parent / f".broken-{entry.name}-{os.getpid()}"
    os.rename(entry, aside)  # out of the way at once; deleting a large one takes a while
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def _sigterm_interrupts():
    """While a cold start builds: SIGTERM raises KeyboardInterrupt (the CLI's exit 4, "interrupted
    before a run started"), so the build's temporary directory is removed instead of the process
    dying where it stands. Only in the main thread and where SIGTERM still has its default action
    (a run's own handler, installed later, is never replaced)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _build_into(target: Path, kind, size, cold, task, log) -> Path:
    with _sigterm_interrupts():
        return _build_in_tmp(target, kind, size, cold, task, log)


def _build_in_tmp(target: Path, kind, size, cold, task, log) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        t0 = time.time()
        with fixed_threads(COLD_START_THREADS):
            model, tok, final_loss = _build_and_cold_start(kind, size, cold, task, log)
        # transformers writes weights on global rank 0 only (should_save_on_this_rank); a
        # cache is per node, and every node that builds must get its weights.
        model.should_save_on_this_rank = lambda is_main_process: True
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / COMPLETE_MARK).write_text(
            json.dumps(
                {
                    "steps": cold.steps,
                    "batch_size": cold.batch_size,
                    "final_loss": final_loss,
                    "seconds": round(time.time() - t0, 1),
                    **build_numerics(),
                    **cold_start_data(task),
                }
            )
        )
        publish_entry(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def publish_entry(tmp: Path, target: Path) -> None:
    """Make the finished directory `tmp` the cache entry `target`, whole or not at all: a
    `tmp` that is not complete is an error (a bug); a concurrent builder that published first
    wins (same key, same recipe)."""
    if not is_complete(tmp):
        raise RuntimeError(f"{tmp}: built model is incomplete: {sorted(p.name for p in tmp.iterdir())}")
    _fsync_tree(tmp)
    try:
        os.rename(tmp, target)  # atomic: a concurrent builder either wins or finds ours
    except OSError:
        if not is_complete(target):
            raise


def _fsync_tree(path: Path) -> None:
    for f in [*path.iterdir(), path]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def entry_digest(entry: Path) -> str:
    """sha256 over the entry's files (names and bytes), the cold-start timing record aside:
    equal digests mean bit-equal models and tokenizers."""
    h = hashlib.sha256()
    for f in sorted(entry.iterdir()):
        if f.is_file() and f.name != COMPLETE_MARK:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def _build_and_cold_start(kind, size, cold: ColdStartConfig, task: Task, log):
    from transformers import AutoModelForCausalLM

    rng = random.Random(cold.seed)
    tok = build_tokenizer(task.corpus_text(random.Random(cold.seed + 1)))
    config = build_config(kind, size, tok)
    torch.manual_seed(cold.seed)
    model = (
        AutoModelForCausalLM.from_config(config, experts_implementation="eager")
        if kind == "tiny-moe"
        else AutoModelForCausalLM.from_config(config)
    )
    _init_routers(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cold.lr, weight_decay=0.0)
    eos = tok.eos_token
    final_loss = None
    log(f"cold start: {kind}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, {cold.steps} steps")
    t0 = last = time.monotonic()
    for step in range(cold.steps):
        lr = cold.lr * 0.5 * (1 + math.cos(math.pi * step / max(cold.steps, 1)))
        for g in opt.param_groups:
            g["lr"] = lr
        probs = _with_solutions(task, rng, cold.batch_size)
        input_ids, labels, attn = _sft_batch(tok, [p.prompt for p in probs], [p.solution + eos for p in probs])
        out = model(input_ids=input_ids, attention_mask=attn, labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        final_loss = out.loss.item()
        # a fifth of the steps, or PROGRESS_S without a line (a long cold start on a loaded box)
        now = time.monotonic()
        if (step + 1) % max(1, cold.steps // 5) == 0 or step == cold.steps - 1 or now - last >= PROGRESS_S:
            last, done = now, step + 1
            left = "" if done == cold.steps else f", about {_minutes((now - t0) / done * (cold.steps - done))} left"
            log(f"cold start step {done}/{cold.steps}: loss {final_loss:.3f} ({_minutes(now - t0)} so far{left})")
    model.eval()
    return model, tok, final_loss


def _minutes(seconds: float) -> str:
    """A duration as people read it: "42 s", "3 min 05 s"."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def cold_start_data(task: Task) -> dict:
    """What a cold start on `task` trains on, for run.json and `gspo eval`: the task, its data
    fingerprint, how many training problems (None: generated) and how many are excluded."""
    pool = task.train_pool
    return {
        "task": task.name,
        "data": task.data_fingerprint(),
        "train_problems": len(pool) if pool is not None else None,
        "with_solution": sum(p.solution is not None for p in pool) if pool is not None else None,
        "excluded_problems": len(task.excluded),
    }


def cold_start_info(source: str) -> dict | None:
    """The cold_start.json of a built-in model directory (None for any other model)."""
    path = Path(source) / "cold_start.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def cold_start_line(info: dict) -> str:
    """One line saying what a built-in model's cold start trained on (from `cold_start_info`)."""
    pool = info.get("train_problems")
    data = (
        f"{pool} {info.get('task', '')} problems" if pool is not None else f"generated {info.get('task', '')} problems"
    )
    excluded = info.get("excluded_problems")
    return (
        f"built-in model cold-started for {info.get('steps')} steps x {info.get('batch_size', '?')} on {data}"
        + (f", {excluded} evaluation problems excluded" if excluded else "")
        # The data fingerprint is a cache key, for run.json, not for the terminal.
        + (f" (final loss {loss:.3f})" if isinstance(loss := info.get("final_loss"), (int, float)) else "")
    )


def _with_solutions(task: Task, rng: random.Random, n: int) -> list:
    """`n` training problems that have a reference solution (rows without one are skipped).
    SpecError when the training data has none at all (LiveCodeBench rows, for instance)."""
    out: list = []
    for _ in range(100):
        out += [p for p in task.train_problems(rng, n) if p.solution is not None]
        if len(out) >= n:
            return out[:n]
        if not out:
            break
    raise SpecError(
        f"model.cold_start: the training data of task {task.name} has no reference solutions to cold-start "
        "the built-in model on (task prompts: a `solution` or `completion` column); use a synthetic "
        "task.params.source or a pretrained model"
    )


def _init_routers(model) -> None:
    """HF initialises Qwen3-MoE router weights to zero in from_config; without a random
    start every token picks the same experts and the experts never specialise."""
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("TopKRouter"):
                module.weight.normal_(0.0, std)


def check_prompt_lengths(problems: list, where: str, positions: int, new_tokens: int) -> None:
    """SpecError (one line, before any model is built) when a prompt of `problems` leaves fewer
    than `new_tokens` of the built-in model's `positions` for the response. Its tokenizer reads
    one character as one token, so a prompt's length in characters is its length in tokens (a
    chat-formatted prompt's text adds a few more)."""
    room = positions - new_tokens
    for p in problems:
        if len(p.prompt) > room:
            raise SpecError(
                f"{where}: the prompt of problem {p.id!r} is {len(p.prompt):,} characters long; the built-in model "
                f"reads {positions} positions (model.builtin.max_positions), {new_tokens} of them for the response "
                f"(rollout.max_new_tokens), so prompts of at most {room} fit: shorten or drop that row"
            )


def _sft_batch(tok, prompts: list[str], targets: list[str]):
    """Right-padded (B, T) ids with labels -100 on prompt and padding, and on the tool output
    of a solution that calls tools (`split_tool_output`: the model never learns to write it)."""
    rows, labels = [], []
    for p, t in zip(prompts, targets):
        p_ids = tok(p, add_special_tokens=False).input_ids
        t_ids, t_labels = [], []
        for part, tool in split_tool_output(t):
            ids = tok(part, add_special_tokens=False).input_ids
            t_ids += ids
            t_labels += [-100] * len(ids) if tool else ids
        rows.append(p_ids + t_ids)
        labels.append([-100] * len(p_ids) + t_labels)
    width = max(map(len, rows))
    pad = tok.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, lab, attn


def share_across_nodes(source: str | None, info: DistInfo) -> str:
    """Every rank's path to rank 0's built-in model `source` (None off rank 0), for caches that
    are per node (GSPO_CACHE_DIR on a local disk) or shared: each node's local rank 0 checks
    its own cache entry against rank 0's digest and, when it is missing, incomplete or
    different (built on other hardware), receives rank 0's files over the process group and
    publishes them atomically. Ranks then load bit-identical models. Collective; the
    built-in models are small (the whole entry passes through every rank's memory)."""
    name, digest = distributed.broadcast_object(
        (Path(source).name, entry_digest(Path(source))) if info.is_main else None, info
    )
    local = cache_root() / "models" / name
    leader = os.environ.get("LOCAL_RANK", "0") == "0"
    need = leader and not info.is_main and not (is_complete(local) and entry_digest(local) == digest)
    if any(distributed.gather_objects(need, info)):
        blob = {f.name: f.read_bytes() for f in Path(source).iterdir() if f.is_file()} if info.is_main else None
        blob = distributed.broadcast_object(blob, info)
        if need:
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".recv-", dir=local.parent))
            try:
                for fname, data in blob.items():
                    (tmp / fname).write_bytes(data)
                if local.exists():
                    _remove_entry(local)
                publish_entry(tmp, local)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        del blob
    distributed.barrier(info)
    return str(source if info.is_main else local)
