"""What scripts/bench-rooms.py and scripts/bench-relay.py share: the children they start and
kill, the throwaway broker's port, and the /proc readings behind their CPU and memory figures.
Python 3 standard library only."""

import signal
import socket
import subprocess


class BenchError(Exception):
    """A part could not produce its figure; the text says which process and why."""


class Budget(Exception):
    pass


class Processes:
    """Every child this script starts, so that all of them are killed at the end, on error too."""

    def __init__(self):
        self.children = []

    def start(self, name, args, **kwargs):
        try:
            p = subprocess.Popen(args, **kwargs)
        except OSError as error:
            raise BenchError(f"could not start {name} ({args[0]}): {error}")
        self.children.append((name, p))
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=5):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def kill_all(self):
        for _, p in reversed(self.children):
            if p.poll() is None:
                p.kill()
        for _, p in self.children:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.children = []


def accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_ticks():
    """(busy, total) over all cores from /proc/stat: what else ran on the machine."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def percentile(sorted_values, p):
    """Nearest rank: a value actually measured."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


def status_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out
