# Transformers from Scratch -- every command a student, an instructor or a maintainer needs.
#
#   make            set up .venv, execute every notebook into build/, build the site in build/html
#                   (.venv gets requirements.txt, what a student runs, and requirements-dev.txt,
#                   the tests and the site builder; make learn and make lab install the first only)
#   make test       package tests + strict nbval over every notebook (also under a second BLAS kernel)
#   make portability  every notebook under each BLAS kernel this CPU can run (about half an hour)
#   make learn      do the exercises yourself: your workspace (built once), JupyterLab on it
#   make test-quick make test without the slow tests (handout execution, grading, mutants): a third of its time
#   make lab        open JupyterLab on the notebooks (as root too: containers, WSL)
#   make help       everything else
#
# PYTHON picks the interpreter the virtual environment is made from (Python 3.10 to 3.13).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# requirements.txt alone, what a student runs (make learn, make lab) and what the instructors'
# tools need (Gradescope's autograder installs the same); STAMP adds requirements-dev.txt.
STUDENT_STAMP := $(VENV)/.installed-student
# Run with the variables that make notebook outputs reproducible (also set by conftest.py).
export PYTHONHASHSEED := 0
export PYTHONWARNINGS := ignore
# pytest-xdist workers for `make test` (each runs whole notebooks, --dist loadscope), and the
# notebooks `make grade` grades at once (the files it writes are the same for every JOBS).
JOBS ?= 2
# `make refresh NB=notebooks/01_attention.ipynb` refreshes one notebook.
NB ?= notebooks
# `make grade SUBMISSIONS=dir` grades a folder of submissions, each student's code in a
# bubblewrap sandbox (apt-get install bubblewrap); TIMEOUT: seconds per cell; GRADE_ARGS: further
# options of transformer_lab.course.grade (--case-timeout, --no-execute, --memory, --no-sandbox).
SUBMISSIONS ?=
TIMEOUT ?= 60
# OUT: where make grade writes (emptied and rewritten: late work or a regrade gets its own)
OUT ?= build/grades
# NOTEBOOKS: the assignment's notebooks, for make grade and make gradescope (01 06, or names)
NOTEBOOKS ?=
GRADE_ARGS ?=
# `make learn`: your workspace (built once, never overwritten); LAB_ARGS go to JupyterLab.
WORKSPACE ?= workspace
LAB_ARGS ?=

.DEFAULT_GOAL := all
.PHONY: all venv notebooks site test test-quick test-package test-notebooks test-kernel \
	portability lab learn refresh lint \
	figures student grade gradescope clean distclean help

all: notebooks site ## set up, execute every notebook into build/notebooks, build build/html
	@echo
	@echo "Done. Open build/html/index.html, or run 'make lab' to work in the notebooks."

# Said before pip installs torch into a .venv without it on Linux, where the default wheel brings
# several GB of CUDA libraries (the README's second line installs the CPU build first).
TORCH_NOTE = @$(PY) -c "import torch" 2>/dev/null || [ "$$(uname)" != Linux ] || echo "==> Note: \
	$(VENV) has no torch yet, so pip now installs its default Linux build with several GB of CUDA \
	libraries; for the CPU build, stop (Ctrl-C) and run the README's second line first."

venv: $(STAMP) ## create .venv, install requirements*.txt and the package (only when they changed)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@echo "==> Creating $(VENV) and installing requirements.txt, requirements-dev.txt (tests, site) and the package"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(TORCH_NOTE)
	$(PY) -m pip install --disable-pip-version-check -r requirements.txt -r requirements-dev.txt -e .
	@touch $@ $(STUDENT_STAMP)

$(STUDENT_STAMP): requirements.txt pyproject.toml
	@echo "==> Creating $(VENV) and installing requirements.txt (what a student runs) and the package"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(TORCH_NOTE)
	$(PY) -m pip install --disable-pip-version-check -r requirements.txt -e .
	@touch $@

notebooks: $(STAMP) ## execute notebooks/ in order, each in a fresh kernel, into build/notebooks
	@echo "==> Executing the notebooks into build/notebooks (notebooks/ stays untouched)"
	$(PY) -m transformer_lab.course.execute notebooks --output-dir build/notebooks

site: notebooks ## build the HTML course site from the executed notebooks into build/html
	@echo "==> Building the HTML site"
	$(PY) -m transformer_lab.course.site --executed build/notebooks --out build/html

test: test-package test-notebooks test-kernel ## package tests, strict nbval, nbval under another kernel

test-quick: $(STAMP) ## everyday: make test without the slow tests (handout execution, grading, mutants)
	$(PY) -m pytest tests -n $(JOBS) -m "not slow"
	$(MAKE) --no-print-directory test-notebooks test-kernel

test-package: $(STAMP) ## pytest over tests/
	$(PY) -m pytest tests -n $(JOBS)

test-notebooks: $(STAMP) ## nbval, strict: every output compared with the stored one
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
		-n $(JOBS) --dist loadscope notebooks

# Every assertion must hold on any CPU: the solved notebooks again under one other choice of
# OpenBLAS's and PyTorch's kernels (transformer_lab.course.portability.CI_COMBINATION).
test-kernel: $(STAMP) ## nbval, strict, with NumPy's and torch's matrix kernels chosen otherwise
	$(PY) -m transformer_lab.course.portability --ci --jobs $(JOBS)

portability: $(STAMP) ## maintainers: every notebook under each BLAS kernel of this CPU (~30 min)
	$(PY) -m transformer_lab.course.portability --jobs $(JOBS)

# JupyterLab refuses to start as root unless told --allow-root (containers, Docker, some WSL).
lab: $(STUDENT_STAMP) ## open JupyterLab on the notebooks
	$(VENV)/bin/jupyter lab notebooks $$(test "$$(id -u)" = 0 && echo --allow-root)

learn: $(STUDENT_STAMP) ## do the exercises yourself: build WORKSPACE=workspace once, open JupyterLab on it
	$(PY) -m transformer_lab.course.learn --workspace "$(WORKSPACE)" -- $(LAB_ARGS)

refresh: $(STAMP) ## maintainers: re-execute notebooks in place to refresh stored outputs (NB=...)
	$(PY) -m transformer_lab.course.execute --in-place $(NB)

lint: $(STAMP) ## maintainers: ruff over the code (installs ruff into .venv on first use)
	@$(VENV)/bin/ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q ruff==0.17.6
	$(VENV)/bin/ruff check src tests conftest.py docs

figures: $(STAMP) ## redraw img/ and embed it in the notebooks, each guarded (works on its own)
	$(PY) -m transformer_lab.course.figures --out img
	$(PY) -m transformer_lab.course.standalone --img img notebooks

student: $(STUDENT_STAMP) ## instructors: the handout (notebooks, package with its core stubbed) in build/student
	$(PY) -m transformer_lab.course.student --source notebooks --out build/student

grade: $(STUDENT_STAMP) ## instructors: grade SUBMISSIONS=dir (JOBS at once, sandboxed) into OUT (build/grades)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<folder of submissions>" \
		"[JOBS=<notebooks at once>] [TIMEOUT=<seconds per cell>] [NOTEBOOKS=<01 06 ...>]" \
		"[OUT=<folder, default build/grades>]" \
		"[GRADE_ARGS=...];" \
		"see README, 'For instructors'" >&2; exit 2; }
	$(PY) -m transformer_lab.course.grade "$(SUBMISSIONS)" --source notebooks --out "$(OUT)" \
		--timeout $(TIMEOUT) --jobs $(JOBS) $(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS)) $(GRADE_ARGS)

gradescope: $(STUDENT_STAMP) ## instructors: Gradescope's autograder, build/gradescope/autograder.zip (GRADESCOPE_ARGS=...)
	$(PY) -m transformer_lab.course.gradescope build --source notebooks --project . \
		--out build/gradescope $(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS)) $(GRADESCOPE_ARGS)

clean: ## remove build/ (executed notebooks, site)
	rm -rf build

distclean: clean ## also remove .venv
	rm -rf $(VENV)

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'
