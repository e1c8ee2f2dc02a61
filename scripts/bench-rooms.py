#!/usr/bin/env python3
"""Rooms figures for scripts/bench (docs/performance.md "Rooms").

Runs real processes only: the release `baton sim --scenario`, one release `baton gateway` per
room, a throwaway mosquitto on 127.0.0.1 and a free port, and `mosquitto_sub` as the
subscriber a user's Home Assistant would be. Four parts:

  latency  3 rooms in a line, --walkers devices each walking to a neighbouring room and back
           at staggered times, on the --radio (house: walks take 3.3 s, shadowing, fading;
           step: the sim's default, a walk is a jump), 10 reports/s, the gateways' default
           room parameters. For each walk: the first activity message at the subscriber naming
           the destination room's gateway, minus the instant the walk passed the door (half its
           `takes`). Run twice: with the defaults (or --rooms), and with `rooms.dwell: 0s` to
           show what the dwell adds.
  sparse   the same with 10 walkers advertising once a second and once every 5 s: latency also
           in advertising intervals.
  still    --still devices standing on the border of two rooms and as many in a room whose
           gateway (and the one next door) hears with 6 dB of noise, for --still-for s, on the
           house radio and again with its shadowing changing every 2 s standing still
           ("fidgeting"; --still-radios picks one or both): owner changes per device per hour
           after the first minute, and of them the ones back to a room that held the device
           before.
  load     --crowd devices wandering (every --wander s; to any other room, or with --walk
           next-door only through a wall) over the rooms of a --grid (5x2: 10 rooms) at --rate reports/s each; over a --window s window after --warmup s: each
           gateway's CPU (utime + stime, /proc/PID/stat) and memory (VmHWM, VmRSS,
           /proc/PID/status), the simulator's and mosquitto's CPU, the message rates from each
           gateway's retained stats topic, and the broker's deliveries (PUBLISH packets sent,
           mosquitto's $SYS/broker/publish/messages/sent). Once per --layouts entry, in the
           same run on the same scenario: `json` is the layout before issue 21 (one JSON
           sighting per device, `rooms.batches: false`), `batches` one batch per gateway per
           tick with every gateway subscribed to all (`rooms.neighbourhoods: false`),
           `neighbourhoods` the default (docs/rooms.md §8). Then once more on the default
           layout with --over devices (3,000): more than a gateway's table holds. Every
           gateway runs the shipped capacities (no `table.capacity` or `rooms.capacity` in
           its config: issue 30). Also counted at the broker: activity messages, the devices'
           Home Assistant configs, and at the end which devices are in the room they last
           walked to.

  scripts/bench-rooms.py BATON [--json FILE] [--parts latency,sparse,still,load] [--keep DIR]
                         [--sim BATON2] [--radio house|step] [--rooms 'KEY: VALUE']...
                         [--still N] [--still-for S] [--still-radios house,fidgeting]
                         [--walkers N] [--crowd N] [--wander S] [--walk W] [--rate N] [--grid CxR]
                         [--layouts json,batches] [--over N] [--warmup S] [--window S] [--budget S]

Prints a table on stdout and progress on stderr; --json FILE also writes every figure as
JSON. Everything it starts is killed when it ends, on error too, and the whole run is bounded
by --budget seconds. Python 3 standard library only.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchkit import (BenchError, Budget, Processes, accepts, cpu_ticks, free_port, machine_ticks,
                      percentile, status_kib)

MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_SUB = "/usr/bin/mosquitto_sub"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# `--sim`: the baton whose simulator plays the scenarios (default: BATON's own), so an older
# gateway can be measured on the same radio.
SIM = None


def say(text):
    print(f"bench-rooms: {text}", file=sys.stderr, flush=True)


def now_us():
    return time.time_ns() // 1000


# ---------------------------------------------------------------- processes


class LineReader:
    """Reads a child's stdout line by line on a thread and stamps each line with the unix time
    (µs) at which this process read it: the subscriber's arrival time."""

    def __init__(self, stream):
        self.lines = []  # (arrival_us, text)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream):
        for raw in iter(stream.readline, b""):
            stamp = now_us()
            with self.lock:
                self.lines.append((stamp, raw.decode("utf-8", "replace").rstrip("\n")))

    def snapshot(self):
        with self.lock:
            return list(self.lines)


def start_broker(procs, work):
    """mosquitto on 127.0.0.1 and a free port, no persistence, its config in `work`, as
    Tests/BatonTestSupport/MosquittoBroker.swift does it."""
    if not os.access(MOSQUITTO, os.X_OK):
        raise BenchError(f"{MOSQUITTO} is missing: install the mosquitto package (scripts/setup)")
    for _ in range(3):
        port = free_port()
        conf = os.path.join(work, "mosquitto.conf")
        lines = ["persistence false", f"log_dest file {os.path.join(work, 'mosquitto.log')}",
                 "log_type error", "log_type warning"]
        # As root mosquitto would switch to the "mosquitto" user, who cannot write `work`.
        if os.geteuid() == 0:
            lines.append("user root")
        # $SYS every second, for the deliveries' rate; and the per-client queue a building
        # needs (board/mosquitto-building.conf): a gateway's subscription must not drop.
        lines += ["sys_interval 1", "max_queued_messages 60000", "max_inflight_messages 100"]
        lines += ["allow_anonymous true", f"listener {port} 127.0.0.1"]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        p = procs.start("mosquitto", [MOSQUITTO, "-c", conf], stdout=subprocess.DEVNULL,
                        stderr=open(os.path.join(work, "mosquitto.err"), "w"))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if accepts(port):
                return p, port
            if p.poll() is not None:
                break
            time.sleep(0.02)
        procs.stop(p, signal.SIGKILL)
    raise BenchError(f"mosquitto did not accept connections on 127.0.0.1; see {work}/mosquitto.err")


def subscribe(procs, port, topic):
    """mosquitto_sub -v, line-buffered (stdbuf) so that a line is read when it arrives."""
    args = [MOSQUITTO_SUB, "-h", "127.0.0.1", "-p", str(port), "-v", "-t", topic]
    if shutil.which("stdbuf"):
        args = ["stdbuf", "-oL"] + args
    p = procs.start("mosquitto_sub", args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return p, LineReader(p.stdout)


def messages(reader, prefix):
    """(arrival_us, last topic level, JSON or None) for each line of a `mosquitto_sub -v`."""
    out = []
    for stamp, line in reader.snapshot():
        topic, _, payload = line.partition(" ")
        if not topic.startswith(prefix):
            continue
        try:
            value = json.loads(payload) if payload.strip() else None
        except ValueError:
            value = None
        out.append((stamp, topic.rsplit("/", 1)[-1], value))
    return out


def gateway_yaml(port, gid, room, sock, extra):
    return "\n".join([
        "gateway:", f"  id: {gid}", f"  room: {room}",
        "broker:", f"  url: mqtt://127.0.0.1:{port}",
        "radio:", f"  source: sim:{sock}",
    ] + extra) + "\n"


class Building:
    """`baton sim --scenario` plus one `baton gateway` per room, and their files in `work`."""

    def __init__(self, procs, baton, work, scenario, rooms, port, extra_config):
        self.procs, self.work = procs, work
        path = os.path.join(work, "scenario.yaml")
        with open(path, "w") as f:
            f.write(scenario)
        sockets = os.path.join(work, "rooms")
        self.sim = procs.start("baton sim", [SIM or baton, "sim", "--scenario", path, "--sockets", sockets],
                               stdout=subprocess.PIPE, stderr=open(os.path.join(work, "sim.log"), "w"))
        self.events = LineReader(self.sim.stdout)
        self.wait_for(lambda e: e.get("event") == "ready", 15, "the simulator did not get ready")
        self.gateways = {}
        for gid, name in rooms:
            config = os.path.join(work, f"{gid}.yaml")
            with open(config, "w") as f:
                f.write(gateway_yaml(port, gid, name, os.path.join(sockets, f"{gid}.sock"), extra_config))
            self.gateways[gid] = procs.start(
                f"gateway {gid}", [baton, "gateway", "--config", config], stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(work, f"{gid}.log"), "w"))
        # The sim starts its clock when every room's gateway scans.
        self.start_us = self.wait_for(lambda e: e.get("event") == "start", 30,
                                      "the gateways did not all connect and scan within 30 s")["unix_us"]

    def parsed(self):
        out = []
        for _, line in self.events.snapshot():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_for(self, match, seconds, failure):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for e in self.parsed():
                if match(e):
                    return e
            if self.sim.poll() is not None:
                break
            for gid, g in getattr(self, "gateways", {}).items():
                if g.poll() is not None:
                    raise BenchError(f"gateway {gid} exited with {g.returncode}: see {self.work}/{gid}.log")
            time.sleep(0.05)
        for e in self.parsed():
            if match(e):
                return e
        raise BenchError(f"{failure} (see {self.work}/sim.log and the gateways' logs)")

    def stop(self):
        """SIGTERM to the simulator (it prints its `end` line with each room's counts), then
        to the gateways; returns the `end` line or None."""
        self.procs.stop(self.sim, signal.SIGTERM, timeout=10)
        end = next((e for e in self.parsed() if e.get("event") == "end"), None)
        for g in self.gateways.values():
            self.procs.stop(g, signal.SIGTERM, timeout=5)
        return end


# ---------------------------------------------------------------- latency

LINE_ROOMS = [("hall", "Hall"), ("kitchen", "Kitchen"), ("office", "Office")]

# The radio the rule is measured on (docs/simulator.md "A radio that moves like a person"): a
# person walks 1.2 m/s, a room is about 4 m across, so 0.3 rooms a second (3.3 s room to room);
# a body between phone and gateway costs 3–10 dB, here an offset of 3 dB standard deviation per
# device and room that changes over a metre walked (a still device keeps it); and Rician fading
# of K = 0 dB (as much scattered as direct power) on every report, beside the 3 dB of gaussian
# noise. `fidgeting` also changes the shadowing over 2 s standing still (people moving about).
# `step` is the sim's default: a walk is a jump.
RADIOS = {
    "house": ["radio:", "  walk-speed: 0.3", "  shadowing: 3", "  shadowing-distance: 0.25", "  fading-k: 0"],
    "fidgeting": ["radio:", "  walk-speed: 0.3", "  shadowing: 3", "  shadowing-distance: 0.25", "  shadowing-time: 2",
                  "  fading-k: 0"],
    "step": [],
}


def latency_scenario(walkers, first, spacing, back, rate=10, radio="house"):
    """Device i starts in room i mod 3 and walks to a neighbouring room at first + i·spacing,
    and back at back + i·spacing: one walk in progress at a time per spacing."""
    lines = ["# Generated by scripts/bench-rooms.py: three rooms in a line, devices walking to a",
             f"# neighbouring room and back at staggered times; the {radio} radio.",
             "seed: 1", "speed: 1", f"duration: {back + walkers * spacing + 15:g}", f"rate: {rate:g}",
             ] + RADIOS[radio] + ["rooms:"] + [f"  - {{id: {gid}, name: {name}}}" for gid, name in LINE_ROOMS] + ["devices:"]
    ids = [r for r, _ in LINE_ROOMS]
    for i in range(walkers):
        home = ids[i % 3]
        there = "kitchen" if home != "kitchen" else ("hall" if i % 2 == 0 else "office")
        lines += [f"  - id: 5a00000001{i:02x}", f"    name: walker-{i}", f"    at: {home}", "    script:",
                  f"      - {{at: {first + i * spacing:g}, walk: {there}}}",
                  f"      - {{at: {back + i * spacing:g}, walk: {home}}}"]
    return "\n".join(lines) + "\n"


def run_latency(procs, baton, work, label, walkers, extra, rate=10, radio="house", settle=8):
    os.makedirs(work)
    broker, port = start_broker(procs, work)
    sub, reader = subscribe(procs, port, "baton/activities/+")
    first, spacing = 12, 0.8
    back = first + walkers * spacing + settle
    scenario = latency_scenario(walkers, first, spacing, back, rate, radio)
    b = Building(procs, baton, work, scenario, LINE_ROOMS, port, extra)
    expected = 2 * walkers
    say(f"latency ({label}): {expected} walks over {back + walkers * spacing - first:.0f} s")
    slowest = []  # the ten slowest walks, for the JSON: which device, when, where to

    def resolved():
        walks = [e for e in b.parsed() if e.get("event") == "walk"]
        slowest.clear()
        return walks, compute_latencies(walks, messages(reader, "baton/activities/"), slowest)

    # Until every walk happened and moved, or 25 s after the last walk (bounded either way).
    deadline = time.monotonic() + back + walkers * spacing + 40
    last_walk_seen = None
    while time.monotonic() < deadline:
        walks, (lat, never) = resolved()
        if len(walks) >= expected:
            last_walk_seen = last_walk_seen or time.monotonic()
            if not never or time.monotonic() - last_walk_seen > 25:
                break
        if b.sim.poll() is not None:
            break
        time.sleep(0.25)
    end = b.stop()
    walks, (lat, never) = resolved()
    procs.stop(sub)
    procs.stop(broker)
    if len(walks) < expected:
        raise BenchError(f"latency ({label}): the simulator made {len(walks)} of {expected} walks")
    lat.sort()
    ms = [v / 1000 for v in lat]
    interval_ms = 1000 / rate
    return {"label": label, "config": extra, "radio": radio, "rate": rate, "walks": len(walks), "moved": len(lat),
            "p50_intervals": percentile(ms, 50) / interval_ms if ms else None,
            "p99_intervals": percentile(ms, 99) / interval_ms if ms else None,
            "never_moved": len(never), "never_moved_devices": never,
            "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
            "max_ms": ms[-1] if ms else None, "min_ms": ms[0] if ms else None,
            "mean_ms": sum(ms) / len(ms) if ms else None, "latencies_ms": [round(v, 1) for v in ms],
            "slowest": slowest, "sim_end": end.get("rooms") if end else None}


def compute_latencies(walks, activity, slowest=None):
    """For each walk: the first activity message for the device, arriving after the walk began
    and before the device's next walk, that names the destination room's gateway; its latency
    counted from when the walk passed the door (half its `takes`, where both rooms hear the
    device alike; the walk's start when a walk is a step). Negative: the room changed before."""
    by_device = {}
    for stamp, device, value in activity:
        by_device.setdefault(device, []).append((stamp, value))
    walks_by_device = {}
    for w in walks:
        walks_by_device.setdefault(w["device"], []).append(w)
    latencies, never = [], []
    for device, ws in walks_by_device.items():
        ws.sort(key=lambda w: w["unix_us"])
        for k, w in enumerate(ws):
            until = ws[k + 1]["unix_us"] if k + 1 < len(ws) else float("inf")
            hit = next((s for s, v in by_device.get(device, [])
                        if w["unix_us"] <= s < until and v and v.get("gateway") == w.get("room")), None)
            if hit is None:
                # What the subscriber saw of the device from the walk on (s after it, gateway).
                seen = [f"{(s - w['unix_us']) / 1e6:+.1f}s {v.get('gateway') if v else '(cleared)'}"
                        for s, v in by_device.get(device, []) if s >= w["unix_us"] - 30_000_000][:8]
                never.append(f"{device}@{w['t']} to {w.get('room')} (seen: {', '.join(seen) or 'nothing'})")
            else:
                latencies.append(hit - (w["unix_us"] + w.get("takes", 0) / 2 * 1e6))
                if slowest is not None:
                    slowest.append({"device": device, "t": w["t"], "to": w.get("room"),
                                    "ms": round(latencies[-1] / 1000, 1)})
    if slowest is not None:
        slowest.sort(key=lambda x: -x["ms"])
        del slowest[10:]
    return latencies, never


# ---------------------------------------------------------------- still

STILL_ROOMS = [("hall", "Hall", 0), ("kitchen", "Kitchen", 1), ("office", "Office", 2), ("study", "Study", 3)]


def still_scenario(count, duration, radio="house"):
    """`count` devices standing on the border of hall and kitchen (both hear them alike), and
    `count` standing in the study, whose gateway and the office's next door hear with 6 dB of
    noise (twice the default), on the house radio."""
    lines = ["# Generated by scripts/bench-rooms.py: devices that do not move, on a border and in a",
             "# noisy room; any change of room is a flap.",
             "seed: 1", "speed: 1", f"duration: {duration:g}", "rate: 10"] + RADIOS[radio] + ["rooms:"]
    for gid, name, x in STILL_ROOMS:
        noise = ", noise: 6" if gid in ("office", "study") else ""
        lines.append(f"  - {{id: {gid}, name: {name}, x: {x}{noise}}}")
    lines.append("devices:")
    for i in range(count):
        lines += [f"  - id: 5c00000001{i:02x}", f"    name: border-{i}", "    at: {between: [hall, kitchen]}"]
        lines += [f"  - id: 5c00000002{i:02x}", f"    name: noisy-{i}", "    at: study"]
    return "\n".join(lines) + "\n"


def run_still(procs, baton, work, count, duration, settle=60, extra=(), radio="house"):
    """Owner changes per hour: changes of the gateway named in a standing device's activity
    messages after `settle` s (a minute: a room the device is nearer by a little may take it
    over slowly, once), over the devices' hours standing; and of them the flaps, changes back
    to a room that held the device before."""
    os.makedirs(work)
    broker, port = start_broker(procs, work)
    sub, reader = subscribe(procs, port, "baton/activities/+")
    b = Building(procs, baton, work, still_scenario(count, duration, radio), [(g, n) for g, n, _ in STILL_ROOMS], port,
                 list(extra))
    say(f"still: {2 * count} devices standing for {duration:g} s")
    deadline = time.monotonic() + duration + 5
    while time.monotonic() < deadline and b.sim.poll() is None:
        time.sleep(0.5)
    b.stop()
    activity = messages(reader, "baton/activities/")
    procs.stop(sub)
    procs.stop(broker)
    # From the settle to the scenario's end: the gateways stopping after it hand their devices
    # over (their `offline`), which is not a flap.
    start, end = b.start_us + settle * 1e6, b.start_us + duration * 1e6
    result = {"devices": 2 * count, "duration_s": duration, "settle_s": settle, "config": list(extra), "radio": radio}
    for kind, prefix in (("border", "5c00000001"), ("noisy", "5c00000002")):
        changes, back, last, held = 0, 0, {}, {}
        for stamp, device, value in activity:
            if not device.startswith(prefix) or not value or not value.get("gateway"):
                continue
            g = value["gateway"]
            if stamp >= end:
                break
            if device in last and last[device] != g and stamp >= start:
                changes += 1
                back += g in held.get(device, ())
            last[device] = g
            held.setdefault(device, set()).add(g)
        hours = count * (duration - settle) / 3600
        result[kind] = {"changes": changes, "device_hours": hours, "changes_per_hour": changes / hours,
                        "flaps": back, "flaps_per_hour": back / hours,
                        "rooms": sorted(set(last.values())), "devices_seen": len(last)}
    return result


# ---------------------------------------------------------------- load

def grid_rooms(cols=5, rows=2):
    """cols × rows rooms (10 by default, 5 × 2): with the sim's default radio a device is heard
    at −55 dBm in its room, −70 next door, −76 diagonally, −85 two rooms along; down to −95."""
    return [(f"room{y:02}{x:02}", f"Room {y}.{x}", x, y) for y in range(rows) for x in range(cols)]


def load_scenario(crowd, wander, rate, duration, grid=(5, 2), walk="anywhere"):
    lines = [f"# Generated by scripts/bench-rooms.py: a crowd wandering over the rooms of a {grid[0]} x {grid[1]} grid.",
             "seed: 1", "speed: 1", f"duration: {duration:g}", f"rate: {rate:g}", "rooms:"]
    lines += [f"  - {{id: {gid}, name: {name}, x: {x}, y: {y}}}" for gid, name, x, y in grid_rooms(*grid)]
    lines += ["crowd:", f"  count: {crowd}", "  first-id: 5b0000000000", f"  wander: {wander:g}", f"  walk: {walk}"]
    return "\n".join(lines) + "\n"


def counter(stats, *path):
    for key in path:
        if not isinstance(stats, dict):
            return 0
        stats = stats.get(key)
    return stats if isinstance(stats, (int, float)) else 0


LAYOUTS = {
    "json": ("one JSON sighting per device, every gateway subscribed to all (before issue 21)",
             ["rooms:", "  batches: false"]),
    "batches": ("one batch per gateway per tick, every gateway subscribed to all (docs/rooms.md §8.1)",
                ["rooms:", "  neighbourhoods: false"]),
    "neighbourhoods": ("one batch per gateway per tick, each gateway subscribed to its neighbours' (§8.3, the default)",
                       []),
}


def run_load(procs, baton, work, crowd, wander, rate, warmup, window, layout="batches", grid=(5, 2), walk="anywhere"):
    os.makedirs(work)
    broker, port = start_broker(procs, work)
    stats_sub, stats_reader = subscribe(procs, port, "baton/gateways/+/stats")
    activity_sub, activity_reader = subscribe(procs, port, "baton/activities/+")
    discovery_sub, discovery_reader = subscribe(procs, port, "homeassistant/#")
    sys_sub, sys_reader = subscribe(procs, port, "$SYS/broker/publish/messages/sent")
    rooms = grid_rooms(*grid)
    # The shipped capacities (issue 30: a table sized to the crowd hid a takeover storm at the
    # default capacity): what a user who writes no capacity gets. Stats every 5 s so the window
    # is bracketed closely (telemetry only); more gateways than the default 32 only for a
    # building that has more rooms, as its installer must write.
    extra = ["status:", "  interval: 5s"]
    layout_lines = LAYOUTS[layout][1]
    rooms_lines = [f"  gateways: {len(rooms) + 8}"] if len(rooms) > 32 else []
    if layout_lines or rooms_lines:
        extra += ["rooms:"] + [l for l in layout_lines if l != "rooms:"] + rooms_lines
    b = Building(procs, baton, work, load_scenario(crowd, wander, rate, warmup + window + 30, grid, walk),
                 [(g, n) for g, n, _, _ in rooms], port, extra)
    say(f"load ({layout}): {crowd} devices in {len(rooms)} rooms at {rate:g} report/s each; "
        f"{warmup:g} s warm-up, then {window:g} s measured")
    pids = {g: p.pid for g, p in b.gateways.items()}
    pids["sim"], pids["mosquitto"] = b.sim.pid, broker.pid

    def sleep_until(unix_us):
        while now_us() < unix_us:
            for gid, g in b.gateways.items():
                if g.poll() is not None:
                    raise BenchError(f"gateway {gid} exited with {g.returncode}: see {work}/{gid}.log")
            time.sleep(min(0.5, max(0.0, (unix_us - now_us()) / 1e6)))

    sleep_until(b.start_us + int(warmup * 1e6))
    t0, m0 = time.monotonic(), machine_ticks()
    c0 = {k: cpu_ticks(p) for k, p in pids.items()}
    w0 = now_us()
    sleep_until(w0 + int(window * 1e6))
    t1, m1 = time.monotonic(), machine_ticks()
    c1 = {k: cpu_ticks(p) for k, p in pids.items()}
    w1 = now_us()
    memory = {g: status_kib(p) for g, p in pids.items()}
    elapsed = t1 - t0
    cpu = {k: 100.0 * (c1[k] - c0[k]) / CLOCK_TICKS / elapsed for k in pids}
    end = b.stop()
    stats = messages(stats_reader, "baton/gateways/")
    # The crowd's walks in the window, as in the latency part, on a loaded machine: walks in
    # the last 20 s are left out, as they may not have moved yet when the window ended (the
    # slowest took 13–15 s at 50 rooms; with 10 s, one walk 10.03 s before the end counted as
    # never moved).
    walks = [e for e in b.parsed() if e.get("event") == "walk" and w0 <= e["unix_us"] <= w1 - 20_000_000]
    lat, never = compute_latencies(walks, messages(activity_reader, "baton/activities/"))
    all_walks = sum(1 for e in b.parsed() if e.get("event") == "walk" and w0 <= e["unix_us"] <= w1)
    lat = sorted(v / 1000 for v in lat)
    # The broker's PUBLISH packets sent, from the first $SYS value in the window to the last.
    sent = [(s, float(line.partition(" ")[2])) for s, line in sys_reader.snapshot()
            if line.startswith("$SYS/broker/publish/messages/sent ")]
    inside = [(s, v) for s, v in sent if w0 <= s <= w1]
    deliveries = ((inside[-1][1] - inside[0][1]) / ((inside[-1][0] - inside[0][0]) / 1e6)
                  if len(inside) >= 2 and inside[-1][0] > inside[0][0] else None)
    activity = messages(activity_reader, "baton/activities/")
    # Every device's room at the window's end, against where the simulator last sent it: the
    # devices whose last walk ended 20 s before it or more.
    last_walk = {}
    for e in b.parsed():
        if e.get("event") == "walk" and e.get("room") and e["unix_us"] <= w1:
            last_walk[e["device"]] = e
    last_seen = {}
    for stamp, device, value in activity:
        if stamp <= w1:
            last_seen[device] = value
    settled = [(d, e["room"]) for d, e in last_walk.items() if e["unix_us"] <= w1 - 20_000_000]
    right = sum(1 for d, room in settled if (last_seen.get(d) or {}).get("gateway") == room)
    wrong_room = [f"{d} in {(last_seen.get(d) or {}).get('gateway') or '(nothing)'}, walked to {room}"
                  for d, room in settled if (last_seen.get(d) or {}).get("gateway") != room]
    in_window = [(s_, d) for s_, d, _ in activity if w0 <= s_ <= w1]
    # What a wrong room is read from, kept beside the gateways' logs (--keep): the simulator's
    # events and every activity message, each with the unix µs it arrived at.
    with open(os.path.join(work, "events.txt"), "w") as f:
        f.writelines(f"{stamp} {line}\n" for stamp, line in b.events.snapshot())
    with open(os.path.join(work, "activities.txt"), "w") as f:
        f.writelines(f"{stamp} {line}\n" for stamp, line in activity_reader.snapshot())
    # Home Assistant's configs of the tracked devices (not the gateways' own) in the window.
    configs = [line.partition(" ")[0] for stamp, line in discovery_reader.snapshot()
               if w0 <= stamp <= w1 and line.partition(" ")[0].endswith("/config") and "/baton_5b" in line.partition(" ")[0]]
    procs.stop(discovery_sub)
    procs.stop(sys_sub)
    procs.stop(activity_sub)
    procs.stop(stats_sub)
    procs.stop(broker)

    per_gateway = {}
    for g in b.gateways:
        inside = [(s, v) for s, gid, v in stats if gid == "stats" and v and v.get("gateway") == g]
        # The first stats message in the window and the last one before its end.
        first = next(((s, v) for s, v in inside if s >= w0), None)
        last = next(((s, v) for s, v in reversed(inside) if s <= w1), None)
        entry = {"cpu_percent": cpu[g], "vm_hwm_kib": memory[g].get("VmHWM"),
                 "vm_rss_kib": memory[g].get("VmRSS"), "rss_anon_kib": memory[g].get("RssAnon")}
        if first and last and last[0] > first[0]:
            seconds = (last[0] - first[0]) / 1e6
            a, z = first[1], last[1]

            def rate_of(*path):
                return (counter(z, *path) - counter(a, *path)) / seconds
            drops = sum(counter(z, "drops", k) for k in (z.get("drops") or {}))
            room_drops = sum(counter(z, "rooms", "drops", k) for k in ((z.get("rooms") or {}).get("drops") or {}))
            entry.update({
                "stats_span_s": seconds,
                "reports_per_s": rate_of("reports"),
                "sightings_sent_per_s": rate_of("rooms", "sightings_sent"),
                "sightings_received_per_s": rate_of("rooms", "sightings_received"),
                "batches_sent_per_s": rate_of("rooms", "batches_sent"),
                "building_sightings_received_per_s": rate_of("rooms", "building_sightings_received"),
                "building_batches_received_per_s": rate_of("rooms", "building_batches_received"),
                "messages_received_per_s": rate_of("broker", "messages_received"),
                "changes_published_per_s": rate_of("changes_published"),
                "ownership_changes_per_s": rate_of("rooms", "ownership_changes"),
                "ownership_changes": counter(z, "rooms", "ownership_changes") - counter(a, "rooms", "ownership_changes"),
                "takeovers": counter(z, "rooms", "takeovers") - counter(a, "rooms", "takeovers"),
                "evicted": counter(z, "table", "evicted") - counter(a, "table", "evicted"),
                "refused_per_s": rate_of("table", "refused"),
                "table_capacity": counter(z, "table", "capacity"),
                "table_fill": counter(z, "table", "fill"), "rooms_devices": counter(z, "rooms", "devices"),
                "owned": counter(z, "rooms", "owned"),
                "neighbours": len((z.get("rooms") or {}).get("neighbours") or []) if "neighbours" in (z.get("rooms") or {}) else None,
                "drops": drops, "room_drops": room_drops,
                "drop_reasons": {**(z.get("drops") or {}), **((z.get("rooms") or {}).get("drops") or {})},
            })
        per_gateway[g] = entry

    def summary(key):
        values = [e[key] for e in per_gateway.values() if e.get(key) is not None]
        if not values:
            return None
        return {"mean": sum(values) / len(values), "max": max(values), "total": sum(values)}

    keys = ["cpu_percent", "vm_hwm_kib", "vm_rss_kib", "rss_anon_kib", "reports_per_s",
            "sightings_sent_per_s", "sightings_received_per_s", "batches_sent_per_s", "messages_received_per_s",
            "building_sightings_received_per_s", "building_batches_received_per_s",
            "changes_published_per_s",
            "ownership_changes_per_s", "ownership_changes", "takeovers", "evicted", "refused_per_s",
            "table_fill", "owned", "neighbours", "drops", "room_drops"]
    sim_rooms = (end or {}).get("rooms") or {}
    return {
        "crowd": crowd, "rooms": len(rooms), "layout": f"{grid[0]} x {grid[1]} grid", "rate_per_device": rate,
        "sightings_layout": layout, "sightings_layout_text": LAYOUTS[layout][0],
        "broker_deliveries_per_s": deliveries,
        "wander_s": wander, "walk": walk, "warmup_s": warmup, "window_s": elapsed, "cores": os.cpu_count(),
        "gateways": per_gateway, "gateway_summary": {k: summary(k) for k in keys},
        "sim_cpu_percent": cpu["sim"], "mosquitto_cpu_percent": cpu["mosquitto"],
        "mosquitto_vm_hwm_kib": memory["mosquitto"].get("VmHWM"),
        "sim_vm_hwm_kib": memory["sim"].get("VmHWM"),
        "machine_busy_percent": 100.0 * (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * (os.cpu_count() or 1),
        "sim_delivered": sum(r.get("delivered", 0) for r in sim_rooms.values()),
        "sim_dropped": sum(r.get("dropped", 0) for r in sim_rooms.values()),
        "sim_not_scanning": sum(r.get("not_scanning", 0) for r in sim_rooms.values()),
        "walks": len(walks), "walks_never_moved": len(never), "walks_never_moved_devices": never[:50],
        "walks_in_window": all_walks,
        "activity_publishes_per_s": len(in_window) / elapsed,
        "discovery_configs_per_s": len(configs) / elapsed,
        "discovery_per_device_per_hour": len(configs) / max(1, crowd) / (elapsed / 3600),
        "right_room": right, "right_room_of": len(settled), "wrong_room_devices": wrong_room[:20],
        "walk_p50_ms": percentile(lat, 50), "walk_p99_ms": percentile(lat, 99),
        "walk_max_ms": lat[-1] if lat else None,
        "sim_elapsed_s": ((end or {}).get("unix_us", 0) - b.start_us) / 1e6 if end else None,
    }


# ---------------------------------------------------------------- report

def table(result):
    out = ["rooms: the release `baton sim` and `baton gateway`s on one mosquitto (127.0.0.1); no peer",
           "runs here (ESPresense and room-assistant need BLE hardware): figures, not ratios."]
    for run in result.get("latency", []):
        out += ["", f"owner-change latency, {run['label']}, {run['radio']} radio: the walk past the door → first "
                    f"activity message naming the new room's gateway at a subscriber",
                f"  config: {' '.join(x.strip() for x in run['config']) or 'defaults'}",
                f"  {run['moved']} of {run['walks']} walks moved, {run['never_moved']} never moved",
                f"  p50 {fmt_s(run['p50_ms'])}   p90 {fmt_s(run['p90_ms'])}   p99 {fmt_s(run['p99_ms'])}"
                f"   max {fmt_s(run['max_ms'])}   min {fmt_s(run['min_ms'])}   mean {fmt_s(run['mean_ms'])}"]
    for run in result.get("sparse", []):
        out += ["", f"owner-change latency, a device advertising every {1 / run['rate']:g} s ({run['radio']} radio):",
                f"  {run['moved']} of {run['walks']} walks moved, {run['never_moved']} never moved",
                f"  p50 {fmt_s(run['p50_ms'])} ({run['p50_intervals']:.1f} intervals)   p99 {fmt_s(run['p99_ms'])} "
                f"({run['p99_intervals']:.1f} intervals)   max {fmt_s(run['max_ms'])}" if run["moved"] else "  –"]
    for still in result.get("still", []):
        out += ["", f"standing devices, {still['radio']} radio: {still['devices']} for {still['duration_s']:g} s "
                    f"(changes counted after {still['settle_s']:g} s); config: "
                    f"{' '.join(x.strip() for x in still['config']) or 'defaults'}"]
        for kind, text in (("border", "on the hall/kitchen border"), ("noisy", "in a noisy room (noise 6)")):
            k = still[kind]
            out.append(f"  {text}: {k['changes']} owner changes in {k['device_hours']:.2f} device-hours, "
                       f"{k['changes_per_hour']:.2f} per device per hour; {k['flaps']} of them back to a room that "
                       f"held it before ({k['flaps_per_hour']:.2f} per hour)")
    for load in result.get("load", []):
        s = load["gateway_summary"]
        out += ["", f"load, {load['sightings_layout']}: {load['sightings_layout_text']}",
                f"  {load['crowd']} devices wandering (every ~{load['wander_s']:g} s, "
                f"{'next door' if load.get('walk') == 'next-door' else 'to any room'}) over "
                    f"{load['rooms']} rooms ({load['layout']}), {load['rate_per_device']:g} report/s per "
                    f"device, {load['window_s']:.0f} s measured after {load['warmup_s']:g} s;",
                f"  everything shares this machine's {load['cores']} cores "
                f"(busy over the window: {load['machine_busy_percent']:.0f} % of one core, all processes)",
                f"  {'per gateway':<28}{'mean':>12}{'max':>12}{'total':>12}"]
        rows = [("CPU, % of one core", "cpu_percent", "{:.1f}"), ("VmHWM, KiB", "vm_hwm_kib", "{:,.0f}"),
                ("VmRSS, KiB", "vm_rss_kib", "{:,.0f}"), ("RssAnon, KiB", "rss_anon_kib", "{:,.0f}"),
                ("reports heard /s", "reports_per_s", "{:,.0f}"),
                ("sightings sent /s", "sightings_sent_per_s", "{:,.0f}"),
                ("sightings received /s", "sightings_received_per_s", "{:,.0f}"),
                ("sighting messages sent /s", "batches_sent_per_s", "{:,.1f}"),
                ("messages received /s", "messages_received_per_s", "{:,.0f}"),
                ("  building-wide sightings /s", "building_sightings_received_per_s", "{:,.0f}"),
                ("  building-wide batches /s", "building_batches_received_per_s", "{:,.0f}"),
                ("activities published /s", "changes_published_per_s", "{:,.1f}"),
                ("owner changes /s (all rooms)", "ownership_changes_per_s", "{:,.1f}"),
                ("owner changes in the window", "ownership_changes", "{:,.0f}"),
                ("  of them takeovers", "takeovers", "{:,.0f}"),
                ("table capacity", "table_capacity", "{:,.0f}"),
                ("table evictions in the window", "evicted", "{:,.0f}"),
                ("beacons not taken in /s", "refused_per_s", "{:,.0f}"),
                ("table fill (end)", "table_fill", "{:,.0f}"), ("devices owned (end)", "owned", "{:,.0f}"),
                ("neighbours (end)", "neighbours", "{:,.0f}"),
                ("drops (advertisements)", "drops", "{:,.0f}"), ("drops (sightings)", "room_drops", "{:,.0f}")]
        for title, key, f in rows:
            v = s.get(key)
            if v:
                # Every gateway follows every device's owner: its count is the building's, not a share.
                total = "–" if key in ("ownership_changes_per_s", "ownership_changes", "takeovers", "table_capacity") else f.format(v["total"])
                out.append(f"  {title:<28}{f.format(v['mean']):>12}{f.format(v['max']):>12}{total:>12}")
        d = load.get("broker_deliveries_per_s")
        out += [f"  broker deliveries (PUBLISH packets sent): {'–' if d is None else f'{d:,.0f}'} /s",
                f"  at the broker: {load['activity_publishes_per_s']:,.1f} activity messages /s, "
                f"{load['discovery_configs_per_s']:,.2f} device discovery configs /s "
                f"({load['discovery_per_device_per_hour']:.3f} per device per hour); "
                f"{load['walks_in_window']} walks in the window",
                f"  in its room at the end: {load['right_room']} of {load['right_room_of']} devices whose last walk "
                f"ended 20 s before it or more" + (f" (not: {', '.join(load['wrong_room_devices'][:5])})"
                                                  if load['wrong_room_devices'] else ""),
                f"  simulator CPU {load['sim_cpu_percent']:.1f} % (VmHWM {load['sim_vm_hwm_kib']:,} KiB), "
                f"mosquitto CPU {load['mosquitto_cpu_percent']:.1f} % (VmHWM {load['mosquitto_vm_hwm_kib']:,} KiB)",
                f"  simulator: {load['sim_delivered']:,} reports delivered to the rooms, "
                f"{load['sim_dropped']:,} dropped (a gateway not reading in time), "
                f"{load['sim_not_scanning']:,} while a gateway was not scanning",
                f"  owner-change latency of the crowd's walks in the window (defaults, under this load): "
                f"{load['walks'] - load['walks_never_moved']} of {load['walks']} moved,",
                f"    p50 {fmt_s(load['walk_p50_ms'])}   p99 {fmt_s(load['walk_p99_ms'])}"
                f"   max {fmt_s(load['walk_max_ms'])}"]
        reasons = {}
        for e in load["gateways"].values():
            for k, v in (e.get("drop_reasons") or {}).items():
                reasons[k] = reasons.get(k, 0) + v
        if reasons:
            out.append("  drops by reason (all gateways, totals at the end): "
                       + ", ".join(f"{k} {v:,}" for k, v in sorted(reasons.items())))
        if load.get("walks_never_moved_devices"):
            out.append(f"    never moved (device@t): {', '.join(load['walks_never_moved_devices'][:10])}")
    return "\n".join(out)


def fmt_s(ms):
    return "–" if ms is None else f"{ms / 1000:.2f} s"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baton", help="the release baton binary (.build-bench/release/baton)")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    parser.add_argument("--sim", help="the baton whose `sim` plays the scenarios (default: BATON): an older "
                                      "gateway on this simulator's radio")
    parser.add_argument("--parts", default="latency,sparse,still,load")
    parser.add_argument("--keep", help="keep every process's files (scenarios, configs, logs) in DIR")
    parser.add_argument("--walkers", type=int, default=40)
    parser.add_argument("--radio", choices=sorted(RADIOS), default="house",
                        help="the latency part's radio: house (walks take time, shadowing, fading) or step")
    parser.add_argument("--still", type=int, default=40, help="the still part: devices on a border, and as many in a noisy room")
    parser.add_argument("--still-for", type=float, default=300, help="the still part's seconds")
    parser.add_argument("--still-radios", default="house,fidgeting",
                        help="the still part's radios, each a run of its own (about 5.5 minutes): house and/or fidgeting")
    parser.add_argument("--rooms", action="append", default=[], metavar="KEY: VALUE",
                        help="a rooms key for every gateway of the latency (first run), sparse and still parts, "
                             "like 'dwell: 2s' (repeatable); default: none, the shipped defaults")
    parser.add_argument("--crowd", type=int, default=1000)
    parser.add_argument("--over", type=int, default=3000,
                        help="after the layouts, one more run on the default layout with this many devices: more than "
                             "a gateway's default table holds (issue 30); 0: none")
    parser.add_argument("--wander", type=float, default=30)
    parser.add_argument("--walk", choices=("anywhere", "next-door"), default="anywhere",
                        help="where the crowd wanders to (the scenario's crowd.walk): any other room, or next door")
    parser.add_argument("--rate", type=float, default=1)
    parser.add_argument("--grid", default="5x2", help="the load part's rooms, columns x rows (5x2: 10 rooms)")
    parser.add_argument("--layouts", default="json,batches,neighbourhoods",
                        help="the load part's sighting layouts, each run on the same scenario: json, batches, neighbourhoods")
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--budget", type=float, default=2400, help="seconds for the whole run")
    args = parser.parse_args()
    global SIM
    SIM = args.sim
    parts = set(args.parts.split(","))
    rooms = (["rooms:"] + [f"  {r}" for r in args.rooms]) if args.rooms else []
    if not parts <= {"latency", "sparse", "still", "load"}:
        parser.error(f"--parts: latency, sparse, still and/or load, not {args.parts}")
    still_radios = args.still_radios.split(",")
    # Each radio runs into a folder of its own name: one named twice would overwrite the first.
    if len(set(still_radios)) != len(still_radios) or not set(still_radios) <= {"house", "fidgeting"}:
        parser.error(f"--still-radios: house and/or fidgeting, each once, not {args.still_radios}")
    if not (os.path.isfile(args.baton) and os.access(args.baton, os.X_OK)):
        parser.error(f"{args.baton} is not an executable: build it with "
                     "BATON_BENCH=1 swift build -c release --scratch-path .build-bench --product baton")
    if not os.access(MOSQUITTO_SUB, os.X_OK):
        parser.error(f"{MOSQUITTO_SUB} is missing: install mosquitto-clients (scripts/setup)")

    def on_alarm(signum, frame):
        raise Budget()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(int(args.budget))

    work = args.keep or tempfile.mkdtemp(prefix="baton-bench-rooms.")
    os.makedirs(work, exist_ok=True)
    procs = Processes()
    result = {"latency": []}
    try:
        if "latency" in parts:
            result["latency"].append(run_latency(procs, args.baton, os.path.join(work, "latency-defaults"),
                                                 "default room parameters" if not rooms else
                                                 "rooms " + ", ".join(args.rooms), args.walkers, rooms, radio=args.radio))
            result["latency"].append(run_latency(procs, args.baton, os.path.join(work, "latency-dwell0"),
                                                 "rooms.dwell 0s, the rest default", args.walkers,
                                                 ["rooms:", "  dwell: 0s"], radio=args.radio))
        if "sparse" in parts:
            # One report a second, and one every 5 s: each walker waits 12 intervals before it walks back.
            result["sparse"] = [run_latency(procs, args.baton, os.path.join(work, f"sparse-{rate:g}"),
                                            f"{rate:g} report/s", 10, rooms, rate=rate, radio=args.radio,
                                            settle=12 / rate)
                                for rate in (1, 0.2)]
        if "still" in parts:
            result["still"] = [run_still(procs, args.baton, os.path.join(work, f"still-{radio}"), args.still,
                                         args.still_for, extra=rooms, radio=radio) for radio in still_radios]
        if "load" in parts:
            grid = tuple(int(n) for n in args.grid.split("x"))
            result["load"] = []
            for layout in args.layouts.split(","):
                result["load"].append(run_load(procs, args.baton, os.path.join(work, f"load-{layout}"), args.crowd,
                                               args.wander, args.rate, args.warmup, args.window, layout, grid,
                                               args.walk))
            if args.over:
                result["load"].append(run_load(procs, args.baton, os.path.join(work, f"load-over-{args.over}"), args.over,
                                               args.wander, args.rate, args.warmup, args.window, "neighbourhoods",
                                               grid, args.walk))
    except Budget:
        say(f"the run took longer than --budget {args.budget:g} s; stopped (files in {work})")
        args.keep = work
        return 1
    except BenchError as error:
        say(f"{error}")
        args.keep = work
        return 1
    finally:
        signal.alarm(0)
        procs.kill_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    loads = result.get("load", [])
    by_layout = {l["sightings_layout"]: l for l in loads}
    for name in ("batches", "neighbourhoods"):
        if "json" not in by_layout or name not in by_layout:
            continue
        old, new = by_layout["json"], by_layout[name]
        if old.get("broker_deliveries_per_s") and new.get("broker_deliveries_per_s"):
            print(f"\n{name} ÷ json, same scenario, same run: broker deliveries "
                  f"{new['broker_deliveries_per_s'] / old['broker_deliveries_per_s']:.3f}, per-gateway CPU "
                  f"{new['gateway_summary']['cpu_percent']['mean'] / max(0.001, old['gateway_summary']['cpu_percent']['mean']):.3f}")
    never = sum(r["never_moved"] for r in result["latency"] + result.get("sparse", []))
    return 1 if never else 0


if __name__ == "__main__":
    sys.exit(main())
