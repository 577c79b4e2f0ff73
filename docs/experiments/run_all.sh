#!/bin/sh
# The runs behind docs/notes-kernel-oom.md (about 6 minutes on 2 cores). Run as root from the
# repository root; every run uses its own child cgroup (1 GiB) and removes it afterwards.
set -e
PY=${PYTHON:-/work/main/.venv/bin/python}
D=docs/experiments/results
export PYTHONPATH=src
$PY docs/experiments/oom_driver.py worker --runs 6 --sleep-item 0.05 --out $D/A-worker-grows-main-waits.json
$PY docs/experiments/oom_driver.py worker --runs 6 --sleep-item 0 --compute 5 --out $D/B-worker-grows-main-busy.json
$PY docs/experiments/oom_driver.py worker --runs 5 --sleep-item 0 --compute 5 --loader-thread --out $D/C-worker-grows-loader-thread.json
$PY docs/experiments/oom_driver.py main --runs 5 --sleep-item 0.05 --out $D/D-main-grows.json
