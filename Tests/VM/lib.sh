# Sourced by the scripts that run inside the VM (bluez-test.sh, unit-test.sh): what both print
# and wait with. Each sets W (its work directory), OUT (the host's log directory), T0 and pids
# before, and defines fail() (what it dumps differs).

elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%5.1fs", b-a}'; }
step() { echo "[$(elapsed)] $*"; }
pass() { echo "[$(elapsed)] PASS: $*"; }
# The last lines of every log, for a FAIL.
show_logs() { for f in "$W"/*.log; do echo "---- $(basename "$f") (last 25 lines)"; tail -25 "$f"; done; }
# Stops what the test started, keeps its logs on the host, exits with $1.
finish() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  cp "$W"/*.log "$OUT"/ 2>/dev/null
  exit "$1"
}
mg() { script -qec "btmgmt $*" /dev/null | tr -d '\r'; }   # btmgmt prints nothing without a tty
# The retained message on topic $1, or nothing after $2 seconds.
retained() { mosquitto_sub -h 127.0.0.1 -t "$1" -C 1 -W "$2" 2>/dev/null; }
# Waits up to $2 s for the retained message on $1 to match the regex $3; prints the last one seen.
wait_retained() {
  local end=$((SECONDS + $2)) msg=""
  while [ $SECONDS -lt $end ]; do
    msg=$(retained "$1" 2)
    if [[ "$msg" =~ $3 ]]; then echo "$msg"; return 0; fi
    sleep 0.3
  done
  echo "$msg"
  return 1
}
