"""A tune directory's files, rebuilt from its sweeps (no model runs): tune.json, schedule.json, tune.csv, tune.md
and tune.png. ``mtpbench report TUNE_DIR`` calls ``build``."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.files import csv_text, write_json, write_text
from mtpbench.tune.analyse import TuneRow, analyse
from mtpbench.tune.points import read_sweeps
from mtpbench.tune.reliable import facts, goodput_reasons, reasons
from mtpbench.tune.validate import read_validation


def is_tune_dir(out: Path) -> bool:
    return (Path(out) / "tune.json").is_file()


def build(out: Path) -> dict:
    """Rebuild every file of a tune directory from its sweeps; returns the answer (tune.json's ``result``)."""
    from mtpbench.tune.markdown import markdown
    from mtpbench.tune.plot import plot

    out = Path(out)
    try:
        saved = json.loads((out / "tune.json").read_text())
        config = saved["config"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise MtpBenchError(f"{out}/tune.json cannot be read as a tune ({e})") from None
    sweeps = read_sweeps(config["sources"] or [out / "sweeps"], config.get("mode"))
    slo = config.get("goodput")  # --goodput: the SLO to choose by beside tokens/s (null: none)
    result = analyse(sweeps, slo=slo)
    validation = read_validation(out, result)
    if validation:  # it may have measured the schedule where it gives k = 0 under its speculative config
        result = analyse(sweeps, validation, slo)
    result["validation"] = validation
    found = facts(result, sweeps.dirs)
    why = reasons(found)  # the answer carries its noise
    result["decision_reliable"], result["unreliable_because"] = not why, why
    if result.get("goodput"):  # and so does the answer by goodput
        why = goodput_reasons(found)
        result["goodput"]["decision_reliable"], result["goodput"]["unreliable_because"] = not why, why
    result["provenance"] = {key: sweeps.run.get("provenance", {}).get(key) for key in ("hardware", "versions", "date")}
    result["model"] = sweeps.run["config"].get("model")
    write_json(out / "tune.json", {"config": config, "result": result})
    write_json(out / "schedule.json", schedule_file(result))
    write_text(out / "tune.csv", csv_text(list(TuneRow.__dataclass_fields__), result["rows"]))
    write_text(out / "tune.md", markdown(result))
    plot(out / "tune.png", result)
    from mtpbench.html.pages import render
    from mtpbench.tune.page import page

    render(page, out)
    return result


def schedule_file(result: dict) -> dict:
    """schedule.json: vLLM's ranges of the per-load choices, the ready --speculative-config object of what to run
    (null: don't draft), the decision and, where the two differ, why."""
    return {"num_speculative_tokens_per_batch_size": result["schedule"],
            "speculative_config": result["speculative_config"], "decision": result["decision"],
            "decision_note": result["decision_note"], "decision_reliable": result.get("decision_reliable"),
            "unreliable_because": result.get("unreliable_because"),
            "unit": result["unit"], "model": result["model"],
            "note": None if result["unit"] == "batch" else
            "measured over concurrency: vLLM applies the ranges to the batch the scheduler runs, which a "
            "concurrency bounds from above"}
