"""A sweep over running servers (``sweep --server A --server B ...``): each attached server already serves its own k
(read from the server: its speculative config), and their points, at every load, make one sweep in one directory,
as if one engine had been restarted at each k. The way people with one pool of GPUs and no restart rights measure:
start (or find) one deployment per k, point mtpbench at all of them.

Every server is read before anything is written; two that serve the same k, or servers of different models, are
refused in one line (their points would be one point twice, or no sweep at all). The k = 0 server, where one is
given, is every other point's baseline (speedup), as in any sweep. Each point file names the server it measured.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mtpbench.backends import get_backend
from mtpbench.config import SweepConfig, execution, validate
from mtpbench.environment import environment, provenance
from mtpbench.errors import MtpBenchError
from mtpbench.files import make_out_dir, write_json
from mtpbench.prompts import run_prompts


def read_servers(cfg: SweepConfig) -> list[tuple[str, object, dict]]:
    """(URL, its started backend, what it said of itself) for every --server, in the order given; the backends stay
    attached (the caller closes them). Refuses two servers at one k and servers of different models."""
    attached: list[tuple[str, object, dict]] = []
    try:
        for url in cfg.servers:
            backend = get_backend("vllm-server")
            attached.append((url, backend, {}))
            attached[-1] = (url, backend, backend.start(replace(cfg, server=url, k=())))
    except BaseException:
        close(attached)
        raise
    problem = conflict([(url, facts.get("k"), facts.get("model")) for url, _, facts in attached])
    if problem:
        close(attached)
        raise MtpBenchError(problem)
    return attached


def conflict(servers: list[tuple[str, int | None, str | None]]) -> str | None:
    """Why (URL, k, model) servers cannot make one sweep, or None."""
    by_k: dict = {}
    for url, k, _ in servers:
        if k in by_k:
            return (f"--server {by_k[k]} and {url} both serve k = {k}: one sweep measures each k once (give each k's "
                    f"server once)")
        by_k[k] = url
    models = {model for _, _, model in servers if model}
    if len(models) > 1:
        return f"the servers serve different models ({', '.join(sorted(models))}): one sweep compares k on one model"
    return None


def close(attached) -> None:
    for _, backend, _ in attached:
        backend.close()


def run_servers(cfg: SweepConfig, on_point=None, say=None) -> list:
    """Measure every point of every attached server into ``cfg.out``, then build the sweep's files; its rows."""
    from mtpbench.stats.judge import ALPHA, law_family
    from mtpbench.sweep.report import build
    from mtpbench.sweep import store
    from mtpbench.sweep.rounds import family_of
    from mtpbench.sweep.run import grid, run_one

    validate(cfg, None)
    if cfg.k:
        raise MtpBenchError("--k: several --server are each measured at the k they serve; leave --k out")
    pset = run_prompts(cfg)
    out = Path(cfg.out)
    prov = provenance()
    fp = store.sweep_fingerprint(cfg.to_json(), prov["versions"], pset.describe()["sha256"])
    store.tell(store.claim(out, fp, [], cfg.replace, attached=True, force=cfg.force), cfg.out, say)  # attached points: never reused
    attached = read_servers(cfg)
    try:
        plan = [(url, backend, replace(cfg, server=url), facts) for url, backend, facts in
                sorted(attached, key=lambda a: a[2].get("k") or 0)]
        points = [(url, backend, c, p) for url, backend, c, facts in plan for p in grid(c, None, facts.get("k"))]
        make_out_dir(out)
        law_fam = law_family(p.k for *_, p in points) if cfg.law else None  # one family across every server's points
        write_json(out / "run.json", {"config": cfg.to_json(), "provenance": prov,
                                      "engine": {**plan[0][3], "servers": {u: f for u, _, _, f in plan}},
                                      "prompts": pset.describe(), "fingerprint": fp,
                                      "execution": execution(cfg.to_json()),
                                      "judge": {"family": family_of([p for *_, p in points]), "looks": 1,
                                                "alpha": ALPHA, **({"law_family": law_fam} if law_fam else {})}})
        for i, (url, backend, c, point) in enumerate(points):
            if on_point:
                on_point(i, len(points), f"{point.name} ({url})")
            run_one(c, backend, point, pset.prompts, out, fp, law_fam=law_fam)
            path = out / f"{point.name}.json"
            if path.is_file():  # which server measured it
                write_json(path, {**json.loads(path.read_text()), "server": url})
        run = json.loads((out / "run.json").read_text())
        run["provenance"]["load_average_end"] = environment()["load_average"]
        write_json(out / "run.json", run)
    finally:
        close(attached)
    if on_point:
        on_point(1, 1, "report")
    return build(out)
