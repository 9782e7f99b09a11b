#!/bin/sh
# A stand-in trial for the shared-study tests: fake_trial.sh LAYOUT SLEEP_S (cwd: trial folder).
# Records the worker, sleeps, then prints a throughput that depends only on the layout.
# A finished trial creates the file MARK_DONE (when set); once it exists, later trials of the
# same worker also wait (at most 300 s) for the file HOLD_UNTIL (when set).
echo "${WORKER:-unknown}" > worker
sleep "$2"
if [ -n "${HOLD_UNTIL:-}" ] && [ -e "${MARK_DONE:-/nonexistent}" ]; then
  waited=0
  while [ ! -e "$HOLD_UNTIL" ] && [ "$waited" -lt 1500 ]; do sleep 0.2; waited=$((waited + 1)); done
fi
sum=$(printf '%s' "$1" | cksum | cut -d ' ' -f 1)
echo "{\"tokens_per_s\": $((1000 + sum % 1000))}"
if [ -n "${MARK_DONE:-}" ]; then touch "$MARK_DONE"; fi
