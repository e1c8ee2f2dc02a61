#!/bin/bash
# Runs INSIDE the VM (scripts/vm/test starts it; docs/vm.md): the gateway, `baton device` and
# `baton continue` against the real Linux Bluetooth stack. btvirt has joined four LE
# controllers: hci0 is the hall gateway's (scanner, L2CAP central), hci1 the device's
# (advertiser, L2CAP peripheral), hci2 the phone's (`baton continue`: scanner, L2CAP central),
# hci3 the office gateway's (re-advertises the hall's activity for the phone, docs/relay.md §9).
# Every check prints PASS or FAIL with what a user would look at; the first FAIL ends the test.
#
# Environment: BATON (the baton binary), VMTEST_OUT (a host directory for the logs), BATON_TESTS
# (optional: the host's test bundle, whose Bluetooth-aware unit tests run here first).
set -u
BATON="${BATON:?BATON names the baton binary}"
# The gateways run the firmware when scripts/vm/test is given one (docs/firmware.md): the
# Embedded Swift build against the real kernel stack; the other commands are the toolbox's.
GATEWAY="${BATON_GATEWAY:-$BATON}"
OUT="${VMTEST_OUT:-/tmp/vmtest}"
W=/tmp/vmtest
mkdir -p "$W" "$OUT"
T0=$(date +%s.%N)
PREFIX=baton
BROKER=mqtt://127.0.0.1:1883
DEVICE=5a123456789a          # the device's fixed id (open group: docs/protocol.md §2.4)
TOPIC=$PREFIX/activities/$DEVICE
pids=()

. "$(dirname "$0")/lib.sh"
fail() {
  echo "[$(elapsed)] FAIL: $*"
  show_logs
  echo "---- dmesg (Bluetooth)"; dmesg | grep -i bluetooth | tail -10
  finish 1
}

# The retained activity, or nothing after $1 seconds.
activity() { retained "$TOPIC" "$1"; }
# Waits up to $1 s for the retained activity to match the regex $2; prints the last message seen.
wait_activity() { wait_retained "$TOPIC" "$1" "$2"; }
# Waits up to $1 s for the topic to have no retained message (cleared).
wait_cleared() {
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    [ -z "$(activity 1)" ] && return 0
    sleep 0.3
  done
  return 1
}

# btvirt (BlueZ 5.66, emulator/btdev.c ACL_HANDLE 42) gives every connection of a controller
# the same handle, so a controller carries one LE connection at a time: a second peer's
# connection is refused by the kernel ("hciN: failed to register connection device", dmesg) and
# its data goes astray. A real controller has many. So before a link from another controller,
# wait until the last one's connection is gone: the kernel drops an LE connection 2 s after its
# last channel closed (HCI_DISCONN_TIMEOUT), a gateway closes an idle fetch link after
# relay.link-idle (10 s). `hcitool con` is HCIGETCONNLIST.
wait_unlinked() {  # controller, seconds
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    hcitool -i "$1" con 2>/dev/null | grep -q handle || return 0
    sleep 0.3
  done
  return 1
}

start_gateway() {  # [extra gateway options]
  "$GATEWAY" gateway --broker "$BROKER" --radio hci0 --room Hall --id hall "$@" >>"$W/gateway.log" 2>&1 &
  GW=$!
  pids+=("$GW")
}
stop_gateway() {
  kill -TERM "$GW" 2>/dev/null
  wait "$GW" 2>/dev/null
}

PHONE=hci2      # the continuing device's controller (baton continue)
OFFICE=hci3     # the second gateway's controller (re-advertising)
step "controllers: $(hciconfig | grep -c '^hci') (kernel $(uname -r))"
A1=$(hciconfig hci1 | awk '/BD Address/{print $3}')
[ -n "$A1" ] || fail "hci1 has no address"
A3=$(hciconfig $OFFICE | awk '/BD Address/{print $3}')
[ -n "$A3" ] || fail "$OFFICE has no address (btvirt made $(hciconfig | grep -c '^hci') controllers)"
for h in hci0 hci1 $PHONE $OFFICE; do mg -i $h power on >/dev/null; done

if [ -n "${BATON_TESTS:-}" ]; then
  # The unit tests that take the other branch with Bluetooth in the kernel (hci99 is not found,
  # the kernel answers Invalid Index, ...): run from the host's build, here.
  step "unit tests that ask this kernel about Bluetooth"
  "$BATON_TESTS" --testing-library swift-testing \
    --filter 'RadioBlueZTests|ManagementTests|L2CAPListenerTests|DeviceCommandTests|DeviceLinkTests|DeviceLinkAdoptTests|ContinueCommandTests/onThisKernel' \
    >"$W/unit-tests.log" 2>&1 || fail "unit tests failed with Bluetooth in the kernel: $(grep -E '✘' "$W/unit-tests.log" | head -5)"
  pass "$(grep -E 'Test run with' "$W/unit-tests.log" | sed 's/\x1b\[[0-9;]*m//g')"
fi

step "mosquitto on the VM's loopback"
cat >"$W/mosquitto.conf" <<EOF
listener 1883 127.0.0.1
allow_anonymous true
persistence false
user root
EOF
mosquitto -c "$W/mosquitto.conf" >"$W/mosquitto.log" 2>&1 &
pids+=($!)
for i in $(seq 1 50); do mosquitto_pub -h 127.0.0.1 -t vmtest/ping -m x 2>/dev/null && break; sleep 0.1; done
mosquitto_pub -h 127.0.0.1 -t vmtest/ping -m x || fail "mosquitto does not accept connections"

step "gateway on hci0"
start_gateway

step "device on hci1 ($A1): baton device"
echo '{"position": 42, "chapter": "three"}' >"$W/info.json"
mkfifo "$W/device.ctl"
"$BATON" device --adapter hci1 --type com.example.reader.article --title "Chapter 3" \
  --url https://example.com/chapter-3 --user-info "$W/info.json" --id "$DEVICE" --group a1b2c3d4 \
  --sequence 7 <"$W/device.ctl" >"$W/device.log" 2>&1 &
DEV=$!
pids+=("$DEV")
exec 3>"$W/device.ctl"   # the device's stdin: one command a line (save, end)

msg=$(wait_activity 30 '"seq":7[,}]') || fail "no retained activity with seq 7 on $TOPIC within 30 s (last: ${msg:-nothing})"
for want in "\"device\":\"$DEVICE\"" '"room":"Hall"' '"group":"a1b2c3d4"' '"supports_streams":true' '"has_web_url":true' \
            '"type_hash":"be9b4bb7"'; do
  [[ "$msg" == *"$want"* ]] || fail "the activity lacks $want: $msg"
done
[[ "$msg" =~ \"psm\":(12[89]|1[3-9][0-9]|2[0-5][0-9])[,}] ]] || fail "the activity names no dynamic LE PSM: $msg"
pass "the gateway published the device's activity: $msg"

step "save: the sequence goes up"
echo '{"position": 43, "chapter": "three"}' >"$W/info.json"
echo save >&3
msg=$(wait_activity 20 '"seq":8[,}]') || fail "a save did not bump the sequence to 8 (last: ${msg:-nothing})"
[[ "$msg" == *'"change":"saved"'* ]] || fail "the change is not \"saved\": $msg"
pass "after a save the broker has seq 8, change saved"

step "fetch through the gateway: the payload over a real L2CAP CoC"
python3 -c 'import sys, cbor2
sys.stdout.buffer.write(cbor2.dumps({0: 1, 1: "com.example.reader.article", 2: "Chapter 3",
  3: cbor2.CBORTag(32, "https://example.com/chapter-3"), 5: {"position": 43, "chapter": "three"}}, canonical=True))' \
  >"$W/expected.cbor" || fail "python3-cbor2 could not encode the expected payload"
timeout 30 "$BATON" fetch "$DEVICE" --broker "$BROKER" --cbor --timeout 20 >"$W/fetched.cbor" 2>"$W/fetch.log" ||
  fail "baton fetch failed (exit $?): $(cat "$W/fetch.log")"
cmp -s "$W/expected.cbor" "$W/fetched.cbor" ||
  fail "the fetched payload differs from the device's: got $(od -An -tx1 "$W/fetched.cbor" | tr -d '\n'), want $(od -An -tx1 "$W/expected.cbor" | tr -d '\n')"
pass "baton fetch --cbor returned the exact $(stat -c %s "$W/expected.cbor") payload bytes (Python cbor2 encodes the same)"

step "continued: the device is told where"
timeout 30 "$BATON" fetch "$DEVICE" --broker "$BROKER" --timeout 20 --continue "Office TV" >"$W/fetched.json" 2>>"$W/fetch.log" ||
  fail "baton fetch --continue failed (exit $?): $(cat "$W/fetch.log")"
for i in $(seq 1 50); do grep -q '^continued in Office TV (seq 8)' "$W/device.log" && break; sleep 0.2; done
grep -q '^continued in Office TV (seq 8)' "$W/device.log" || fail "baton device did not hear that it was continued in Office TV"
pass "baton device printed: $(grep '^continued in' "$W/device.log")"

step "stream: 1 MiB each way through the gateway and the device's echo"
head -c 1048576 /dev/urandom >"$W/up.bin"
t=$SECONDS
timeout 120 "$BATON" stream "$DEVICE" --broker "$BROKER" <"$W/up.bin" >"$W/down.bin" 2>"$W/stream.log" ||
  fail "baton stream failed (exit $?): $(cat "$W/stream.log")"
up=$(sha256sum <"$W/up.bin" | cut -d' ' -f1); down=$(sha256sum <"$W/down.bin" | cut -d' ' -f1)
[ "$up" = "$down" ] || fail "the echo differs: sent sha256 $up, got $down ($(stat -c %s "$W/down.bin") bytes)"
pass "1 MiB up and its echo down in $((SECONDS - t)) s, sha256 $up both ways"

step "phone: baton continue on $PHONE finds the device's beacon and fetches over its own L2CAP CoC"
wait_unlinked hci1 20 || fail "the gateway's links to the device did not end within 20 s: $(hcitool -i hci1 con)"
timeout 30 "$BATON" continue "$DEVICE" --adapter $PHONE --timeout 20 >"$W/continued.json" 2>"$W/continue.log" ||
  fail "baton continue failed (exit $?): $(cat "$W/continue.log")"
grep -q "^found $DEVICE at $A1 (public) psm 0x00[89A-F][0-9A-F] seq 8\$" "$W/continue.log" ||
  fail "baton continue did not say it found the device's own beacon at $A1: $(cat "$W/continue.log")"
cmp -s "$W/fetched.json" "$W/continued.json" ||
  fail "baton continue printed $(cat "$W/continued.json"), baton fetch through the gateway $(cat "$W/fetched.json")"
timeout 30 "$BATON" continue "$DEVICE" --adapter $PHONE --timeout 20 --cbor >"$W/continued.cbor" 2>>"$W/continue.log" ||
  fail "baton continue --cbor failed (exit $?): $(cat "$W/continue.log")"
cmp -s "$W/expected.cbor" "$W/continued.cbor" || fail "baton continue --cbor differs from the device's payload: $(od -An -tx1 "$W/continued.cbor" | tr -d '\n')"
pass "$(head -1 "$W/continue.log"); it printed what baton fetch prints, and --cbor the exact bytes"

step "phone: baton continue --stream, 64 KiB each way straight to the device"
head -c 65536 /dev/urandom >"$W/phone-up.bin"
t=$SECONDS
timeout 60 "$BATON" continue "$DEVICE" --adapter $PHONE --stream --timeout 20 <"$W/phone-up.bin" >"$W/phone-down.bin" 2>"$W/continue-stream.log" ||
  fail "baton continue --stream failed (exit $?): $(cat "$W/continue-stream.log")"
up=$(sha256sum <"$W/phone-up.bin" | cut -d' ' -f1); down=$(sha256sum <"$W/phone-down.bin" | cut -d' ' -f1)
[ "$up" = "$down" ] || fail "the device's echo to the phone differs: sent sha256 $up, got $down ($(stat -c %s "$W/phone-down.bin") bytes)"
pass "64 KiB up from the phone and the device's echo down in $((SECONDS - t)) s, sha256 $up both ways"

step "save after the links: the gateway still hears the device"
# To connect, the kernel turned the gateway's scan off and left it off (docs/radio.md):
# RadioBlueZ must have set it again, or this save is never heard.
echo save >&3
msg=$(wait_activity 20 '"seq":9[,}]') || fail "a save after the fetch and the stream was not heard (last: ${msg:-nothing})"
pass "after the links a save still reaches the broker: seq 9"

step "gateway restart: the activity is published again"
stop_gateway
mosquitto_pub -h 127.0.0.1 -t "$TOPIC" -r -n   # clear it, so only a new publish can bring it back
[ -z "$(activity 1)" ] || fail "could not clear the retained activity before the restart"
start_gateway
msg=$(wait_activity 30 '"seq":9[,}]') || fail "the restarted gateway did not publish the activity again (last: ${msg:-nothing})"
pass "the restarted gateway republished seq 9"

step "end: the activity is invalidated and the topic cleared"
echo end >&3
wait_cleared 20 || fail "the retained activity was not cleared after end: $(activity 1)"
pass "the topic is cleared"
exec 3>&-
for i in $(seq 1 100); do kill -0 "$DEV" 2>/dev/null || break; sleep 0.1; done
kill -0 "$DEV" 2>/dev/null && fail "baton device did not stop within 10 s of end"
wait "$DEV"; rc=$?
[ $rc -eq 0 ] || fail "baton device exited $rc"
pass "baton device stopped: $(tail -1 "$W/device.log")"

step "keyed group: the gateway holds the beacon key; device 1 of the group rotates its id every 3 s"
# docs/security.md §8.1's secret and §8.2's beacon key; device 1's identity id is 7cec72260001.
stop_gateway
# The gateway fetches the keyed activity's title over a link to hci1 as soon as it publishes
# it (relay.fetch-titles): the last links to hci1 must be gone first (wait_unlinked above). A
# CI run without this wait saw the phone's link still on hci1 when the gateway's came, the
# kernel refuse the second (sysfs: duplicate hci1:42), and the first never end.
wait_unlinked hci1 20 || fail "the last links to the device did not end within 20 s: $(hcitool -i hci1 con)"
printf 'security:\n  beacon-key: BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO\n' >"$W/keyed.yaml"
echo "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL" >"$W/group.key"
start_gateway --config "$W/keyed.yaml"
KEYED=7cec72260001
TOPIC=$PREFIX/activities/$KEYED
mkfifo "$W/keyed.ctl"
"$BATON" device --adapter hci1 --type com.example.notes.edit --title "Secret plan" --key "$W/group.key" \
  --identity 1 --rotate 3 --sequence 20 <"$W/keyed.ctl" >"$W/keyed-device.log" 2>&1 &
KDEV=$!
pids+=("$KDEV")
exec 4>"$W/keyed.ctl"
msg=$(wait_activity 30 '"seq":20[,}]') || fail "no verified activity of device 1 on $TOPIC within 30 s (last: ${msg:-nothing})"
for want in '"verified":true' '"identity":1' '"group":"7cec7226"'; do
  [[ "$msg" == *"$want"* ]] || fail "the keyed activity lacks $want: $msg"
done
pass "the gateway verified the tagged beacon and published device 1 under its identity: $msg"

step "keyed fetch: ciphertext without the key, the payload with it"
wait_unlinked hci1 20 || fail "the phone's link to the device did not end within 20 s: $(hcitool -i hci1 con)"
timeout 30 "$BATON" fetch "$KEYED" --broker "$BROKER" --cbor --timeout 20 >"$W/sealed.bin" 2>"$W/fetch-keyed.log" ||
  fail "baton fetch of the sealed payload failed (exit $?): $(cat "$W/fetch-keyed.log")"
grep -q "Secret plan" "$W/sealed.bin" && fail "the title crossed the gateway in the clear"
timeout 30 "$BATON" fetch "$KEYED" --broker "$BROKER" --key "$W/group.key" --timeout 20 >"$W/opened.json" 2>>"$W/fetch-keyed.log" ||
  fail "baton fetch --key failed (exit $?): $(cat "$W/fetch-keyed.log")"
grep -q '"title":"Secret plan"' "$W/opened.json" || fail "the opened payload lacks the title: $(cat "$W/opened.json")"
pass "sealed over the real L2CAP CoC ($(stat -c %s "$W/sealed.bin") bytes of envelope); --key opens it: $(cat "$W/opened.json")"

step "rotation: the id changes on air, the topic stays"
sleep 7
rotations=$(grep -c '^rotated' "$W/keyed-device.log")
[ "$rotations" -ge 2 ] || fail "baton device rotated its id $rotations times in 7 s"
topics=$(mosquitto_sub -h 127.0.0.1 -t "$PREFIX/activities/+" -v -W 2 --retained-only 2>/dev/null | cut -d' ' -f1 | sort -u)
[ "$topics" = "$TOPIC" ] || fail "after $rotations rotations the retained activities are: ${topics:-none}"
pass "$rotations rotations on air, one retained topic: $topics"

step "sealed stream: 256 KiB each way, ciphertext through the gateway"
head -c 262144 /dev/urandom >"$W/up2.bin"
timeout 120 "$BATON" stream "$KEYED" --broker "$BROKER" --key "$W/group.key" <"$W/up2.bin" >"$W/down2.bin" 2>"$W/stream-keyed.log" ||
  fail "baton stream --key failed (exit $?): $(cat "$W/stream-keyed.log")"
cmp -s "$W/up2.bin" "$W/down2.bin" || fail "the sealed echo differs ($(stat -c %s "$W/down2.bin") bytes back)"
pass "256 KiB sealed up and its sealed echo down, identical"

step "phone, keyed: baton continue --key resolves the rotating id and opens the sealed payload"
wait_unlinked hci1 20 || fail "the gateway's links to the device did not end within 20 s: $(hcitool -i hci1 con)"
timeout 30 "$BATON" continue "$KEYED" --key "$W/group.key" --adapter $PHONE --timeout 20 >"$W/continued-keyed.json" 2>"$W/continue-keyed.log" ||
  fail "baton continue --key failed (exit $?): $(cat "$W/continue-keyed.log")"
grep -q "^found $KEYED at $A1 (public) psm 0x00[89A-F][0-9A-F] seq 20\$" "$W/continue-keyed.log" ||
  fail "baton continue --key did not say it found device 1's own beacon at $A1: $(cat "$W/continue-keyed.log")"
cmp -s "$W/opened.json" "$W/continued-keyed.json" ||
  fail "baton continue --key printed $(cat "$W/continued-keyed.json"), baton fetch --key $(cat "$W/opened.json")"
pass "$(head -1 "$W/continue-keyed.log"), opened: $(cat "$W/continued-keyed.json")"

step "phone, keyed: baton continue --stream --key, 64 KiB each way sealed"
timeout 60 "$BATON" continue "$KEYED" --key "$W/group.key" --adapter $PHONE --stream --timeout 20 <"$W/phone-up.bin" >"$W/phone-down2.bin" 2>"$W/continue-stream-keyed.log" ||
  fail "baton continue --stream --key failed (exit $?): $(cat "$W/continue-stream-keyed.log")"
cmp -s "$W/phone-up.bin" "$W/phone-down2.bin" || fail "the sealed echo to the phone differs ($(stat -c %s "$W/phone-down2.bin") bytes back)"
pass "64 KiB sealed up from the phone and the sealed echo down, identical"

step "relayed: an office gateway on $OFFICE re-advertises the hall's activity for the phone (docs/relay.md §9)"
# Started after the hall published device 1, so the hall stays its owner: the incumbent keeps
# a device unless another room hears it 6 dB louder (docs/rooms.md), and btvirt gives both the
# same (no) RSSI.
printf 'security:\n  beacon-key: BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO\nrelay:\n  readvertise: 2\n' >"$W/office.yaml"
"$GATEWAY" gateway --broker "$BROKER" --radio $OFFICE --room Office --id office --config "$W/office.yaml" >>"$W/office-gateway.log" 2>&1 &
OGW=$!
pids+=("$OGW")
wait_unlinked $PHONE 20 || fail "the phone's link to the device did not end within 20 s: $(hcitool -i $PHONE con)"
timeout 40 "$BATON" continue "$KEYED" --relayed --key "$W/group.key" --adapter $PHONE --timeout 30 >"$W/relayed.json" 2>"$W/continue-relayed.log" ||
  fail "baton continue --relayed failed (exit $?): $(cat "$W/continue-relayed.log")"
grep -q "^found $KEYED relayed by $A3 (public) psm 0x00[89A-F][0-9A-F] seq 20\$" "$W/continue-relayed.log" ||
  fail "baton continue --relayed did not say the office gateway ($A3) relayed it: $(cat "$W/continue-relayed.log")"
cmp -s "$W/opened.json" "$W/relayed.json" ||
  fail "through the office gateway the phone got $(cat "$W/relayed.json"), directly $(cat "$W/opened.json")"
msg=$(activity 2)
[[ "$msg" == *'"gateway":"hall"'* ]] || fail "the hall no longer owns device 1: $msg"
for i in $(seq 1 50); do grep -q '^continued in Office (seq 20)' "$W/keyed-device.log" && break; sleep 0.2; done
grep -q '^continued in Office (seq 20)' "$W/keyed-device.log" || fail "device 1 was not told it was continued in Office"
pass "$(head -1 "$W/continue-relayed.log"): the same payload as directly; the hall still owns it; device 1 heard: continued in Office"

step "relayed: baton continue --relayed --stream --key, 64 KiB each way phone ⇄ office ⇄ broker ⇄ hall ⇄ device"
t=$SECONDS
timeout 60 "$BATON" continue "$KEYED" --relayed --key "$W/group.key" --adapter $PHONE --stream --timeout 20 \
  <"$W/phone-up.bin" >"$W/phone-down3.bin" 2>"$W/continue-stream-relayed.log" ||
  fail "baton continue --relayed --stream failed (exit $?): $(cat "$W/continue-stream-relayed.log")"
up=$(sha256sum <"$W/phone-up.bin" | cut -d' ' -f1); down=$(sha256sum <"$W/phone-down3.bin" | cut -d' ' -f1)
[ "$up" = "$down" ] || fail "the relayed sealed echo differs: sent sha256 $up, got $down ($(stat -c %s "$W/phone-down3.bin") bytes)"
pass "64 KiB sealed through the office gateway and back in $((SECONDS - t)) s, sha256 $up both ways"
kill -TERM "$OGW" 2>/dev/null; wait "$OGW" 2>/dev/null

echo end >&4
wait_cleared 20 || fail "the keyed activity was not cleared after end: $(activity 1)"
exec 4>&-
for i in $(seq 1 100); do kill -0 "$KDEV" 2>/dev/null || break; sleep 0.1; done
pass "the keyed device ended: $(tail -1 "$W/keyed-device.log")"

step "Home Assistant's active window: an office gateway with esphome: on $OFFICE, a thermometer on $PHONE (docs/esphome.md §3.6)"
# The thermometer: BTHome service data in its advertisement, its name only in its scan response
# (what many sensors do). Connectable (ADV_IND), so the kernel advertises from the public
# address: a non-connectable one takes a fresh random address, which a controller that still
# scans for the kernel refuses (LE Set Random Address, Command Disallowed). Nobody connects.
SENSOR_ADV=0616d2fc4002c4
SENSOR_RSP=0c0968616c6c2d746865726d6f   # Complete Local Name "hall-thermo"
mg -i $PHONE add-adv -c -d $SENSOR_ADV -s $SENSOR_RSP 1 >"$W/sensor-adv.log" 2>&1
grep -q 'Instance added' "$W/sensor-adv.log" || fail "btmgmt add-adv with a scan response failed: $(cat "$W/sensor-adv.log")"
# Noise, as Home Assistant is given a key (docs/esphome.md §4): a fixed one, the tests' own.
ESPHOME_KEY=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=
printf 'esphome:\n  encryption-key: %s\n  address: 127.0.0.1\n  port: 6053\n  mdns-service-file: ""\n' "$ESPHOME_KEY" >"$W/esphome.yaml"
"$GATEWAY" gateway --broker "$BROKER" --radio $OFFICE --room Office --id office --config "$W/esphome.yaml" >>"$W/esphome-gateway.log" 2>&1 &
EGW=$!
pids+=("$EGW")
ESPHOME_PYTHON="${BATON_ESPHOME_PYTHON:-$PWD/.build/esphome-venv/bin/python}"
[ -x "$ESPHOME_PYTHON" ] || fail "no aioesphomeapi venv at $ESPHOME_PYTHON (scripts/esphome-venv makes it)"
for i in $(seq 1 50); do grep -q 'esphome: listening' "$W/esphome-gateway.log" && break; sleep 0.2; done
# btvirt's controllers send an advertising report when the advertiser enables advertising or
# the scanner enables scanning, not on every advertising interval as a radio does (BlueZ
# emulator/btdev.c): so the sensor's advertisement is added again every ~0.5 s while the client
# runs, each time one report (and, to an active scanner, one scan response).
( while :; do mg -i $PHONE remove-adv 1 >/dev/null; mg -i $PHONE add-adv -c -d $SENSOR_ADV -s $SENSOR_RSP 1 >/dev/null; sleep 0.3; done ) &
READVERTISE=$!
pids+=("$READVERTISE")
# The client: 3 advertisements passive, then asks for active and takes 3, then passive again.
timeout 60 "$ESPHOME_PYTHON" Tests/BatonProxyTests/Interop/esphome_client.py 6053 "$ESPHOME_KEY" 3 active >"$W/esphome-client-out.log" 2>"$W/esphome-client.log" ||
  fail "the aioesphomeapi client failed (exit $?): $(tail -5 "$W/esphome-client.log")"
kill "$READVERTISE" 2>/dev/null
verdict=$("$ESPHOME_PYTHON" - "$W/esphome-client-out.log" "$SENSOR_ADV" "$SENSOR_RSP" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
adv, rsp = sys.argv[2], sys.argv[3]
phase = {k: l[k] for l in lines for k in ("advertisements", "active", "passive_again") if k in l}
# The kernel puts its Flags (02 01 04) in front of the data it was given.
def sensor(k): return [a["data"] for a in (phase.get(k) or []) if adv in a["data"] or rsp in a["data"]]
p, a, q = sensor("advertisements"), sensor("active"), sensor("passive_again")
states = [l["scanner"] for l in lines if "scanner" in l][-1]
problems = []
if not p or any(rsp in d for d in p): problems.append(f"passive: {p}")
if not any(d.endswith(adv + rsp) for d in a): problems.append(f"no merged scan response while active: {a}")
if not q or any(rsp in d for d in q): problems.append(f"passive again: {q}")
if [2, 1, 0] not in states or states[-1][:2] != [2, 0]: problems.append(f"scanner states {states}")
print("FAIL " + "; ".join(problems) if problems else
      f"passive {len(p)}x the advertisement alone, active {sum(d.endswith(adv + rsp) for d in a)}x merged with its scan response ({a[-1]}), passive again {len(q)}x alone; scanner states {states}")
PY
)
[[ "$verdict" == FAIL* ]] && fail "active scanning through the gateway: ${verdict#FAIL }"
grep -q 'radio hci3: active scanning, for Home Assistant' "$W/esphome-gateway.log" || fail "the gateway did not log its active scan"
pass "$verdict"

step "Home Assistant connects through the office gateway to a thermometer's GATT server on $PHONE (docs/esphome.md §11)"
# The kernel's own stack end to end: the gateway's ATT socket on $OFFICE (CID 4) makes the LE
# connection, `baton sim sensor` holds $PHONE's ATT channel, aioesphomeapi drives the gateway's
# ESPHome server over Noise as bleak-esphome does. btvirt carries one LE connection per controller: the
# phone's and the office's last links must be gone.
wait_unlinked $PHONE 20 || fail "$PHONE still has a connection: $(hcitool -i $PHONE con)"
wait_unlinked $OFFICE 20 || fail "$OFFICE still has a connection: $(hcitool -i $OFFICE con)"
"$BATON" sim sensor --adapter $PHONE --interval 0.5 --seconds 90 >"$W/sensor.log" 2>&1 &
SENSOR=$!
pids+=("$SENSOR")
for i in $(seq 1 25); do grep -q 'serving' "$W/sensor.log" && break; sleep 0.2; done
grep -q 'serving' "$W/sensor.log" || fail "baton sim sensor did not start: $(cat "$W/sensor.log")"
mg -i $PHONE remove-adv 1 >/dev/null; mg -i $PHONE add-adv -c -d $SENSOR_ADV 1 >/dev/null
A2=$(hciconfig $PHONE | awk '/BD Address/{print $3}')
A2INT=$((16#${A2//:/}))
# Public address (address_type 0): the kernel advertises connectable from it.
timeout 60 "$ESPHOME_PYTHON" Tests/BatonProxyTests/Interop/gatt_client.py 6053 "$A2INT" "$ESPHOME_KEY" 0 >"$W/gatt-client-out.log" 2>"$W/gatt-client.log" ||
  fail "the aioesphomeapi GATT client failed (exit $?): $(tail -5 "$W/gatt-client.log")"
verdict=$("$ESPHOME_PYTHON" - "$W/gatt-client-out.log" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = lambda k: next((l[k] for l in lines if k in l), None)
problems = []
if first("error"): problems.append(f"{first('error')}: {first('message')}")
if first("feature_flags") != 103: problems.append(f"feature flags {first('feature_flags')}, not 103")
conn = first("connected") or []
if not conn or not conn[0][0]: problems.append(f"not connected: {conn}")
uuids = [s["uuid"] for s in first("services") or []]
if uuids[:1] != ["0000180f-0000-1000-8000-00805f9b34fb"] or len(uuids) != 2: problems.append(f"services {uuids}")
if first("battery") != "57": problems.append(f"battery level {first('battery')}, not 57")
if first("long") != bytes(range(40)).hex(): problems.append(f"long value {first('long')}")
if first("written") != "04": problems.append(f"after the writes {first('written')}, not 04")
note = first("notification") or ""
if len(note) != 4: problems.append(f"notification {note!r}")
states = first("states") or []
if len(states) != 2 or states[1][0]: problems.append(f"connection states {states}")
slots = first("slots") or []
if not slots or slots[-1][0] != slots[-1][1]: problems.append(f"slots at the end {slots}")
print(("FAIL " + "; ".join(problems)) if problems else
      f"connected (MTU {conn[0][1]}), {len(uuids)} services, battery 87 %, 40-byte value read, written with and without response, notified {note}, disconnected {states[1]}, slots {slots}")
PY
)
[[ "$verdict" == FAIL* ]] && fail "a connection through the gateway: ${verdict#FAIL }"
pass "$verdict"
kill -TERM "$SENSOR" 2>/dev/null; wait "$SENSOR" 2>/dev/null
# The kernel scanned and connected on the gateway's controller meanwhile: its own scan must go on.
wait_unlinked $OFFICE 20 || fail "$OFFICE kept the connection after the disconnect: $(hcitool -i $OFFICE con)"
( while :; do mg -i $PHONE remove-adv 1 >/dev/null; mg -i $PHONE add-adv -c -d $SENSOR_ADV 1 >/dev/null; sleep 0.3; done ) &
READVERTISE=$!
pids+=("$READVERTISE")
timeout 40 "$ESPHOME_PYTHON" Tests/BatonProxyTests/Interop/esphome_client.py 6053 "$ESPHOME_KEY" 3 >"$W/after-gatt-out.log" 2>"$W/after-gatt.log" ||
  fail "the aioesphomeapi client after the connection failed (exit $?): $(tail -5 "$W/after-gatt.log")"
kill "$READVERTISE" 2>/dev/null
heard=$("$ESPHOME_PYTHON" -c 'import json,sys; print(sum(len(l.get("advertisements", [])) for l in map(json.loads, open(sys.argv[1])) if "advertisements" in l))' "$W/after-gatt-out.log")
[ "${heard:-0}" -ge 3 ] || fail "the gateway's scanner went quiet after the connection: $heard advertisements ($(cat "$W/after-gatt-out.log"))"
pass "still scanning after the connection: $heard advertisements to Home Assistant"
kill -TERM "$EGW" 2>/dev/null; wait "$EGW" 2>/dev/null

stop_gateway
step "done"
finish 0
