#!/usr/bin/env python3
"""Combines the parts of scripts/bench into one table (or one JSON object) and checks the
allocation budgets. Standard library only; runs on the system python3.

  report.py --swift swift.json --cwalk cwalk.json --peers peers.json --budget decode.json
            [--gateway gateway.json --gateway-budget gateway-budget.json] [--json]

Exit status: 0 when every decoder saw the same reports, Baton's allocations per report are
within the budget in git, and (with --gateway) the gateway loop's allocations per unchanged
advertisement are within theirs; 1 otherwise. The speed aims, the gateway's latency and its
memory are reported, never enforced: wall-clock figures on a shared machine are not a
pass/fail signal, and no peer gateway runs in the bench to compare them with.
"""
import argparse
import json
import sys

AIM_C_WALK = 0.5     # Baton at least half the C walk's rate
AIM_PEER = 10.0      # Baton at least ten times the faster peer
AIM_FIRMWARE_HWM_KIB = 5 * 1024  # the firmware's peak resident set holding 1,000 activities (issue 17)


def rate(x):
    if x >= 1e6:
        return f"{x / 1e6:.1f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def ratio(x):
    return f"{x:.2f}×" if x < 100 else f"{x:,.0f}×"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swift", required=True)
    ap.add_argument("--cwalk", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--budget", required=True)
    ap.add_argument("--gateway", help="GatewayBench --json output")
    ap.add_argument("--gateway-budget", help="Tests/Benchmarks/Thresholds/gateway.json")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if bool(args.gateway) != bool(args.gateway_budget):
        ap.error("--gateway and --gateway-budget go together")
    load = lambda p: json.load(open(p))
    swift, cwalk, peers, budget = load(args.swift), load(args.cwalk), load(args.peers), load(args.budget)

    problems = []
    counts = {"baton": swift["reports"], "c-walk": cwalk["reports"], "peers": peers["reports"]}
    if len(set(counts.values())) != 1:
        problems.append(f"decoders disagree on the number of reports: {counts}")

    baton = swift["reports_per_second"]
    rows = [("Baton: CaptureReader + AdvertisementDecoder (full decode)", baton, None)]
    rows.append(("C walk: records, reports, AD structures (the floor)", cwalk["reports_per_second"], None))
    bdt = peers["bluetooth_data_tools"]
    rows.append((f"bluetooth-data-tools {bdt['version']} parse_advertisement_data_bytes (HA's, cached)",
                 bdt["reports_per_second"], None))
    rows.append((f"bluetooth-data-tools {bdt['version']} parser without its cache",
                 bdt["uncached_reports_per_second"], None))
    peer_rates = {"bluetooth-data-tools": max(bdt["reports_per_second"], bdt["uncached_reports_per_second"])}
    th = peers.get("theengs")
    if th:
        note = f" ({th['subset']:,}-report subset, extrapolated)" if th["extrapolated"] else ""
        rows.append((f"Theengs Decoder {th['version']} decodeBLE{note}", th["reports_per_second"], None))
        peer_rates["theengs"] = th["reports_per_second"]
    faster_name = max(peer_rates, key=peer_rates.get)
    faster = peer_rates[faster_name]

    vs_c = baton / cwalk["reports_per_second"]
    vs_peer = baton / faster
    aims = {
        "c_walk": {"aim": AIM_C_WALK, "ratio": vs_c, "met": vs_c >= AIM_C_WALK},
        "faster_peer": {"aim": AIM_PEER, "peer": faster_name, "peer_reports_per_second": faster,
                        "ratio": vs_peer, "met": vs_peer >= AIM_PEER},
    }

    limit = budget["decode_allocations_per_report"]
    per_report = swift["allocations_per_report"]
    allocation_ok = per_report <= limit
    if not allocation_ok:
        problems.append(f"allocations per report {per_report} exceed the budget {limit} "
                        f"(Tests/Benchmarks/Thresholds/decode.json)")
    if swift["calibration_mallocs"] < 1000:
        problems.append("the malloc counter did not see the calibration allocations")

    gateway = load(args.gateway) if args.gateway else None
    gateway_check = None
    if gateway is not None:
        gateway_budget = load(args.gateway_budget)
        gateway_check = check_gateway(gateway, gateway_budget, problems)
        firmware = compare_firmware(gateway, gateway_budget, problems)

    if args.json:
        out = {
            "capture": {k: swift[k] for k in ("reports", "records", "bytes", "devices", "seed")},
            "baton": swift, "c_walk": cwalk, "peers": peers,
            "ratios": {"baton_over_c_walk": vs_c,
                       **{f"baton_over_{name}": baton / r for name, r in peer_rates.items()}},
            "aims": aims,
            "allocations": {"per_report": per_report, "budget": limit, "within_budget": allocation_ok},
            "problems": problems,
        }
        if gateway is not None:
            out["gateway"] = gateway
            out["gateway_allocations"] = gateway_check
            if firmware is not None:
                out["firmware_vs_full"] = firmware
        print(json.dumps(out, indent=2))
    else:
        print(f"capture: {swift['reports']:,} reports in {swift['records']:,} btsnoop records "
              f"({swift['bytes'] / 1e6:.1f} MB), {swift['devices']} devices, seed {swift['seed']}; "
              f"one core; best of {len(swift['runs_seconds'])} runs")
        print()
        width = max(len(r[0]) for r in rows)
        print(f"{'decoder':<{width}}  {'reports/s':>11}  {'ns/report':>10}  {'Baton is':>9}")
        for name, r, _ in rows:
            print(f"{name:<{width}}  {rate(r):>11}  {1e9 / r:>10.1f}  {ratio(baton / r):>9}")
        print()
        print(f"allocations per report (Baton, steady state, counted by malloc-interposer): "
              f"{per_report:g} ({swift['mallocs']} mallocs over {swift['reports_counted']:,} reports; "
              f"budget {limit:g}) {'OK' if allocation_ok else 'OVER BUDGET'}")
        print(f"aim Baton ≥ {AIM_C_WALK}× the C walk: {vs_c:.2f}× — {'met' if aims['c_walk']['met'] else 'NOT met'}")
        print(f"aim Baton ≥ {AIM_PEER:g}× the faster peer ({faster_name}, {rate(faster)}/s): {vs_peer:.2f}× — "
              f"{'met' if aims['faster_peer']['met'] else 'NOT met'}")
        if gateway is not None:
            print()
            print_gateway(gateway, gateway_check)
            if firmware is not None:
                print()
                print_firmware(gateway, firmware)
        for p in problems:
            print(f"bench: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


def check_gateway(gateway, budget, problems):
    """The gateway loop's allocation budget, and the checks that make its figure mean something."""
    a = gateway.get("allocations")
    if a is None:
        problems.append("the gateway bench did not measure allocations")
        return None
    limit = budget["gateway_allocations_per_unchanged_advertisement"]
    per = a["allocations_per_unchanged_advertisement"]
    ok = per <= limit
    if not ok:
        problems.append(f"gateway allocations per unchanged advertisement {per} exceed the budget {limit} "
                        f"(Tests/Benchmarks/Thresholds/gateway.json)")
    if a["calibration_mallocs"] < 1000 or a["library_calibration_mallocs"] < 1:
        problems.append("the malloc counter did not see the calibration allocations (Swift objects, libmosquitto)")
    if a["published_during_window"] != 0:
        problems.append(f"the gateway published {a['published_during_window']} changes while its allocations were "
                        f"counted: the window did not hold only unchanged advertisements")
    # The same loop holding a beacon key and IRKs (docs/security.md §4.4, §10): same budget.
    k = gateway.get("allocations_keyed")
    keyed = None
    if k is not None:
        keyed = k["allocations_per_unchanged_advertisement"]
        if keyed > limit:
            ok = False
            problems.append(f"with a beacon key and IRKs, gateway allocations per unchanged advertisement {keyed} "
                            f"exceed the budget {limit}")
    # Long extended advertisements in fragments (docs/radio.md): every fragment is reassembled in
    # the fixed pool, so the same budget holds per report, and per fragment.
    f = gateway.get("allocations_fragmented")
    fragmented = None
    if f is not None:
        fragmented = f["allocations_per_fragment"]
        frag_limit = budget.get("gateway_allocations_per_fragment", limit)
        if f["allocations_per_unchanged_advertisement"] > limit or fragmented > frag_limit:
            ok = False
            problems.append(f"with advertisements in fragments, gateway allocations per report "
                            f"{f['allocations_per_unchanged_advertisement']} / per fragment {fragmented} exceed the budget")
        if f["fragments"] == 0 or f["assembled"] == 0:
            problems.append("the fragmented pass counted no fragments: it did not measure reassembly")
        if f["published_during_window"] != 0:
            problems.append(f"the gateway published {f['published_during_window']} changes during the fragmented pass")
    # Home Assistant's Bluetooth proxy on, one client subscribed (docs/esphome.md): every report
    # also goes into a batch to the client, and the same budget holds.
    e = gateway.get("allocations_esphome")
    esphome = None
    if e is not None:
        esphome = e["allocations_per_unchanged_advertisement"]
        if esphome > limit:
            ok = False
            problems.append(f"with the ESPHome proxy and a client subscribed, gateway allocations per report {esphome} "
                            f"exceed the budget {limit}")
        if e["esphome_bytes"] == 0:
            problems.append("the ESPHome pass sent its client nothing while counting: it did not measure the proxy")
    return {"per_unchanged_advertisement": per, "keyed_per_unchanged_advertisement": keyed,
            "per_fragment": fragmented, "esphome_per_unchanged_advertisement": esphome, "budget": limit, "within_budget": ok}


def compare_firmware(g, budget, problems):
    """The firmware beside the full build (GatewayBench --firmware): each figure, and firmware ÷ full.
    None when the gateway bench ran without the firmware."""
    fm, m = g.get("firmware_memory"), g.get("memory")
    sizes, tp, ht = g.get("sizes", {}), g.get("throughput", {}), g.get("heaptrack", {})
    if fm is None and "firmware" not in tp and "firmware" not in ht:
        return None
    rows = []

    def row(key, full, firmware):
        rows.append({"figure": key, "full": full, "firmware": firmware,
                     "ratio": firmware / full if full and firmware is not None else None})

    if m and fm:
        for state in ("idle", "loaded"):
            for field in ("vm_hwm_kib", "rss_anon_kib", "rss_file_kib"):
                row(f"{state}_{field}", m[state]["memory"][field], fm[state]["memory"][field])
    if "full" in sizes and "firmware" in sizes:
        f, w = sizes["full"], sizes["firmware"]
        for field in ("executable_bytes", "executable_stripped_bytes", "executable_and_swift_runtime_bytes",
                      "system_libraries_bytes"):
            row(field, f[field], w[field])
    if "full" in tp and "firmware" in tp:
        row("reports_per_second", tp["full"]["reports_per_second"], tp["firmware"]["reports_per_second"])
    if "full" in ht and "firmware" in ht:
        row("allocations_per_unchanged_advertisement", ht["full"]["allocations_per_unchanged_advertisement"],
            ht["firmware"]["allocations_per_unchanged_advertisement"])
    out = {"rows": rows}
    if fm:
        hwm = fm["loaded"]["memory"]["vm_hwm_kib"]
        out["aim_vm_hwm_kib"] = {"aim": AIM_FIRMWARE_HWM_KIB, "measured": hwm, "met": hwm <= AIM_FIRMWARE_HWM_KIB}
        # Enforced only once Tests/Benchmarks/Thresholds/gateway.json sets it (a measured value backs it).
        limit = budget.get("firmware_vm_hwm_kib")
        if limit is not None and hwm > limit:
            problems.append(f"the firmware's VmHWM holding {fm['loaded']['table_fill']} activities, {hwm} KiB, "
                            f"exceeds {limit} KiB (Tests/Benchmarks/Thresholds/gateway.json)")
    # heaptrack counts the whole running process: a PUBACK read in one run and not in the other
    # moves the difference by an allocation or two, hence a budget per report, not 0 exactly.
    limit = budget.get("heaptrack_allocations_per_unchanged_advertisement")
    for label, h in ht.items():
        per = h["allocations_per_unchanged_advertisement"]
        if limit is not None and per > limit:
            problems.append(f"{label} build under heaptrack: {per:g} allocations per unchanged advertisement exceed "
                            f"{limit:g} (Tests/Benchmarks/Thresholds/gateway.json); its call sites: "
                            f"heaptrack.{label}.difference in the JSON")
    out["heaptrack_budget"] = limit
    return out


FIGURES = {
    "idle_vm_hwm_kib": ("VmHWM idle", "kib"), "idle_rss_anon_kib": ("RssAnon idle", "kib"),
    "idle_rss_file_kib": ("RssFile idle", "kib"),
    "loaded_vm_hwm_kib": ("VmHWM, 1,000 activities", "kib"), "loaded_rss_anon_kib": ("RssAnon, 1,000 activities", "kib"),
    "loaded_rss_file_kib": ("RssFile, 1,000 activities", "kib"),
    "executable_bytes": ("executable", "bytes"), "executable_stripped_bytes": ("executable, stripped", "bytes"),
    "executable_and_swift_runtime_bytes": ("executable + Swift runtime .so it maps", "bytes"),
    "system_libraries_bytes": ("system libraries it maps (libc, libcrypto …)", "bytes"),
    "reports_per_second": ("reports/s through --radio capture:FILE", "rate"),
    "allocations_per_unchanged_advertisement": ("allocations per unchanged advertisement (heaptrack)", "number"),
}


def figure(value, unit):
    if value is None:
        return "–"
    if unit == "kib":
        return kib(value)
    if unit == "bytes":
        return f"{value / 1e6:,.2f} MB"
    if unit == "rate":
        return f"{rate(value)}/s"
    return f"{value:g}"


def print_firmware(g, f):
    print("the firmware (Embedded Swift, .build-firmware/amd64/baton) beside the release `baton gateway`,")
    print("same input, same run:")
    width = max(len(FIGURES[r["figure"]][0]) for r in f["rows"]) if f["rows"] else 10
    print(f"  {'':<{width}}  {'full':>12}  {'firmware':>12}  {'fw ÷ full':>9}")
    for r in f["rows"]:
        name, unit = FIGURES[r["figure"]]
        q = "–" if r["ratio"] is None or unit == "number" else f"{r['ratio']:.2f}"
        print(f"  {name:<{width}}  {figure(r['full'], unit):>12}  {figure(r['firmware'], unit):>12}  {q:>9}")
    aim = f.get("aim_vm_hwm_kib")
    if aim:
        print(f"aim firmware VmHWM ≤ {kib(aim['aim'])} holding 1,000 activities: {kib(aim['measured'])} — "
              f"{'met' if aim['met'] else 'NOT met'}")
    fm = g.get("firmware_memory")
    if fm:
        rss = fm["loaded"]["resident_by_mapping"]["rss"]
        top = ", ".join(f"{r['path'].rsplit('/', 1)[-1]} {r['rss_kib']:,}" for r in rss[:8])
        print(f"  the firmware's resident KiB by mapping, 1,000 activities (/proc/PID/smaps): {top}")
    ht = g.get("heaptrack", {})
    for label, h in ht.items():
        print(f"  heaptrack, {label}: {h['long_allocations']:,} − {h['short_allocations']:,} allocations over "
              f"{h['long_reports']:,} − {h['short_reports']:,} unchanged reports = "
              f"{h['allocations_per_unchanged_advertisement']:g} per report (budget {f['heaptrack_budget']})")


def kib(x):
    return f"{x:,} KiB"


def us(x):
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} µs"


def print_gateway(g, check):
    print("gateway: the release `baton gateway` and a mosquitto on 127.0.0.1. No peer gateway runs here")
    print("(Theengs Gateway and ESPresense need a BLE adapter or an ESP32): these are figures, not ratios.")
    lat = g.get("latency")
    if lat:
        print()
        print(f"end-to-end latency, report written to the controller socket → retained message at a subscriber,")
        print(f"{lat['changes']:,} changes one at a time (after {lat['warmup']} warm-up):")
        print(f"  p50 {us(lat['p50_us'])}   p90 {us(lat['p90_us'])}   p99 {us(lat['p99_us'])}   "
              f"p99.9 {us(lat['p999_us'])}   max {us(lat['max_us'])}   mean {us(lat['mean_us'])}")
    mem = g.get("memory")
    if mem:
        idle, loaded = mem["idle"], mem["loaded"]
        rate = mem["reports_per_second_sent"]
        pace = f"{rate:,} reports/s" if rate else "as fast as the socket took them"
        print()
        print(f"resident memory (/proc/PID/status), table.capacity 1024; {loaded['reports']:,} reports sent at {pace}:")
        rows = [("idle (no devices)", idle),
                (f"{loaded['table_fill']:,} activities, {loaded['apple_fill']} Apple entries", loaded)]
        width = max(len(r[0]) for r in rows)
        print(f"  {'':<{width}}  {'VmHWM':>10}  {'RssAnon':>10}  {'RssFile':>10}")
        for name, r in rows:
            m = r["memory"]
            print(f"  {name:<{width}}  {kib(m['vm_hwm_kib']):>10}  {kib(m['rss_anon_kib']):>10}  {kib(m['rss_file_kib']):>10}")
        print(f"  per activity: {mem['per_device_rss_anon_bytes']:,.0f} bytes RssAnon, "
              f"{mem['per_device_vm_hwm_bytes']:,.0f} bytes VmHWM")
    a = g.get("allocations")
    if a and check:
        print()
        print(f"allocations per unchanged advertisement through Gateway.turn() (in process, malloc-interposer): "
              f"{check['per_unchanged_advertisement']:g}")
        print(f"  ({a['mallocs']} mallocs over {a['reports_counted']:,} reports: {a['beacons']:,} beacons, "
              f"{a['continuity']:,} Continuity, {a['other']:,} other; {a['turns']:,} turns in "
              f"{a['window_ms'] / 1000:.1f} s; budget {check['budget']:g}) "
              f"{'OK' if check['within_budget'] else 'OVER BUDGET'}")


if __name__ == "__main__":
    main()
