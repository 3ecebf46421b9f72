# DMTP suite. `make ablation-code` runs the embedded default end to end; `make test` runs the quick tests.
# PROFILE defaults to mini on a CUDA machine, tiny otherwise (see dmtp/profiles.py).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
PROFILE ?= $(if $(HAS_CUDA),mini,tiny)
WORK ?= work
RESULTS ?= results
# where pip finds the CPU build of torch that requirements/cpu.lock pins when no local wheel folder of pip's own
# configuration holds it (tried first, the wheel alone without any index: the lock pins its dependencies); empty:
# pip's configuration alone
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv wheels lock test test-all test-gpu ablation-code bench bench-shapes bench-train tables figures report corpus tokenizer target \
	data drafters eval dpcheck dppool clean-work verify revision reproduce

# CPU machines: every package at the version requirements/cpu.lock pins (CI and a newcomer resolve the same
# environment; torch is its CPU build, never a CUDA wheel), then the suite itself without dependencies. GPU machines
# keep the torch they have (environment.yml describes the one the committed results came from).
INSTALL_GPU = $(PY) -m pip install -q -e '.[dev,eval]' -c constraints.txt
TORCH_PIN = $(shell grep -m1 '^torch==' requirements/cpu.lock)
INSTALL_CPU = { $(PY) -m pip install -q --no-index --no-deps $(TORCH_PIN) 2>/dev/null \
	|| $(PY) -m pip install -q $(TORCH_PIN) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)); } \
	&& $(PY) -m pip install -q -r requirements/cpu.lock && $(PY) -m pip install -q --no-deps -e .
$(VENV)/.installed: pyproject.toml requirements/cpu.lock
	test -d $(VENV) || python3 -m venv $(if $(HAS_CUDA),--system-site-packages,) $(VENV)
	$(if $(HAS_CUDA),$(INSTALL_GPU),$(INSTALL_CPU))
	touch $@

venv: $(VENV)/.installed

# the pure-Python wheels a profile's pinned corpus sources name, into $(DMTP_WHEELS) (default ~/.cache/dmtp/wheels),
# where the corpus stage reads them when the installed versions differ (the same bytes on every machine)
DMTP_WHEELS ?= $(HOME)/.cache/dmtp/wheels
wheels: $(VENV)/.installed
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d $(DMTP_WHEELS) \
		$$($(PY) -m dmtp.profiles $(PROFILE) wheels)

# requirements/cpu.lock from the CPU venv as it is now (after adding a package to pyproject.toml and installing it)
lock:
	bash requirements/lock.sh $(PY)

# the tests in TEST_WORKERS processes (pytest-xdist; a module's tests stay in one process, so its fixtures are built
# once); TEST_WORKERS=0 runs them in this process. `test` leaves out the tests marked slow (heavy end-to-end runs
# whose properties quick tests also cover); `test-all` runs every test; `test-gpu` the GPU tests (a CUDA machine)
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: $(VENV)/.installed
	$(PY) -m pytest $(XDIST) -m "not slow" tests

test-all: $(VENV)/.installed
	$(PY) -m pytest $(XDIST) tests

test-gpu: $(VENV)/.installed
	$(PY) -m pytest -v tests/test_cuda.py

# on a CUDA machine the profile's parts share the GPU as processes (experiments/one_gpu.sh); on a CPU one process.
# on a CPU DEADLINE=SECONDS (a job's time limit) and ARCHIVE=FILE.tgz pass on (`dmtp pipeline --help`)
ablation-code: $(VENV)/.installed
	$(if $(HAS_CUDA),PY=$(PY) PROFILE=$(PROFILE) WORK=$(WORK) RESULTS=$(RESULTS) bash experiments/one_gpu.sh,\
	  $(PY) -m dmtp.cli pipeline --profile $(PROFILE) --work $(WORK) --results $(RESULTS) \
	  $(if $(DEADLINE),--deadline $(DEADLINE)) $(if $(ARCHIVE),--archive $(ARCHIVE)))
	$(PY) -m dmtp.cli.report report --profile $(PROFILE) --results $(RESULTS)

# single stages (each resumes / skips finished work); `make target|data|drafters NGPU=2` runs data-parallel under
# torchrun (`dmtp.cli.torchrun`: Ctrl-C exits 130 in one line), one process per GPU (corpus, tokenizer and eval run
# in one process)
NGPU ?= 1
corpus tokenizer eval: $(VENV)/.installed
	$(PY) -m dmtp.cli pipeline --profile $(PROFILE) --work $(WORK) --results $(RESULTS) --stage $@

target data drafters: $(VENV)/.installed
	$(if $(filter 1,$(NGPU)),$(PY),$(PY) -m dmtp.cli.torchrun --nproc_per_node=$(NGPU)) -m dmtp.cli pipeline \
		--profile $(PROFILE) --work $(WORK) --results $(RESULTS) --stage $@

# 1 process vs NGPU (at least 2) processes pretraining the target on TOKENS tokens, with a repeated 1-process run
# as a control -> results/<profile>/multigpu/$(DPRUN); needs the corpus and tokenizer stages. dppool pools every
# run folder there (results/<profile>/multigpu/pool.json, pool.png): one repeat is a thin noise floor.
TOKENS ?= 20000000
DPRUN ?= run
DPFLAGS ?= --control
dpcheck: $(VENV)/.installed
	$(PY) -m experiments.dpcheck --profile $(PROFILE) --work $(WORK) --tokens $(TOKENS) $(DPFLAGS) \
		--nproc $(if $(filter 1,$(NGPU)),2,$(NGPU)) --out $(RESULTS)/$(PROFILE)/multigpu/$(DPRUN)
dppool: $(VENV)/.installed
	$(PY) -m experiments.dpcheck --profile $(PROFILE) --out $(RESULTS)/$(PROFILE)/multigpu \
		--pool $(wildcard $(RESULTS)/$(PROFILE)/multigpu/*/curves.csv)

# the blog's open reproduction on a local target (dmtp/cli/reproduce.py): regen -> train -> eval -> report, each stage
# resumable; NGPU > 1 runs it under torchrun (regen, train and eval data-parallel). DATA: SET=PATH items, e.g.
#   make reproduce PROFILE=qwen3.6-27b TARGET=/models/Qwen3.6-27B NGPU=8 \
#     DATA='openperfectblend=/data/opb gsm8k=/data/gsm8k math500=/data/math500.jsonl \
#           humaneval=/data/HumanEval.jsonl.gz alpaca=/data/alpaca_data.json mtbench=/data/question.jsonl'
# REPRODUCE_ARGS passes more flags (--init-from PATH, --stage eval,report, --set eval.new_tokens=128, ...)
REPRODUCE_WORK ?= runs/$(PROFILE)
reproduce: $(VENV)/.installed
	@test -n "$(TARGET)" || { echo "make reproduce: give TARGET=<local target checkpoint folder>" >&2; exit 2; }
	$(if $(filter 1,$(NGPU)),$(PY),$(PY) -m dmtp.cli.torchrun --nproc_per_node=$(NGPU)) -m dmtp.cli reproduce \
		--profile $(PROFILE) --target $(TARGET) --work $(REPRODUCE_WORK) $(foreach d,$(DATA),--data-path $(d)) \
		$(REPRODUCE_ARGS)

# benchmarks (GPU for meaningful numbers): stage overhead, throughput per batch cap, our loop vs a plain HF loop
bench: $(VENV)/.installed
	$(PY) -m dmtp.cli.bench --profile $(PROFILE) --target $(WORK)/$(PROFILE)/target \
		--drafters $(WORK)/$(PROFILE)/drafters \
		--out $(RESULTS)/$(PROFILE)/bench $(BENCH_ARGS)
	$(PY) -m dmtp.cli.report report --profile $(PROFILE) --results $(RESULTS)

# the engine at the paper's (Qwen3-8B) and mini's shapes with random weights (GPU; no trained model needed): rounds
# against AR, batch 1 beside HF's loops, regeneration, kernel tables -> $(RESULTS)/$(PROFILE)/bench
bench-shapes: $(VENV)/.installed
	$(PY) -m dmtp.cli.bench --paper-shape --out $(RESULTS)/$(PROFILE)/bench $(BENCH_ARGS)
	$(PY) -m dmtp.cli.bench --mini-shape --out $(RESULTS)/$(PROFILE)/bench $(BENCH_ARGS)

# training throughput, eager and compiled paths side by side (GPU): pretraining tok/s + MFU, drafter steps/s ->
# $(RESULTS)/$(PROFILE)/bench/train.json and the ratio records in ratios.json; needs no trained model
bench-train: $(VENV)/.installed
	$(PY) -m dmtp.cli.bench_train --profile $(PROFILE) --out $(RESULTS)/$(PROFILE)/bench $(BENCH_ARGS)

# verification modes at T > 0 (target-only vs speculative sampling vs block verification), after the drafters:
# results/<profile>/verify, then its tables, figure and report section (GPU for meaningful throughput);
# VERIFY_ARGS='--set verify.temperatures=0.6' changes the profile's `verify.*` settings
verify: $(VENV)/.installed
	$(PY) -m dmtp.cli pipeline --profile $(PROFILE) --work $(WORK) --results $(RESULTS) --stage verify $(VERIFY_ARGS)
	$(PY) -m dmtp.cli.report report --profile $(PROFILE) --results $(RESULTS)

tables figures report: $(VENV)/.installed
	$(PY) -m dmtp.cli.report $@ --profile $(PROFILE) --results $(RESULTS)

clean-work:
	rm -rf $(WORK)/$(PROFILE)

# REVISION: the commit and the source digest, which a copy of this tree without .git (copied to a cluster node,
# unpacked from an archive) records as every meta file's git_sha (`dmtp.io.git_sha`; re-run after each commit)
revision:
	$(PY) -c 'from dmtp.io import revision_line; print(revision_line())' > REVISION.tmp && mv REVISION.tmp REVISION
	@echo "REVISION: $$(cat REVISION)"
