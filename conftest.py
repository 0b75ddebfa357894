"""Root pytest configuration, shared by the package tests and by nbval over notebooks/.

- Kernels started by nbval inherit this process's environment, so the variables that make
  notebook outputs reproducible (transformer_lab.course.kernel_env) are set here, before any
  kernel starts -- also when pytest is run directly rather than through `make test`.
- nbval opens --nbval-sanitize-with relative to the current directory; we resolve it against
  the project root, and use tests/nbval_sanitize.cfg when --nbval is given without one.
"""

from pathlib import Path

from transformer_lab.course.kernel_env import apply_kernel_env

ROOT = Path(__file__).resolve().parent
SANITIZE_FILE = ROOT / "tests" / "nbval_sanitize.cfg"

apply_kernel_env()


def pytest_configure(config):
    option = config.option
    if not getattr(option, "nbval", False):
        return
    given = getattr(option, "nbval_sanitize_with", None)
    if given is None:
        option.nbval_sanitize_with = str(SANITIZE_FILE)
    elif not Path(given).is_absolute() and not Path(given).exists():
        option.nbval_sanitize_with = str(ROOT / given)


MUTANT_TEST = "test_the_mutant_fails_the_public_and_the_graders_cases["


def pytest_terminal_summary(terminalreporter):
    """The mutation score of the checks (tests/test_mutations.py), also under pytest-xdist,
    whose workers do not print: a mutant killed is a test passed."""
    outcome = {}
    for kind in ("passed", "failed"):
        for report in terminalreporter.stats.get(kind, []):
            if MUTANT_TEST in report.nodeid and report.when == "call":
                outcome[report.nodeid] = kind
    if outcome:
        killed = sum(kind == "passed" for kind in outcome.values())
        terminalreporter.write_line(
            f"mutation score of the checks: {killed}/{len(outcome)} mutants fail the public "
            "and the grader's cases (tests/mutants.py)")
