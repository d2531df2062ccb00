"""The documentation runs: every command in a `bash` block of README.md and docs/**/*.md is run
here (the cheap ones, on hand-written run directories), or is shown to be run by a named test,
or is marked as needing a GPU (`# GPU`) or a SLURM cluster (`# SLURM`). Also: the README stays a
front door, its links resolve, the contributing guide's walk-throughs run, the site builds."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from helpers import TINY
from synthetic_runs import make_experiment
from typer.testing import CliRunner

from gspo_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FIXTURES = Path(__file__).parent / "fixtures"
MARKER = re.compile(r"^(GPU|SLURM)\b")

# Cheap commands this file runs itself (results/..., /tmp/runs/... become hand-written runs).
RUN_HERE = [
    r"gspo --help",
    r"gspo train --help",
    r"gspo --version",
    r"gspo schema",
    r"gspo plugins",
    r"gspo sweep experiments/sweep_clip\.yaml --dry-run",
    r"gspo (list|compare|plot) \S+.*",
    r"gspo eval --completions samples\.jsonl --task math --dataset aime_2024\.jsonl",
]

# Expensive commands and the tests that run them (the same command on a tiny spec or model).
COVERED = {
    r"gspo plan experiments/gpu_qwen3_moe\.yaml --gpus 8 --gpu-memory 80GB .*": [
        "tests/test_plan.py::test_the_documented_command"
    ],
    r"gspo train experiments/quickstart\.yaml": ["tests/test_train_e2e.py::test_cli_train_end_to_end"],
    r"gspo train experiments/own_rewards\.yaml": [
        "tests/test_user_rewards.py::test_the_example_trains_and_logs_every_reward"
    ],
    r"python experiments/own_rewards/make_data\.py": [
        "tests/test_user_rewards.py::test_the_example_data_is_what_its_script_writes"
    ],
    r"gspo train experiments/quickstart\.yaml --set model\.lora\.r=8": [
        "tests/test_lora.py::test_the_quickstart_with_lora_trains_both_arms"
    ],
    r"gspo train experiments/lora_quickstart\.yaml": [
        "tests/test_lora.py::test_the_quickstart_with_lora_trains_both_arms",
        "tests/test_lora.py::test_the_lora_example_is_the_quickstart_with_adapters",
    ],
    r"gspo check experiments/quickstart\.yaml --set rollout\.group_size=8": [
        "tests/test_check.py::test_the_documented_command"
    ],
    r"gspo train exp\.yaml --arm gspo --seed 1": ["tests/test_cli.py::test_set_and_options_reach_the_trainer"],
    r"gspo train (exp|experiments/quickstart)\.yaml --set \S+ --set \S+ -o /tmp/runs": [
        "tests/test_cli.py::test_set_and_options_reach_the_trainer",
        "tests/test_train_e2e.py::test_cli_train_end_to_end",
    ],
    r"gspo train exp\.yaml --force": [
        "tests/test_resume.py::test_completed_run_skips_and_exit_codes",
        "tests/test_train_e2e.py::test_completed_run_is_skipped_and_force_reruns",
    ],
    r"python -m gspo_cli train exp\.yaml": ["tests/test_resume.py::test_sigterm_subprocess_then_rerun_resumes"],
    r"gspo sweep experiments/(quickstart|sweep_clip)\.yaml --jobs 2": [
        "tests/test_docs.py::test_sweep_with_jobs_trains_each_run_in_its_own_process"
    ],
    r"gspo sweep experiments/quickstart\.yaml --until-decided --max-seeds \d+( --round-seeds \d+)?": [
        "tests/test_until_decided.py::test_a_clear_difference_stops_early_and_a_rerun_resumes_to_the_same_verdict",
        "tests/test_until_decided.py::test_round_seeds_and_mistakes",
    ],
    r"gspo sweep experiments/quickstart\.yaml --until-decided --max-seeds \d+ --round-seeds \d+ --dry-run": [
        "tests/test_until_decided.py::test_the_design_lives_in_the_spec_and_a_dry_run_prints_the_looks"
    ],
    r"gspo sweep experiments/sweep_clip\.yaml --shard 0/4": [
        "tests/test_sweep.py::test_shards_partition_the_plan_exactly",
        "tests/test_sweep.py::test_cli_dry_run_json_and_errors",
        "tests/test_docs.py::test_sweep_with_jobs_trains_each_run_in_its_own_process",
    ],
    r"gspo eval results/quickstart/gspo/seed0 -k 8": ["tests/test_eval_cli.py::test_eval_of_a_run_directory"],
    r"gspo eval results/quickstart/gspo/seed0 --checkpoint step_000050": [
        "tests/test_eval_cli.py::test_eval_of_a_checkpoint_directory_with_options"
    ],
    r"gspo eval \./my-model --task math --dataset aime_2024\.parquet -k 32 --max-tokens 4096": [
        "tests/test_eval_cli.py::test_eval_of_a_checkpoint_directory_with_options",
        "tests/test_eval_cli.py::test_eval_of_a_run_on_another_dataset",
        "tests/test_math_task.py::test_parquet_with_question_column_gaps_and_ratings",
    ],
    r"gspo report results/paper_tiny": ["tests/test_report.py::test_cli_report_and_bad_input"],
    r"gspo tune experiments/tune_clip\.yaml --dry-run": [
        "tests/test_tune.py::test_dry_run_lists_equal_budgets_and_every_tuning_run"
    ],
    r"gspo tune experiments/tune_clip\.yaml --jobs 2( --resume)?": [
        "tests/test_tune.py::test_tune_trains_selects_and_compares_end_to_end"
    ],
    r"gspo samples results/quickstart/gspo/seed0( --step \d+)?( --(worst|best))?( -n \d+)?( --(plain|json))?": [
        "tests/test_samples.py::test_cli_plain_json_and_errors",
        "tests/test_samples.py::test_training_writes_samples_users_can_read",
    ],
    # The synopsis: -o and --max-shard-gb, --dtype, a whole-model run, and --checkpoint (a missing
    # step; the checkpoint directory as RUN selects one too) are each run by one of these.
    r"gspo export RUN \[--checkpoint step_N\] \[--dtype bfloat16\] \[-o DIR\] \[--max-shard-gb 5\]": [
        "tests/test_sharded_checkpoints.py::test_export_writes_several_files_that_transformers_loads_exactly",
        "tests/test_sharded_checkpoints.py::test_export_in_bf16_holds_the_rounded_weights",
        "tests/test_sharded_checkpoints.py::test_export_of_a_whole_checkpoint_recasts_and_splits_it",
        "tests/test_sharded_checkpoints.py::test_export_bad_input_is_one_line",
    ],
    r"torchrun --nproc-per-node 2 -m gspo_cli train exp\.yaml": [
        "tests/test_distributed.py::test_torchrun_trains_writes_once_and_resumes_with_one_process",
        "tests/vllm/test_vllm_server.py::test_sharded_processes_push_through_rank_zero",
    ],
    r"gspo vllm-server exp\.yaml --port 8000": [
        "tests/vllm/test_vllm_server.py::test_a_trainer_pushes_its_weights_to_the_server_every_step",
        "tests/vllm/test_vllm_server.py::test_the_servers_command_line",
    ],
    r"gspo sweep experiments/quickstart\.yaml --executor slurm": [
        "tests/slurm/test_slurm_executor.py::test_a_tiny_sweep_through_slurm_has_the_local_executors_metrics",
        "tests/slurm/test_slurm_executor.py::test_ctrl_c_leaves_the_job_cancel_stops_it_and_a_rerun_resumes_from_its_checkpoint",
    ],
    r"gspo sweep experiments/quickstart\.yaml --executor ray": [
        "tests/ray/test_ray_executor.py::test_a_tiny_sweep_through_ray_has_the_local_executors_metrics"
    ],
    r"pip install 'gspo-cli\[(slurm|ray)\]'": [
        "tests/slurm/test_slurm_executor.py::test_a_tiny_sweep_through_slurm_has_the_local_executors_metrics",
        "tests/ray/test_ray_executor.py::test_a_tiny_sweep_through_ray_has_the_local_executors_metrics",
    ],
    r"gspo sweep experiments/quickstart\.yaml --executor slurm --tasks-per-node 2": [
        "tests/slurm/test_slurm_executor.py::test_two_tasks_per_node_train_under_torchrun_as_a_local_torchrun_does"
    ],
    r"ray start --head --port 6379|gspo sweep experiments/quickstart\.yaml --executor ray --address 10\.0\.0\.1:6379": [
        "tests/ray/test_ray_executor.py::test_address_trains_on_a_running_cluster_and_leaves_it_running"
    ],
    r"gspo sweep experiments/quickstart\.yaml --executor slurm --cancel": [
        "tests/slurm/test_slurm_executor.py::test_ctrl_c_leaves_the_job_cancel_stops_it_and_a_rerun_resumes_from_its_checkpoint"
    ],
    # CI (.ci/run) runs `make test`, which runs `make setup` first; `make run` is its three
    # commands (test_make_run_is_three_documented_commands).
    r"make (setup|test|test-slurm|test-ray)": [".ci/run"],
    r"make run": ["tests/test_docs.py::test_make_run_is_three_documented_commands"],
}


def doc_commands() -> list[tuple[str, str, str]]:
    """(page, command, trailing comment) for every command line of every `bash` block."""
    out = []
    for page in PAGES:
        for block in re.findall(r"^ *```bash\n(.*?)^ *```", page.read_text(encoding="utf-8"), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                command, comment = re.fullmatch(r"(.*?)(?:\s+#\s*(.*))?", line).groups()
                out.append((str(page.relative_to(ROOT)), " ".join(command.split()), (comment or "").strip()))
    return out


COMMANDS = doc_commands()


def matches(patterns, command: str) -> list[str]:
    return [p for p in patterns if re.fullmatch(p, command)]


def test_every_documented_command_is_run_covered_or_marked():
    unaccounted = [
        f"{page}: {cmd}"
        for page, cmd, comment in COMMANDS
        if not MARKER.match(comment) and not matches(RUN_HERE, cmd) and not matches(COVERED, cmd)
    ]
    assert unaccounted == [], "run it in tests/test_docs.py, name the test that runs it, or mark it # GPU / # SLURM"


def test_covering_tests_exist_and_every_entry_is_used():
    for pattern, targets in COVERED.items():
        assert any(re.fullmatch(pattern, cmd) for _, cmd, _ in COMMANDS), f"no documented command is {pattern!r}"
        for target in targets:
            path, _, name = target.partition("::")
            text = (ROOT / path).read_text()
            assert (f"def {name}(" in text) if name else ("make test" in text), target
    for pattern in RUN_HERE:
        assert any(re.fullmatch(pattern, cmd) for _, cmd, _ in COMMANDS), f"no documented command is {pattern!r}"


def test_make_run_is_three_documented_commands():
    recipe = re.search(r"^run: setup\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    steps = [line.strip().replace("$(BIN)/", "") for line in recipe.splitlines()]
    assert steps == [
        "gspo sweep experiments/quickstart.yaml --jobs 2",
        "gspo compare results/quickstart",
        "gspo plot results/quickstart",
    ]
    for step in steps:
        assert matches(RUN_HERE, step) or matches(COVERED, step), step


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    return make_experiment(tmp_path_factory.mktemp("runs"))


def _args(command: str, experiment: Path, tmp: Path) -> list[str]:
    """The documented command's arguments, with its paths pointed at hand-written files."""
    args = shlex.split(command)[1:]
    out, prev = [], None
    for a in args:
        if prev in ("-o", "--out"):
            a = str(tmp / a)
        elif re.match(r"(results|/tmp/runs)/", a):  # an experiment directory, or a glob below one
            a = re.sub(r"^(results|/tmp/runs)/[^/]+", str(experiment), a)
        elif a == "samples.jsonl":
            a = str(tmp / a)
            rows = [json.loads(line) for line in (FIXTURES / "aime_h4.jsonl").read_text().splitlines()]
            Path(a).write_text("".join(json.dumps({"id": r["id"], "completion": r["solution"]}) + "\n" for r in rows))
        elif a == "aime_2024.jsonl":
            a = str(FIXTURES / "aime_h4.jsonl")
        elif a.startswith("experiments/"):
            a = str(ROOT / a)
        out.append(a)
        prev = a if a.startswith("-") else None
    return out


RUN = sorted({cmd for _, cmd, comment in COMMANDS if not MARKER.match(comment) and matches(RUN_HERE, cmd)})


@pytest.mark.parametrize(
    "command",
    # Every figure of a plot takes 15-20 s on 2 cores: end-to-end tier.
    [pytest.param(c, marks=pytest.mark.slow) if c.startswith("gspo plot") and " -m " not in c else c for c in RUN],
)
def test_documented_command_runs(command, experiment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default output folder (results/eval/...) lands here, not in the repo
    args = _args(command, experiment, tmp_path)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, f"{command} -> gspo {' '.join(args)}\n{res.output}"
    assert res.output.strip()


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220
    assert lines[2:6] == [
        "```bash",
        "make run    # set up (first time) and train the quickstart: GRPO vs GSPO on a built-in tiny MoE, CPU, offline",
        "make test   # set up (first time) and run the test suite",
        "```",
    ]
    text = "\n".join(lines)
    assert "arXiv:2507.18071" in text and "@article{" in text
    for command in ("gspo train", "gspo eval", "gspo compare", "gspo plot"):
        assert f"\n{command} " in text


@pytest.mark.parametrize("page", [p for p in PAGES if p.name == "README.md"] + [ROOT / "results/README.md"])
def test_relative_links_outside_the_site_resolve(page):
    """README.md is read on GitHub, not in the site: its links are checked here (mkdocs checks
    the pages under docs/)."""
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if "://" not in target and not target.startswith("#"):
            assert (page.parent / target.split("#")[0]).exists(), f"{page.name}: {target}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with `mkdocs build --strict` (as `make docs`)."""
    pytest.importorskip("material", reason="the docs extra (make docs installs it)")
    out = tmp_path_factory.mktemp("site") / "site"
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_the_site_builds_strict(site):
    assert (site / "reference" / "spec" / "index.html").is_file()
    # Repository files served beside the pages (the hook) never replace a page of the same path.
    assert "The earlier 16-expert study" in (site / "results" / "index.html").read_text()
    assert (site / "results" / "paper_moe" / "figures" / "eval_math.png").is_file()


class _Page(HTMLParser):
    """A built page's tag names, its text (entities decoded) and its formulas."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.text: list[str] = []
        self.math: list[str] = []
        self._in_math = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if self._in_math:
            self._in_math += tag in ("span", "div")
        elif tag in ("span", "div") and "arithmatex" in (dict(attrs).get("class") or "").split():
            self._in_math = 1
            self.math.append("")

    def handle_endtag(self, tag):
        if self._in_math and tag in ("span", "div"):
            self._in_math -= 1

    def handle_data(self, data):
        self.text.append(data)
        if self._in_math:
            self.math[-1] += data


# What a page of the site may contain: HTML and SVG elements (Material's icons), nothing else. A
# `<placeholder>` written raw in Markdown passes through as an unknown tag and vanishes from view.
HTML_TAGS = set(
    "html head body meta title link script style noscript header footer nav main article aside section div span "
    "a p br hr h1 h2 h3 h4 h5 h6 ul ol li dl dt dd table thead tbody tfoot tr th td caption colgroup col code pre "
    "em strong b i u s sub sup small kbd samp var mark blockquote img figure figcaption label input button form "
    "details summary abbr del ins svg path g circle rect line polyline polygon defs use symbol title iframe".split()
)


def test_the_spec_reference_shows_its_placeholders(site):
    """Generated descriptions such as `<output_dir>/<name>/<arm>/seed<k>/` and `hub:<id>` render
    as text, not as unknown HTML tags (which a browser hides: "runs go to ///seed/")."""
    page = _Page((site / "reference" / "spec" / "index.html").read_text(encoding="utf-8"))
    assert page.tags <= HTML_TAGS, sorted(page.tags - HTML_TAGS)
    text = "".join(page.text)
    assert "runs go to <output_dir>/<name>/<arm>/seed<k>/" in text
    assert "hub:<id>" in text
    assert "the run directory <experiment>/<arm>/" in text


def test_no_page_has_raw_placeholder_tags(site):
    strays = {}
    for path in sorted(site.rglob("*.html")):
        unknown = _Page(path.read_text(encoding="utf-8")).tags - HTML_TAGS
        if unknown:
            strays[str(path.relative_to(site))] = sorted(unknown)
    assert strays == {}


def _script_and_style_sources(html: str) -> list[str]:
    return re.findall(r'<script[^>]*\ssrc="([^"]+)"', html) + re.findall(
        r'<link[^>]*rel="stylesheet"[^>]*href="([^"]+)"', html
    )


def test_math_is_rendered_by_the_vendored_katex(site):
    """The algorithm pages' formulas are LaTeX that arithmatex hands to KaTeX, and KaTeX is the copy
    in docs/assets/katex/: every script and stylesheet of every page is served by the site itself
    (no CDN, no web fonts), and the fonts KaTeX's stylesheet names are there."""
    html = (site / "algorithms" / "gspo" / "index.html").read_text(encoding="utf-8")
    page = _Page(html)
    assert len(page.math) >= 3 and any("\\frac" in m for m in page.math), page.math
    sources = _script_and_style_sources(html)
    assert any(s.endswith("assets/katex/katex.min.js") for s in sources), sources
    assert any(s.endswith("assets/katex/katex.min.css") for s in sources), sources
    assert any(s.endswith("assets/katex-render.js") for s in sources), sources
    for path in sorted(site.rglob("*.html")):
        text = path.read_text(encoding="utf-8")
        remote = [s for s in _script_and_style_sources(text) if "//" in s]
        assert remote == [] and "fonts.googleapis" not in text, (path, remote)
    css = (site / "assets" / "katex" / "katex.min.css").read_text()
    fonts = re.findall(r"url\(([^)]+)\)", css)
    assert fonts and all((site / "assets" / "katex" / f).is_file() for f in fonts)


def test_every_formula_parses_in_katex(site):
    """Each formula of every page, given to the vendored KaTeX (with node) as the page's script
    gives it: a LaTeX error would show as red source text in the browser."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    formulas = []
    for path in sorted(site.rglob("*.html")):
        for tex in _Page(path.read_text(encoding="utf-8")).math:
            tex = tex.strip()
            display = tex.startswith("\\[")
            formulas.append(
                [str(path.relative_to(site)), tex[2:-2] if display or tex.startswith("\\(") else tex, display]
            )
    assert len(formulas) >= 50
    script = (
        "const katex = require(process.argv[1]); const bad = [];"
        "for (const [page, tex, display] of JSON.parse(require('fs').readFileSync(0, 'utf8'))) {"
        "  try { katex.renderToString(tex, {displayMode: display, throwOnError: true}); }"
        "  catch (e) { bad.push(page + ': ' + e.message); } }"
        "console.log(JSON.stringify(bad));"
    )
    katex = str(site / "assets" / "katex" / "katex.min.js")
    res = subprocess.run(
        [node, "-e", script, katex], input=json.dumps(formulas), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []


def _params_table(text: str, heading: str) -> dict[str, str]:
    """The table after `heading` in a page: each parameter named in its first column (several
    may share a row) -> the row's default column."""
    lines = text.split(heading, 1)[1].splitlines()
    rows, started = {}, False
    for line in lines:
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("param", "---"):
            continue
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


def test_task_params_tables_list_every_parameter():
    """docs/guides/tasks.md has a table of each task's `task.params`: every field of the task's
    parameter model is in it, nothing else, and the math prompt's default is shown verbatim."""
    from gspo_cli.tasks.code import CodeParams
    from gspo_cli.tasks.math import DEFAULT_TEMPLATE, MathParams

    text = (ROOT / "docs" / "guides" / "tasks.md").read_text(encoding="utf-8")
    math = _params_table(text, "`task.params` for `name: math`")
    code = _params_table(text, "`task.params` for `name: code`")
    assert sorted(math) == sorted(MathParams.model_fields)
    assert sorted(code) == sorted(CodeParams.model_fields)
    assert math["prompt_template"] == f"`{json.dumps(DEFAULT_TEMPLATE)}`"
    assert math["answer_fallbacks"] == str(MathParams().answer_fallbacks).lower()


@pytest.mark.slow
def test_contributing_walk_throughs_run():
    """The loss, task and engine walk-throughs of docs/contributing.md, run as written, in a
    process of their own (they register a loss and a task)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/contributing.md").read_text(), re.S)
    assert len(blocks) == 3
    code = "\n".join(f"exec(compile({b!r}, 'walk-through {i}', 'exec'), {{}})" for i, b in enumerate(blocks))
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_sweep_with_jobs_trains_each_run_in_its_own_process(tmp_path):
    """`gspo sweep SPEC --jobs 2` (as `make run` does): both arms trained, each by its own
    `gspo train` process, two at a time; a second sweep skips them."""
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "arms": [TINY["arms"][0], TINY["arms"][2]],
        "train": {"steps": 1},
    }
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--jobs", "2", "--json"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)
    assert sorted((r["run"], r["status"], r["skipped"]) for r in records) == [
        ("grpo", "completed", False),
        ("gspo", "completed", False),
    ]
    again = json.loads(CliRunner().invoke(app, ["sweep", str(spec), "--jobs", "2", "--json"]).stdout)
    assert all(r["skipped"] for r in again)


def test_every_registered_name_has_an_algorithm_page_entry():
    """Each loss, advantage estimator, aggregation and mismatch correction is described (formula,
    source, preset) somewhere under docs/algorithms/, named in backticks."""
    from gspo_cli import algorithms

    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "algorithms").glob("*.md"))
    names = [
        *algorithms.POLICY_LOSSES,
        *algorithms.ADVANTAGE_ESTIMATORS,
        *algorithms.AGGREGATIONS,
        *algorithms.MISMATCH_CORRECTIONS,
    ]
    assert [n for n in names if f"`{n}`" not in text] == []


def test_the_presets_table_is_the_presets():
    """docs/algorithms/index.md shows each preset's fields; they must be what PRESETS holds."""
    from gspo_cli.spec import PRESETS

    text = (ROOT / "docs" / "algorithms" / "index.md").read_text(encoding="utf-8")
    header, rows = None, {}
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if cells[0] == "preset":
            header = cells
        elif header and len(cells) == len(header) and cells[0] in PRESETS:
            rows[cells[0]] = dict(zip(header, cells))
    assert set(rows) == set(PRESETS)
    for name, row in rows.items():
        p = PRESETS[name]
        low, high = (float(x) for x in row["clip_low / clip_high"].split("/"))
        shown = {k: row[k] for k in ("loss", "aggregation", "routing_replay", "advantage")}
        assert shown == {k: p[k] for k in shown}, name
        assert (low, high) == (p["clip_low"], p["clip_high"]), name
        assert (int(row["mini_batches"]), int(row["epochs"]), float(row["kl_coef"])) == (
            p["mini_batches"],
            p["epochs"],
            p["kl_coef"],
        ), name
