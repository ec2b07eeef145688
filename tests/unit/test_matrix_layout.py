"""matrix.md's first line says the engines' layout where they have several ranks, and only then; matrix.json keeps
the layout's four keys (not gpu_memory_utilization, which is not a layout)."""

from __future__ import annotations

import json

import pytest

from mtpbench.matrix.report import layout_text, write_matrix


def test_the_layout_is_said_only_for_engines_with_several_ranks():
    assert layout_text(None) == layout_text({}) == ""
    assert layout_text({"tensor_parallel_size": 1, "distributed_executor_backend": "mp"}) == ""
    assert layout_text({"gpu_memory_utilization": 0.5}) == ""
    assert layout_text({"tensor_parallel_size": 2, "distributed_executor_backend": "mp",
                        "gpu_memory_utilization": 0.5}) == ", each at tensor parallel 2, executor mp, every rank traced"
    assert layout_text({"tensor_parallel_size": 1, "pipeline_parallel_size": 2}) == \
        ", each at pipeline parallel 2, every rank traced"


@pytest.mark.filterwarnings("ignore:Attempting to set identical")  # the picture of no cells
def test_matrix_json_keeps_the_layout_and_nothing_else(tmp_path):
    write_matrix(tmp_path, [], "test", 1.0, 1, layout={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5},
                 saved_provenance={})
    assert json.loads((tmp_path / "matrix.json").read_text())["layout"] == {"tensor_parallel_size": 2}
    assert "each at tensor parallel 2, every rank traced" in (tmp_path / "matrix.md").read_text()
