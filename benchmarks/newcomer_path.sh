#!/usr/bin/env bash
# A newcomer's first hour as tests/test_first_hour.py::test_a_newcomers_path walks it, printed for
# docs/first-hour.md: the main job, a rerun into the same folder, other settings (refused into the first's folder), the
# same sweep again beside it, compare, report, and help at 80 columns through a pipe. Run from an empty directory with
# mtpbench installed: bash benchmarks/newcomer_path.sh. Name the CPU (lscpu) beside what it prints.
set -u
run() { echo "\$ mtpbench $*"; mtpbench "$@" 2>&1; echo "[exit $?]"; echo; }
lscpu | grep -m1 "Model name"
run sweep
run sweep
run sweep --max-tokens 64
run sweep --out second
run compare results second --out cmp
run report results
echo "\$ mtpbench sweep -h | head -30"; mtpbench sweep -h | head -30
echo "\$ mtpbench sweep -h | wc -l"; mtpbench sweep -h | wc -l
