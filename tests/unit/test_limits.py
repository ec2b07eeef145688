"""The package's shape, kept by a test: no import circle among mtpbench's modules (imports inside functions
count), no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES lines. Read from the source
with ``ast``; nothing is imported.

``DEBT`` names what is over a limit today: the restructuring of issue 24 takes each entry out as it splits the
module or function, and an entry may only shrink (a debt that grew, or one paid off but still listed, fails).
``EXCEPTIONS`` is for what stays over a limit on purpose, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mtpbench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

EXCEPTIONS: dict[str, str] = {}
# module or module:function -> its size when it was listed; issue 24's restructuring paid every entry off: keep it
# empty (an entry here is debt to pay, not a way around the limits; a justified one goes in EXCEPTIONS)
DEBT: dict[str, int] = {}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # "mtpbench.x.y" where y is a name in module mtpbench.x
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def sizes(root: Path) -> dict[str, int]:
    """Lines of every module, and of every function (``module:function``, decorators included)."""
    out = {}
    for name, path in modules(root).items():
        text = path.read_text()
        out[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                key = f"{name}:{node.name}"
                out[key] = max(out.get(key, 0), node.end_lineno - start + 1)
    return out


def over_limits(root: Path) -> dict[str, int]:
    return {k: n for k, n in sizes(root).items() if n > (MAX_FUNCTION_LINES if ":" in k else MAX_MODULE_LINES)}


def import_circles(root: Path) -> list[list[str]]:
    mods = modules(root)
    return circles({name: imports(name, path, set(mods)) for name, path in mods.items()})


def test_no_import_circle():
    assert import_circles(PACKAGE) == []


def test_no_module_or_function_over_its_limit_beyond_the_named_debt():
    over = over_limits(PACKAGE)
    new = {k: n for k, n in over.items() if k not in DEBT and k not in EXCEPTIONS}
    assert not new, f"over the limits ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function): {new}"
    grown = {k: (DEBT[k], n) for k, n in over.items() if k in DEBT and n > DEBT[k]}
    assert not grown, f"listed debt that grew (listed, now): {grown}"
    paid = sorted(k for k in DEBT if k not in over)
    assert not paid, f"within the limits now, take them out of DEBT: {paid}"


def test_the_checks_find_a_planted_circle_and_a_planted_long_module(tmp_path):
    pkg = tmp_path / "mtpbench"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from mtpbench.sub import b\n    return b\n")  # inside a function
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")  # relative
    (pkg / "c.py").write_text("from mtpbench import a\n")
    assert import_circles(pkg) == [["mtpbench.a", "mtpbench.sub.b"]]
    (pkg / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (pkg / "fn.py").write_text("def g():\n" + "    pass\n" * MAX_FUNCTION_LINES)
    assert over_limits(pkg) == {"mtpbench.long": MAX_MODULE_LINES + 1, "mtpbench.fn:g": MAX_FUNCTION_LINES + 1}
    (pkg / "long.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert "mtpbench.long" not in over_limits(pkg)
