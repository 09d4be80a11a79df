#!/usr/bin/env bash
# Run kineto-comm on a training job's traces in CI: write every report format, annotate the
# run, and fail on findings at or above FAIL_ON or on a regression against a baseline.
#
# usage: kineto-comm-ci.sh TRACES_DIR OUT_DIR [BASELINE]
#   TRACES_DIR  the rank traces the job wrote (one file per rank)
#   OUT_DIR     where report.{json,sarif,html,md,xml} and diff.{txt,json} go
#   BASELINE    optional: a saved report.json (or a traces directory) to compare against
# environment:
#   KINETO_COMM     command to run (default: kineto-comm; tests use "python -m kineto_comm.cli")
#   FAIL_ON         info|warning|error: findings at or above fail the job (default: error)
#   MAX_REGRESSION  allowed mean step time growth over the baseline (default: 5%)
#   FAIL_ON_NEW     fail on new findings at or above this severity (default: never)
# exit: 0 pass; 1 findings at/above FAIL_ON or a regression gate exceeded; 2 tool/input error
# (a trace file left out, unreadable or of another job, included: report --strict).
set -uo pipefail

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 TRACES_DIR OUT_DIR [BASELINE]" >&2
    exit 2
fi
traces=$1
out=$2
baseline=${3:-}
read -r -a kc <<< "${KINETO_COMM:-kineto-comm}"
mkdir -p "$out"

# One analysis, all formats: annotations to stdout, the rest to files.
"${kc[@]}" report "$traces" --strict --format github --fail-on "${FAIL_ON:-error}" \
    --also "json=$out/report.json" --also "sarif=$out/report.sarif" \
    --also "html=$out/report.html" --also "markdown=$out/report.md" \
    --also "junit=$out/report.xml"
report_rc=$?
if [ "$report_rc" -ge 2 ]; then
    echo "error: kineto-comm report failed (exit $report_rc)" >&2
    exit "$report_rc"
fi

diff_rc=0
if [ -n "$baseline" ]; then
    "${kc[@]}" diff "$baseline" "$out/report.json" \
        --max-regression "${MAX_REGRESSION:-5%}" --fail-on-new "${FAIL_ON_NEW:-never}" \
        --format json --output "$out/diff.json"
    diff_rc=$?
    if [ "$diff_rc" -ge 2 ]; then
        echo "error: kineto-comm diff failed (exit $diff_rc)" >&2
        exit "$diff_rc"
    fi
    "${kc[@]}" diff "$baseline" "$out/report.json" --max-regression "${MAX_REGRESSION:-5%}" \
        --fail-on-new "${FAIL_ON_NEW:-never}" --output "$out/diff.txt" --exit-zero
    cat "$out/diff.txt"
fi

if [ "$report_rc" -ne 0 ] || [ "$diff_rc" -ne 0 ]; then
    exit 1
fi
exit 0
