"""What the instructor should look at: code that reaches into the grader's machinery.

The verdicts do not depend on it, but an attempt is worth seeing even when it earned nothing:
:func:`scan_python` reads code by its syntax tree and reports, with the line and the code, what
the sets below name (the list: docs/instructors.md, "Grading", item 5).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from transformer_lab.course import untrusted

#: A cell with a longer line is not given to IPython's transformer. On Python 3.12.1 its
#: tokens each hold a copy of their line, so its memory grows with the square of a line's
#: length: 9.8 GB for one line of 50,000 additions (100 kB), where 3.11 needs 50 MB.
LONGEST_TRANSFORMED_LINE = 4_000

#: IPython's cell magics whose body is Python (the probe runs it).
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}
_IPYTHON_CALLS = {"run_line_magic", "run_cell_magic", "system", "getoutput"}

_IPYTHON_ATTRS = {"set_custom_exc", "events", "input_transformers_post",
                  "input_transformers_cleanup", "ast_transformers", "showtraceback",
                  "showsyntaxerror", "run_cell", "run_cell_async", "run_code", "run_ast_nodes",
                  "register_magic_function", "display_pub", "displayhook", "excepthook",
                  "user_ns", "user_global_ns", "kernel", "shell"}
_IPYTHON_NAMES = {"get_ipython", "InteractiveShell", "clear_output", "__IPYTHON__"}
_PATCH_NAMES = {"setattr", "delattr", "__import__", "builtins", "__builtins__", "importlib",
                "monkeypatch", "mock", "unittest"}
_CODE_ATTRS = {"__code__", "__globals__", "__closure__", "__defaults__", "__kwdefaults__",
               "FunctionType", "CodeType", "getsource", "getsourcelines", "getfile",
               "getmodule"}
_CODE_NAMES = {"FunctionType", "CodeType", "marshal", "getsource", "getsourcelines"}
_FRAME_ATTRS = {"_getframe", "currentframe", "f_back", "f_globals", "f_locals", "settrace",
                "setprofile", "get_referrers", "get_objects", "stack"}
_FRAME_NAMES = {"ctypes", "gc"}
_EXIT_ATTRS = {"_exit", "exit", "abort", "kill", "killpg", "signal", "alarm", "setitimer"}
_EXIT_NAMES = {"atexit", "exit", "quit", "signal"}
_PROCESS_ATTRS = {"system", "popen", "Popen", "run", "call", "check_call", "check_output",
                  "fork", "forkpty", "spawnl", "spawnv", "spawnve", "spawnlp", "spawnvp",
                  "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle", "execlp",
                  "execvp", "execvpe", "startfile"}
_PROCESS_NAMES = {"subprocess", "multiprocessing", "pty"}
_WRITE_ATTRS = {"write_text", "write_bytes", "unlink", "rmdir", "remove", "removedirs",
                "rename", "replace", "rmtree", "copy", "copy2", "copyfile", "copytree", "move",
                "makedirs", "mkdir", "symlink", "symlink_to", "hardlink_to", "chmod", "truncate",
                "save", "savez", "savez_compressed", "savetxt", "tofile", "touch"}
#: Of those, the ones whose second argument is the path written (shutil.copy(src, dst)).
_WRITE_SECOND = {"rename", "replace", "copy", "copy2", "copyfile", "copytree", "move",
                 "symlink"}
#: The modules whose aliases are read as the module (import os as o; from os import fork).
_ALIASED = {"os", "sys", "subprocess", "shutil", "signal", "atexit", "builtins", "importlib",
            "ctypes", "gc", "inspect", "multiprocessing", "pty", "numpy", "torch", "pathlib"}
_STRING_CODE = {"eval", "exec", "compile"}
#: What importing a module means, by its top-level name.
_IMPORT_REASONS = {
    **dict.fromkeys(("builtins", "importlib"), "patching or re-importing modules"),
    **dict.fromkeys(_PROCESS_NAMES, "starts other processes"),
    **dict.fromkeys(("atexit", "signal"), "acts when the process ends or is signalled"),
    **dict.fromkeys(("ctypes", "gc", "marshal"), "reaches into the interpreter"),
    "tracemalloc": "controls the memory measurement some checks make in your process",
    "IPython": "reaches into the kernel's machinery"}
_CHECK_ATTRS = {"expected", "stored_expected", "store_expected", "get_check", "REGISTRY",
                "run_case", "hidden_cases", "load_values", "judge", "functions_for",
                "python_loops", "def_loops", "_CACHED", "checks", "framework"}
#: What makes the read-only caches of the checks writable again.
_WRITABLE_ATTRS = {"writeable", "setflags", "WRITEABLE"}
_SHELL_MAGICS = {"bash", "sh", "script", "system", "sx", "writefile", "file", "run", "capture",
                 "perl", "ruby", "python", "python2", "python3", "pypy", "load", "load_ext",
                 "env", "store"}


@dataclass(frozen=True)
class Flag:
    """One line of code worth the instructor's look."""

    where: str  # "cell 4 (id exercise-x)" or the file
    line: int
    what: str
    code: str


def python_source(source: str) -> str:
    """A cell's source as plain Python, line for line: IPython's magics and shell lines become
    ``pass`` (or nothing), the body of a ``%%time``-like cell magic stays. Line numbers are
    those of the cell."""
    lines = source.split("\n")
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        name = first[2:].split()[0] if first[2:].split() else ""
        if name in PYTHON_CELL_MAGICS:
            return "\n" + python_source("\n".join(lines[1:]))
        return "\n".join("" for _ in lines)
    if max(map(len, lines)) > LONGEST_TRANSFORMED_LINE:
        return source  # (as one that IPython cannot transform: see LONGEST_TRANSFORMED_LINE)
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        transformed = TransformerManager().transform_cell(source)
    except Exception:
        return source
    if transformed.endswith("\n") and not source.endswith("\n"):
        transformed = transformed[:-1]
    if transformed.count("\n") != source.count("\n"):
        return source  # not line for line: the probe reports what fails
    try:
        tree = untrusted.parse(transformed)
    except SyntaxError:
        return transformed
    out = transformed.split("\n")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expr, ast.Assign)) and _ipython_call(node.value):
            indent = re.match(r"[ \t]*", out[node.lineno - 1]).group(0)
            out[node.lineno - 1] = indent + "pass"
            for k in range(node.lineno, node.end_lineno):
                out[k] = ""
    return "\n".join(out)


def _ipython_call(node) -> bool:
    """``get_ipython().run_line_magic(...)`` and the like: what IPython makes of magics."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in _IPYTHON_CALLS and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython")


def imported_names(sources: list[str]) -> set[str]:
    """The names that imports bind in these sources (plain Python)."""
    names = set()
    for source in sources:
        try:
            tree = untrusted.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def scan_python(source: str, where: str, imported: set[str] | None = None,
                core: bool = False) -> list[Flag]:
    """The flags of one piece of plain Python (``imported``: names that imports bind in the
    same namespace, e.g. in a notebook's other cells; ``core``: a core module, where torch is
    worth a flag too)."""
    try:
        tree = untrusted.parse(source)
    except SyntaxError:
        return []
    imported = imported_names([source]) | (imported or set())
    tree = _unaliased(tree)
    lines = source.split("\n")
    found: dict[tuple[int, str], Flag] = {}

    def flag(node, what: str) -> None:
        line = getattr(node, "lineno", 1)
        code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        found.setdefault((line, what), Flag(where, line, what, code[:200]))

    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            _name(node, flag)
        elif isinstance(node, ast.Attribute):
            _attribute(node, flag)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for module in modules:
                top = module.split(".")[0]
                if top in _IMPORT_REASONS:
                    flag(node, f"imports {top}: {_IMPORT_REASONS[top]}")
                elif module in ("unittest.mock", "mock"):
                    flag(node, "imports mock: patching")
                elif (module.startswith(("transformer_lab.checks.", "transformer_lab.course"))
                      and module != "transformer_lab.checks.check" and (
                          isinstance(node, ast.Import) or module == node.module
                          or node.module == "transformer_lab.checks")) or (
                        module == "transformer_lab.checks" and (
                            isinstance(node, ast.Import) or node.module == "transformer_lab")):
                    flag(node, f"imports {module}: the checks' or the grader's internals")
                elif top == "torch" and core:
                    flag(node, "imports torch in the core, which the course writes in NumPy")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
                [node.target]
            for target in targets:
                _target(node, target, imported, flag)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.name in imported:
            flag(node, f"rebinds {node.name}, a name an import binds")
        elif isinstance(node, ast.Call):
            _call(node, flag)
    merged: dict[int, Flag] = {}  # one row per line, its reasons joined
    for (line, _), f in sorted(found.items()):
        merged[line] = Flag(where, line, f"{merged[line].what}; {f.what}", f.code) \
            if line in merged else f
    return list(merged.values())


def _unaliased(tree: ast.Module) -> ast.Module:
    """``tree`` with the names that imports bind to the modules of :data:`_ALIASED`, or to
    what they hold, read as written out: ``_os.fork()`` and ``fork()`` after ``import os as
    _os`` or ``from os import fork`` as ``os.fork()``, which the rules know."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and a.name.split(
                ".")[0] in _ALIASED - {"numpy", "torch"}}  # np, as the rules read it
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _ALIASED:
            aliases |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}

    class Unalias(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name):
            if node.id not in aliases or not isinstance(node.ctx, ast.Load):
                return node
            *path, last = aliases[node.id].split(".")
            written = ast.Name(path[0] if path else last, ast.Load())
            for part in [*path[1:], last] if path else []:
                written = ast.Attribute(written, part, ast.Load())
            return ast.copy_location(written, node)
    return Unalias().visit(tree) if aliases else tree


def _target(node, target, imported: set[str], flag) -> None:
    """Flag an assignment (or del) target that patches what an import brought in."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            _target(node, element, imported, flag)
        return
    if isinstance(target, ast.Starred):
        _target(node, target.value, imported, flag)
        return
    if isinstance(target, ast.Name):
        if target.id in imported:
            flag(node, f"rebinds {target.id}, a name an import binds")
        return
    spine = target  # x.a[0].b = ...: the chain of attributes and subscripts down to x
    while isinstance(spine, (ast.Attribute, ast.Subscript)):
        if isinstance(spine, ast.Subscript) and isinstance(spine.value, ast.Attribute) and \
                spine.value.attr == "flags":  # a.flags["WRITEABLE"] = True
            flag(node, f"sets {ast.unparse(spine)}: makes an array writable again (the checks "
                       "make the caches of forward passes read-only)")
            return
        if isinstance(spine, ast.Subscript) and ast.unparse(spine.value) in (
                "sys.modules", "globals()", "builtins.__dict__", "__builtins__", "vars()"):
            flag(node, f"patches {ast.unparse(spine.value)}")
            return
        spine = spine.value
    if isinstance(spine, ast.Name) and spine.id in imported and \
            any(isinstance(t, ast.Attribute) for t in ast.walk(target)):
        flag(node, f"patches {ast.unparse(target)}, an attribute of an imported module or "
                   "object")


def _root(node) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else ""


#: What a name means, first match wins: (the names, the flag's reason).
_NAME_REASONS = ((_IPYTHON_NAMES, "reaches into IPython's machinery"), (_PATCH_NAMES, "patching"),
                 (_CODE_NAMES, "copies or reads function code"),
                 (_FRAME_NAMES, "reaches into the interpreter"),
                 (_EXIT_NAMES, "ends the process or acts when it ends"),
                 (_PROCESS_NAMES, "starts other processes"),
                 (_STRING_CODE, "runs code from a string"))


def _name(node: ast.Name, flag) -> None:
    reason = next((why for names, why in _NAME_REASONS if node.id in names), None)
    if reason:
        flag(node, f"uses {node.id}: {reason}")


def _attribute(node: ast.Attribute, flag) -> None:
    attr, base = node.attr, ast.unparse(node.value)
    if attr in _IPYTHON_ATTRS and base not in ("np", "numpy", "torch", "self"):
        flag(node, f"uses .{attr}: reaches into IPython's or the grader's machinery")
    elif attr == "modules" and base == "sys":
        flag(node, "uses sys.modules: patching modules")
    elif attr in _CODE_ATTRS:
        flag(node, f"uses .{attr}: copies or reads function code")
    elif attr in _FRAME_ATTRS and (attr.startswith(("f_", "_")) or base in ("sys", "inspect",
                                                                            "gc", "traceback")):
        flag(node, f"uses {base}.{attr}: reaches into the interpreter")
    elif attr in _EXIT_ATTRS and base in ("os", "sys", "signal", "atexit"):
        flag(node, f"uses {base}.{attr}: ends the process or acts when it ends")
    elif attr == "register" and base == "atexit":
        flag(node, "uses atexit.register: acts when the process ends")
    elif attr in _PROCESS_ATTRS and base in ("os", *_PROCESS_NAMES):
        flag(node, f"uses {base}.{attr}: starts other processes")
    elif attr in _CHECK_ATTRS:
        flag(node, f"uses .{attr}: the checks' or the grader's internals")
    elif attr in _WRITABLE_ATTRS:
        flag(node, f"uses .{attr}: makes an array writable again (the checks make the caches "
                   "of forward passes read-only)")


def _literal_path(node) -> str | None:
    """The path a literal (or a Path("...") / pathlib.Path("...") of one) names, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("Path", "pathlib.Path") and \
            len(node.args) == 1:
        return _literal_path(node.args[0])
    return None


def _outside(path: str | None) -> bool:
    """Whether a path written to may lie outside the working folder (None: computed at run
    time, so it may)."""
    if path is None:
        return True
    return path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", path) is not None or \
        ".." in re.split(r"[/\\]", path)


def _call(node: ast.Call, flag) -> None:
    func = node.func
    name = ast.unparse(func)
    if name == "open" or name.endswith(".open"):
        mode = None
        if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            mode = node.args[1].value
        for keyword in node.keywords:
            if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant):
                mode = keyword.value.value
        if name.endswith(".open") and name != "os.open":
            target = _literal_path(func.value) if isinstance(func, ast.Attribute) else None
            mode = mode if mode is not None else (node.args[0].value if node.args and isinstance(
                node.args[0], ast.Constant) else None)
        else:
            target = _literal_path(node.args[0]) if node.args else None
        if isinstance(mode, str) and set(mode) & set("wax+") and _outside(target):
            flag(node, "writes a file outside the working folder" if target else
                       "writes a file whose path is computed at run time")
    elif isinstance(func, ast.Attribute) and func.attr in _WRITE_ATTRS and (
            _root(func) in ("os", "shutil", "np", "numpy", "torch")
            or func.attr in ("write_text", "write_bytes", "unlink", "rmtree", "touch",
                             "tofile", "symlink_to")):
        given = 1 if func.attr in _WRITE_SECOND else 0
        target = (_literal_path(node.args[given]) if len(node.args) > given else None) \
            if _root(func) in ("os", "shutil", "np", "numpy", "torch") else \
            _literal_path(func.value)
        if _outside(target):
            flag(node, f"{name}: changes files outside the working folder" if target else
                       f"{name}: changes files at a path computed at run time")


def scan_magics(source: str, where: str) -> list[Flag]:
    """Shell lines (``!cmd``) and magics that run shells, write files or load code."""
    found = []
    for k, line in enumerate(source.split("\n"), 1):
        text = line.strip()
        match = re.match(r"^(?:[\w.,\s\[\]]+=\s*)?(!|%%?)(\w*)", text)
        if not match:
            continue
        if match.group(1) == "!":
            found.append(Flag(where, k, "a shell command (!): starts other processes",
                              text[:200]))
        elif match.group(2) in _SHELL_MAGICS:
            found.append(Flag(where, k, f"the magic {match.group(1)}{match.group(2)}: shells, "
                                        "files or code from elsewhere", text[:200]))
    return found


def scan_notebook_cells(cells: list[tuple[str, str]]) -> list[Flag]:
    """The flags of a notebook's code cells, given as (where, source) pairs."""
    plain = [(where, python_source(source), source) for where, source in cells]
    imported = imported_names([p for _, p, _ in plain])
    found = []
    for where, python, source in plain:
        found += scan_magics(source, where)
        found += scan_python(python, where, imported)
    return found
