"""The mutation score per module: runs ``mutmut results --all true`` in a directory where ``mutmut run`` has run
(the repository root, or a scratch clone whose [tool.mutmut] narrows only_mutate) and prints one row a mutated
module: mutants, killed, survived, no tests (no fast test calls the function), timeout, other (suspicious, skipped,
segfault, not checked...) and the killed share, killed / mutants (a timeout or an untested mutant counts against
it). docs/mutation.md records the measured rows.

    mutmut run --max-children 2                 # from the repository root: [tool.mutmut] in pyproject.toml
    python benchmarks/mutation_score.py [DIR] [--survivors]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

COLUMNS = ("killed", "survived", "no tests", "timeout")


def mutmut_command() -> str:
    """The mutmut beside this interpreter (the project's venv), else the one on PATH."""
    here = Path(sys.executable).parent / "mutmut"
    found = str(here) if here.exists() else shutil.which("mutmut")
    if found is None:
        sys.exit("mutation_score: no mutmut beside this Python or on PATH (pip install mutmut)")
    return found


def parse(text: str) -> dict[str, dict[str, str]]:
    """Module file -> {mutant: status} from ``mutmut results --all true`` lines ``    pkg.mod.x_func__mutmut_3: killed``
    (a method's mangled name, ``xǁClassǁmethod__mutmut_1``, has no dot of its own either)."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for line in text.splitlines():
        name, sep, status = line.strip().partition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        module = name.rsplit(".", 1)[0]
        out[module.replace(".", "/") + ".py"][name] = status.strip()
    return dict(out)


def table(results: dict[str, dict[str, str]]) -> list[str]:
    """A markdown table, one row a module and a total row."""
    rows = ["| module | mutants | killed | survived | no tests | timeout | other | killed share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    total: Counter = Counter()

    def row(name: str, c: Counter, n: int) -> str:
        other = n - sum(c[k] for k in COLUMNS)
        share = f"{100 * c['killed'] / n:.1f} %" if n else "-"
        return f"| {name} | {n} | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {other} | {share} |"

    for module in sorted(results):
        c = Counter(results[module].values())
        total += c
        rows.append(row(module, c, len(results[module])))
    if len(results) > 1:
        rows.append(row("all", total, sum(total.values())))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=".", help="where mutmut ran (default: here)")
    ap.add_argument("--survivors", action="store_true", help="also list each surviving or untested mutant")
    args = ap.parse_args()
    where = Path(args.dir).resolve()
    if not (where / "mutants").is_dir():
        sys.exit(f"mutation_score: no mutants/ in {where}: run `mutmut run` there first")
    done = subprocess.run([mutmut_command(), "results", "--all", "true"], cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mutation_score: mutmut results failed in {where}: {done.stderr.strip().splitlines()[-1:]}")
    results = parse(done.stdout)
    if not results:
        sys.exit(f"mutation_score: mutmut results in {where} listed no mutants")
    print("\n".join(table(results)))
    if args.survivors:
        for module in sorted(results):
            for name, status in results[module].items():
                if status != "killed":
                    print(f"{status}: {name}  (mutmut show {name})")


if __name__ == "__main__":
    main()
