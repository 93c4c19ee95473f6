# Thin front over CMake. `make demo` and `make test` each do all set-up on a fresh Debian 12
# machine (as root): packages via deploy/setup.sh, then configure, build, run.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
XLOCO := $(BUILD)/src/cli/xloco

.PHONY: all setup configure build demo demo-train test bench experiments attack rehearse-scale rehearse-many clean setup-torch2 build-torch2 test-torch2 gpu-pack

all: build

setup:
	bash deploy/setup.sh

configure: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	bash experiments/demo.sh $(XLOCO) local

demo-train: build
	bash experiments/demo.sh $(XLOCO) train

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

bench: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DXLOCO_BUILD_BENCH=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)
	bash experiments/bench/run.sh $(BUILD)

# The convergence harness (experiments/harness.py): PLAN=quick (about an hour on 2 cores),
# PLAN=full, or PLAN=recipes (the recipes of README, three seeds, about 70 minutes, root for its
# 5 Mbit/s entries); runs every entry from scratch unless EXPERIMENT_FLAGS is set (e.g. to nothing, to
# keep finished runs). The WAN entries need root (network namespaces).
PLAN ?= quick
EXPERIMENT_FLAGS ?= --rerun all
experiments: build
	XLOCO_EXTRA_PACKAGES=dict-gcide bash deploy/setup.sh  # PLAN=recipes' second corpus
	python3 experiments/harness.py --plan experiments/plans/$(PLAN).json --xloco $(XLOCO) $(EXPERIMENT_FLAGS)

# The attack table (issue 52): experiments/plans/attack.json, 1 hostile provider of 4 and 2 of 7
# through the XLOCO_ATTACK test device, int8 and the sparse relay setting, with and without
# outer.score; each run against the same run without attackers (36 runs, about 75 minutes on 2
# cores). The honest-run cost of clipping: PLAN=honest-cost with `make experiments`.
attack: build
	python3 experiments/harness.py --plan experiments/plans/attack.json --xloco $(XLOCO) $(EXPERIMENT_FLAGS)

# The scale rehearsal of issue 14 (root, ~15 minutes, ~14 GB): a 101 M-parameter GPT, the head and
# 4 providers in network namespaces over 100/100/50/10 Mbit/s links; report in runs/scale.
# SCALE_ARGS adds --set KEY=VALUE overrides (e.g. the topk codec, experiments/RESULTS.md issue 20).
SCALE_ARGS ?=
rehearse-scale: build
	bash experiments/rehearse_scale.sh $(XLOCO) $(SCALE_ARGS)

# The head at K = 4, 16, 64 simulated providers (issue 54; 9.5 minutes on 2 cores, most of it
# K = 64 relay, whose 64 updates of 252 MB a round pass through one process of simulated providers):
# a real head over CURVE on loopback, its providers replaying pre-encoded topk frames of a
# 101 M-parameter GPT, int8 and relay downlinks; the table in runs/rehearse-many/table.md.
# KS="4 16" or DOWNS=int8 narrow it.
rehearse-many: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DXLOCO_BUILD_BENCH=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target xloco rehearse_many
	bash experiments/rehearse_many.sh $(XLOCO) $(BUILD)/experiments/bench/outer/rehearse_many

# LibTorch 2.x with CUDA (issue 55): the torch wheel the lent GPU machines run (2.11.0, pinned in
# deploy/requirements-torch2.txt, with this machine's CUDA 13 toolkit) beside Debian's 1.13, from
# the same tree. `make test` stays on 1.13; `make test-torch2` runs the CPU suite on this build.
# ~25 minutes on 2 cores from scratch. `make gpu-pack` packs it for deploy/gpu_check.sh.
BUILD_TORCH2 ?= build-torch2
TORCH2_VENV ?= $(CURDIR)/.venv-torch2
CUDA_ARCHS ?= 8.0;9.0
setup-torch2: setup
	bash deploy/setup_torch2.sh $(TORCH2_VENV)

build-torch2: setup-torch2
	cmake -S . -B $(BUILD_TORCH2) -DCMAKE_BUILD_TYPE=Release \
	  "-DCMAKE_PREFIX_PATH=$$($(TORCH2_VENV)/bin/python -c 'import torch.utils, os; print(os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path)))')" \
	  -DCMAKE_CUDA_COMPILER=$${CUDACXX:-/usr/local/cuda/bin/nvcc} "-DTORCH_CUDA_ARCH_LIST=$(CUDA_ARCHS)" \
	  -DXLOCO_TORCH2_VENV=$(TORCH2_VENV) $(CMAKE_FLAGS)
	cmake --build $(BUILD_TORCH2) -j$(JOBS)

test-torch2: build-torch2
	cd $(BUILD_TORCH2) && ctest --output-on-failure --timeout 600

gpu-pack: build-torch2
	bash deploy/gpu_check.sh pack $(BUILD_TORCH2)

clean:
	rm -rf $(BUILD)
