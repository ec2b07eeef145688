"""al_histogram.png's line is the AL the table reports (pooled), not the mean of per-request ALs."""

import json
from dataclasses import asdict

from mtpbench.sweep.load import load_run
from mtpbench.sweep.plots import histogram_panels
from mtpbench.sweep.report import build
from mtpbench.config import SweepConfig, fingerprint
from mtpbench.metrics import BatchRecord, GridPoint, RequestRecord, request_acceptance


def test_the_histogram_line_is_the_reported_acceptance_length(tmp_path):
    # one short request that accepted both drafts of its one step (AL 3) and one long one that accepted
    # nothing in 9 steps (AL 1): the mean of the two is 2, the reported AL 1 + 2 / 10 = 1.2
    reqs = [RequestRecord("c", 5, [1] * 3, 0.01, 0.1, prompt_id="short", **request_acceptance(2, [2])),
            RequestRecord("c", 5, [1] * 9, 0.01, 0.1, prompt_id="long", **request_acceptance(2, [0] * 9))]
    batch = BatchRecord("c", 1.0, 10, 20, 2, [1, 1])
    cfg, versions = SweepConfig().to_json(), {"mtpbench_code": "c0de"}
    fp = fingerprint(cfg, versions)
    (tmp_path / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": versions},
                                                   "fingerprint": fp}))
    (tmp_path / "chain-L1-k2.json").write_text(json.dumps(
        {"point": GridPoint("chain", 2, 1).to_json("native"), "fingerprint": fp, "requests": [asdict(r) for r in reqs],
         "batches": [asdict(batch)], "repeats": []}))
    rows = build(tmp_path)
    (point, als, al), = histogram_panels(load_run(tmp_path)[1], rows)
    assert sorted(als) == [1.0, 3.0] and sum(als) / len(als) == 2.0
    assert al == rows[0].acceptance_length == 1.2
    assert (tmp_path / "al_histogram.png").stat().st_size > 1000
