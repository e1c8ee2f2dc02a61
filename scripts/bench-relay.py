#!/usr/bin/env python3
"""Relay figures for scripts/bench (docs/performance.md "Relay").

Runs real processes only: the release `baton sim --scenario` (two rooms, hall and office, and
one phone in the hall whose payload is 3,072 bytes and whose activity offers streams), the
release `baton gateway` of each room on its `sim:` socket (so its device link is the room's
`.link` socket, docs/relay.md §5), a throwaway mosquitto on 127.0.0.1 and a free port with
`set_tcp_nodelay true` (as board/mosquitto-building.conf), and the release `baton stream`.
Three parts:

  fetch    a paho-mqtt client (MQTT v5) asks for the phone's payload --fetches times, one at
           a time: each is timed from the publish of `baton/fetch/<device>` to the answer's
           arrival on its response topic, which must say `ok` and carry 3,072 bytes. Two
           buildings side by side, each with its own broker, simulator and gateways: one with
           `relay.cache: 0` (every fetch goes over the device link), one with the default
           cache (answered from it, no link); their fetches alternate, so both runs see the
           same machine. Link time is the difference of the two p50s.
  stream   `baton stream` with stdin a file of --stream-mib MiB of random bytes, stdout to a
           file; the phone echoes, so each direction carries all of it. Timed from start to
           exit; the output must equal the input (sha256). The hall's stats `relay.streams`
           before and after.
  memory   the hall gateway's VmRSS and VmHWM (/proc/PID/status) idle, then with 16
           `baton stream`s open at once, each fed 1 KiB every 50 ms, after 5 s of all 16
           flowing (the hall's stats say `relay.streams.open` 16). With --firmware FW, the
           same again in a third building whose two gateways are the firmware (the Embedded
           Swift `baton gateway`, scripts/firmware); its simulator and streams stay BATON's.

They run in the order memory (so that "idle" is before anything was relayed), fetch, stream,
in about 20 s.

  scripts/bench-relay.py BATON [--firmware FW] [--json FILE] [--keep DIR] [--fetches N]
                         [--stream-mib N] [--budget S]

Prints a table on stdout and progress on stderr; --json FILE also writes every figure as
JSON. Everything it starts is killed when it ends, on error too, and the whole run is bounded
by --budget seconds. Exits 1 if a part fails: a fetch not answered `ok` with the payload, a
stream whose output differs from its input or that does not end cleanly. Needs paho-mqtt
(scripts/bench-peers/requirements.txt): run it with the bench venv's python.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from benchkit import (BenchError, Budget, Processes, accepts, cpu_ticks, free_port, machine_ticks,
                      percentile, status_kib)

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
except ImportError:
    mqtt = None

MOSQUITTO = "/usr/sbin/mosquitto"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DEVICE = "5a0000000001"
PAYLOAD_BYTES = 3072
ROOMS = [("hall", "Hall"), ("office", "Office")]
STREAMS = 16  # relay.streams, the default: every slot of the hall taken


def say(text):
    print(f"bench-relay: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


def start_broker(procs, work):
    """mosquitto on 127.0.0.1 and a free port, no persistence, with `set_tcp_nodelay true`:
    without it mosquitto holds each small stream frame for the receiver's delayed ack, about
    40 ms a round trip (docs/broker.md "Streams and set_tcp_nodelay")."""
    if not os.access(MOSQUITTO, os.X_OK):
        raise BenchError(f"{MOSQUITTO} is missing: install the mosquitto package (scripts/setup)")
    for _ in range(3):
        port = free_port()
        conf = os.path.join(work, "mosquitto.conf")
        lines = ["persistence false", f"log_dest file {os.path.join(work, 'mosquitto.log')}",
                 "log_type error", "log_type warning", "set_tcp_nodelay true"]
        # As root mosquitto would switch to the "mosquitto" user, who cannot write `work`.
        if os.geteuid() == 0:
            lines.append("user root")
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


def mqtt_client(name):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-relay-{name}-{os.getpid()}",
                    protocol=mqtt.MQTTv5)
    return c


def nodelay(client):
    """paho leaves Nagle's algorithm on; a requester sending one small request after the
    previous answer's PUBACK would wait for the broker's delayed ack (docs/broker.md)."""
    client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Watcher:
    """A paho client on its own thread keeping the newest retained stats of each gateway and
    the newest activity message of the phone, with their arrival times (monotonic)."""

    def __init__(self, port):
        self.lock = threading.Condition()
        self.stats = {}     # gateway → (arrival, JSON)
        self.activity = None  # (arrival, JSON)
        self.client = mqtt_client("watcher")
        self.client.on_connect = self._connected
        self.client.on_message = self._message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _connected(self, client, userdata, flags, reason, properties):
        client.subscribe([("baton/gateways/+/stats", 1), (f"baton/activities/{DEVICE}", 1)])

    def _message(self, client, userdata, m):
        try:
            value = json.loads(m.payload) if m.payload else None
        except ValueError:
            value = None
        with self.lock:
            if m.topic.startswith("baton/gateways/") and isinstance(value, dict):
                self.stats[m.topic.split("/")[2]] = (time.monotonic(), value)
            elif m.topic.startswith("baton/activities/"):
                self.activity = (time.monotonic(), value)
            self.lock.notify_all()

    def wait(self, predicate, seconds, failure):
        """Until predicate(self) is true (checked under the lock), or BenchError."""
        deadline = time.monotonic() + seconds
        with self.lock:
            while True:
                value = predicate(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(failure)
                self.lock.wait(min(left, 0.5))

    def fresh_stats(self, gateway, after, seconds=10):
        """The first stats of `gateway` that arrived after `after` (monotonic)."""
        def newer(w):
            s = w.stats.get(gateway)
            return s[1] if s and s[0] > after else None
        return self.wait(newer, seconds, f"no stats from gateway {gateway} within {seconds} s")

    def stop(self):
        self.client.loop_stop()
        self.client.disconnect()


# ---------------------------------------------------------------- the building


def scenario():
    return "\n".join([
        "# Generated by scripts/bench-relay.py: one phone in the hall, a 3,072-byte payload,",
        "# streams offered; no noise, no loss, a device that answers at once.",
        "seed: 1", "speed: 1", "duration: 3600", "rate: 10",
        "radio:", "  noise: 0", "  loss: 0", "  link-latency: 0",
        "rooms:"] + [f"  - {{id: {gid}, name: {name}}}" for gid, name in ROOMS] + [
        "devices:", f"  - id: {DEVICE}", "    name: bench-phone", "    title: Relay bench",
        f"    payload-bytes: {PAYLOAD_BYTES}", "    streams: true", "    at: hall"]) + "\n"


def gateway_yaml(port, gid, room, sock, extra):
    # The relay link follows the radio: sim:DIR/hall.sock → DIR/hall.link (docs/relay.md §5).
    # Stats every second, so a part's counters can be read right after it.
    return "\n".join([
        "gateway:", f"  id: {gid}", f"  room: {room}",
        "broker:", f"  url: mqtt://127.0.0.1:{port}",
        "radio:", f"  source: sim:{sock}",
        "status:", "  interval: 1s",
    ] + extra) + "\n"


class Building:
    """A fresh mosquitto, `baton sim --scenario` and the hall's and office's `baton gateway`,
    their files in `work`; ready once the phone's retained activity names the hall."""

    def __init__(self, procs, baton, work, extra_config, gateway_binary=None):
        self.procs, self.work = procs, work
        os.makedirs(work)
        self.broker, self.port = start_broker(procs, work)
        self.watcher = Watcher(self.port)
        path = os.path.join(work, "scenario.yaml")
        with open(path, "w") as f:
            f.write(scenario())
        sockets = os.path.join(work, "rooms")
        self.sim = procs.start("baton sim", [baton, "sim", "--scenario", path, "--sockets", sockets],
                               stdout=open(os.path.join(work, "sim.out"), "w"),
                               stderr=open(os.path.join(work, "sim.log"), "w"))
        self._until(lambda: os.path.exists(os.path.join(sockets, "office.link")), 15,
                    "the simulator did not get ready (see sim.log)")
        self.gateways = {}
        for gid, name in ROOMS:
            config = os.path.join(work, f"{gid}.yaml")
            with open(config, "w") as f:
                f.write(gateway_yaml(self.port, gid, name, os.path.join(sockets, f"{gid}.sock"), extra_config))
            self.gateways[gid] = procs.start(
                f"gateway {gid}", [gateway_binary or baton, "gateway", "--config", config], stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(work, f"{gid}.log"), "w"))
        started = time.monotonic()
        self.watcher.wait(lambda w: w.activity and (w.activity[1] or {}).get("gateway") == "hall", 30,
                          f"the phone's activity did not name gateway hall within 30 s (see {work})")
        self.ready_s = time.monotonic() - started
        self.check()

    def _until(self, condition, seconds, failure):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return
            if self.sim.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchError(f"{failure} in {self.work}")

    def check(self):
        if self.sim.poll() is not None:
            raise BenchError(f"the simulator exited with {self.sim.returncode}: see {self.work}/sim.log")
        for gid, g in self.gateways.items():
            if g.poll() is not None:
                raise BenchError(f"gateway {gid} exited with {g.returncode}: see {self.work}/{gid}.log")

    @property
    def hall(self):
        return self.gateways["hall"].pid

    def stop(self):
        self.watcher.stop()
        for g in self.gateways.values():
            self.procs.stop(g, signal.SIGTERM, timeout=5)
        self.procs.stop(self.sim, signal.SIGTERM, timeout=10)
        self.procs.stop(self.broker)


def busy_percent(m0, m1):
    """The machine's busy time between two machine_ticks(), in % of one core."""
    return 100.0 * (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * (os.cpu_count() or 1)


def relay_stats(stats):
    return (stats or {}).get("relay") or {}


def hall_streams(stats):
    """The stats' `relay.streams` object (docs/mqtt.md §1)."""
    return relay_stats(stats).get("streams") or {}


# ---------------------------------------------------------------- fetch


class Fetcher:
    """The requester: a paho client driven from this thread (no network thread), so the
    clock runs from the publish call to the callback that hands over the answer."""

    def __init__(self, port):
        self.client = mqtt_client("fetch")
        self.topic = f"baton/answers/bench-relay-{os.getpid()}"
        self.answer = None
        self.subscribed = False
        self.client.on_message = self._message
        self.client.on_subscribe = lambda *a: setattr(self, "subscribed", True)
        self.client.connect("127.0.0.1", port)
        nodelay(self.client)
        self.client.subscribe(self.topic, qos=1)
        deadline = time.monotonic() + 10
        while not self.subscribed:
            if time.monotonic() > deadline:
                raise BenchError("the fetch client could not subscribe within 10 s")
            self.client.loop(timeout=0.1)
        self.correlation = 0

    def _message(self, client, userdata, m):
        props = m.properties
        user = dict(getattr(props, "UserProperty", []) or [])
        self.answer = (time.perf_counter_ns(), getattr(props, "CorrelationData", None), user, m.payload)

    def fetch(self, timeout=10):
        """(seconds, status, gateway, payload length); status None when nothing answered."""
        self.correlation += 1
        corr = struct.pack(">I", self.correlation)
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.topic
        props.CorrelationData = corr
        self.answer = None
        start = time.perf_counter_ns()
        self.client.publish(f"baton/fetch/{DEVICE}", b"", qos=1, properties=props)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.client.loop(timeout=0.5)
            a = self.answer
            if a and a[1] == corr:
                return (a[0] - start) / 1e9, a[2].get("status"), a[2].get("gateway"), len(a[3])
            # Another correlation is an earlier request's late answer: keep waiting for ours.
        return None, None, None, 0

    def stop(self):
        self.client.disconnect()


WARMUP = 10  # untimed fetches per building after the first, so both runs start warm


def first_fetch(fetcher, label):
    """The first fetch may find the office not yet agreeing on the owner (`not-owner`,
    rooms.settle): asked again until ok. Timed on its own: it opens the link."""
    deadline = time.monotonic() + 15
    while True:
        first, status, gateway, length = fetcher.fetch()
        if status == "ok":
            return first * 1000
        if time.monotonic() > deadline:
            raise BenchError(f"fetch ({label}): the first fetch was answered {status or 'nothing'}")
        time.sleep(0.2)


def run_fetches(runs, count):
    """`runs`: (key, label, building). Each building has its own requester; their fetches
    alternate (A B, B A, A B, …), so that whatever else the machine does falls on both runs
    alike and the difference of their p50s is the link, not the moment each run was made."""
    fetchers = {key: Fetcher(b.port) for key, _, b in runs}
    times = {key: [] for key, _, _ in runs}
    failures = {key: [] for key, _, _ in runs}
    firsts = {}
    try:
        for key, label, _ in runs:
            firsts[key] = first_fetch(fetchers[key], label)
            for _ in range(WARMUP):
                fetchers[key].fetch()
        m0 = machine_ticks()
        for i in range(count):
            for key, _, _ in (runs if i % 2 == 0 else list(reversed(runs))):
                seconds, status, gateway, length = fetchers[key].fetch()
                if status != "ok" or length != PAYLOAD_BYTES or gateway != "hall":
                    failures[key].append(f"fetch {i + 1} ({key}): status {status or 'no answer'}, "
                                         f"{length} bytes, gateway {gateway}")
                if seconds is not None:
                    times[key].append(seconds * 1000)
        m1 = machine_ticks()
        for _, _, b in runs:
            b.check()
    finally:
        for f in fetchers.values():
            f.stop()
    out = {}
    for key, label, b in runs:
        stats = relay_stats(b.watcher.fresh_stats("hall", time.monotonic()))
        ms = sorted(times[key])
        out[key] = {"label": label, "fetches": count, "ok": count - len(failures[key]),
                    "failures": failures[key][:10], "first_ms": firsts[key], "warmup": WARMUP,
                    "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
                    "max_ms": ms[-1] if ms else None, "min_ms": ms[0] if ms else None,
                    "mean_ms": sum(ms) / len(ms) if ms else None,
                    "hall_link_opens": stats.get("link_opens"), "hall_cache_hits": stats.get("cache_hits"),
                    "hall_answers_ok": (stats.get("answers") or {}).get("ok")}
    out["machine_busy_percent"] = busy_percent(m0, m1)
    return out


# ---------------------------------------------------------------- stream


def stream_args(baton, port):
    return [baton, "stream", DEVICE, "--broker", f"mqtt://127.0.0.1:{port}"]


def wait4(p, seconds):
    """Waits for a child and returns its rusage; kills it after `seconds`."""
    timer = threading.Timer(seconds, p.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return usage


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_stream(procs, baton, building, mib):
    work = building.work
    source, sink = os.path.join(work, "stream.in"), os.path.join(work, "stream.out")
    with open(source, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    size = mib << 20

    # An empty stream first: what opening and closing costs, without data.
    empty = procs.start("baton stream", stream_args(baton, building.port), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "stream-empty.log"), "w"))
    t0 = time.monotonic()
    wait4(empty, 30)
    empty_s = time.monotonic() - t0
    if empty.returncode != 0:
        raise BenchError(f"stream: an empty stream exited with {empty.returncode} "
                         f"(see {work}/stream-empty.log)")

    # The counters before: the first stats after the empty stream with no stream open (the
    # empty one counted as finished, so that it is not mistaken for this one below).
    ended = time.monotonic()

    def idle_stats(w):
        s = w.stats.get("hall")
        return s[1] if s and s[0] > ended and hall_streams(s[1]).get("open") == 0 else None
    before = building.watcher.wait(idle_stats, 10, "stream: the hall's stats still count a stream open")
    pids = {"hall": building.hall, "office": building.gateways["office"].pid,
            "sim": building.sim.pid, "mosquitto": building.broker.pid}
    c0, m0 = {k: cpu_ticks(p) for k, p in pids.items()}, machine_ticks()
    say(f"stream: {mib} MiB through `baton stream`, echoed back")
    with open(source, "rb") as stdin, open(sink, "wb") as stdout:
        t0 = time.monotonic()
        p = procs.start("baton stream", stream_args(baton, building.port), stdin=stdin, stdout=stdout,
                        stderr=open(os.path.join(work, "stream.log"), "w"))
        usage = wait4(p, 150)
        seconds = time.monotonic() - t0
    c1, m1 = {k: cpu_ticks(p) for k, p in pids.items()}, machine_ticks()
    building.check()
    if p.returncode != 0:
        raise BenchError(f"stream: `baton stream` exited with {p.returncode} (see {work}/stream.log)")
    out_size = os.path.getsize(sink)
    same = out_size == size and sha256(source) == sha256(sink)
    finished = hall_streams(before).get("finished", 0)

    def counted(w):
        s = w.stats.get("hall")
        return s[1] if s and hall_streams(s[1]).get("open") == 0 and \
            hall_streams(s[1]).get("finished", 0) > finished else None
    after = building.watcher.wait(counted, 10, "stream: the hall's stats never counted the stream finished")
    s0, s1 = hall_streams(before), hall_streams(after)
    delta = {k: s1.get(k, 0) - s0.get(k, 0) for k in
             ("opened", "finished", "aborted", "frames_up", "frames_down", "resent")}
    return {"mib": mib, "bytes": size, "bytes_out": out_size, "identical": same,
            "seconds": seconds, "mb_per_s_each_way": size / seconds / 1e6,
            "mib_per_s_each_way": size / seconds / (1 << 20),
            "empty_stream_s": empty_s,
            "cpu_percent": {k: 100.0 * (c1[k] - c0[k]) / CLOCK_TICKS / seconds for k in pids}
            | {"baton stream": 100.0 * (usage.ru_utime + usage.ru_stime) / seconds},
            "machine_busy_percent": busy_percent(m0, m1),
            "hall_streams": delta, "hall_streams_drops": s1.get("drops") or {},
            "stream_vm_hwm_kib": usage.ru_maxrss}


# ---------------------------------------------------------------- memory

# A slow endless writer: 1 KiB every 50 ms (20 KiB/s), until it is stopped.
WRITER = ("import sys, time\nb = b'x' * 1024\nwhile True:\n"
          "    sys.stdout.buffer.write(b); sys.stdout.buffer.flush(); time.sleep(0.05)\n")


def run_memory(procs, baton, building, settle, hold):
    work = building.work
    time.sleep(settle)
    building.check()
    idle = status_kib(building.hall)
    say(f"memory: hall idle {idle['VmRSS']:,} KiB; opening {STREAMS} streams")
    writers, streams, sinks = [], [], []
    for i in range(STREAMS):
        w = procs.start("writer", [sys.executable, "-c", WRITER], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL)
        sink = os.path.join(work, f"memory-stream-{i}.out")
        s = procs.start("baton stream", stream_args(baton, building.port), stdin=w.stdout,
                        stdout=open(sink, "wb"), stderr=open(os.path.join(work, f"memory-stream-{i}.log"), "w"))
        w.stdout.close()  # the stream's stdin now; closed here so that its EOF is the writer's
        writers.append(w)
        streams.append(s)
        sinks.append(sink)
    building.watcher.wait(lambda w: "hall" in w.stats and hall_streams(w.stats["hall"][1]).get("open") == STREAMS,
                          20, f"memory: the hall never had {STREAMS} streams open (see {work}/memory-stream-*.log)")
    sizes0 = [os.path.getsize(s) for s in sinks]
    time.sleep(hold)
    building.check()
    loaded = status_kib(building.hall)
    sizes1 = [os.path.getsize(s) for s in sinks]
    stats = hall_streams(building.watcher.fresh_stats("hall", time.monotonic()))
    open_at_end = stats.get("open")
    stalled = [i for i in range(STREAMS) if sizes1[i] <= sizes0[i]]
    # Each writer's end is its stream's end of stdin: the stream closes cleanly, both ways.
    for w in writers:
        procs.stop(w)
    codes = []
    for s in streams:
        try:
            s.wait(timeout=20)
        except subprocess.TimeoutExpired:
            procs.stop(s, signal.SIGKILL)
        codes.append(s.returncode)
    failures = []
    if stalled:
        failures.append(f"streams {stalled} echoed nothing over the {hold:g} s measured")
    if open_at_end != STREAMS:
        failures.append(f"the hall had {open_at_end} streams open at the end of the {hold:g} s, not {STREAMS}")
    if any(c != 0 for c in codes):
        failures.append(f"streams exited with {codes} (see {work}/memory-stream-*.log)")
    return {"streams": STREAMS, "settle_s": settle, "hold_s": hold, "idle": idle, "streams_open": loaded,
            "difference_kib": {k: loaded[k] - idle[k] for k in idle},
            "echoed_bytes_per_stream_per_s": (sum(sizes1) - sum(sizes0)) / STREAMS / hold,
            "stream_exit_codes": codes, "failures": failures}


# ---------------------------------------------------------------- report


def table(r):
    out = ["relay: the release `baton sim`, two release `baton gateway`s (hall, office) and a mosquitto",
           "(127.0.0.1, set_tcp_nodelay) on one machine; the phone is in the hall, so the hall answers.",
           "No peer runs here: figures, not ratios."]
    f = r.get("fetch") or {}
    if f:
        out += ["", f"fetch round trip, {PAYLOAD_BYTES:,}-byte payload, one at a time: publish of baton/fetch/<device>",
                "(MQTT v5) → the answer at the requester; both gateways get each request, the hall answers"]
        for key in ("no_cache", "cache"):
            run = f.get(key)
            if run:
                out += [f"  {run['label']}: {run['ok']} of {run['fetches']} ok",
                        f"    p50 {us(run['p50_ms'])}   p90 {us(run['p90_ms'])}   p99 {us(run['p99_ms'])}"
                        f"   max {us(run['max_ms'])}   min {us(run['min_ms'])}   mean {us(run['mean_ms'])}",
                        f"    the first fetch, untimed above (it opens the link): {us(run['first_ms'])}; "
                        f"hall: {run['hall_link_opens']} link opened, {run['hall_cache_hits']} cache hits"]
        if f.get("link_time_ms") is not None:
            out.append(f"  link time (p50 without cache − p50 with cache): {us(f['link_time_ms'])}")
        if f.get("machine_busy_percent") is not None:
            out.append(f"  the machine was busy {f['machine_busy_percent']:.0f} % of one core "
                       f"(of {r['cores'] * 100} %) over the fetches, all processes")
    s = r.get("stream")
    if s:
        cpu = "   ".join(f"{k} {v:.0f} %" for k, v in s["cpu_percent"].items())
        d = s["hall_streams"]
        out += ["", f"stream throughput: {s['mib']} MiB of random bytes through `baton stream`, echoed by the phone",
                f"  {s['seconds']:.2f} s: {s['mb_per_s_each_way']:.2f} MB/s each way "
                f"({s['mib_per_s_each_way']:.2f} MiB/s); output {'identical' if s['identical'] else 'DIFFERENT'} "
                f"(sha256); an empty stream takes {s['empty_stream_s'] * 1000:.0f} ms",
                f"  hall relay.streams: {d['frames_up']:,} frames up, {d['frames_down']:,} down, "
                f"{d['resent']} resent, {d['aborted']} aborted",
                f"  CPU, % of one core: {cpu}",
                f"  the machine was busy {s['machine_busy_percent']:.0f} % of one core (of {r['cores'] * 100} %), "
                f"all processes"]
    for key, who in (("memory", "hall gateway"), ("memory_firmware", "hall gateway, the firmware,")):
        m = r.get(key)
        if not m:
            continue
        i, o, d = m["idle"], m["streams_open"], m["difference_kib"]
        out += ["", f"{who} memory (/proc/PID/status), idle and with {m['streams']} streams open "
                    f"({m['echoed_bytes_per_stream_per_s'] / 1024:.1f} KiB/s echoed each), after {m['hold_s']:g} s:",
                f"  {'':<22}{'VmRSS':>12}{'VmHWM':>12}{'RssAnon':>12}",
                f"  {'idle':<22}{i['VmRSS']:>8,} KiB{i['VmHWM']:>8,} KiB{i['RssAnon']:>8,} KiB",
                f"  {str(m['streams']) + ' streams open':<22}{o['VmRSS']:>8,} KiB{o['VmHWM']:>8,} KiB"
                f"{o['RssAnon']:>8,} KiB",
                f"  {'difference':<22}{d['VmRSS']:>8,} KiB{d['VmHWM']:>8,} KiB{d['RssAnon']:>8,} KiB"]
    m, fw = r.get("memory"), r.get("memory_firmware")
    if m and fw:
        o, w = m["streams_open"], fw["streams_open"]
        out.append(f"  firmware ÷ full with {m['streams']} streams open: VmHWM {w['VmHWM'] / o['VmHWM']:.2f}, "
                   f"RssAnon {w['RssAnon'] / o['RssAnon']:.2f}")
    for failure in r.get("failures", []):
        out.append(f"FAILED: {failure}")
    return "\n".join(out)


def us(ms):
    return "–" if ms is None else f"{ms * 1000:,.0f} µs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baton", help="the release baton binary (.build-bench/release/baton)")
    parser.add_argument("--firmware", metavar="FW",
                        help="the firmware (.build-firmware/amd64/baton): its memory with 16 streams too")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON to this file")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep every process's files (scenarios, configs, logs, stream data) in DIR")
    parser.add_argument("--fetches", metavar="N", type=int, default=500, help="timed fetches per run (500)")
    parser.add_argument("--stream-mib", metavar="N", type=int, default=32, help="MiB through the stream (32)")
    parser.add_argument("--budget", metavar="S", type=float, default=300, help="seconds for the whole run (300)")
    args = parser.parse_args()
    if mqtt is None:
        parser.error("paho-mqtt is missing: run with the python of a venv that has "
                     "scripts/bench-peers/requirements.txt installed (scripts/bench makes one)")
    if not (os.path.isfile(args.baton) and os.access(args.baton, os.X_OK)):
        parser.error(f"{args.baton} is not an executable: build it with "
                     "swift build -c release --product baton")
    if args.fetches < 1 or args.stream_mib < 1:
        parser.error("--fetches and --stream-mib must be at least 1")

    def on_alarm(signum, frame):
        raise Budget()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(int(args.budget))

    work = args.keep or tempfile.mkdtemp(prefix="baton-bench-relay.")
    os.makedirs(work, exist_ok=True)
    procs = Processes()
    result = {"cores": os.cpu_count(), "payload_bytes": PAYLOAD_BYTES, "fetch": {}, "failures": []}
    building = no_cache = None
    try:
        # The default config first, idle: its memory before anything was relayed.
        say("building with the default relay config")
        building = Building(procs, args.baton, os.path.join(work, "defaults"), [])
        result["memory"] = run_memory(procs, args.baton, building, settle=3, hold=5)
        if args.firmware:
            # The same building with the firmware's gateways, alone beside the first (idle now).
            say("a building whose gateways are the firmware: its memory idle and with 16 streams")
            fw = Building(procs, args.baton, os.path.join(work, "firmware"), [], gateway_binary=args.firmware)
            result["memory_firmware"] = run_memory(procs, args.baton, fw, settle=3, hold=5)
            fw.stop()
        # A second building beside it, its gateways with `relay.cache: 0`: every fetch goes
        # over the device link. Its own broker and simulator, so the two share nothing but
        # the machine.
        say("a second building, relay.cache 0: every fetch over the device link")
        no_cache = Building(procs, args.baton, os.path.join(work, "no-cache"), ["relay:", "  cache: 0"])
        say(f"fetch: {args.fetches} fetches in each building, alternating")
        result["fetch"] = run_fetches([("no_cache", "relay.cache 0 (over the device link)", no_cache),
                                       ("cache", "default relay.cache (from the cache)", building)],
                                      args.fetches)
        no_cache.stop()
        no_cache = None
        result["stream"] = run_stream(procs, args.baton, building, args.stream_mib)
        building.stop()
        building = None
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
        for b in (building, no_cache):
            if b is not None:
                try:
                    b.watcher.stop()
                except Exception:
                    pass
        procs.kill_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    f = result["fetch"]
    f["link_time_ms"] = f["no_cache"]["p50_ms"] - f["cache"]["p50_ms"]
    for run in (f["no_cache"], f["cache"]):
        result["failures"] += run["failures"]
    result["failures"] += result["memory"]["failures"]
    if "memory_firmware" in result:
        result["failures"] += [f"firmware: {x}" for x in result["memory_firmware"]["failures"]]
    if not result["stream"]["identical"]:
        result["failures"].append(f"the stream's output ({result['stream']['bytes_out']:,} bytes) differs "
                                  f"from its input ({result['stream']['bytes']:,} bytes)")
    print(table(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
