#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the MHA -> GQA/MQA trade-off study
# (`tiny` preset, about 11 minutes on 2 cores with the build) on the bundled tinyshakespeare. Re-running
# resumes and skips finished cells. Pass another preset as the first argument (small, paper).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-tiny}"
bash scripts/setup.sh
TAPELM_TARGET=tapelm bash scripts/build.sh
./build/tapelm sweep --preset "$preset" --data corpora/tinyshakespeare.txt --out "runs/sweep-$preset"
echo
echo "report: runs/sweep-$preset/report.md"
