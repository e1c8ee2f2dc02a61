// The gateway half of scripts/bench (docs/performance.md "The gateway"). Three figures of the
// whole service, each measured against a real mosquitto on 127.0.0.1 started here:
//   * latency: advertising report in, retained activity message out at a subscriber, for
//     `--changes` changes one at a time, through the release `baton gateway` (child process);
//   * memory: VmHWM and RssAnon of the release gateway holding `--devices` activities, and
//     of the same gateway holding none;
//   * allocations: mallocs per unchanged advertisement through `Gateway.turn()`, in process,
//     counted by malloc-interposer.
// With `--firmware PATH` (the Embedded Swift build, scripts/firmware) the memory runs it beside
// the release build on the same input, and (Firmware.swift) both binaries' sizes and resident
// pages per mapping, their reports/s through `--radio capture:FILE` (throughput), and their
// allocations per unchanged advertisement counted in the running binary by heaptrack.
// No peer runs here: Theengs Gateway and ESPresense need a BLE adapter or an ESP32.
import ArgumentParser
import BatonTestSupport
import Foundation
import Glibc

@main
struct GatewayBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "GatewayBench",
        abstract: "Measures the gateway: end-to-end latency, peak memory, allocations per unchanged advertisement.")

    enum Part: String, ExpressibleByArgument, CaseIterable { case latency, memory, allocations, throughput, heaptrack }

    @Option(help: "The release `baton` binary (latency, memory, throughput and heaptrack run it as a child process).")
    var baton: String?

    @Option(help: "The firmware (.build-firmware/amd64/baton): memory, throughput and heaptrack run it beside --baton.")
    var firmware: String?

    @Option(help: "Which parts to run, comma-separated: latency, memory, allocations, throughput, heaptrack.")
    var parts = "latency,memory,allocations,throughput,heaptrack"

    @Option(help: "Throughput: reports in the replayed capture (the decode bench's generator).")
    var throughputReports = 250_000

    @Option(help: "Throughput: the generator's devices.")
    var throughputDevices = 300

    @Option(help: "Throughput: replays of each capture per binary (the best counts).")
    var throughputRuns = 3

    @Option(help: "Heaptrack: unchanged reports in the short and the long capture, comma-separated.")
    var heaptrackReports = "20000,100000"

    @Option(help: "Latency: measured changes (after the warm-up).")
    var changes = 10_000

    @Option(help: "Latency: changes sent first and not measured.")
    var warmup = 200

    @Option(help: "Memory: Baton devices the loaded gateway holds (the generator makes three times as many devices).")
    var devices = 1_000

    @Option(help: "Memory: advertising reports sent to the loaded gateway (default 40 per Baton device: every one is heard).")
    var memoryReports: Int?

    @Option(help: "Memory: reports per second sent to the loaded gateway (0: as fast as the socket takes them).")
    var memoryRate = 5_000

    @Option(help: "Allocations: simulated devices (a third each Baton, Apple, ordinary).")
    var allocationDevices = 150

    @Option(help: "Allocations: unchanged reports counted.")
    var allocationReports = 100_000

    @Option(help: "Allocations: the in-process gateway's status.interval in seconds (its stats publish allocates; 30 is the default).")
    var allocationStatusInterval = 30

    @Option(help: "Allocations: the in-process gateway's broker.keepalive in seconds (its PINGREQ allocates; 30 is the default).")
    var allocationKeepalive = 30

    @Option(help: "Generator seed.")
    var seed: UInt64 = 1

    @Flag(help: "Print one JSON object instead of text.")
    var json = false

    mutating func validate() throws {
        let names = parts.split(separator: ",").map(String.init)
        guard !names.isEmpty, names.allSatisfy({ Part(rawValue: $0) != nil }) else {
            throw ValidationError("--parts takes latency, memory and allocations, comma-separated")
        }
        if names.contains(where: { $0 != "allocations" }) {
            guard let baton, FileManager.default.isExecutableFile(atPath: baton) else {
                throw ValidationError("--baton must name the built `baton` binary for latency, memory, throughput and heaptrack")
            }
        }
        if let firmware, !FileManager.default.isExecutableFile(atPath: firmware) {
            throw ValidationError("--firmware \(firmware) is not an executable (scripts/firmware amd64 builds it)")
        }
        if names.contains("heaptrack"), !FileManager.default.isExecutableFile(atPath: "/usr/bin/heaptrack") {
            throw ValidationError("heaptrack is missing: apt-get install heaptrack (scripts/setup)")
        }
        let lengths = heaptrackReports.split(separator: ",").compactMap { Int($0) }
        guard lengths.count == 2, lengths[0] >= 1000, lengths[1] > lengths[0], throughputReports >= 10_000,
              throughputDevices >= 3, throughputRuns >= 1 else {
            throw ValidationError("--heaptrack-reports SHORT,LONG (1000 ≤ SHORT < LONG), --throughput-reports ≥ 10000, --throughput-devices ≥ 3, --throughput-runs ≥ 1")
        }
        guard changes >= 100, warmup >= 1, devices >= 1, (memoryReports ?? devices) >= devices, allocationDevices >= 3,
              allocationReports >= 1000, memoryRate >= 0,
              allocationStatusInterval >= 1, allocationKeepalive >= 5 else {
            throw ValidationError("--changes ≥ 100, --warmup ≥ 1, --devices ≥ 1, --memory-reports ≥ --devices, --allocation-devices ≥ 3, --allocation-reports ≥ 1000, --memory-rate ≥ 0, --allocation-status-interval ≥ 1, --allocation-keepalive ≥ 5")
        }
    }

    func run() throws {
        let wanted = Set(parts.split(separator: ",").compactMap { Part(rawValue: String($0)) })
        // A child killed mid-write must not kill the bench with SIGPIPE.
        signal(SIGPIPE, SIG_IGN)
        let dir = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let broker = try MosquittoBroker()

        var allocations: AllocationFigures?
        var keyedAllocations: AllocationFigures?
        var fragmentedAllocations: AllocationFigures?
        var esphomeAllocations: AllocationFigures?
        var latency: LatencyFigures?
        var memory: [(String, MemoryFigures)] = []
        var sizes: [(String, BinarySize)] = []
        var throughput: [ThroughputFigures] = []
        var heaptrack: [HeaptrackFigures] = []
        let binaries: [(String, String)] = (baton.map { [("full", $0)] } ?? []) + (firmware.map { [("firmware", $0)] } ?? [])
        if wanted.contains(.allocations) {
            say("allocations: \(allocationReports) unchanged reports from \(allocationDevices) devices, in process")
            allocations = try measureAllocations(broker: broker, devices: allocationDevices, warmup: 5_000,
                                                 measured: allocationReports, seed: seed,
                                                 statusInterval: .seconds(allocationStatusInterval),
                                                 keepalive: allocationKeepalive)
            say("allocations again with a beacon key, 8 IRKs and re-advertising: every report verified or resolved, another room's activity on the air")
            keyedAllocations = try measureAllocations(broker: broker, devices: allocationDevices, warmup: 5_000,
                                                      measured: allocationReports, seed: seed,
                                                      statusInterval: .seconds(allocationStatusInterval),
                                                      keepalive: allocationKeepalive, keyed: true)
            say("allocations again with long extended advertisements in fragments, interleaved (docs/radio.md)")
            fragmentedAllocations = try measureAllocations(broker: broker, devices: allocationDevices, warmup: 5_000,
                                                           measured: allocationReports, seed: seed,
                                                           statusInterval: .seconds(allocationStatusInterval),
                                                           keepalive: allocationKeepalive, fragmented: true)
            say("allocations again with Home Assistant's Bluetooth proxy on and one client subscribed (docs/esphome.md)")
            esphomeAllocations = try measureAllocations(broker: broker, devices: allocationDevices, warmup: 5_000,
                                                        measured: allocationReports, seed: seed,
                                                        statusInterval: .seconds(allocationStatusInterval),
                                                        keepalive: allocationKeepalive, esphome: true)
        }
        if wanted.contains(.latency), let baton {
            say("latency: \(changes) changes (after \(warmup) warm-up) through \(baton) gateway")
            latency = try measureLatency(baton: baton, broker: broker, dir: dir, changes: changes, warmup: warmup)
        }
        if wanted.contains(.memory) {
            let memoryReports = memoryReports ?? 40 * devices
            say("memory: an idle gateway, then one holding \(devices) activities (\(memoryReports) reports, \(memoryRate == 0 ? "unpaced" : "\(memoryRate)/s")): \(binaries.map { $0.0 }.joined(separator: ", "))")
            memory = try measureMemory(binaries: binaries, broker: broker, dir: dir, devices: devices, reports: memoryReports,
                                       rate: memoryRate, seed: seed)
            for (label, m) in memory {
                let path = binaries.first { $0.0 == label }!.1  // Proof: memory is measured for each of binaries.
                sizes.append((label, try BinarySize(path: path, mapped: m.loaded.mappings, dir: dir)))
            }
        }
        if wanted.contains(.throughput) {
            say("throughput: \(throughputReports) reports from \(throughputDevices) devices through --radio capture:FILE, best of \(throughputRuns): \(binaries.map { $0.0 }.joined(separator: ", "))")
            throughput = try measureThroughput(binaries: binaries, broker: broker, dir: dir, reports: throughputReports,
                                               devices: throughputDevices, seed: seed, runs: throughputRuns)
        }
        if wanted.contains(.heaptrack) {
            let lengths = heaptrackReports.split(separator: ",").compactMap { Int($0) }
            say("heaptrack: the running binary's allocations over \(lengths[0]) and \(lengths[1]) unchanged reports: \(binaries.map { $0.0 }.joined(separator: ", "))")
            heaptrack = try measureHeaptrack(binaries: binaries, broker: broker, dir: dir, devices: allocationDevices,
                                             short: lengths[0], long: lengths[1], seed: seed)
        }
        let full = memory.first { $0.0 == "full" }?.1
        let fw = memory.first { $0.0 == "firmware" }?.1
        print(json ? jsonText(latency, full, allocations, keyedAllocations, fragmentedAllocations, esphomeAllocations, fw, sizes, throughput, heaptrack)
                   : text(latency, full, allocations, keyedAllocations, fragmentedAllocations, esphomeAllocations, fw, sizes, throughput, heaptrack))
    }

    func say(_ s: String) { FileHandle.standardError.write(Data("gateway bench: \(s)\n".utf8)) }

    func jsonText(_ l: LatencyFigures?, _ m: MemoryFigures?, _ a: AllocationFigures?, _ k: AllocationFigures?,
                  _ f: AllocationFigures?, _ e: AllocationFigures?, _ fw: MemoryFigures?, _ sizes: [(String, BinarySize)],
                  _ t: [ThroughputFigures], _ h: [HeaptrackFigures]) -> String {
        var fields: [String] = []
        if let fw { fields.append("\"firmware_memory\": \(fw.json)") }
        if !sizes.isEmpty { fields.append("\"sizes\": {" + sizes.map { "\"\($0.0)\": \($0.1.json)" }.joined(separator: ", ") + "}") }
        if !t.isEmpty { fields.append("\"throughput\": {" + t.map { "\"\($0.label)\": \($0.json)" }.joined(separator: ", ") + "}") }
        if !h.isEmpty { fields.append("\"heaptrack\": {" + h.map { "\"\($0.label)\": \($0.json)" }.joined(separator: ", ") + "}") }
        if let l { fields.append("\"latency\": \(l.json)") }
        if let m { fields.append("\"memory\": \(m.json)") }
        if let a { fields.append("\"allocations\": \(a.json)") }
        if let k { fields.append("\"allocations_keyed\": \(k.json)") }
        if let f { fields.append("\"allocations_fragmented\": \(f.json)") }
        if let e { fields.append("\"allocations_esphome\": \(e.json)") }
        return "{" + fields.joined(separator: ", ") + "}"
    }

    func text(_ l: LatencyFigures?, _ m: MemoryFigures?, _ a: AllocationFigures?, _ k: AllocationFigures?,
              _ f: AllocationFigures?, _ e: AllocationFigures?, _ fw: MemoryFigures?, _ sizes: [(String, BinarySize)],
              _ t: [ThroughputFigures], _ h: [HeaptrackFigures]) -> String {
        var lines: [String] = []
        if let fw {
            lines.append("firmware memory idle: VmHWM \(fw.idle.memory.vmHWM) KiB, RssAnon \(fw.idle.memory.rssAnon) KiB")
            lines.append("firmware memory with \(fw.loaded.tableFill) activities: VmHWM \(fw.loaded.memory.vmHWM) KiB, RssAnon \(fw.loaded.memory.rssAnon) KiB")
        }
        for (label, s) in sizes {
            lines.append("\(label) size: executable \(s.bytes) bytes (stripped \(s.strippedBytes)), Swift runtime mapped \(s.swiftRuntimeBytes) bytes, system libraries \(s.systemBytes) bytes")
        }
        for x in t { lines.append(String(format: "%@ throughput: %.0f reports/s (%d reports)", x.label, x.reportsPerSecond, x.bigReports)) }
        for x in h {
            lines.append("\(x.label) heaptrack: \(x.longAllocations) − \(x.shortAllocations) allocations over \(x.longReports) − \(x.shortReports) unchanged reports = \(x.perReport) per report")
        }
        if let l {
            let s = l.samples
            lines.append(String(format: "latency over %d changes: p50 %.0f µs, p99 %.0f µs, max %.0f µs, mean %.0f µs",
                                s.count, percentile(s, 0.5), percentile(s, 0.99), s.last!, s.reduce(0, +) / Double(s.count)))
        }
        if let m {
            lines.append("memory idle: VmHWM \(m.idle.memory.vmHWM) KiB, RssAnon \(m.idle.memory.rssAnon) KiB")
            lines.append("memory with \(m.loaded.tableFill) activities: VmHWM \(m.loaded.memory.vmHWM) KiB, RssAnon \(m.loaded.memory.rssAnon) KiB")
            lines.append(String(format: "per activity: %.0f bytes (VmHWM), %.0f bytes (RssAnon)", m.perDeviceHWMBytes, m.perDeviceAnonBytes))
        }
        if let a {
            lines.append("allocations: \(a.mallocs) mallocs over \(a.reports) unchanged reports in \(a.turns) turns = \(a.perReport) per report; published meanwhile \(a.publishedDuringWindow)")
        }
        if let k {
            lines.append("allocations with a beacon key, 8 IRKs and re-advertising: \(k.mallocs) mallocs over \(k.reports) unchanged reports in \(k.turns) turns = \(k.perReport) per report; published meanwhile \(k.publishedDuringWindow)")
        }
        if let f {
            lines.append("allocations with long advertisements in fragments: \(f.mallocs) mallocs over \(f.reports) unchanged reports (\(f.fragments) fragments, \(f.assembled) advertisements assembled, \(f.drops) drops) in \(f.turns) turns = \(f.perReport) per report, \(f.perFragment) per fragment; published meanwhile \(f.publishedDuringWindow)")
        }
        if let e {
            lines.append("allocations with the ESPHome proxy and one client subscribed: \(e.mallocs) mallocs over \(e.reports) unchanged reports in \(e.turns) turns = \(e.perReport) per report; \(e.esphomeBytes) bytes to the client; published meanwhile \(e.publishedDuringWindow)")
        }
        return lines.joined(separator: "\n")
    }
}
