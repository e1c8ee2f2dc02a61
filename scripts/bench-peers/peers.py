#!/usr/bin/env python3
"""The peers for scripts/bench (docs/performance.md): two widely used Python decoders of BLE
advertisements, timed on the same btsnoop capture the Swift bench decodes.

  peers.py CAPTURE [--runs N] [--theengs-subset N] [--skip-theengs]

Run inside a virtualenv holding bluetooth-data-tools and theengsdecoder (scripts/bench makes a
throwaway one). Reading the file and extracting each report's AD bytes is not timed: the peers
only ever see AD bytes (bluetooth-data-tools) or a JSON object built from them (Theengs), so
the HCI layer that Baton's figure includes is done for them, untimed.

Timed, each the best of --runs passes over all reports:
  * bluetooth-data-tools `parse_advertisement_data_bytes`, the entry point Home Assistant's
    bluetooth stack (habluetooth) calls per advertisement. It is an lru_cache(maxsize=1024)
    around a Cython parser; the cache is cleared before each pass and then works as it does in
    Home Assistant (hits on repeated payloads).
  * the same library's Cython parser without the cache (`_uncached_parse_advertisement_bytes`).
  * Both are driven by `collections.deque(map(f, data), maxlen=0)`: the loop runs in C, so no
    Python bytecode executes per report. What remains is CPython's call into the function,
    which any Python user of the library pays. That floor, `map(len, data)` driven the same
    way, is reported as `loop_overhead_seconds`, with a `net` rate that subtracts it.
  * Theengs Decoder `decodeBLE` on the JSON form it takes (id, rssi, name, manufacturerdata,
    servicedata, servicedatauuid), over a fixed subset (the first --theengs-subset reports):
    it is slow, so the rate is extrapolated from the subset, and the output says so.
Prints one JSON object.
"""
import argparse
import collections
import json
import struct
import sys
import time


def reports_in(path):
    """Yields (address, rssi, ad_bytes) for every advertising report in a btsnoop 1002 file
    (Core 5.4, Vol 4, Part E, §7.7.65.2 and §7.7.65.13)."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"btsnoop\0" or struct.unpack_from(">I", blob, 12)[0] != 1002:
        sys.exit(f"{path}: not a btsnoop file of datalink 1002")
    at = 16
    while at + 24 <= len(blob):
        included = struct.unpack_from(">I", blob, at + 4)[0]
        at += 24
        packet = blob[at:at + included]
        at += included
        if len(packet) < 5 or packet[0] != 0x04 or packet[1] != 0x3E:
            continue
        sub, count, i = packet[3], packet[4], 5
        for _ in range(count):
            if sub == 0x02:  # type, address type, address (6), length, data, RSSI
                length = packet[i + 8]
                address = packet[i + 2:i + 8]
                data = packet[i + 9:i + 9 + length]
                rssi = struct.unpack_from("b", packet, i + 9 + length)[0]
                i += 10 + length
            elif sub == 0x0D:  # 24-byte fixed part ending in the data length, then data
                address = packet[i + 3:i + 9]
                rssi = struct.unpack_from("b", packet, i + 13)[0]
                length = packet[i + 23]
                data = packet[i + 24:i + 24 + length]
                i += 24 + length
            else:
                break
            yield address, rssi, data


def ad_structures(data):
    i = 0
    while i < len(data):
        length = data[i]
        if length == 0 or i + 1 + length > len(data):
            return
        yield data[i + 1], data[i + 2:i + 1 + length]
        i += 1 + length


def theengs_json(address, rssi, data):
    """The object OpenMQTTGateway hands Theengs Decoder for one advertisement."""
    obj = {"id": ":".join(f"{b:02X}" for b in reversed(address)), "rssi": rssi}
    for ad_type, value in ad_structures(data):
        if ad_type in (0x08, 0x09):
            obj["name"] = value.decode("utf-8", "replace")
        elif ad_type == 0xFF:
            obj["manufacturerdata"] = value.hex()
        elif ad_type == 0x16 and len(value) >= 2:
            obj["servicedatauuid"] = f"0x{value[1]:02x}{value[0]:02x}"
            obj["servicedata"] = value[2:].hex()
        elif ad_type == 0x0A and len(value) == 1:
            obj["txpower"] = struct.unpack("b", value)[0]
    return json.dumps(obj, separators=(",", ":"))


def best_of(runs, body):
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        body()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("capture")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--theengs-subset", type=int, default=5000)
    ap.add_argument("--skip-theengs", action="store_true")
    args = ap.parse_args()

    reports = list(reports_in(args.capture))
    data = [d for _, _, d in reports]
    n = len(data)
    out = {"reports": n, "python": sys.version.split()[0]}

    import bluetooth_data_tools
    from bluetooth_data_tools import gap

    drain = collections.deque(maxlen=0).extend
    cached = gap.parse_advertisement_data_bytes
    uncached = gap._uncached_parse_advertisement_bytes

    def run_cached():
        cached.cache_clear()
        drain(map(cached, data))

    overhead = best_of(args.runs, lambda: drain(map(len, data)))
    t_cached = best_of(args.runs, run_cached)
    t_uncached = best_of(args.runs, lambda: drain(map(uncached, data)))
    info = cached.cache_info()

    def for_loop():
        f = cached
        for d in data:
            f(d)

    t_loop = best_of(args.runs, lambda: (cached.cache_clear(), for_loop()))
    t_empty = best_of(args.runs, lambda: [None for _ in data])
    # Results must be real: count manufacturer entries and names over one uncached pass.
    parsed = list(map(uncached, data))
    out["bluetooth_data_tools"] = {
        "version": bluetooth_data_tools.__version__,
        "api": "parse_advertisement_data_bytes (lru_cache 1024 around the Cython parser)",
        "seconds": t_cached,
        "reports_per_second": n / t_cached,
        "cache_hits": info.hits,
        "cache_misses": info.misses,
        "uncached_api": "_uncached_parse_advertisement_bytes",
        "uncached_seconds": t_uncached,
        "uncached_reports_per_second": n / t_uncached,
        "loop_overhead_seconds": overhead,
        "net_reports_per_second": n / max(t_cached - overhead, 1e-9),
        "net_uncached_reports_per_second": n / max(t_uncached - overhead, 1e-9),
        "python_for_loop_reports_per_second": n / t_loop,
        "python_empty_for_loop_seconds": t_empty,
        "with_manufacturer_data": sum(1 for p in parsed if p[3]),
        "with_name": sum(1 for p in parsed if p[0] is not None),
    }

    if not args.skip_theengs:
        import importlib.metadata
        from TheengsDecoder import decodeBLE

        subset = [theengs_json(*r) for r in reports[:args.theengs_subset]]
        decoded = [0]

        def run_theengs():
            hits = 0
            for s in subset:
                if decodeBLE(s) is not None:
                    hits += 1
            decoded[0] = hits

        t = best_of(1, run_theengs)
        out["theengs"] = {
            "version": importlib.metadata.version("theengsdecoder"),
            "api": "TheengsDecoder.decodeBLE(json)",
            "subset": len(subset),
            "seconds": t,
            "reports_per_second": len(subset) / t,
            "extrapolated": len(subset) < n,
            "recognised": decoded[0],
        }

    print(json.dumps(out))


if __name__ == "__main__":
    main()
