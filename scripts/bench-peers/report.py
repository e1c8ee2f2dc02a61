#!/usr/bin/env python3
"""Combines the three halves of scripts/bench into one table (or one JSON object) and checks
the allocation budget. Standard library only; runs on the system python3.

  report.py --swift swift.json --cwalk cwalk.json --peers peers.json --budget decode.json [--json]

Exit status: 0 when every decoder saw the same reports and Baton's allocations per report are
within the budget in git; 1 otherwise. The speed aims are reported, never enforced: wall-clock
figures on a shared machine are not a pass/fail signal.
"""
import argparse
import json
import sys

AIM_C_WALK = 0.5     # Baton at least half the C walk's rate
AIM_PEER = 10.0      # Baton at least ten times the faster peer


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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
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
        for p in problems:
            print(f"bench: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
