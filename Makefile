# Two commands do all set-up on a fresh machine: `make run` (the demo) and `make test`.
# The venv is rebuilt only when pyproject.toml changes, so a second run is quick.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast mutate bench bench-gpu bundled eval-bundled clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch/torchvision first, pinned to the CUDA wheels that lie on this machine's disk
	# (PyPI's torchvision does not import beside the 2.13.0+cpu wheel; timm needs torchvision).
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/graphkit trace examples/vit_b16.py --out out/vit_b16.json
	$(BIN)/graphkit trace examples/gpt2.py --out out/gpt2.json
	rm -rf out/vits-1k
	$(BIN)/graphkit generate vits-1k --out out/vits-1k --workers 2
	$(BIN)/graphkit stats out/vits-1k --png out/vits-1k-params.png
	$(BIN)/graphkit ls out/vits-1k --split eval --limit 5
	$(BIN)/graphkit predict examples/vit_b16.py --out out/vit_b16-predicted.safetensors

# ruff first (pyproject.toml's [tool.ruff]: import order, imports at the top, 120 columns, the
# format), then mypy on graphkit/ ([tool.mypy]), then every test (the 15 slowest listed: where a slower run went).
# pytest-xdist runs one worker a core, each torch on one thread (two torch processes with a thread
# a core each slow each other down), handed 4 tests at a time so the slow tests, which conftest.py
# puts first, spread over the workers; `pytest` alone runs the suite in one process
PYTEST_PARALLEL = -n auto --maxschedchunk 4
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=15

# the everyday lane: every test but the ones marked slow (training, generation, subprocesses)
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

# Mutation testing, outside CI (docs/tracer.md, "Mutation testing"): mutmut plants one small bug
# at a time in graphkit/attention and graphkit/tracing and runs the not-slow tests that reach the
# function it changed ([tool.mutmut] in pyproject.toml); a mutant no test fails is a survivor.
# MUTANTS picks some, e.g. make mutate MUTANTS='graphkit.attention.grouping.*'. Results stay in
# mutants/: `$(BIN)/mutmut results` lists the survivors, `$(BIN)/mutmut show NAME` shows one.
MUTANTS ?=
mutate: $(STAMP)
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e ".[test,mutate]"
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2 $(MUTANTS)

bench: $(STAMP)
	$(BIN)/python benchmarks/trace_speed.py --write
	$(BIN)/python benchmarks/dataset_speed.py --write
	$(BIN)/python benchmarks/attention_speed.py --write
	$(BIN)/python benchmarks/predict_speed.py --write
	$(BIN)/python benchmarks/train_speed.py --write

# On a GPU machine, with its own Python (BENCH_PYTHON="python3", PYTHONPATH=.): the sections of
# BENCHMARKS.md that only a GPU can fill (issue #26), each labelled with the device
BENCH_PYTHON ?= $(BIN)/python
bench-gpu:
	$(BENCH_PYTHON) benchmarks/train_speed.py --gpu --write
	$(BENCH_PYTHON) benchmarks/attention_speed.py --gpu --write
	$(BENCH_PYTHON) benchmarks/predict_speed.py --device cuda --write
	$(BENCH_PYTHON) benchmarks/ghn_eval.py --device cuda --write

# The five bundled LoGAH-tiny checkpoints (graphkit/ghn/pretrained/), retrained from scratch on
# the bundled data (about 4 hours on 2 cores: ViTs about 70 min in two stages, GPT-2s 35, LLaMAs about 25 in two stages;
# the mini zoos 13 and 16 min, zoo-vision about 60 min from its role-means start, zoo-decoders in two stages
# of 1 and about 28 min), then the family ones' held-out evaluation.
BUNDLED := graphkit/ghn/pretrained
bundled: $(STAMP)
	test -d out/vits-digits || $(BIN)/graphkit generate vits-digits --out out/vits-digits --workers 2
	test -d out/gpts-1k || $(BIN)/graphkit generate gpts-1k --out out/gpts-1k --workers 2
	test -d out/llamas-1k || $(BIN)/graphkit generate llamas-1k --out out/llamas-1k --workers 2
	test -d out/zoo-vits-mini || $(BIN)/graphkit generate zoo-vits-mini --out out/zoo-vits-mini --workers 2
	test -d out/zoo-decoders-mini || $(BIN)/graphkit generate zoo-decoders-mini --out out/zoo-decoders-mini --workers 2
	rm -rf runs/logah-tiny-vits-digits runs/logah-tiny-vits-mixed runs/logah-tiny-vits runs/logah-tiny-gpts runs/logah-tiny-llamas-4 runs/logah-tiny-llamas runs/logah-tiny-zoo-vision runs/logah-tiny-zoo-decoders-4 runs/logah-tiny-zoo-decoders
	# ViTs in three stages (docs/experiments.md, "Training on pre-norm ViTs", "A third stage across token grids"):
	# vits-digits; then it and its pre-norm twins (CLIP's); then those and its patch-4 twins (a 2 x 2 token grid)
	$(BIN)/graphkit train-ghn --dataset out/vits-digits --out runs/logah-tiny-vits-digits --steps 3500 --meta-batch 4 --batch-size 32 --lr-fan-in 8
	test -d out/vits-digits-grids-mixed || $(BIN)/python experiments/pre_norm.py data
	$(BIN)/graphkit train-ghn --dataset out/vits-digits-mixed --out runs/logah-tiny-vits-mixed --steps 3000 --meta-batch 4 --batch-size 32 --lr-fan-in 8 --initial-checkpoint runs/logah-tiny-vits-digits
	$(BIN)/graphkit train-ghn --dataset out/vits-digits-grids-mixed --out runs/logah-tiny-vits --steps 1500 --meta-batch 4 --batch-size 32 --lr-fan-in 8 --initial-checkpoint runs/logah-tiny-vits-mixed
	$(BIN)/graphkit train-ghn --dataset out/gpts-1k --out runs/logah-tiny-gpts --steps 2400 --meta-batch 2 --batch-size 8 --seq-len 64 --lr-fan-in 32 --role-maps --tie-feature
	test -d out/llamas-4 || $(BIN)/graphkit generate llamas-1k --num 4 --out out/llamas-4 --workers 2
	# LLaMA in two stages (docs/experiments.md, "The curriculum with the spread penalty"): 4 architectures, then the space, blocks kept spread
	$(BIN)/graphkit train-ghn --dataset out/llamas-4 --out runs/logah-tiny-llamas-4 --steps 600 --meta-batch 2 --batch-size 8 --seq-len 64 --lr-fan-in 32 --role-maps
	$(BIN)/graphkit train-ghn --dataset out/llamas-1k --out runs/logah-tiny-llamas --steps 1200 --meta-batch 2 --batch-size 8 --seq-len 64 --lr-fan-in 32 --role-maps --initial-checkpoint runs/logah-tiny-llamas-4 --spread 1.0
	# the vision zoo from a start whose role factors are each role's mean (docs/experiments.md, "The role-means start, shipped")
	$(BIN)/graphkit train-ghn --dataset out/zoo-vits-mini --data digits --out runs/logah-tiny-zoo-vision --steps 1500 --meta-batch 4 --batch-size 32 --lr-fan-in 8 --role-maps --role-key leaf --role-rows 1024 --role-factors --role-means-start --lr 1e-3 --correction 1 --clip 1e6
	# the decoder zoo in two stages too, from the role-means start (docs/experiments.md, "The role-means start, then the curriculum"): 4 LLaMA-like families, then the zoo
	$(BIN)/graphkit train-ghn --dataset out/zoo-decoders-mini --data stdlib-text --out runs/logah-tiny-zoo-decoders-4 --steps 600 --meta-batch 2 --batch-size 8 --seq-len 64 --lr-fan-in 32 --role-maps --role-key layer --role-rows 1024 --role-factors --role-means-start --lr 1e-3 --correction 1 --clip 1e6 --table-gain 8 --zoo-families mistral,qwen2,qwen3,helium
	$(BIN)/graphkit train-ghn --dataset out/zoo-decoders-mini --data stdlib-text --out runs/logah-tiny-zoo-decoders --steps 1500 --meta-batch 2 --batch-size 8 --seq-len 64 --lr-fan-in 32 --role-maps --role-key layer --role-rows 1024 --role-factors --initial-checkpoint runs/logah-tiny-zoo-decoders-4 --lr 1e-3 --correction 1 --clip 1e6 --table-gain 8 --spread 1.0
	for name in logah-tiny-vits logah-tiny-gpts logah-tiny-llamas logah-tiny-zoo-vision logah-tiny-zoo-decoders; do mkdir -p $(BUNDLED)/$$name && cp runs/$$name/model.safetensors runs/$$name/config.json $(BUNDLED)/$$name/; done

eval-bundled: $(STAMP)
	$(BIN)/python benchmarks/ghn_eval.py --write

clean:
	rm -rf $(VENV) out runs
