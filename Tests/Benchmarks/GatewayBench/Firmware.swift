// The firmware beside the full build (docs/performance.md "The firmware beside the full
// build"): the same gateway code built two ways, `.build-firmware/amd64/baton` (Embedded Swift,
// scripts/firmware) and the release `baton` (full Swift, Foundation and its runtime), given the
// same input in the same run. The memory part runs both (Memory.swift); this file holds the rest:
//   * sizes: each executable on disk, unstripped and stripped (`strip -o`), and every file the
//     running gateway maps (/proc/PID/smaps): the Swift runtime's .so files (the toolchain's
//     usr/lib/swift) and the system's libraries (libc, libmosquitto, libcrypto …);
//   * resident pages per mapping (/proc/PID/smaps, Rss summed by path): what the peak is made of;
//   * throughput: reports/s decoded end to end through `baton gateway --radio capture:FILE`
//     (`radio.paced: false`: the replay runs as fast as the loop goes), timed from the spawn to
//     the gateway's `capture replayed: N reports` line, for a big capture and a small one made
//     by the same generator: (N_big − N_small) / (t_big − t_small) takes out the start-up;
//   * allocations per unchanged advertisement in the running binary, counted by heaptrack
//     (LD_PRELOAD of its malloc/calloc/realloc/posix_memalign/… hooks): the paced capture of the
//     in-process count (Allocations.swift) at two lengths, its last record the last measured
//     report, so the replay ends and the gateway logs `capture replayed`; stopped with SIGTERM
//     2 s later (no timer of its falls in that time: status, keepalive and sightings are 30 s). (A_long − A_short) / (N_long − N_short) takes out start-up, warm-up and shutdown;
//     `heaptrack_print -f LONG -d SHORT` names the call sites of any difference.
// Each replay (throughput and heaptrack) gets a mosquitto of its own: on a shared broker each
// gateway would receive, at its subscribe, the retained activities every earlier run left, and
// the long capture's run (after the short one) would handle 50 more messages than the short
// one: their allocations, not the advertisements', would be the difference.
import BatonLibc
import BatonSim
import BatonTestSupport
import Foundation
import Glibc

// MARK: - /proc/PID/smaps

/// Resident memory per mapping: Rss summed over the mappings of each path ("[anon]" for the
/// nameless ones, "[heap]", "[stack]" …), in KiB, and the size on disk of each mapped file.
struct Mappings {
    var residentKiB: [(path: String, kib: Int)]
    var fileBytes: [(path: String, bytes: Int)]

    init(pid: pid_t) throws {
        let path = "/proc/\(pid)/smaps"
        // Read to the end: /proc files say size 0, and smaps is longer than one page.
        guard let handle = FileHandle(forReadingAtPath: path), let data = try? handle.readToEnd(),
              let text = String(data: data, encoding: .utf8) else { throw BenchError("cannot read \(path)") }
        var rss: [String: Int] = [:]
        var order: [String] = []
        var current = "[anon]"
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            // A mapping's header: "start-end perms offset dev inode [path]".
            if let first = fields.first, first.contains("-"), fields.count >= 5, first.allSatisfy({ $0.isHexDigit || $0 == "-" }) {
                current = fields.count >= 6 ? fields[5...].joined(separator: " ") : "[anon]"
                if rss[current] == nil { rss[current] = 0; order.append(current) }
            } else if fields.first == "Rss:", fields.count >= 2, let kib = Int(fields[1]) {
                rss[current, default: 0] += kib
            }
        }
        residentKiB = order.map { ($0, rss[$0]!) }.sorted { $0.kib > $1.kib }  // Proof: every key of order is in rss.
        fileBytes = order.filter { $0.hasPrefix("/") }.compactMap { p in
            var st = stat()
            return stat(p, &st) == 0 ? (p, Int(st.st_size)) : nil
        }
    }

    var fileBackedKiB: Int { residentKiB.filter { $0.path.hasPrefix("/") }.reduce(0) { $0 + $1.kib } }

    var json: String {
        let r = residentKiB.map { "{\"path\": \(quoted($0.path)), \"rss_kib\": \($0.kib)}" }
        let f = fileBytes.map { "{\"path\": \(quoted($0.path)), \"bytes\": \($0.bytes)}" }
        return "{\"file_backed_kib\": \(fileBackedKiB), \"rss\": [\(r.joined(separator: ", "))], \"files\": [\(f.joined(separator: ", "))]}"
    }
}

func quoted(_ s: String) -> String {
    var out = "\""
    for c in s.unicodeScalars {
        switch c {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        default:
            if c.value < 0x20 { out += String(format: "\\u%04x", c.value) } else { out.unicodeScalars.append(c) }
        }
    }
    return out + "\""
}

// MARK: - Sizes

struct BinarySize {
    var path: String
    var bytes: Int
    var strippedBytes: Int
    /// Files the running gateway maps, other than the executable: the Swift runtime (under the
    /// toolchain's usr/lib/swift) and the rest (the system's).
    var swiftRuntime: [(path: String, bytes: Int)]
    var system: [(path: String, bytes: Int)]

    var swiftRuntimeBytes: Int { swiftRuntime.reduce(0) { $0 + $1.bytes } }
    var systemBytes: Int { system.reduce(0) { $0 + $1.bytes } }
    /// What a package must carry beyond the system's libraries: the executable and the runtime.
    var shippedBytes: Int { bytes + swiftRuntimeBytes }

    init(path: String, mapped: Mappings, dir: URL) throws {
        self.path = path
        bytes = fileSize(path)
        let stripped = dir.appendingPathComponent("stripped-\(UUID().uuidString)").path
        guard try ChildProcess.run("/usr/bin/strip", ["-o", stripped, path], timeout: .seconds(60)) == 0 else {
            throw BenchError("strip -o \(stripped) \(path) failed")
        }
        strippedBytes = fileSize(stripped)
        unlink(stripped)
        let real = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
        let others = mapped.fileBytes.filter { URL(fileURLWithPath: $0.path).resolvingSymlinksInPath().path != real }
        swiftRuntime = others.filter { $0.path.contains("/lib/swift/") }
        system = others.filter { !$0.path.contains("/lib/swift/") }
    }

    var json: String {
        let list = { (xs: [(path: String, bytes: Int)]) in
            "[" + xs.map { "{\"path\": \(quoted($0.path)), \"bytes\": \($0.bytes)}" }.joined(separator: ", ") + "]"
        }
        return """
            {"path": \(quoted(path)), "executable_bytes": \(bytes), "executable_stripped_bytes": \(strippedBytes), \
            "swift_runtime_bytes": \(swiftRuntimeBytes), "executable_and_swift_runtime_bytes": \(shippedBytes), \
            "system_libraries_bytes": \(systemBytes), "swift_runtime": \(list(swiftRuntime)), "system_libraries": \(list(system))}
            """
    }
}

func fileSize(_ path: String) -> Int {
    var st = stat()
    return stat(path, &st) == 0 ? Int(st.st_size) : -1
}

// MARK: - Throughput

struct ThroughputFigures {
    var label: String
    var bigReports: Int
    var smallReports: Int
    var bigSeconds: [Double]
    var smallSeconds: [Double]

    /// Best of the runs each: the fastest replay is the one least disturbed by the machine.
    var reportsPerSecond: Double {
        Double(bigReports - smallReports) / (bigSeconds.min()! - smallSeconds.min()!)
    }

    var json: String {
        """
        {"reports": \(bigReports), "baseline_reports": \(smallReports), "seconds": \(bigSeconds), \
        "baseline_seconds": \(smallSeconds), "reports_per_second": \(reportsPerSecond)}
        """
    }
}

/// Replays the capture the decode bench makes (same generator, devices and seed) through each
/// binary, `runs` times each, alternating, and a 1,000-report capture of the same generator.
func measureThroughput(binaries: [(String, String)], broker: MosquittoBroker, dir: URL, reports: Int, devices: Int,
                       seed: UInt64, runs: Int) throws -> [ThroughputFigures] {
    let small = 1_000
    var generator = CaptureGenerator(devices: devices, seed: seed)
    let big = generator.capture(reports: reports, datalink: .androidH4)
    var smallGenerator = CaptureGenerator(devices: devices, seed: seed)
    let little = smallGenerator.capture(reports: small, datalink: .androidH4)
    let bigPath = dir.appendingPathComponent("throughput-big.btsnoop")
    let smallPath = dir.appendingPathComponent("throughput-small.btsnoop")
    try Data(big.file).write(to: bigPath)
    try Data(little.file).write(to: smallPath)

    var figures = binaries.map { ThroughputFigures(label: $0.0, bigReports: big.reports.count, smallReports: little.reports.count,
                                                   bigSeconds: [], smallSeconds: []) }
    for run in 0..<runs {
        for (k, (label, binary)) in binaries.enumerated() {
            for (path, count) in [(smallPath, little.reports.count), (bigPath, big.reports.count)] {
                let own = try MosquittoBroker()
                let seconds = try replay(binary: binary, label: "\(label)-\(run)", capture: path.path, reports: count,
                                         broker: own, dir: dir)
                if count == big.reports.count { figures[k].bigSeconds.append(seconds) } else { figures[k].smallSeconds.append(seconds) }
            }
        }
    }
    return figures
}

/// Seconds from spawning `binary gateway` on the capture to its `capture replayed: N reports` line.
private func replay(binary: String, label: String, capture: String, reports: Int, broker: MosquittoBroker,
                    dir: URL) throws -> Double {
    let id = "bench-throughput-\(label)"
    let yaml = """
        gateway:
          id: \(id)
          room: Bench
        broker:
          url: mqtt://127.0.0.1:\(broker.port)
        radio:
          source: capture:\(capture)
          paced: false
        """
    let config = dir.appendingPathComponent("\(id).yaml")
    try yaml.write(to: config, atomically: true, encoding: .utf8)
    let logPath = dir.appendingPathComponent("\(id).log").path
    let started = Instant.now
    let gateway = try ChildProcess(binary, ["gateway", "--config", config.path], stderr: logPath)
    defer {
        gateway.signal(SIGTERM)
        if gateway.wait(timeout: .seconds(5)) == nil { gateway.signal(SIGKILL); gateway.wait(timeout: .seconds(5)) }
    }
    let needle = "capture replayed: \(reports) reports"
    let deadline = started + .seconds(120)
    while Instant.now < deadline {
        if let text = try? String(contentsOfFile: logPath, encoding: .utf8), text.contains(needle) {
            return microseconds(Instant.now - started) / 1e6
        }
        guard gateway.isRunning else { throw BenchError("\(binary) gateway exited before replaying \(capture): \(readLog(logPath))") }
        usleep(500)
    }
    throw BenchError("\(binary) gateway never logged \"\(needle)\" within 120 s: \(readLog(logPath))")
}

// MARK: - Allocations in the running binary (heaptrack)

struct HeaptrackFigures {
    var label: String
    var shortReports: Int
    var longReports: Int
    var shortAllocations: Int
    var longAllocations: Int
    /// `heaptrack_print -f LONG -d SHORT`: the call sites whose counts differ (top of the list).
    var difference: String

    var perReport: Double { Double(longAllocations - shortAllocations) / Double(longReports - shortReports) }

    var json: String {
        """
        {"short_reports": \(shortReports), "long_reports": \(longReports), "short_allocations": \(shortAllocations), \
        "long_allocations": \(longAllocations), "allocations_per_unchanged_advertisement": \(perReport), \
        "difference": \(quoted(difference))}
        """
    }
}

/// The in-process count's paced capture (unchanged advertisements after a warm-up), `short`
/// and `long` measured reports, each replayed by `binary gateway` under heaptrack.
func measureHeaptrack(binaries: [(String, String)], broker: MosquittoBroker, dir: URL, devices: Int, short: Int, long: Int,
                      seed: UInt64) throws -> [HeaptrackFigures] {
    let captures = try [short, long].map { measured -> (URL, Int) in
        let c = try pacedCapture(devices: devices, warmup: 5_000, measured: measured, seed: seed, endless: false)
        let url = dir.appendingPathComponent("heaptrack-\(measured).btsnoop")
        try Data(c.file).write(to: url)
        return (url, c.firsts + c.warmup + c.measured)
    }
    return try binaries.map { label, binary in
        let counts = try captures.map { url, total in
            try heaptrackRun(binary: binary, label: "\(label)-\(total)", capture: url.path, reports: total,
                             broker: try MosquittoBroker(), dir: dir)
        }
        let diff = dir.appendingPathComponent("heaptrack-\(label)-diff.txt").path
        _ = try ChildProcess.run("/usr/bin/heaptrack_print", ["-f", counts[1].file, "-d", counts[0].file, "-p", "0", "-T", "0",
                                                            "-l", "0", "-n", "12", "-s", "3"],
                                 stdout: diff, timeout: .seconds(300))
        let text = (try? String(contentsOfFile: diff, encoding: .utf8)) ?? ""
        return HeaptrackFigures(label: label, shortReports: short, longReports: long, shortAllocations: counts[0].allocations,
                                longAllocations: counts[1].allocations, difference: String(text.prefix(12_000)))
    }
}

private func heaptrackRun(binary: String, label: String, capture: String, reports: Int, broker: MosquittoBroker,
                          dir: URL) throws -> (allocations: Int, file: String) {
    let id = "bench-heaptrack-\(label)"
    // As the in-process count: the stats, PINGREQ and sighting heartbeats (each a publish, each
    // allocating in libmosquitto) fall outside the run; a lone gateway owns its devices at once.
    let yaml = """
        gateway:
          id: \(id)
          room: Bench
        broker:
          url: mqtt://127.0.0.1:\(broker.port)
          keepalive: 30s
        radio:
          source: capture:\(capture)
          paced: true
        status:
          interval: 30s
        rooms:
          sighting-interval: 30s
          sighting-fresh: 60s
          sighting-step: 60
          settle: 0s
        """
    let config = dir.appendingPathComponent("\(id).yaml")
    try yaml.write(to: config, atomically: true, encoding: .utf8)
    let logPath = dir.appendingPathComponent("\(id).log").path
    let output = dir.appendingPathComponent(id).path
    // heaptrack is a shell script that starts the program as its child and waits for it, then
    // for its interpreter to write OUTPUT.zst: the program itself gets the SIGTERM.
    let heaptrack = try ChildProcess("/usr/bin/heaptrack", ["-o", output, binary, "gateway", "--config", config.path],
                                     stdout: dir.appendingPathComponent("\(id).heaptrack").path, stderr: logPath)
    defer {
        heaptrack.signal(SIGKILL)
        heaptrack.wait(timeout: .seconds(5))
    }
    let needle = "capture replayed: \(reports) reports"
    let deadline = Instant.now + .seconds(120)
    while true {
        if let text = try? String(contentsOfFile: logPath, encoding: .utf8), text.contains(needle) { break }
        guard heaptrack.isRunning, Instant.now < deadline else {
            throw BenchError("\(binary) gateway under heaptrack never logged \"\(needle)\": \(readLog(logPath))")
        }
        usleep(2_000)
    }
    // Both runs then hold 2 s: the broker's answers to the first publishes (their echoes on the
    // gateway's own subscription) arrive in both, not only in the long run that outlasts them.
    usleep(2_000_000)
    guard let child = children(of: heaptrack.pid).first(where: { executable(of: $0) == URL(fileURLWithPath: binary).resolvingSymlinksInPath().path })
    else { throw BenchError("cannot find \(binary) among heaptrack's children") }
    kill(child, SIGTERM)
    guard heaptrack.wait(timeout: .seconds(60)) != nil else { throw BenchError("heaptrack did not finish within 60 s") }
    let file = output + ".zst"
    let summary = dir.appendingPathComponent("\(id).summary").path
    _ = try ChildProcess.run("/usr/bin/heaptrack_print", ["-f", file, "-p", "0", "-a", "0", "-T", "0", "-l", "0"],
                             stdout: summary, timeout: .seconds(300))
    let text = (try? String(contentsOfFile: summary, encoding: .utf8)) ?? ""
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("calls to allocation functions:") }),
          let n = line.split(separator: " ").dropFirst(4).first.flatMap({ Int($0) }) else {
        throw BenchError("heaptrack_print -f \(file) gave no \"calls to allocation functions\": \(text.suffix(2000))")
    }
    return (n, file)
}

func children(of pid: pid_t) -> [pid_t] {
    let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
    return text.split(separator: " ").compactMap { pid_t(String($0).trimmingCharacters(in: .whitespacesAndNewlines)) }
}

func executable(of pid: pid_t) -> String? {
    try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")
}
