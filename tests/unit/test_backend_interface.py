"""One declared backend interface, kept by a test: outside ``mtpbench/backends/`` nothing asks a backend what it
has (``getattr``/``hasattr`` on a backend: what it offers is declared in ``backends.BackendBase``), and outside
``backends/`` and the CLI nothing branches on a backend's name (``cfg.backend == "vllm"``: the static facts are in
``backend_info.info(name)``), so a new backend is one registry entry plus one class. Read with ``ast``; nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mtpbench"
PROBES = ("getattr", "hasattr", "setattr", "delattr")


def _is_backend(node: ast.AST) -> bool:
    """``backend``, ``self.backend``, ``e.backend``, ``cfg.backend`` ..."""
    return (isinstance(node, ast.Name) and node.id == "backend") or \
        (isinstance(node, ast.Attribute) and node.attr == "backend")


def _is_literal(node: ast.AST) -> bool:
    """A string, or a tuple/list/set holding one: the backend names written out."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return False


def probes(tree: ast.AST) -> list[int]:
    """Lines where getattr/hasattr/setattr/delattr is called on a backend."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in PROBES and n.args and _is_backend(n.args[0])]


def name_branches(tree: ast.AST) -> list[int]:
    """Lines comparing a backend (its name) with a string literal: ``cfg.backend == "vllm"``,
    ``backend in ("vllm", "vllm-server")``."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(_is_backend(s) for s in sides) and any(_is_literal(s) for s in sides):
                found.append(n.lineno)
    return found


def violations(root: Path) -> dict[str, list[str]]:
    """``{"probes": [...], "names": [...]}``, each entry ``path:line``."""
    out: dict[str, list[str]] = {"probes": [], "names": []}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        in_backends = rel.startswith("backends/")
        in_cli = rel == "cli.py" or rel.startswith("cli/")
        if rel.startswith("shims/"):
            continue  # stand-ins for third-party packages: a ``target.backend`` there is triton's, not ours
        tree = ast.parse(path.read_text())
        if not in_backends:
            out["probes"] += [f"{rel}:{line}" for line in sorted(set(probes(tree)))]
        if not (in_backends or in_cli):
            out["names"] += [f"{rel}:{line}" for line in sorted(set(name_branches(tree)))]
    return out


def test_no_getattr_or_hasattr_on_a_backend_outside_backends():
    found = violations(PACKAGE)["probes"]
    assert not found, f"declare it in backends.BackendBase instead of probing for it: {found}"


def test_no_branch_on_a_backend_name_outside_backends_and_the_cli():
    found = violations(PACKAGE)["names"]
    assert not found, f"ask backend_info.info(name) for the fact instead of comparing names: {found}"


def test_the_checks_find_planted_probes_and_name_branches(tmp_path):
    pkg = tmp_path / "mtpbench"
    (pkg / "backends").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "a.py").write_text("def f(backend, cfg, e, self):\n"
                              "    if hasattr(backend, 'x'):\n"
                              "        return getattr(self.backend, 'y', None)\n"
                              "    if cfg.backend == 'vllm' or e.backend not in ('native', 'vllm'):\n"
                              "        return 1\n"
                              "    return backend != 'native'\n")
    (pkg / "b.py").write_text("def g(cfg, backend):\n"
                              "    return backend.dtype_name, getattr(cfg, 'k'), cfg.backend == cfg.other\n")
    (pkg / "backends" / "x.py").write_text("def h(backend):\n    return getattr(backend, 'z', backend == 'v')\n")
    (pkg / "cli" / "m.py").write_text("def c(backend):\n    return backend in (None, 'vllm-server')\n")
    (pkg / "shims").mkdir()
    (pkg / "shims" / "t.py").write_text("def s(target):\n    return target.backend == 'cpu'\n")
    (pkg / "cli.py").write_text("def c(backend):\n    return getattr(backend, 'q'), backend == 'vllm'\n")
    assert violations(pkg) == {"probes": ["a.py:2", "a.py:3", "cli.py:2"],
                               "names": ["a.py:4", "a.py:6"]}
