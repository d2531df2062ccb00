"""Rollouts from a vLLM server on its own devices (`rollout.engine: vllm-server`).

The server (`gspo vllm-server SPEC` starts one) samples; the trainer never holds an engine.
After every optimizer step the trainer's rank 0 pushes the new weights before anyone samples
again: it opens vLLM's weight update over HTTP (`/start_weight_update`, `/update_weights`,
`/finish_weight_update`) and broadcasts each tensor, in checkpoint names and layouts, over a
process group it shares with the server's workers (`gspo_cli.rollout.weight_transfer`: gloo
for a CPU server, NCCL for a GPU one). Under FSDP every rank takes part in the gathers while
rank 0 sends; under torchrun the other ranks wait for the push to finish before they sample
(a request served mid-update would sample from half-loaded weights).

Sampling goes through vLLM's token-in/token-out endpoint (`/inference/v1/generate`, served
with `--enable-scale-out`): token ids in, token ids and the sampled tokens' log-probs out, one
request per row (the server batches them), seeded per row. The batch is laid out exactly as
the colocated engine lays out its own (`vllm_batch.to_batch`).

R3: with `--enable-return-routed-experts` (which `gspo vllm-server` passes for a spec with an
r3 arm) each answer carries the experts every position was routed to, converted as the colocated
engine converts its own. With rollout.staleness: k the staleness worker process holds this
engine: before each batch it pushes the copy of the weights that batch was requested with (k
steps behind the trainer's once warmed up) and samples while the trainer trains. Sleep mode does
not apply (the server's memory is its own).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import torch

from gspo_cli.errors import RunError, SpecError
from gspo_cli.models.prompts import raw_prompts
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.rollout.vllm_weights import checkpoint_weights, weights_version
from gspo_cli.rollout.weight_transfer import BACKEND, pair_group

_SETUP_HINT = "is the server started with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out? `gspo vllm-server` does"


class ServerError(RunError):
    """The vLLM server could not be reached or refused a request (one line)."""


class VLLMServerClient:
    """The HTTP calls the trainer makes, each a one-line ServerError when it fails."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def call(self, path: str, body: dict | None = None, *, get: bool = False, timeout_s: float | None = None):
        data = None if get else json.dumps(body or {}).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                text = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                payload = json.loads(detail)
                detail = payload.get("error", {}).get("message") or payload.get("detail") or detail
            if err.code == 404:
                detail += f" ({_SETUP_HINT})"
            raise ServerError(f"vLLM server {self.url}{path}: HTTP {err.code}: {_one_line(detail)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServerError(
                f"vLLM server {self.url}: no answer to {path} ({reason}); start one with `gspo vllm-server SPEC`"
            ) from None
        return json.loads(text) if text else {}

    def settings(self) -> dict:
        """What the trainer must know of the server: its workers' count, device and dtype."""
        world = self.call("/get_world_size", get=True, timeout_s=30).get("world_size", 1)
        info = str(self.call("/server_info", get=True, timeout_s=30).get("vllm_config", ""))
        dtype = re.search(r"\bdtype=torch\.(\w+)", info)
        device = re.search(r"\bdevice_config=(\w+)", info)
        return {
            "world_size": int(world),
            "dtype": getattr(torch, dtype.group(1)) if dtype else None,
            "device": device.group(1) if device else "cuda",
            "routes": "enable_return_routed_experts=True" in info,
        }


def check_server(url: str, r3: bool) -> None:
    """Before any model loads: the server answers (ServerError, exit 1) and, for an r3 arm,
    returns routed experts (SpecError, exit 2)."""
    client = VLLMServerClient(url, 30)
    client.call("/health", get=True)
    if r3 and not client.settings()["routes"]:
        raise SpecError(
            f"routing_replay: r3 needs the routes the server sampled with, and the server at {url} does not "
            "return them: start it with --enable-return-routed-experts (`gspo vllm-server` does for a spec "
            "with an r3 arm)"
        )


class VLLMServerRolloutEngine:
    """Samples from a vLLM server that holds a copy of `model`'s weights, pushed by rank 0
    after every change (see the module docstring)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        url: str,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int = 0,
        stop_ids: list[int],
        prompt_format=None,
        weight_port: int = 51216,
        timeout_s: float = 600.0,
        sharded: bool = False,
        max_parallel: int = 64,
        return_routes: bool = False,
        moe_layers: list[int] | None = None,
        num_experts: int | None = None,
    ):
        """`url`: the server's base URL. `weight_port`: the port rank 0 listens on for the
        server's workers to join the weight group (must be reachable from the server).
        `sharded`: `model`'s weights are FSDP shards (every sync gathers them on every rank).
        `return_routes` (r3): batches carry the experts the server routed every position to,
        restricted to the decoder layers `moe_layers` and checked against `num_experts`, as the
        colocated engine's. Rank 0 connects to the server here (ServerError if it cannot)."""
        import torch.distributed as dist

        self.model, self.tokenizer = model, tokenizer
        self.format = prompt_format or raw_prompts(tokenizer)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.seed = seed
        self.stop_ids = list(stop_ids)
        self.client = VLLMServerClient(url, timeout_s)
        self.max_parallel = max_parallel
        self.return_routes, self.moe_layers, self.num_experts = return_routes, moe_layers, num_experts
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        # Every sync is a step all ranks take together (rank 0 sends, FSDP ranks gather, the
        # others wait), including before an evaluation rank 0 samples alone (train/loop.py).
        self.sharded = sharded or self.world > 1
        self.gathers = sharded
        server = self.client.settings()
        self.weight_dtype = server["dtype"]
        self.group = None
        if self.rank == 0:
            self.group = self._join(server, url, weight_port, timeout_s)
        self._synced = None  # what the server holds is unknown: the first generate pushes
        self.sync_s = 0.0

    def _join(self, server: dict, url: str, port: int, timeout_s: float):
        """Open the weight group: rank 0 of it here, the server's workers 1.. (they join while
        /init_weight_transfer_engine is answered, so the request runs beside the rendezvous)."""
        backend = "gloo" if server["device"] == "cpu" else "nccl"
        host = _address_towards(url)
        info = {
            "host": host,
            "port": port,
            "world_size": 1 + server["world_size"],
            "backend": backend,
            "timeout_s": timeout_s,
        }
        group, failed = None, []
        thread = _in_thread(lambda: self.client.call("/init_weight_transfer_engine", {"init_info": info}), failed)
        try:
            group = pair_group(host, port, 0, 1 + server["world_size"], backend, timeout_s)
        except Exception as err:  # a busy port, an unreachable host: one line
            thread.join(timeout=timeout_s)
            raise ServerError(
                f"rollout.server.weight_port: cannot open the weight group on {host}:{port}: {err}"
            ) from None
        thread.join()
        if failed:
            msg = str(failed[0])
            if "Invalid weight transfer backend" in msg or "not initialized" in msg.lower():
                config = json.dumps({"backend": BACKEND})
                msg += f" (the server needs --weight-transfer-config '{config}'; `gspo vllm-server` sets it)"
            raise ServerError(msg)
        return group

    # -- weights ---------------------------------------------------------------------------

    def sync_weights(self) -> None:
        """Push the trainer's current weights to the server (rank 0), every rank in step."""
        t0 = time.time()
        hf = getattr(self.model, "module", self.model)  # DDP wraps the PreTrainedModel
        with torch.no_grad():
            if self.rank == 0:
                self._push(hf)
            elif self.gathers:
                for _ in checkpoint_weights(hf, self.weight_dtype):  # each gather is a collective
                    pass
        if self.world > 1:
            torch.distributed.barrier()  # no rank samples before the server holds the new weights
        self._synced = weights_version(self.model)
        self.sync_s += time.time() - t0

    def _push(self, hf) -> None:
        names, dtypes, shapes = stream_metadata(hf, self.weight_dtype)
        self.client.call("/start_weight_update")
        failed: list = []
        update = {"names": names, "dtype_names": dtypes, "shapes": shapes}
        thread = _in_thread(lambda: self.client.call("/update_weights", {"update_info": update}), failed)
        for i, (name, tensor) in enumerate(checkpoint_weights(hf, self.weight_dtype)):
            if name != names[i] or list(tensor.shape) != shapes[i]:  # the metadata pass and the stream disagree: a bug
                raise RuntimeError(
                    f"weight stream: {name} {tuple(tensor.shape)} where {names[i]} {shapes[i]} was announced"
                )
            self.group.broadcast(tensor.contiguous(), 0).wait()
        thread.join()
        if failed:
            raise ServerError(str(failed[0]))
        self.client.call("/finish_weight_update")
        self.client.call("/reset_prefix_cache")

    def sync_if_stale(self) -> bool:
        """Push the weights if they changed since the last push (or were never pushed); every
        rank reaches the same answer (their weights change in step)."""
        if self.model is None or weights_version(self.model) == self._synced:
            return False
        self.sync_weights()
        return True

    def sleep(self) -> None:
        """Nothing to hand back: the server's memory is not the trainer's."""

    @contextlib.contextmanager
    def same_prompts(self):
        yield

    samples_with_rank0 = False

    # -- sampling --------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[str], temperature: float | None = None) -> RolloutBatch:
        """One sample per prompt. `temperature` overrides the engine's (0: greedy). A prompt is text
        or a conversation (`tasks.base.Conversation`): the engine gets the token ids of the same
        rendering as the hf engine's (`self.format`), and the batch holds exactly those ids."""
        from gspo_cli.rollout.vllm_batch import to_batch

        self.sync_if_stale()
        prompt_ids = self.tokenizer(self.format(prompts), add_special_tokens=False).input_ids
        temp = self.temperature if temperature is None else temperature
        # Each row's seed from torch's generator, as the hf engine's draws: a run (and a staleness
        # worker, seeded by step) repeats exactly.
        base = int(torch.randint(0, 2**31 - 1, ()))
        bodies = [self._request(ids, temp, (base, row)) for row, ids in enumerate(prompt_ids)]
        completions = [_Completion.from_answer(a) for a in self._post_all(bodies)]
        device = next(self.model.parameters()).device if self.model is not None else torch.device("cpu")
        return to_batch(
            prompt_ids,
            completions,
            self.tokenizer,
            device,
            self.stop_ids,
            with_routes=self.return_routes,
            moe_layers=self.moe_layers,
            num_experts=self.num_experts,
        )

    def sample_ids(
        self, prompt_ids: list[list[int]], max_tokens: list[int], stop_ids: list[int], key: int = 0
    ) -> list[tuple[list[int], list[float]]]:
        """One continuation per row of token ids, at most `max_tokens[i]` tokens, up to and
        including the first of `stop_ids`: (its token ids, each one's log-prob), as the server
        sampled them (multi-turn rollouts, rollout/vllm_turns.py; the caller syncs the weights
        first). Row i's seed is drawn as `generate` draws it, from (`key`, i)."""
        base = int(torch.randint(0, 2**31 - 1, ()))
        bodies = [
            self._request(ids, self.temperature, (base, key, row), max_tokens=m, stop_ids=stop_ids)
            for row, (ids, m) in enumerate(zip(prompt_ids, max_tokens))
        ]
        answers = self._post_all(bodies)
        return [
            (c.token_ids, [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
            for c in map(_Completion.from_answer, answers)
        ]

    def _post_all(self, bodies: list[dict]) -> list[dict]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(self.max_parallel, len(bodies)))) as pool:
            return list(pool.map(lambda b: self.client.call("/inference/v1/generate", b), bodies))

    def _request(
        self, ids: list[int], temperature: float, key: tuple, max_tokens: int | None = None, stop_ids=None
    ) -> dict:
        return {
            "token_ids": ids,
            "sampling_params": {
                "n": 1,
                "temperature": temperature,
                "top_p": self.top_p,
                "top_k": 0,
                "min_p": 0.0,
                "repetition_penalty": 1.0,
                "presence_penalty": 0.0,
                "frequency_penalty": 0.0,
                "max_tokens": self.max_new_tokens if max_tokens is None else max_tokens,
                "min_tokens": 0,
                "stop_token_ids": self.stop_ids if stop_ids is None else stop_ids,
                "ignore_eos": False,
                "logprobs": 0,
                "detokenize": False,
                # Python hashes tuples of ints the same in every process and run.
                "seed": hash((self.seed, *key)) & 0x7FFFFFFF,
            },
        }

    def close(self) -> None:
        """Leave the weight group (the server keeps running)."""
        if self.group is not None:
            with contextlib.suppress(ServerError):
                self.client.call("/shutdown_weight_transfer_engine", timeout_s=30)
            self.group = None


class _Completion:
    """One answer of /inference/v1/generate in the shape `to_batch` reads (vLLM's
    CompletionOutput): token_ids, per-position {token: logprob}, routed_experts."""

    class _LP:
        def __init__(self, logprob: float):
            self.logprob = logprob

    def __init__(self, token_ids: list[int], logprobs: list[float], routed_experts=None):
        self.token_ids = token_ids
        self.logprobs = [{t: self._LP(lp)} for t, lp in zip(token_ids, logprobs)]
        self.routed_experts = routed_experts  # (prompt + response - 1, layers, k), as vLLM's own

    @classmethod
    def from_answer(cls, answer: dict) -> _Completion:
        try:
            choice = answer["choices"][0]
            ids = list(choice["token_ids"])
            lps = [c["logprob"] for c in choice["logprobs"]["content"]]
        except (KeyError, IndexError, TypeError):
            raise ServerError(
                f"vLLM server: an answer without token ids and log-probs: {_one_line(str(answer))[:200]}"
            ) from None
        if len(lps) != len(ids):
            raise ServerError(f"vLLM server: {len(ids)} tokens but {len(lps)} log-probs in one answer")
        return cls(ids, lps, _decoded_routes(choice.get("routed_experts")))


def _decoded_routes(encoded: str | None):
    """The answer's `routed_experts`: base64 of a `.npy` array (vLLM serialises the completion's
    routed_experts so, uint8/uint16/int32), or None."""
    if encoded is None:
        return None
    import base64
    import io

    import numpy as np

    try:
        return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    except (ValueError, OSError) as err:
        raise ServerError(f"vLLM server: routed_experts that do not decode as a .npy array ({err})") from None


def stream_metadata(hf, dtype: torch.dtype | None) -> tuple[list[str], list[str], list[list[int]]]:
    """Names, dtypes and shapes of what `checkpoint_weights(hf, dtype)` will yield, in its order,
    without gathering or materialising anything (meta tensors through the same conversion)."""
    from transformers.core_model_loading import revert_weight_conversion

    names, dtypes, shapes = [], [], []
    for name, param in hf.named_parameters():
        meta = torch.empty(tuple(param.shape), dtype=dtype or param.dtype, device="meta")
        for n, t in revert_weight_conversion(hf, {name: meta}).items():
            names.append(n)
            dtypes.append(str(t.dtype).removeprefix("torch."))
            shapes.append(list(t.shape))
    return names, dtypes, shapes


def _address_towards(url: str) -> str:
    """This host's address on the route to the server (where its workers can reach us)."""
    parsed = urllib.parse.urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


def _in_thread(fn, errors: list) -> threading.Thread:
    def run():
        try:
            fn()
        except Exception as err:  # surfaced by the caller after join
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
