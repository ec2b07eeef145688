"""The fast tier stays fast: tests/unit collects with torch and vLLM made unimportable (a module that imports
either at its top, here or in conftest, fails the collection)."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BLOCK = "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"


def test_the_unit_tier_collects_without_torch_or_vllm(tmp_path):
    (tmp_path / "block_heavy.py").write_text(BLOCK)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "block_heavy", "--collect-only", "-q",
                        "-p", "no:cacheprovider", str(TESTS / "unit")],
                       capture_output=True, text=True, cwd=TESTS.parent,
                       env={**os.environ, "PYTHONPATH": path})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " collected" in r.stdout or "tests collected" in r.stdout, r.stdout[-500:]
