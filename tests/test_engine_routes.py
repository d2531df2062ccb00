"""vLLM's routed experts as they really come: one row per DECODER layer (dense ones included),
uint8 or uint16, prompt routes inside the completion's array or beside it, no route for the
final sampled token. No vLLM needed: the arrays are built by hand."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as tf

from gspo_cli.errors import RunError
from gspo_cli.models.builtin import build_tokenizer
from gspo_cli.models.engine_routes import route_rows, routes_from_vllm
from gspo_cli.models.routing import RoutingController, decoder_layer_ids, moe_layer_indices
from gspo_cli.rollout.vllm_batch import to_batch


def _rows(n: int, L_dec: int, k: int, dtype, seed: int = 0, high: int = 4) -> np.ndarray:
    """(n, L_dec, k) routes; layer l's ids are offset so each layer is recognisable."""
    gen = np.random.default_rng(seed)
    return gen.integers(0, high, (n, L_dec, k)).astype(dtype)


# ----------------------------------------------------------------- which layers are MoE


def test_moe_layers_follow_each_config_convention():
    # Qwen3-MoE: mlp_only_layers dense; decoder_sparse_step 2 -> layers 1, 3, 5 sparse
    qwen = SimpleNamespace(num_hidden_layers=6, mlp_only_layers=[3], decoder_sparse_step=2)
    assert moe_layer_indices(qwen) == [1, 5]
    # DeepSeek-V3 / GLM-4.5: first_k_dense_replace 3 dense layers first, then every layer
    deepseek = SimpleNamespace(num_hidden_layers=6, first_k_dense_replace=3, moe_layer_freq=1)
    assert moe_layer_indices(deepseek) == [3, 4, 5]
    # Mixtral: every layer
    assert moe_layer_indices(SimpleNamespace(num_hidden_layers=3)) == [0, 1, 2]
    assert moe_layer_indices(SimpleNamespace()) is None


def test_router_decoder_layers_come_from_module_names():
    assert decoder_layer_ids(["model.layers.1.mlp.gate", "model.layers.3.mlp.gate"]) == [1, 3]
    cfg = SimpleNamespace(num_hidden_layers=3, first_k_dense_replace=1)
    assert decoder_layer_ids(["a.gate", "b.gate"], cfg) == [1, 2]  # no index in the names: the config's
    with pytest.raises(ValueError, match="cannot tell which decoder layers hold the 1 routers"):
        decoder_layer_ids(["a.gate"], cfg)


def test_a_qwen3_moe_with_dense_layers_reports_where_its_routers_sit():
    """A real transformers model: 4 decoder layers, layer 0 dense (mlp_only_layers), layer 2
    dense too; the controller holds 2 routers in decoder layers 1 and 3."""
    cfg = tf.Qwen3MoeConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[0, 2],
    )
    torch.manual_seed(0)
    ctl = RoutingController(tf.Qwen3MoeForCausalLM(cfg).eval())
    assert ctl.num_layers == 2 and ctl.decoder_layers == [1, 3] == moe_layer_indices(cfg)


# ----------------------------------------------------------------- conversion


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("moe_layers", [[1, 2], [0, 2]], ids=["dense-first", "interleaved"])
def test_dense_layers_are_mapped_out_for_both_vllm_dtypes(dtype, moe_layers):
    """3 decoder layers, 2 of them MoE. Row 0: prompt 2 (1 left pad in P=3), response 2 ->
    3 routed rows. Each kept position's routes equal vLLM's rows at the MoE layers, in order."""
    r = _rows(3, 3, 2, dtype, high=300 if dtype == np.uint16 else 200)
    out = routes_from_vllm([r], [2], [2], P=3, C=2, moe_layers=moe_layers, num_experts=300)
    assert out.shape == (2, 1, 5, 2) and out.dtype == torch.int16
    for slot, layer in enumerate(moe_layers):
        assert out[slot, 0, 1:4].tolist() == r[:, layer].astype(int).tolist()
    assert out[:, 0, 0].tolist() == [[0, 1], [0, 1]]  # the pad column: experts 0..k-1
    assert out[:, 0, 4].tolist() == [[0, 1], [0, 1]]  # the final sampled token: no route


def test_uint16_ids_above_int16_survive():
    """Ids past 32767 (uint16 models with more experts) are kept, in int32."""
    r = np.full((1, 1, 2), 40000, dtype=np.uint16)
    out = routes_from_vllm([r], [1], [1], P=1, C=1, num_experts=50000)
    assert out.dtype == torch.int32 and out[0, 0, 0].tolist() == [40000, 40000]


def test_expert_ids_are_checked_on_moe_layers_only():
    r = _rows(2, 2, 2, np.uint8)
    r[:, 0] = 255  # layer 0 is dense: vLLM's ids there mean nothing
    out = routes_from_vllm([r], [2], [1], P=2, C=1, moe_layers=[1], num_experts=4)
    assert out[0, 0, :2].tolist() == r[:, 1].astype(int).tolist()
    r[1, 1, 0] = 9
    with pytest.raises(ValueError, match=r"^row 0: expert id 9 outside \[0, 4\) \(the model's expert count\)") as err:
        routes_from_vllm([r], [2], [1], P=2, C=1, moe_layers=[1], num_experts=4)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"cover 2 decoder layers, but the model's routers sit in layers \[1, 2\]"):
        routes_from_vllm([r], [2], [1], P=2, C=1, moe_layers=[1, 2])


def test_prompt_routes_in_the_output_or_beside_it_give_the_same_rows():
    full = _rows(4, 2, 2, np.uint8)  # prompt 3 + response 2 - 1
    assert np.array_equal(route_rows(full, None, 3, 2), full)  # in the output
    assert np.array_equal(route_rows(full[3:], full[:3], 3, 2), full)  # beside it
    assert np.array_equal(route_rows(full, full[:3], 3, 2), full)  # both: the output already covers the prompt
    assert route_rows(None, full[:3], 3, 1).shape == (3, 2, 2)  # 1-token response: nothing after the prompt
    with pytest.raises(ValueError, match=r"prompt routes \(2, 2, 2\) and response routes \(1, 2, 2\) do not fit"):
        route_rows(full[3:], full[:2], 3, 2)
    with pytest.raises(ValueError, match=r"5 routed positions for a 3-token prompt .* = 4"):
        route_rows(np.concatenate([full, full[:1]]), None, 3, 2)


def _completion(tokens, routed=None):
    return SimpleNamespace(
        token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in tokens], routed_experts=routed
    )


def test_batches_built_from_split_prompt_routes_equal_those_from_whole_ones():
    """The engine's batch: rows whose prompt routes come separately convert exactly like rows
    with them in the output; a model mismatch is one line (RunError, exit 1)."""
    tok = build_tokenizer("0123456789+=?\n")
    ids = tok(["1+2=?\n", "10+20=?\n"], add_special_tokens=False).input_ids
    three, eos = tok.convert_tokens_to_ids("3"), tok.eos_token_id
    whole = [_rows(len(p) + 1, 3, 2, np.uint8, seed=i) for i, p in enumerate(ids)]  # 2-token responses
    cpu = torch.device("cpu")
    kw = dict(with_routes=True, moe_layers=[0, 2], num_experts=4)
    a = to_batch(ids, [_completion([three, eos], r) for r in whole], tok, cpu, [eos], **kw)
    split = [_completion([three, eos], r[len(p) :]) for p, r in zip(ids, whole)]
    b = to_batch(ids, split, tok, cpu, [eos], prompt_routes=[r[: len(p)] for p, r in zip(ids, whole)], **kw)
    assert a.engine_routes.shape == (2, 2, a.input_ids.shape[1], 2)
    assert torch.equal(a.engine_routes, b.engine_routes)
    with pytest.raises(RunError, match=r"^routing_replay: r3: vLLM's routed experts: .*expert id") as err:
        to_batch(ids, [_completion([three, eos], r + 4) for r in whole], tok, cpu, [eos], **kw)
    assert "\n" not in str(err.value)
