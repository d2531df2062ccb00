"""Two nodes without a shared disk, on one host: two `torchrun --nnodes 2 --nproc-per-node 1`
launches (gloo), each with its own GSPO_CACHE_DIR and output directory; and the built-in
model cache's publish-whole-or-nothing rule."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import TINY, free_port

from gspo_cli.models.builtin import builtin_model_dir, cache_key, entry_digest, is_complete, publish_entry
from gspo_cli.runs import RunDir
from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig
from gspo_cli.tasks import make_task


def two_nodes(tmp_path, spec, out0, out1, timeout=900):
    """Launch node 0 and node 1 (separate caches) and wait for both; (exit code, stderr) each."""
    port = free_port()
    procs, logs = [], []
    for node, out in ((0, out0), (1, out1)):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        cmd += ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        cmd += ["-m", "gspo_cli", "train", str(spec), "-o", str(out), "--quiet"]
        env = {**os.environ, "GSPO_CACHE_DIR": str(tmp_path / f"cache{node}")}
        logs.append(open(tmp_path / f"node{node}-{spec.stem}.log", "w+"))  # files: a full pipe would block
        procs.append(subprocess.Popen(cmd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, text=True))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:  # a timeout: leave nothing behind
                p.kill()
    out = []
    for code, log in zip(codes, logs):
        log.seek(0)
        out.append((code, log.read()))
        log.close()
    return out


def spec_file(tmp_path, name, steps, sharding="ddp"):
    raw = {
        **TINY,
        # a short cold start: every test builds into its own empty caches
        "model": {**TINY["model"], "sharding": sharding, "cold_start": {"steps": 10, "batch_size": 8, "lr": 1e-2}},
        "task": {**TINY["task"], "eval_size": 2},
        "rollout": {**TINY["rollout"], "max_new_tokens": 8},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
        "train": {"steps": steps, "checkpoint_every": 1},
    }
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def the_entry(cache):
    entries = [p for p in (cache / "models").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_train_and_resume_only_when_shared(tmp_path):
    out0, out1 = tmp_path / "node0/out", tmp_path / "node1/out"
    # 1. separate caches and output directories: node 1 gets rank 0's built model, trains
    results = two_nodes(tmp_path, spec_file(tmp_path, "exp.yaml", 2), out0, out1)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    rd = RunDir(out0 / "e2e/gspo/seed0")
    assert rd.status() == "completed" and [m["step"] for m in rd.metrics()] == [1, 2]
    assert not out1.exists() or not list(out1.rglob("*.json*"))  # only global rank 0 writes the run
    e0, e1 = the_entry(tmp_path / "cache0"), the_entry(tmp_path / "cache1")
    assert e0.name == e1.name and is_complete(e1) and entry_digest(e0) == entry_digest(e1)  # bit-equal
    # 2. continuing it (3 steps) needs every rank to read rank 0's checkpoint: refused in one line
    rd.update_info(status="running")
    rd.spec_file.write_text(rd.spec_file.read_text().replace("steps: 2", "steps: 3"))
    spec3 = spec_file(tmp_path, "exp3.yaml", 3)
    results = two_nodes(tmp_path, spec3, out0, out1)
    for _, log in results:  # each worker exits 2 with one line (torchrun itself then exits 1)
        errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "exitcode  : 2" in log
        assert "output_dir: resuming" in errors[0] and "is not shared (rank 1 on" in errors[0]
        assert f"in its {out1}" in errors[0]
    assert [m["step"] for m in rd.metrics()] == [1, 2]
    # 3. the same output directory for both nodes (a shared filesystem): it resumes
    results = two_nodes(tmp_path, spec3, out0, out0)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert rd.status() == "completed" and [m["step"] for m in rd.metrics()] == [1, 2, 3]
    assert rd.info()["resumes"] == 1


@pytest.mark.slow
def test_sharded_training_refuses_an_unshared_output_dir_at_start(tmp_path):
    results = two_nodes(tmp_path, spec_file(tmp_path, "fsdp.yaml", 2, "fsdp"), tmp_path / "o0", tmp_path / "o1")
    for _, log in results:  # each worker exits 2 with one line (torchrun itself then exits 1)
        errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "exitcode  : 2" in log
        assert "output_dir:" in errors[0] and "is not shared by all processes" in errors[0]
        assert "model.sharding: fsdp" in errors[0]
    assert not (tmp_path / "o0/e2e").exists()


SIZE = BuiltinModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
COLD = ColdStartConfig(steps=2, batch_size=4)


def test_a_broken_cache_entry_is_rebuilt_never_returned(tmp_path, monkeypatch):
    """A tokenizer-only entry (what transformers left on nodes other than global rank 0) is
    detected and rebuilt; a complete one is returned as is."""
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path))
    task = make_task("arithmetic", TINY["task"]["params"])
    target = tmp_path / "models" / f"tiny-dense-{cache_key('tiny-dense', SIZE, COLD, task)}"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "tokenizer.json").write_text("{}")
    logs = []
    got = builtin_model_dir("tiny-dense", SIZE, COLD, task, log=logs.append)
    assert got == target and is_complete(got) and (got / "model.safetensors").is_file()
    assert any("incomplete" in m for m in logs)
    assert json.loads((got / "cold_start.json").read_text())["steps"] == 2
    digest = entry_digest(got)
    assert builtin_model_dir("tiny-dense", SIZE, COLD, task, log=logs.append) == got
    assert entry_digest(got) == digest and not [p for p in got.parent.iterdir() if p.name.startswith(".build")]


def test_an_incomplete_build_is_never_published(tmp_path):
    tmp = tmp_path / ".build-x"
    tmp.mkdir()
    (tmp / "tokenizer.json").write_text("{}")
    with pytest.raises(RuntimeError, match="incomplete"):
        publish_entry(tmp, tmp_path / "entry")
    assert not (tmp_path / "entry").exists()
