"""`rollout.engine: vllm-server` without a vLLM: the spec's checks, the one-line failures when
the server is missing or not set up for us, what the weight push announces, and how an answer
is read. The real server is tested in tests/vllm/test_vllm_server.py."""

import contextlib
import copy
import http.server
import json
import subprocess
import sys
import threading

import pytest
import torch
from helpers import TINY, free_port, tiny_model_dir

from gspo_cli.errors import SpecError
from gspo_cli.rollout.vllm_server import ServerError, VLLMServerClient, _Completion, stream_metadata
from gspo_cli.rollout.vllm_weights import checkpoint_weights
from gspo_cli.spec.loading import spec_from_dict


def _raw(url="http://127.0.0.1:9", **rollout):
    raw = copy.deepcopy(TINY)
    raw["arms"] = raw["arms"][:1]
    raw["rollout"] = {**raw["rollout"], "engine": "vllm-server", "server": {"url": url}, **rollout}
    return raw


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda r: r["rollout"].pop("server"), "server: engine vllm-server needs server.url"),
        (lambda r: r["rollout"].update(engine="hf"), "server: given but engine is not vllm-server"),
        (
            lambda r: r["rollout"].update(vllm={"max_model_len": 64}),
            "a server's own go after `gspo vllm-server SPEC --`",
        ),
        (lambda r: r["rollout"]["server"].update(weight_port=70000), "rollout.server.weight_port"),
    ],
)
def test_spec_problems_are_named(edit, expected):
    raw = _raw()
    edit(raw)
    with pytest.raises(SpecError, match=None) as err:
        spec_from_dict(raw)
    assert expected in str(err.value)


def test_engine_logprobs_corrections_and_r3_are_accepted():
    spec = spec_from_dict(_raw(use_engine_logprobs=True))
    assert spec.rollout.engine == "vllm-server" and spec.rollout.server.weight_port == 51216
    raw = _raw()
    raw["arms"][0].update(mismatch={"mode": "token_tis"}, routing_replay="r3")
    arm = spec_from_dict(raw).arms[0]
    assert (arm.mismatch.mode, arm.routing_replay) == ("token_tis", "r3")
    assert spec_from_dict(_raw(staleness=1)).rollout.staleness == 1  # the worker samples on the server
    colocated = _raw(staleness=1, engine="vllm")
    colocated["rollout"].pop("server")
    with pytest.raises(
        SpecError, match="staleness: 1 runs its sampler in a worker process; not supported with engine: vllm"
    ):
        spec_from_dict(colocated)


def _gspo(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gspo_cli", *args], capture_output=True, text=True, timeout=timeout)


def _train_against(tmp_path, url: str, *args, **arm):
    raw = _raw(url=url)
    raw["arms"][0].update(arm)
    raw["output_dir"] = str(tmp_path / "out")
    spec = tmp_path / "exp.yaml"
    spec.write_text(json.dumps(raw))
    return _gspo("train", str(spec), *args)


def test_train_without_a_server_says_so_in_one_line_before_loading_a_model(tmp_path):
    port = free_port()
    res = _train_against(tmp_path, f"http://127.0.0.1:{port}", "--quiet")
    line = _the_one_error(res, 1, f"error: vLLM server http://127.0.0.1:{port}: no answer to /health")
    assert "gspo vllm-server SPEC" in line
    assert not (tmp_path / "out").exists()  # nothing was built or written


def _the_one_error(res, code: int, start: str) -> str:
    """The run's only stderr line, which must start with `start`; `code` its exit status."""
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    return lines[0]


@contextlib.contextmanager
def _stub_server(answers: dict):
    """A local HTTP server answering GETs of the paths in `answers` (JSON) and 404 to the rest;
    yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in answers else 404)
            self.end_headers()
            self.wfile.write(json.dumps(answers.get(self.path, {"detail": "Not Found"})).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


# A server set up for us except that it returns no routed experts (vLLM's default).
WITHOUT_ROUTES = {
    "/health": {},
    "/get_world_size": {"world_size": 1},
    "/server_info": {
        "vllm_config": "model='m', dtype=torch.float32, aux_output_config=AuxOutputConfig("
        "enable_return_routed_experts=False, max_bytes=None), device_config=cuda"
    },
}


def test_r3_against_a_server_without_routes_is_one_line_before_any_model(tmp_path):
    with _stub_server(WITHOUT_ROUTES) as url:
        res = _train_against(tmp_path, url, "--quiet", routing_replay="r3")
    start = f"error: routing_replay: r3 needs the routes the server sampled with, and the server at {url} does not"
    assert "--enable-return-routed-experts" in _the_one_error(res, 2, start)
    assert not (tmp_path / "out").exists()


def test_the_server_command_asks_for_routes_only_for_r3():
    from gspo_cli.cli.serve import server_argv

    plain = server_argv("/m", "bfloat16", "0.0.0.0", 8000, on_cpu=False)
    routed = server_argv("/m", "bfloat16", "0.0.0.0", 8000, on_cpu=False, routes=True)
    assert "--enable-return-routed-experts" not in plain and "--enforce-eager" not in plain
    assert routed[len(plain) :] == ["--enable-return-routed-experts", "--enable-prefix-caching"]
    assert server_argv("/m", "float32", "h", 1, on_cpu=True)[-1] == "--enforce-eager"


def test_a_server_without_the_weight_endpoints_is_one_line(tmp_path):
    """A server that answers /health, as any vLLM does, and 404 to the rest (no dev mode)."""
    tiny_model_dir()  # the cold start outside the timed call
    with _stub_server({"/health": {}}) as url:
        res = _train_against(tmp_path, url)
    assert res.returncode == 1, res.stderr
    failed = [line for line in res.stdout.splitlines() if line.startswith("[grpo/seed0] failed:")]
    assert len(failed) == 1, res.stdout
    assert "/get_world_size: HTTP 404: Not Found (is the server started with VLLM_SERVER_DEV_MODE=1" in failed[0]


def test_vllm_server_command_needs_vllm_in_this_python(tmp_path):
    if _has_vllm():
        pytest.skip("vLLM is installed here")
    spec = tmp_path / "exp.yaml"
    spec.write_text(json.dumps(_raw()))
    res = _gspo("vllm-server", str(spec), "--dry-run")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[0].startswith("error: rollout.engine: vllm is not installed")


def _has_vllm() -> bool:
    import importlib.util

    found = importlib.util.find_spec("vllm")  # tests/vllm passes for a namespace package: no origin
    return found is not None and found.origin is not None


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_announced_tensors_are_the_streamed_ones(dtype):
    """What rank 0 announces to the server before it broadcasts (names, dtypes, shapes from meta
    tensors) is exactly what the stream then yields, fused experts split per expert."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    names, dtypes, shapes = stream_metadata(model, dtype)
    streamed = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in checkpoint_weights(model, dtype)]
    assert list(zip(names, dtypes, shapes)) == streamed
    assert any(".experts.3.down_proj.weight" in n for n in names)  # 4 experts, one tensor each
    assert set(dtypes) == {"bfloat16" if dtype else "float32"}


def test_an_answer_is_read_as_vllms_completion():
    answer = {
        "choices": [
            {
                "token_ids": [7, 2],
                "logprobs": {"content": [{"token_id": 7, "logprob": -0.25}, {"token_id": 2, "logprob": -1.5}]},
            }
        ]
    }
    c = _Completion.from_answer(answer)
    assert c.token_ids == [7, 2] and c.routed_experts is None
    assert [c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)] == [-0.25, -1.5]
    with pytest.raises(ServerError, match="without token ids and log-probs"):
        _Completion.from_answer({"choices": [{"token_ids": [1]}]})
    answer["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(ServerError, match="2 tokens but 1 log-probs"):
        _Completion.from_answer(answer)


def _npy_b64(array) -> str:
    import base64
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_routes_in_an_answer_land_on_their_positions(dtype):
    """vLLM serialises a completion's routed_experts as base64 `.npy` (prompt + response - 1
    rows, every decoder layer, k): decoded and laid out as the colocated engine's. A 3-token
    prompt in a batch of width 4 (one left pad) and a 2-token response: rows 0..3 land in columns
    1..4; the pad and the last token keep experts 0..k-1; the dense layer 1 of 3 is dropped."""
    import numpy as np
    from transformers import AutoTokenizer

    from gspo_cli.rollout.vllm_batch import to_batch

    tok = AutoTokenizer.from_pretrained(tiny_model_dir())
    rows = np.arange(4 * 3 * 2, dtype=dtype).reshape(4, 3, 2) % 8  # (P + C - 1, layers, k)
    answer = {
        "choices": [
            {
                "token_ids": [7, 2],
                "logprobs": {"content": [{"token_id": 7, "logprob": -0.5}, {"token_id": 2, "logprob": -0.1}]},
                "routed_experts": _npy_b64(rows),
            }
        ]
    }
    c = _Completion.from_answer(answer)
    assert c.routed_experts.dtype == np.dtype(dtype) and (c.routed_experts == rows).all()
    other = _Completion([5], [-1.0], np.zeros((4, 3, 2), dtype=dtype))  # 4-token prompt, 1 token
    batch = to_batch(
        [[4, 5, 6], [4, 5, 6, 7]], [c, other], tok, "cpu", [2], with_routes=True, moe_layers=[0, 2], num_experts=8
    )
    routes = batch.engine_routes  # (L=2, B=2, P + C = 4 + 2, k)
    assert tuple(routes.shape) == (2, 2, 6, 2)
    for j in range(4):
        assert routes[0, 0, 1 + j].tolist() == rows[j, 0].tolist()
        assert routes[1, 0, 1 + j].tolist() == rows[j, 2].tolist()
    assert routes[:, 0, 0].tolist() == [[0, 1], [0, 1]] and routes[:, 0, 5].tolist() == [[0, 1], [0, 1]]
    with pytest.raises(ServerError, match="do not decode as a .npy array"):
        _Completion.from_answer({**answer, "choices": [{**answer["choices"][0], "routed_experts": "bm90IG5weQ=="}]})


def test_http_errors_are_one_line():
    port = free_port()
    with pytest.raises(ServerError) as err:
        VLLMServerClient(f"http://127.0.0.1:{port}/", 5).call("/health", get=True)
    assert "\n" not in str(err.value) and f"127.0.0.1:{port}: no answer to /health" in str(err.value)
