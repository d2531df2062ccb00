"""Memory of the FSDP -> vLLM weight stream: resident memory per process while the sharded
weights are gathered into each process's colocated engine, next to the steady state.

    torchrun --nproc-per-node 2 studies/vllm-fsdp/vllm_fsdp_stream.py [--hidden 512] [--layers 4] [--vocab 32000]
        [--dtype bfloat16]

(run with `.venv-vllm`'s python: `python -m torch.distributed.run --standalone ...`). Builds a
random Qwen3-MoE from a config (nothing downloaded), shards it with FSDP2 (one unit per decoder
layer plus the root, gloo), starts one vLLM engine per process (external launcher), then syncs
3 times, each after perturbing the weights; sync 0 is the gathers alone, consumed by no
engine. A thread samples this process's RSS every 2 ms during each sync. Prints one JSON
object per process: RSS before each sync (steady state) and the peak during it, the largest
single gathered parameter and one decoder layer's gathered size (MiB), and the max
|engine - trainer| embedding difference after the last sync (0: the weights arrived). This
file only measures; docs/scaling/vllm-fsdp.md holds the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `gspo_cli` from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[2])

MiB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples RSS every `period` seconds between start() and stop(); `.peak` in bytes."""

    def __init__(self, period: float = 0.002):
        self.period, self.peak, self._run = period, 0, False

    def __enter__(self):
        self.peak, self._run = rss_bytes(), True
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def _loop(self):
        while self._run:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.period)

    def __exit__(self, *exc):
        self._run = False
        self._t.join()
        self.peak = max(self.peak, rss_bytes())


def moe_config(hidden: int, layers: int, experts: int, vocab: int):
    """The random Qwen3-MoE the weight-stream benchmarks build (2 of `experts` per token, head
    dimension 64, untied head)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        num_experts=experts,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The `moe_config` sizes as flags."""
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--dtype", default="float32", help="the engine's dtype (the trainer keeps float32 master weights)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import Qwen3MoeForCausalLM

    from gspo_cli.distributed import setup, shard_
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine

    info = setup("cpu")
    cfg = moe_config(args.hidden, args.layers, args.experts, args.vocab)
    torch.manual_seed(0)  # every process builds the same weights (fully_shard does not broadcast)
    model = Qwen3MoeForCausalLM(cfg).eval()
    layer_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    model_dir = Path(os.environ.get("STREAM_DIR") or tempfile.gettempdir()) / f"stream-{args.hidden}-{args.layers}"
    if info.is_main:
        model.save_pretrained(model_dir)
    dist.barrier()
    shard_(model)
    engine = VLLMRolloutEngine(
        model,
        None,
        model_dir=str(model_dir),
        max_new_tokens=4,
        temperature=1.0,
        stop_ids=[0],
        sharded=True,
        dtype=args.dtype,
    )
    from gspo_cli.rollout.vllm_weights import checkpoint_weights

    # Our side alone: the gathers and name conversions, consumed and dropped (no engine).
    before = rss_bytes()
    with PeakRSS() as peak:
        for _ in checkpoint_weights(model, engine.weight_dtype):
            pass
    rows = [{"sync": 0, "rss_before_mib": before / MiB, "rss_peak_mib": peak.peak / MiB, "s": 0.0}]
    for i in range(args.syncs):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (i + 1))  # on every process's shard: a new version to stream
        before = rss_bytes()
        with PeakRSS() as peak:
            t = time.time()
            engine.sync_weights()
            secs = time.time() - t
        rows.append({"sync": i + 1, "rss_before_mib": before / MiB, "rss_peak_mib": peak.peak / MiB, "s": secs})
    # Every parameter arrived: the engine's embedding equals the trainer's full one.
    emb = model.model.embed_tokens.weight.full_tensor().to(engine.weight_dtype)
    got = engine.llm.apply_model(lambda m: m.model.embed_tokens.weight.detach().clone())[0]
    out = {
        "rank": info.rank,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "layer_gathered_mib": layer_bytes / MiB,
        "largest_param_mib": largest / MiB,
        "embed_max_abs_diff": (emb.float() - got.float()).abs().max().item(),
        "dtype": args.dtype,
        "syncs": [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
    }
    print(json.dumps(out), flush=True)
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
