"""The house: every module imports on its own, the registries are the one list of algorithm
names, `gspo --version`, and the reference KL's hand values."""

import math
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import gspo_cli
from gspo_cli import algorithms
from gspo_cli.algorithms import kl_k3_BC, register_policy_loss
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.spec.loading import load_spec

PACKAGE = Path(gspo_cli.__file__).parent


def all_modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_every_module_imports_on_its_own():
    """Each module imported first, with no gspo_cli module loaded before it: an import cycle
    that works only in one order (config <-> spec_loading did) fails here. One interpreter,
    gspo_cli dropped from sys.modules before each import (torch and other third-party
    packages stay loaded, which is what keeps this fast)."""
    modules = all_modules()
    assert "gspo_cli.spec.loading" in modules and "gspo_cli.algorithms.kl" in modules and len(modules) > 30
    code = (
        "import importlib, sys, traceback\n"
        f"failed = []\n"
        f"for name in {modules!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'gspo_cli' or m.startswith('gspo_cli.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as err:\n"
        "        failed.append(f'{name}: {type(err).__name__}: {err}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_module_over_450_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450
    }
    assert not long, long


SPEC = {
    "name": "exp",
    "rollout": {"prompts_per_step": 2, "group_size": 2},
    "arms": [{"name": "mine", "loss": "halved_gspo", "clip_low": 0.2, "clip_high": 0.2, "mini_batches": 2}],
}


@pytest.fixture
def halved_gspo():
    """A loss registered by name only: no other list of names has to learn about it."""
    gspo = algorithms.get_policy_loss("gspo")

    @register_policy_loss("halved_gspo")
    def halved(logp_BC, old_logp_BC, adv, mask_BC, **kwargs):
        loss, stats = gspo(logp_BC, old_logp_BC, adv, mask_BC, **kwargs)
        return loss / 2, stats

    yield halved
    del algorithms.POLICY_LOSSES["halved_gspo"]


def test_a_registered_loss_is_selectable_from_yaml(tmp_path, halved_gspo):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    spec = load_spec(path)
    assert spec.arms[0].loss == "halved_gspo"
    assert algorithms.get_policy_loss(spec.arms[0].loss) is halved_gspo  # what the trainer resolves


def test_unregistered_names_are_refused_with_the_registered_ones(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    with pytest.raises(SpecError) as err:
        load_spec(path)  # not registered in this test
    assert str(err.value) == (
        f"arms[0].loss: unknown policy loss 'halved_gspo'; registered: {', '.join(algorithms.POLICY_LOSSES)}"
    )
    arm = {**SPEC["arms"][0], "loss": "gpso", "aggregation": "token_sum", "advantage": "rloo"}
    path.write_text(yaml.safe_dump({**SPEC, "arms": [arm]}))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("arms[0].loss: unknown policy loss 'gpso' (did you mean 'gspo'?); registered: ")
    assert lines[1].startswith("arms[0].aggregation: unknown aggregation 'token_sum' (did you mean")
    assert lines[2] == (
        "arms[0].advantage: unknown advantage estimator 'rloo'; registered: "
        + ", ".join(algorithms.ADVANTAGE_ESTIMATORS)
    )


def test_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    m = re.fullmatch(r"gspo-cli (\S+) \(torch (\S+), transformers (\S+), python (\S+)\)\n", res.stdout)
    assert m, res.stdout
    assert m.groups()[:3] == (metadata.version("gspo-cli"), metadata.version("torch"), metadata.version("transformers"))
    assert m.group(4) == ".".join(map(str, sys.version_info[:3]))


def test_reference_kl_k3_hand_values():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    ref = torch.log(torch.tensor([[0.25, 0.2, 0.6]]))
    # r = ref/pi: 0.5, 1, 2 -> r - 1 - log r
    want = [0.5 - 1 - math.log(0.5), 0.0, 2 - 1 - math.log(2)]
    assert kl_k3_BC(logp, ref).tolist()[0] == pytest.approx(want, abs=1e-6)
    # A huge log-ratio is clamped to ±20 before exp: finite, equal to the clamped value.
    far = kl_k3_BC(torch.tensor([[0.0, 0.0]]), torch.tensor([[-1e4, 1e4]]))
    assert far.tolist()[0] == pytest.approx([math.exp(-20) - 1 + 20, math.exp(20) - 1 - 20])
    # Gradient in the policy's log-prob: d/dlogp (r - 1 - log r) = 1 - r.
    lp = logp.clone().requires_grad_(True)
    kl_k3_BC(lp, ref).sum().backward()
    assert lp.grad.tolist()[0] == pytest.approx([0.5, 0.0, -1.0], abs=1e-6)
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_k3_BC(logp, ref[:, :2])


# The layers, lowest first: a module may import its own package and anything lower, never higher.
# `analysis` (torch-free, run directories only) imports neither `eval` nor `train`; it sits below
# `train` so that a command running many runs (train/until_decided.py) may use its statistics.
LAYERS = [
    {"errors", "files", "hub", "metrics", "runs", "jsonl", "run_identity", "distributed", "params", "spawned"},
    {"plugins", "user_code"},  # code from outside: installed packages' entry points, FILE.py:NAME
    {"algorithms"},
    {"spec"},
    {"sandbox"},  # runs untrusted programs: the code task's verifier and the environments use it
    {"tasks"},  # problem sources and their verifiers
    {"environments"},  # multi-turn environments (code_feedback judges with the code task's verifier)
    {"rewards"},  # reward functions, their loading, the worker pool, reward models, judges
    {"plan"},  # torch-free: sizes a run from the spec and a config.json
    {"models"},
    {"rollout"},
    {"eval"},
    {"analysis"},
    {"train"},
    {"cli", "__main__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
SIDEWAYS_FORBIDDEN = {("analysis", "train"), ("analysis", "eval")}


def _imported_packages(path: Path) -> set[str]:
    """Top-level gspo_cli components a module imports, anywhere in it (lazy imports too)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gspo_cli"):
            parts = node.module.split(".")
            if len(parts) > 1:
                out.add(parts[1])
            else:  # from gspo_cli import x
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("gspo_cli."))
    return out


def test_imports_run_one_way():
    """No module imports a higher layer: the folders tell the architecture, bottom to top."""
    climbs = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        own = parts[0]
        assert own in RANK, f"{path}: a top-level component missing from LAYERS"
        for dep in _imported_packages(path) - {own}:
            assert dep in RANK, f"{path} imports gspo_cli.{dep}, a component missing from LAYERS"
            if RANK[dep] > RANK[own] or (own, dep) in SIDEWAYS_FORBIDDEN:
                climbs.append(f"{path.relative_to(PACKAGE)} -> {dep}")
    assert not climbs, climbs


def test_analysis_side_never_imports_torch():
    """compare, plot, report and list read files only: the torch-free half of the package."""
    mods = sorted(
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in (PACKAGE / "analysis").rglob("*.py")
    )
    assert "gspo_cli.analysis.report.build" in mods and "gspo_cli.analysis.figures.plot" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods + ['gspo_cli.cli.app', 'gspo_cli.runs', 'gspo_cli.metrics']!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
