// Peak resident memory (docs/performance.md "Memory"): the release `baton gateway` holding
// 1,000 activities, beside the same gateway holding none.
//
// Both run the same config file (table.capacity 1024, so the only difference is the devices),
// with `--radio sim:SOCKET`: this bench is the controller and sends the generated reports
// over the socket, as a serial controller would. A capture replay would hold the whole file
// in the gateway's memory (read, copied into an array, copied into the replay's buffer) and
// its peak would measure the file, not the devices.
//
// The reports are paced (`--memory-rate`, 5,000 a second by default), because a flood is not
// what a radio delivers and it measures something else: every change is a QoS 1 publish, and
// a gateway that is handed a whole capture's worth of reports in one go publishes faster than
// it reads the broker's acknowledgements, so libmosquitto's queue of unacknowledged messages
// grows with the burst. `--memory-rate 0` measures that case.
//
// The bench waits until the gateway's stats topic says every report was heard and the table
// holds every device, then reads /proc/PID/status: VmHWM (the peak resident set) and RssAnon
// (resident anonymous memory: heap, stacks, tables) among others.
import BatonLibc
import BatonSim
import BatonTestSupport
import Foundation
import Glibc

struct MemoryRun {
    var devices: Int
    var reports: Int
    var memory: ProcessMemory
    var stats: [String: Any]
    /// Resident pages per mapping when measured (/proc/PID/smaps), and the files mapped.
    var mappings: Mappings

    var tableFill: Int { (stats["table"] as? [String: Any])?["fill"] as? Int ?? -1 }
    var appleFill: Int { (stats["apple"] as? [String: Any])?["fill"] as? Int ?? -1 }

    var json: String {
        """
        {"baton_devices": \(devices), "reports": \(reports), "table_fill": \(tableFill), "apple_fill": \(appleFill), \
        "memory": \(memory.json), "resident_by_mapping": \(mappings.json)}
        """
    }
}

struct MemoryFigures {
    var idle: MemoryRun
    var loaded: MemoryRun
    /// Reports per second the loaded gateway was sent (0: as fast as the socket took them).
    var rate: Int

    var perDeviceHWMBytes: Double { Double(loaded.memory.vmHWM - idle.memory.vmHWM) * 1024 / Double(loaded.tableFill) }
    var perDeviceAnonBytes: Double { Double(loaded.memory.rssAnon - idle.memory.rssAnon) * 1024 / Double(loaded.tableFill) }

    var json: String {
        """
        {"reports_per_second_sent": \(rate), "idle": \(idle.json), "loaded": \(loaded.json), \
        "per_device_vm_hwm_bytes": \(perDeviceHWMBytes), "per_device_rss_anon_bytes": \(perDeviceAnonBytes)}
        """
    }
}

/// The same input, idle and loaded, through each binary in turn (the release `baton`, then the
/// firmware when there is one): `binaries` are (label, path) pairs.
func measureMemory(binaries: [(String, String)], broker: MosquittoBroker, dir: URL, devices: Int, reports: Int,
                   rate: Int, seed: UInt64) throws -> [(String, MemoryFigures)] {
    // A third of the generator's devices are Baton devices: 3 × devices of them.
    var generator = CaptureGenerator(devices: devices * 3, seed: seed)
    var written: [GeneratedReport] = []
    written.reserveCapacity(reports)
    for _ in 0..<reports { written.append(generator.next()) }
    var heard = Set<Int>()
    for r in written { if case .baton = r.kind { heard.insert(r.device) } }
    guard heard.count == devices else {
        throw BenchError("\(reports) generated reports reach \(heard.count) of the \(devices) Baton devices: give more reports")
    }
    // One report per event, H4-framed, in slices of rate/20 reports: one slice every 50 ms.
    // rate 0: every report in one go, as fast as the socket takes them.
    let perSlice = rate == 0 ? reports : max(1, rate / 20)
    var slices: [[UInt8]] = []
    for (i, r) in written.enumerated() {
        if i % perSlice == 0 { slices.append([]) }
        slices[slices.count - 1] += [0x04] + AdvertisingEvents.event([r][...])
    }

    return try binaries.map { label, baton in
        let idle = try runGateway(baton: baton, broker: broker, dir: dir, name: "\(label)-idle", slices: [], reports: 0,
                                  devices: 0)
        let loaded = try runGateway(baton: baton, broker: broker, dir: dir, name: "\(label)-loaded", slices: slices,
                                    reports: reports, devices: devices)
        return (label, MemoryFigures(idle: idle, loaded: loaded, rate: rate))
    }
}

private func runGateway(baton: String, broker: MosquittoBroker, dir: URL, name: String, slices: [[UInt8]],
                        reports: Int, devices: Int) throws -> MemoryRun {
    let id = "bench-memory-\(name)"
    let socketPath = dir.appendingPathComponent("memory-\(name).sock").path
    let controller = try H4Controller(path: socketPath)
    let stats = "baton/gateways/\(id)/stats"
    let subscriber = try Subscriber(port: broker.port, clientID: "bench-memory-subscriber-\(name)")
    try subscriber.connect(subscribing: [stats])

    // radio.silence 10m: the idle gateway hears nothing, and must not re-initialise its
    // controller while it is measured.
    let yaml = """
        gateway:
          id: \(id)
          room: Bench
        broker:
          url: mqtt://127.0.0.1:\(broker.port)
        radio:
          source: sim:\(socketPath)
          silence: 10m
        table:
          capacity: 1024
        status:
          interval: 1s
        """
    let config = dir.appendingPathComponent("\(id).yaml")
    try yaml.write(to: config, atomically: true, encoding: .utf8)
    let logPath = dir.appendingPathComponent("\(id).log").path
    let gateway = try ChildProcess(baton, ["gateway", "--config", config.path], stderr: logPath)
    defer {
        gateway.signal(SIGTERM)
        if gateway.wait(timeout: .seconds(5)) == nil { gateway.signal(SIGKILL); gateway.wait(timeout: .seconds(5)) }
    }
    try controller.acceptAndInitialise(timeout: .seconds(20)) { readLog(logPath) }
    // Paced: one slice every 50 ms, on a fixed schedule (a late slice does not push the rest).
    let started = Instant.now
    for (k, slice) in slices.enumerated() {
        let due = started + .milliseconds(50 * k)
        sleepUntil(due)
        controller.send(slice)
    }

    // Done when the stats say every report was heard, the table holds every device, and the
    // gateway has run for at least two stats intervals (so the idle one is past its start).
    let deadline = Instant.now + .seconds(60)
    var last: [String: Any] = [:]
    while true {
        var done = false
        subscriber.pump(timeoutMs: 100) { m in
            guard m.topic == stats, let s = json(m.payload) else { return }
            last = s
            let fill = (s["table"] as? [String: Any])?["fill"] as? Int
            let state = (s["radio"] as? [String: Any])?["state"] as? String
            if s["reports"] as? Int == reports, fill == devices, state == "scanning", (s["uptime_s"] as? Int ?? 0) >= 2 {
                done = true
            }
        }
        if done { break }
        guard Instant.now < deadline else {
            throw BenchError("the \(name) gateway never reported \(reports) reports and \(devices) activities; last stats \(last): \(readLog(logPath))")
        }
    }
    let memory = try ProcessMemory(pid: gateway.pid)
    let mappings = try Mappings(pid: gateway.pid)
    return MemoryRun(devices: devices, reports: reports, memory: memory, stats: last, mappings: mappings)
}

func sleepUntil(_ instant: Instant) {
    let now = Instant.now
    guard instant > now else { return }
    let us = microseconds(instant - now)
    usleep(UInt32(min(us, 1_000_000)))
}
