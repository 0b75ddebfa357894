"""The probe's runner: a student's functions run on the grader's cases, in a process of its own,
inside the sandbox (the grader's side is :mod:`.probe_driver`).

    python -s WORKDIR/in/probe_runner.py WORKDIR    (started by the grader only, on a copy of
                                                     this file put beside its request)

``WORKDIR/in/request.json`` (arrays in ``request.npz``) names the probe package, the cells to run
and, per check, the notebook names it takes and its cases. The probe puts the probe package
first on ``sys.path`` (dropping every other ``transformer_lab``), runs the cells statement by
statement in one namespace, noting each cell's first error, then for each case calls
:func:`transformer_lab.checks.framework.run_case` and writes the outcome as plain data (``npz``
without pickle, a JSON header) to ``WORKDIR/out/case-<i>-<j>.npz`` at once.
``WORKDIR/out/progress`` gets a line before each cell and case, for the grader's time limits.
Nothing here decides anything; this file imports nothing from ``transformer_lab`` before the
package is in place.
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import sys

#: Files in WORKDIR/out.
PROGRESS = "progress"
CELLS = "cells.json"
SETUP = "setup done"
FATAL = "fatal.json"
DONE = "done"


def case_file(check_index: int, case_index: int) -> str:
    return f"case-{check_index}-{case_index}.npz"


def check_file(check_index: int) -> str:
    return f"check-{check_index}.json"


def _write_json(path: str, value) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _isolate(root: str) -> None:
    """The probe package first on sys.path; no other copy of transformer_lab importable."""
    root = os.path.abspath(root)

    def other_copy(entry: str) -> bool:
        try:
            entry = os.path.abspath(entry or os.getcwd())
            return entry != root and os.path.isdir(os.path.join(entry, "transformer_lab"))
        except OSError:
            return False

    sys.path[:] = [root] + [e for e in sys.path[1:] if not other_copy(e)]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "__editable__" not in str(getattr(f, "__module__", ""))
                        and "__editable__" not in type(f).__module__]


def _run_cell(cell_id: str, source: str, namespace: dict) -> str | None:
    """Run a cell's statements one by one (a failing one does not stop the others, so that the
    cell's functions are defined); return its first error, or None."""
    filename = f"<cell {cell_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as err:
        return f"SyntaxError: {err.msg} (line {err.lineno})"
    first = None
    for stmt in tree.body:
        code = compile(ast.Module([stmt], type_ignores=[]), filename, "exec")
        try:
            exec(code, namespace)
        except (Exception, SystemExit) as exc:
            if first is None:
                text = " ".join(str(exc).split())[:300]
                first = f"line {stmt.lineno}: {type(exc).__name__}" + (f": {text}" if text else "")
    return first


def main(workdir: str) -> int:
    out = os.path.join(workdir, "out")
    with open(os.path.join(workdir, "in", "request.json"), encoding="utf-8") as f:
        request = json.load(f)
    root = request["package"]
    _isolate(root)
    progress = os.open(os.path.join(out, PROGRESS), os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def mark(text: str) -> None:
        os.write(progress, (text + "\n").encode())

    import transformer_lab

    if not os.path.abspath(transformer_lab.__file__).startswith(os.path.abspath(root) + os.sep):
        _write_json(os.path.join(out, FATAL), {"error": "the probe imported transformer_lab from "
                                                         "somewhere else than the probe package"})
        return 3
    import numpy as np

    from transformer_lab.checks import framework as F

    with np.load(os.path.join(workdir, "in", "request.npz"), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    checks = [F.decode(c, arrays) for c in request["checks"]]

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    cell_errors = []
    for k, cell in enumerate(request["cells"]):
        mark(f"cell {k}")
        error = _run_cell(cell["id"], cell["source"], namespace)
        cell_errors.append({"id": cell["id"], "error": error})
        _write_json(os.path.join(out, CELLS), cell_errors)
    mark(SETUP)

    for chk in checks:
        index = chk["index"]
        mark(f"prepare {index}")  # importing the core modules under test may run code too
        try:
            if chk.get("module", "").startswith("transformer_lab.checks."):
                import importlib  # only the module of this check, not every check module

                importlib.import_module(chk["module"])
                check = F.REGISTRY[chk["id"]]()
            else:
                check = F.get_check(chk["id"])
        except Exception as err:  # not the student's names: the checks themselves
            _write_json(os.path.join(out, check_file(index)), {
                "error": f"the check could not be loaded ({type(err).__name__}: "
                         f"{' '.join(str(err).split())[:200]}): does your code change the "
                         "checks (transformer_lab.checks), or a core module raise on import?"})
            continue
        try:
            given = tuple(namespace[name] for name in chk["args"])
            named = {key: namespace[name] for key, name in chk["kwargs"].items()}
            f = F.functions_for(check, given, named)
        except KeyError as err:
            name = err.args[0] if err.args else "?"
            raised = next((f"; cell {c['id']} raised {c['error']}" for c in cell_errors
                           if c["error"]), "")
            _write_json(os.path.join(out, check_file(index)),
                        {"error": f"your notebook defines no {name!r} (the grader ran its first "
                                  f"code cell and its exercise cells{raised})"})
            continue
        except Exception as err:
            _write_json(os.path.join(out, check_file(index)),
                        {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"})
            continue
        for j, case in enumerate(chk["cases"]):
            mark(f"case {index} {j}")
            case = F.Case(case["name"], tuple(case["args"]), case["kwargs"])
            outcome = F.run_case(check, f, case)
            record = {"check": chk["id"], "case": case.name, "error": outcome.error,
                      "where": outcome.where, "value": outcome.value,
                      "after": list(outcome.after), "after_kwargs": outcome.after_kwargs}
            path = os.path.join(out, case_file(index, j))
            try:
                F.save_values(path + ".tmp", {"outcome": record})
            except Exception as err:  # not plain data: say what came back instead
                record.update(value=None, after=[], after_kwargs={},
                              unplain=' '.join(str(err).split())[:200])
                F.save_values(path + ".tmp", {"outcome": record})
            os.replace(path + ".tmp", path)
    mark(DONE)
    os.close(progress)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
