#!/usr/bin/env python3
"""The three-node NATS cluster against one mosquitto (docs/broker.md "A broker that can die").

By hand, not in scripts/test. Real processes only, everything on 127.0.0.1: `baton sim
--scenario` with a crowd wandering over a 5 x 2 grid (10 rooms, a gateway each: the load of
scripts/bench-rooms.py's load part), and

  rate   the same load once on one mosquitto and once on the cluster (scripts/nats-cluster;
         gateway i given the nodes starting at node i mod 3, MQTT 3.1.1, broker.max-qos
         --max-qos, 0 by default as board/nats-building.conf says). Over a --window s
         window after --warmup s: the messages a subscriber to `baton/#` is sent per second,
         and the broker's CPU (mosquitto, or the three nats-server processes added up).
  kill   on the cluster, after the warm-up, the node leading `$MQTT_sess` (the stream every
         MQTT CONNECT needs) killed -9, then, once all is back, a node leading nothing (the
         leaderships moved off it first with JetStream's step-down API). For each: how long
         until each of its gateways' `online` (a live status, not a retained one) reached a
         subscriber on a surviving node, and until a fresh subscriber on a surviving node was
         sent an activity for every device the building had before the kill.

  scripts/bench-cluster.py BATON [--parts rate,kill] [--crowd N] [--rate R] [--warmup S]
                           [--window S] [--max-qos 0|1] [--keep DIR] [--budget S]

Prints one line per figure on stdout and progress on stderr. Everything it starts is killed
when it ends, on error too, and the whole run is bounded by --budget seconds. Needs
mosquitto, mosquitto-clients, nats-server and curl (scripts/setup installs them).
"""

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchkit import BenchError, Budget, Processes, cpu_ticks  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_rooms", os.path.join(HERE, "bench-rooms.py"))
rooms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rooms)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def say(text):
    print(f"bench-cluster: {text}", file=sys.stderr, flush=True)


class Cluster:
    """scripts/nats-cluster DIR in the background: three nodes, their ports, kill and restart."""

    def __init__(self, procs, work):
        self.work = os.path.join(work, "nats")
        os.makedirs(self.work, exist_ok=True)
        subprocess.run([os.path.join(HERE, "nats-cluster"), "--write", self.work], check=True, capture_output=True)
        self.names = ["a", "b", "c"]

        def ports(kind):
            return [int(open(os.path.join(self.work, f"node-{n}.{kind}-port")).read()) for n in self.names]
        self.mqtt, self.monitor, self.client = ports("mqtt"), ports("monitor"), ports("client")
        self.procs, self.nodes = procs, [None, None, None]
        for i in range(3):
            self.start(i)
        for i in range(3):
            self.wait_healthy(i)

    def start(self, i):
        n = self.names[i]
        self.nodes[i] = self.procs.start(f"nats {n}", ["/usr/sbin/nats-server", "-c", os.path.join(self.work, f"node-{n}.conf"),
                                                      "-l", os.path.join(self.work, f"node-{n}.log")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self, i):
        self.procs.stop(self.nodes[i], signal.SIGKILL)

    def jsz(self, i):
        try:
            out = subprocess.run(["curl", "-fs", "-m", "2", f"http://127.0.0.1:{self.monitor[i]}/jsz?streams=true"],
                                 capture_output=True, text=True, timeout=5).stdout
            return json.loads(out)
        except (ValueError, subprocess.TimeoutExpired):
            return {}

    def wait_healthy(self, i, seconds=20):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            r = subprocess.run(["curl", "-fs", "-m", "2", f"http://127.0.0.1:{self.monitor[i]}/healthz"],
                               capture_output=True, text=True)
            if r.returncode == 0 and "ok" in r.stdout:
                return
            time.sleep(0.1)
        raise BenchError(f"nats node {self.names[i]} not healthy within {seconds} s; see {self.work}")

    def leaders(self, seen_by):
        d = self.jsz(seen_by)
        streams = {s["name"]: (s.get("cluster") or {}).get("leader", "")
                   for a in d.get("account_details", []) for s in a.get("stream_detail", [])}
        return streams, (d.get("meta_cluster") or {}).get("leader", "")

    def request(self, via, subjects):
        """Empty requests over NATS's text protocol (as Tests/BatonTestSupport/NATSCluster.swift)."""
        with socket.create_connection(("127.0.0.1", self.client[via]), timeout=3) as s:
            text = 'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.bench 1\r\n'
            text += "".join(f"PUB {subj} _INBOX.bench 0\r\n\r\n" for subj in subjects) + "PING\r\n"
            s.sendall(text.encode())
            seen = b""
            while b"PONG" not in seen:
                chunk = s.recv(4096)
                if not chunk:
                    break
                seen += chunk

    def move_leaders_off(self, i, seconds=15):
        other, name = (i + 1) % 3, f"baton-{self.names[i]}"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            streams, meta = self.leaders(other)
            led = [s for s, leader in streams.items() if leader == name]
            if len(streams) == 3 and all(streams.values()) and not led and meta and meta != name:
                return True
            subjects = [f"$JS.API.STREAM.LEADER.STEPDOWN.{s}" for s in led]
            if meta == name:
                subjects.append("$JS.API.META.LEADER.STEPDOWN")
            if subjects:
                self.request(other, subjects)
            time.sleep(0.5)
        return False

    def pids(self):
        return [p.pid for p in self.nodes if p is not None and p.poll() is None]


def retained_devices(port, seconds=8):
    """Devices with an activity a fresh subscriber on `port` is sent (mosquitto_sub, v3.1.1),
    or None if it could not connect."""
    r = subprocess.run([rooms.MOSQUITTO_SUB, "-h", "127.0.0.1", "-p", str(port), "-t", "baton/activities/+",
                        "--retained-only", "-W", "2", "-F", "%t"], capture_output=True, text=True, timeout=seconds)
    if r.returncode not in (0, 27):  # 27: the -W timeout, the normal end here
        return None
    return {line.rsplit("/", 1)[-1] for line in r.stdout.split("\n") if line.startswith("baton/activities/")}


def run_building(procs, baton, work, kind, args, cluster=None, broker_port=None):
    grid = rooms.grid_rooms(5, 2)
    duration = args.warmup + args.window + 120
    scenario = rooms.load_scenario(args.crowd, 30, args.rate, duration, (5, 2))
    order = {gid: i for i, (gid, _, _, _) in enumerate(grid)}
    original = rooms.gateway_yaml

    def yaml(port, gid, room, sock, extra):
        text = original(port, gid, room, sock, extra)
        if cluster is None:
            return text
        urls = ", ".join(f"mqtt://127.0.0.1:{cluster.mqtt[(order[gid] + k) % 3]}" for k in range(3))
        return text.replace(f"  url: mqtt://127.0.0.1:{port}", f"  url: [{urls}]\n  protocol: 3.1.1\n  max-qos: {args.max_qos}")
    rooms.gateway_yaml = yaml
    try:
        os.makedirs(work, exist_ok=True)
        port = broker_port if cluster is None else cluster.mqtt[0]
        b = rooms.Building(procs, baton, work, scenario, [(g, n) for g, n, _, _ in grid], port,
                           ["status:", "  interval: 5s"])
    finally:
        rooms.gateway_yaml = original
    return b, grid


def rate_part(procs, baton, work, kind, args, cluster=None, broker=None, broker_port=None):
    watch_port = broker_port if cluster is None else cluster.mqtt[0]
    sub, reader = rooms.subscribe(procs, watch_port, "baton/#")
    b, grid = run_building(procs, baton, os.path.join(work, kind), kind, args, cluster, broker_port)
    say(f"{kind}: {args.crowd} devices in 10 rooms at {args.rate:g} report/s; {args.warmup:g} s warm-up, {args.window:g} s measured")
    time.sleep(args.warmup)
    pids = cluster.pids() if cluster else [broker.pid]
    c0, t0, n0 = sum(cpu_ticks(p) for p in pids), time.monotonic(), len(reader.snapshot())
    time.sleep(args.window)
    c1, t1, n1 = sum(cpu_ticks(p) for p in pids), time.monotonic(), len(reader.snapshot())
    elapsed = t1 - t0
    delivered = (n1 - n0) / elapsed
    cpu = 100.0 * (c1 - c0) / CLOCK_TICKS / elapsed
    print(f"{kind}: a subscriber to baton/# sent {delivered:.0f} messages/s; broker CPU {cpu:.0f} % of one core", flush=True)
    return b, sub


def kill_round(cluster, victim, survivor, gateways_on, before, label):
    sub = subprocess.Popen(["stdbuf", "-oL", rooms.MOSQUITTO_SUB, "-h", "127.0.0.1", "-p", str(cluster.mqtt[survivor]),
                            "-t", "baton/gateways/+/status", "-F", "%U %r %t %p"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    killed = time.time()
    cluster.kill(victim)
    back = {}
    full = None
    deadline = time.time() + 30
    os.set_blocking(sub.stdout.fileno(), False)
    while time.time() < deadline and (len(back) < len(gateways_on) or full is None):
        for line in iter(sub.stdout.readline, ""):
            parts = line.split()
            if len(parts) == 4 and parts[1] == "0" and parts[3] == "online":
                g = parts[2].split("/")[2]
                if g in gateways_on and g not in back:
                    back[g] = float(parts[0]) - killed
        if full is None:
            began = time.time()
            try:
                seen = retained_devices(cluster.mqtt[survivor])
            except subprocess.TimeoutExpired:
                seen = None
            if seen is not None and before <= seen:
                full = began - killed
        time.sleep(0.1)
    sub.kill()
    figures = ", ".join(f"{g} {back[g]:.2f} s" if g in back else f"{g} not back" for g in gateways_on)
    print(f"kill ({label}, node {cluster.names[victim]}): gateways online on another node after: {figures}", flush=True)
    print(f"kill ({label}, node {cluster.names[victim]}): a fresh subscriber on node {cluster.names[survivor]} sent all "
          f"{len(before)} devices' activities after: " + (f"{full:.2f} s" if full is not None else "not within 30 s"), flush=True)
    restarted = time.time()
    cluster.start(victim)
    cluster.wait_healthy(victim)
    print(f"kill ({label}, node {cluster.names[victim]}): back and healthy {time.time() - restarted:.2f} s after its restart", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baton", help="the baton binary (.build/debug/baton, or a release build)")
    parser.add_argument("--parts", default="rate,kill")
    parser.add_argument("--crowd", type=int, default=300)
    parser.add_argument("--rate", type=float, default=1)
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--window", type=float, default=30)
    parser.add_argument("--max-qos", type=int, choices=(0, 1), default=0,
                        help="the cluster's gateways' broker.max-qos (board/nats-building.conf says 0)")
    parser.add_argument("--keep", help="keep every process's files in DIR")
    parser.add_argument("--budget", type=float, default=600)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    work = args.keep or tempfile.mkdtemp(prefix="baton-bench-cluster.")
    procs = Processes()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Budget()))
    signal.alarm(int(args.budget))
    try:
        if "rate" in parts:
            os.makedirs(os.path.join(work, "mosquitto"), exist_ok=True)
            broker, port = rooms.start_broker(procs, os.path.join(work, "mosquitto"))
            b, sub = rate_part(procs, args.baton, work, "mosquitto", args, broker=broker, broker_port=port)
            b.stop()
            procs.stop(sub)
            procs.stop(broker)
        cluster = Cluster(procs, work)
        b, sub = rate_part(procs, args.baton, work, "nats", args, cluster=cluster) if "rate" in parts else \
            (run_building(procs, args.baton, os.path.join(work, "nats"), "nats", args, cluster)[0], None)
        if "kill" in parts:
            if "rate" not in parts:
                time.sleep(args.warmup)
            grid = [g for g, _, _, _ in rooms.grid_rooms(5, 2)]
            streams, meta = cluster.leaders(0)
            say(f"MQTT streams' leaders {streams}, meta {meta}")
            victim = next(i for i, n in enumerate(cluster.names) if streams.get("$MQTT_sess") == f"baton-{n}")
            survivor = (victim + 1) % 3
            before = retained_devices(cluster.mqtt[survivor]) or set()
            kill_round(cluster, victim, survivor, [g for i, g in enumerate(grid) if i % 3 == victim], before,
                       "the $MQTT_sess leader")
            time.sleep(10)
            victim = next(i for i in range(3) if i != victim)
            survivor = (victim + 1) % 3
            if not cluster.move_leaders_off(victim):
                raise BenchError(f"node {cluster.names[victim]} kept a leadership: {cluster.leaders(survivor)}")
            before = retained_devices(cluster.mqtt[survivor]) or set()
            kill_round(cluster, victim, survivor, [g for i, g in enumerate(grid) if i % 3 == victim], before,
                       "a node leading nothing")
        b.stop()
        if sub is not None:
            procs.stop(sub)
    except Budget:
        print(f"bench-cluster: the budget of {args.budget:g} s ran out", file=sys.stderr)
        return 1
    except BenchError as e:
        print(f"bench-cluster: {e}", file=sys.stderr)
        return 1
    finally:
        procs.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
