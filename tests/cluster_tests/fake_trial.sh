#!/bin/sh
# A stand-in trial for the shared-study tests: fake_trial.sh LAYOUT SLEEP_S (cwd: trial folder).
# Records the worker, sleeps, then prints a throughput that depends only on the layout.
echo "${WORKER:-unknown}" > worker
sleep "$2"
sum=$(printf '%s' "$1" | cksum | cut -d ' ' -f 1)
echo "{\"tokens_per_s\": $((1000 + sum % 1000))}"
