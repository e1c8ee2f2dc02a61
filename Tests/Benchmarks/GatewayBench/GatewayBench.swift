// The gateway half of scripts/bench (docs/performance.md "The gateway"). Three figures of the
// whole service, each measured against a real mosquitto on 127.0.0.1 started here:
//   * latency: advertising report in, retained activity message out at a subscriber, for
//     `--changes` changes one at a time, through the release `baton gateway` (child process);
//   * memory: VmHWM and RssAnon of the release gateway holding `--devices` activities, and
//     of the same gateway holding none;
//   * allocations: mallocs per unchanged advertisement through `Gateway.turn()`, in process,
//     counted by malloc-interposer.
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

    enum Part: String, ExpressibleByArgument, CaseIterable { case latency, memory, allocations }

    @Option(help: "The release `baton` binary (latency and memory run it as a child process).")
    var baton: String?

    @Option(help: "Which parts to run, comma-separated: latency, memory, allocations.")
    var parts = "latency,memory,allocations"

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
        if names.contains("latency") || names.contains("memory") {
            guard let baton, FileManager.default.isExecutableFile(atPath: baton) else {
                throw ValidationError("--baton must name the built `baton` binary for latency and memory")
            }
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
        var latency: LatencyFigures?
        var memory: MemoryFigures?
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
        }
        if wanted.contains(.latency), let baton {
            say("latency: \(changes) changes (after \(warmup) warm-up) through \(baton) gateway")
            latency = try measureLatency(baton: baton, broker: broker, dir: dir, changes: changes, warmup: warmup)
        }
        if wanted.contains(.memory), let baton {
            let memoryReports = memoryReports ?? 40 * devices
            say("memory: an idle gateway, then one holding \(devices) activities (\(memoryReports) reports, \(memoryRate == 0 ? "unpaced" : "\(memoryRate)/s"))")
            memory = try measureMemory(baton: baton, broker: broker, dir: dir, devices: devices, reports: memoryReports,
                                       rate: memoryRate, seed: seed)
        }
        print(json ? jsonText(latency, memory, allocations, keyedAllocations, fragmentedAllocations)
                   : text(latency, memory, allocations, keyedAllocations, fragmentedAllocations))
    }

    func say(_ s: String) { FileHandle.standardError.write(Data("gateway bench: \(s)\n".utf8)) }

    func jsonText(_ l: LatencyFigures?, _ m: MemoryFigures?, _ a: AllocationFigures?, _ k: AllocationFigures?,
                  _ f: AllocationFigures?) -> String {
        var fields: [String] = []
        if let l { fields.append("\"latency\": \(l.json)") }
        if let m { fields.append("\"memory\": \(m.json)") }
        if let a { fields.append("\"allocations\": \(a.json)") }
        if let k { fields.append("\"allocations_keyed\": \(k.json)") }
        if let f { fields.append("\"allocations_fragmented\": \(f.json)") }
        return "{" + fields.joined(separator: ", ") + "}"
    }

    func text(_ l: LatencyFigures?, _ m: MemoryFigures?, _ a: AllocationFigures?, _ k: AllocationFigures?,
              _ f: AllocationFigures?) -> String {
        var lines: [String] = []
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
        return lines.joined(separator: "\n")
    }
}
