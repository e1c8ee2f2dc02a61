// Runs `baton gateway` as a user does: the built binary, a YAML config file, a real mosquitto
// from BatonTestSupport. Every wait is bounded and every process is killed at the end.
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

let binaries = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
let batonBinary = binaries.appendingPathComponent("baton")

func scratchDirectory(_ name: String) throws -> URL {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("baton-gw-\(getpid())-\(name)")
    try? FileManager.default.removeItem(at: dir)
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir
}

/// `dir/<name>`, made: the folder of one of several gateways (its config, log and capture).
func folder(_ name: String, in dir: URL) throws -> URL {
    let folder = dir.appendingPathComponent(name)
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    return folder
}

final class GatewayProcess {
    let process = Process()
    let stderrFile: URL

    /// Starts `baton gateway --config <dir>/baton.yaml` with `yaml` as the file; with
    /// `openFiles`, under those soft and hard RLIMIT_NOFILE limits (prlimit(1) execs it, so the
    /// process is the gateway's).
    init(yaml: String, in dir: URL, extraArguments: [String] = [], openFiles: (soft: Int, hard: Int)? = nil) throws {
        let config = dir.appendingPathComponent("baton.yaml")
        try yaml.write(to: config, atomically: true, encoding: .utf8)
        stderrFile = dir.appendingPathComponent("gateway-\(UUID().uuidString.prefix(8)).log")
        _ = FileManager.default.createFile(atPath: stderrFile.path, contents: nil)
        process.executableURL = batonBinary
        process.arguments = ["gateway", "--config", config.path] + extraArguments
        if let openFiles {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/prlimit")
            process.arguments = ["--nofile=\(openFiles.soft):\(openFiles.hard)", batonBinary.path] + process.arguments!
        }
        process.standardError = try FileHandle(forWritingTo: stderrFile)
        process.standardOutput = FileHandle.nullDevice
        try process.run()
    }

    var log: String { (try? String(contentsOf: stderrFile, encoding: .utf8)) ?? "" }
    var isRunning: Bool { process.isRunning }

    /// SIGSTOP / SIGCONT: a hung Pi or a cut cable, its socket left open (issue 16).
    /// Foundation's Process leaves the child's signal mask as the test thread's, but neither
    /// SIGSTOP nor SIGKILL can be blocked, and SIGCONT always resumes a stopped process.
    func signal(_ number: Int32) {
        guard process.isRunning else { return }
        Foundation.kill(process.processIdentifier, number)
    }

    func kill() {
        guard process.isRunning else { return }
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// SIGTERM and wait (bounded): what `systemctl stop` does.
    func stop() -> Int32 {
        guard process.isRunning else { return process.terminationStatus }
        process.terminate()
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        if process.isRunning { kill() }
        return process.terminationStatus
    }

    deinit { kill() }
}

/// Waits until `check` returns a value, up to `seconds`; nil if it never does.
func eventually<T>(within seconds: Double, every interval: Double = 0.1, _ check: () throws -> T?) rethrows -> T? {
    let deadline = Date().addingTimeInterval(seconds)
    while true {
        if let v = try check() { return v }
        if Date() >= deadline { return nil }
        usleep(UInt32(interval * 1_000_000))
    }
}

/// `baton watch --once` on `broker`, as a user runs it: its exit status and what it printed.
func watchOnce(_ broker: MosquittoBroker, in dir: URL? = nil) throws -> (status: Int32, printed: String) {
    let dir = try dir ?? scratchDirectory("watch-\(broker.port)")
    let out = dir.appendingPathComponent("watch.out")
    // Bounded: a watch that never ends fails its test (status -1) instead of hanging the run.
    let status = try ChildProcess.run(batonBinary.path, ["watch", "--broker", "mqtt://127.0.0.1:\(broker.port)", "--once"],
                                      stdout: out.path, stderr: dir.appendingPathComponent("watch.err").path,
                                      timeout: .seconds(20))
    return (status, (try? String(contentsOf: out, encoding: .utf8)) ?? "")
}

extension MosquittoBroker {
    /// What the broker retains under `pattern` once `holds` says it is so, polled for up to
    /// `seconds`; nil if it never is.
    func retained(_ pattern: String, within seconds: Double,
                  where holds: ([String: [UInt8]]) -> Bool) throws -> [String: [UInt8]]? {
        try eventually(within: seconds) { () -> [String: [UInt8]]? in
            let r = try retained(pattern)
            return holds(r) ? r : nil
        }
    }
}

func json(_ bytes: [UInt8]) -> [String: Any]? {
    try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
}

func text(_ bytes: [UInt8]?) -> String? { bytes.map { String(decoding: $0, as: UTF8.self) } }

/// The config every test starts from: loopback broker, a capture radio, short timers.
func gatewayYAML(port: Int, id: String = "hall", room: String = "Hall", radio: String,
                 expiry: String = "60s", extra: String = "") -> String {
    """
    gateway:
      id: \(id)
      room: \(room)
    broker:
      url: mqtt://127.0.0.1:\(port)
      keepalive: 5s
      reconnect-min: 100ms
      reconnect-max: 1s
    radio:
      source: \(radio)
      paced: false
      silence: 30s
    table:
      expiry: \(expiry)
    status:
      interval: 1s
    \(extra)
    """
}

/// A broker of its own, and the hall's gateway (`gatewayYAML` with `expiry`) replaying a capture
/// generated in the scratch directory `name` (the rest are `GeneratedCapture`'s).
func hallReplaying(_ name: String, devices: Int, reports: Int, seed: UInt64, expiry: String = "60s",
                   invalidateAtEnd: Bool = false, truncateBy: Int = 0, corruptFirstBeacon: Bool = false) throws
    -> (broker: MosquittoBroker, capture: GeneratedCapture, gateway: GatewayProcess) {
    let dir = try scratchDirectory(name)
    let broker = try MosquittoBroker()
    let capture = try GeneratedCapture(in: dir, devices: devices, reports: reports, seed: seed, invalidateAtEnd: invalidateAtEnd,
                                       truncateBy: truncateBy, corruptFirstBeacon: corruptFirstBeacon)
    let yaml = gatewayYAML(port: broker.port, radio: "capture:\(capture.path)", expiry: expiry)
    return (broker, capture, try GatewayProcess(yaml: yaml, in: dir))
}

/// The hall's stats once its capture has been replayed (`radio.state` `finished`), within 15 s.
func finishedStats(_ broker: MosquittoBroker, _ gateway: GatewayProcess,
                   sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
    let stats = try eventually(within: 15) { () -> [String: Any]? in
        guard let o = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? []),
              (o["radio"] as? [String: Any])?["state"] as? String == "finished" else { return nil }
        return o
    }
    return try #require(stats, "the capture was never finished: \(gateway.log)", sourceLocation: sourceLocation)
}

/// A generated capture and what it holds: the last beacon each Baton device sent.
struct GeneratedCapture {
    let path: String
    let lastBeacons: [UInt64: ActivityBeacon]
    let apple: Int

    init(in dir: URL, devices: Int, reports: Int, seed: UInt64, invalidateAtEnd: Bool = false, truncateBy: Int = 0,
         corruptFirstBeacon: Bool = false) throws {
        var g = CaptureGenerator(devices: devices, seed: seed)
        let (file, written) = g.capture(reports: reports, datalink: .btmon, invalidateAtEnd: invalidateAtEnd)
        var last: [UInt64: ActivityBeacon] = [:]
        var apple = Set<Int>()
        for r in written {
            switch r.kind {
            case .baton(let b): last[b.deviceID] = b
            case .apple: apple.insert(r.device)
            case .ordinary: break
            }
        }
        var bytes = file
        if corruptFirstBeacon {
            // The first beacon's AD header (length 27, manufacturer data, company 0xFFFF) gets
            // a length that runs past the advertising data: docs/protocol.md §1 "ad-overlong".
            let header: [UInt8] = [0x1B, 0xFF, 0xFF, 0xFF]
            if let i = (0..<(bytes.count - 4)).first(where: { Array(bytes[$0..<$0 + 4]) == header }) { bytes[i] = 0x1F }
        }
        let url = dir.appendingPathComponent("capture-\(seed).btsnoop")
        try Data(bytes.dropLast(truncateBy)).write(to: url)
        path = url.path
        lastBeacons = last
        self.apple = apple.count
    }
}
