// `baton sim --scenario` as the lead's tests and scripts run it: the built binary, gateways
// connecting to its rooms' sockets over H4, its JSON lines read live. The scenario format and
// the RSSI model in process are BatonSimTests' (ScenarioTests.swift).
import BatonLibc
import BatonHCI
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Glibc
import Testing

/// `baton sim` as a child process, its stdout read line by line as it comes.
final class SimProcess {
    let process = Process()
    let out = Pipe()
    let errFile: URL
    var pending: [UInt8] = []
    var lines: [[String: Any]] = []
    var rawLines: [String] = []

    init(_ arguments: [String], in dir: URL) throws {
        errFile = dir.appendingPathComponent("sim-stderr.log")
        _ = FileManager.default.createFile(atPath: errFile.path, contents: nil)
        process.executableURL = binaries.appendingPathComponent("baton")
        process.arguments = arguments
        process.standardOutput = out
        process.standardError = try FileHandle(forWritingTo: errFile)
        try process.run()
        let fd = out.fileHandleForReading.fileDescriptor
        _ = Glibc.fcntl(fd, F_SETFL, Glibc.fcntl(fd, F_GETFL) | O_NONBLOCK)
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }

    var stderr: String { (try? String(contentsOf: errFile, encoding: .utf8)) ?? "" }
    var fd: Int32 { out.fileHandleForReading.fileDescriptor }

    /// Reads what stdout has now; false at its end.
    @discardableResult
    func read() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n == 0 { return false }
            if n < 0 { return true }
            pending += chunk[..<n]
            while let newline = pending.firstIndex(of: 0x0A) {
                let line = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeFirst(newline + 1)
                rawLines.append(line)
                if let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] {
                    lines.append(object)
                }
            }
        }
    }

    func line(_ event: String) -> [String: Any]? { lines.first { $0["event"] as? String == event } }

    /// Reads stdout until `check` holds or `seconds` pass, polling `also` (gateway sockets) meanwhile.
    func wait(seconds: Double, also clients: [GatewayClient] = [], until check: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            read()
            for c in clients { c.read() }
            if check() { return true }
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)] + clients.filter { $0.open }.map {
                pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0)
            }
            _ = poll(&fds, nfds_t(fds.count), 50)
        }
        return false
    }

    func exitStatus(within seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { read(); usleep(10_000) }
        read()
        return process.isRunning ? nil : process.terminationStatus
    }
}

/// What a gateway does on `--radio sim:SOCKET`, by hand: connect, HCI_Reset, LE Set Scan
/// Enable (Core 5.4, Vol 4, Part E, §7.3.2 and §7.8.11), then read LE Advertising Reports
/// (§7.7.65.2).
final class GatewayClient {
    let fd: Int32
    var framer = H4Framer()
    var completes = 0
    var open = true
    /// Every report: the beacon's device id and sequence, and the RSSI.
    var reports: [(device: UInt64, sequence: UInt16, rssi: Int8)] = []

    init(_ path: String) throws {
        // Close-on-exec: tests in parallel spawn brokers and gateways, and a child holding a
        // copy of this descriptor would keep the connection open after `deinit` closes it.
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var unix = try #require(Syscall.unixAddress(path))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, unix.length) }
        }
        try #require(r == 0, "connect \(path): \(String(cString: strerror(Glibc.errno)))")
        _ = Glibc.fcntl(fd, F_SETFL, Glibc.fcntl(fd, F_GETFL) | O_NONBLOCK)
    }

    deinit {
        // shutdown ends the connection even if a copy of the descriptor lives on elsewhere.
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    func scan() {
        let commands: [UInt8] = [0x01, 0x03, 0x0C, 0x00,                // HCI_Reset
                                 0x01, 0x0C, 0x20, 0x02, 0x01, 0x00]    // LE Set Scan Enable: on, no filtering
        _ = commands.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    func read() {
        guard open else { return }
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n == 0 { open = false; return }
            if n < 0 { return }
            chunk.withUnsafeBytes { raw in
                framer.push(UnsafeRawBufferPointer(rebasing: raw[..<n])) { packet in
                    let b = packet.bytes
                    guard packet.type == .event, b.count >= 2 else { return }
                    if b[0] == 0x0E { completes += 1; return }
                    // One legacy report per event: subevent, count, type, address type, address,
                    // length, data, RSSI.
                    guard b[0] == 0x3E, b.count >= 13, b[2] == 0x02, b[3] == 1 else { return }
                    let length = Int(b[12])
                    guard b.count == 14 + length else { return }
                    let data = UnsafeRawBufferPointer(rebasing: b[13..<(13 + length)])
                    guard let beacon = try? ActivityBeacon.find(inAdvertisingData: data) else { return }
                    reports.append((beacon.deviceID, beacon.sequence, Int8(bitPattern: b[13 + length])))
                }
            }
        }
    }

    func levels(of device: UInt64, sequence: UInt16? = nil) -> [Int8] {
        reports.filter { $0.device == device && (sequence == nil || $0.sequence == sequence) }.map(\.rssi)
    }
}

func simDirectory(_ name: String) throws -> URL {
    // Short: a socket path must fit sockaddr_un (108 bytes).
    let dir = URL(fileURLWithPath: "/tmp/bsim-\(getpid())-\(name)")
    try? FileManager.default.removeItem(at: dir)
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir
}

@Suite(.serialized) struct BuildingTests {
    /// Three rooms in a line; alice walks from the hall to the kitchen at 15 s and saves there
    /// (so her sequence tells which side of the walk a report is from); a border device stands
    /// between the hall and the kitchen. Speed 20: 30 simulated seconds in 1.5 real ones.
    static let walk = """
        seed: 5
        speed: 20
        duration: 30
        rate: 10
        radio: {noise: 3, loss: 0.05}
        rooms:
          - {id: hall, name: Hall}
          - {id: kitchen, name: Kitchen}
          - {id: office, name: Office}
        devices:
          - id: 5a0000000001
            name: alice-phone
            at: hall
            script:
              - {at: 15, walk: kitchen}
              - {at: 15, save: true}
          - id: 5a0000000002
            name: border-tablet
            at: {between: [hall, kitchen]}
        """

    @Test func gatewaysHearTheirRoomsAndAWalkMovesTheLoudestRoom() throws {
        let dir = try simDirectory("walk")
        let file = dir.appendingPathComponent("walk.yaml")
        try Self.walk.write(to: file, atomically: true, encoding: .utf8)
        let sockets = dir.appendingPathComponent("rooms").path
        let sim = try SimProcess(["sim", "--scenario", file.path, "--sockets", sockets], in: dir)

        #expect(sim.wait(seconds: 20) { sim.line("ready") != nil }, "\(sim.stderr)")
        let ready = try #require(sim.line("ready"))
        #expect(sim.lines.count == 1)
        let rooms = try #require(ready["rooms"] as? [String: String])
        #expect(rooms == ["hall": sockets + "/hall.sock", "kitchen": sockets + "/kitchen.sock",
                          "office": sockets + "/office.sock"])

        // The clock waits for every room's gateway to scan.
        var clients: [GatewayClient] = []
        for id in ["hall", "kitchen", "office"] {
            let c = try GatewayClient(try #require(rooms[id]))
            c.scan()
            clients.append(c)
            if id != "office" {
                _ = sim.wait(seconds: 0.3, also: clients) { false }
                #expect(sim.line("start") == nil, "started before every room scanned")
            }
        }
        #expect(sim.wait(seconds: 10, also: clients) { sim.line("start") != nil }, "\(sim.stderr)")
        #expect(clients.allSatisfy { $0.completes == 2 })
        #expect(sim.wait(seconds: 30, also: clients) { sim.line("end") != nil }, "\(sim.stderr)")
        // The sockets close after the end line: read what is left.
        _ = sim.wait(seconds: 5, also: clients) { clients.allSatisfy { !$0.open } }
        #expect(sim.exitStatus(within: 10) == 0)

        // The lines: ready, start, the two steps, end, each a JSON object.
        #expect(sim.rawLines.count == 5, "\(sim.rawLines)")
        #expect(sim.lines.count == sim.rawLines.count)
        let start = try #require(sim.line("start"))
        let steps = sim.lines.filter { $0["t"] != nil && $0["event"] as? String != "end" }
        #expect(steps.map { $0["event"] as? String } == ["walk", "save"])
        #expect(steps.allSatisfy { $0["t"] as? Double == 15 && $0["device"] as? String == "5a0000000001" })
        #expect(steps.first?["room"] as? String == "kitchen")
        let startUnix = try #require(start["unix_us"] as? Int)
        let walkUnix = try #require(steps.first?["unix_us"] as? Int)
        // 15 simulated seconds at speed 20 is 0.75 s after the start (the first step's line
        // cannot come before it).
        #expect(walkUnix - startUnix >= 750_000)

        // What each room heard: alice before the walk (sequence 1) and after it (sequence 2).
        let alice: UInt64 = 0x5A00_0000_0001, border: UInt64 = 0x5A00_0000_0002
        let before = clients.map { mean($0.levels(of: alice, sequence: 1)) }
        let after = clients.map { mean($0.levels(of: alice, sequence: 2)) }
        let middle = clients.map { mean($0.levels(of: border)) }
        #expect(abs(before[0] - -55) < 1.5 && abs(before[1] - -70) < 1.5 && abs(before[2] - -85) < 1.5, "\(before)")
        #expect(abs(after[0] - -70) < 1.5 && abs(after[1] - -55) < 1.5 && abs(after[2] - -70) < 1.5, "\(after)")
        #expect(abs(middle[0] - -62.5) < 1.5 && abs(middle[1] - -62.5) < 1.5 && abs(middle[2] - -77.5) < 1.5, "\(middle)")
        // About 150 reports a device on each side of the walk, each room missing ~5 %.
        #expect(clients.allSatisfy { $0.levels(of: alice, sequence: 1).count > 100 })

        // The end line accounts for every report: what each gateway read was delivered.
        let end = try #require(sim.line("end"))
        let counts = try #require(end["rooms"] as? [String: [String: Int]])
        for (id, client) in zip(["hall", "kitchen", "office"], clients) {
            let c = try #require(counts[id])
            #expect(c["delivered"] == client.reports.count, "\(id): \(c)")
            #expect(c["not_scanning"] == 0 && c["unheard"] == 0, "\(id): \(c)")
            let lost = try #require(c["lost"])
            #expect(lost > 0 && lost < client.reports.count / 5, "\(id): \(c)")
        }
        // The sockets are gone.
        #expect(!FileManager.default.fileExists(atPath: sockets + "/hall.sock"))
    }

    @Test func aGatewayMayReconnectAndSIGTERMEndsTheSameWay() throws {
        let dir = try simDirectory("term")
        let file = dir.appendingPathComponent("long.yaml")
        try """
            duration: 3600
            rate: 50
            rooms: [{id: hall}, {id: kitchen}]
            devices: [{id: 5a0000000001, at: hall}]
            """.write(to: file, atomically: true, encoding: .utf8)
        let sockets = dir.path + "/s"
        let sim = try SimProcess(["sim", "--scenario", file.path, "--sockets", sockets, "--no-wait"], in: dir)
        #expect(sim.wait(seconds: 20) { sim.line("start") != nil }, "\(sim.stderr)")
        var first: GatewayClient? = try GatewayClient(sockets + "/hall.sock")
        first!.scan()
        #expect(sim.wait(seconds: 10, also: [first!]) { first!.reports.count >= 5 })
        first = nil  // hangs up
        let second = try GatewayClient(sockets + "/hall.sock")
        second.scan()
        #expect(sim.wait(seconds: 10, also: [second]) { second.reports.count >= 5 }, "\(sim.stderr)")

        sim.process.terminate()  // SIGTERM
        #expect(sim.exitStatus(within: 10) == 0)
        let end = try #require(sim.line("end"), "\(sim.rawLines)")
        let counts = try #require(end["rooms"] as? [String: [String: Int]])
        // The kitchen had no gateway: what it heard was not delivered.
        #expect((counts["kitchen"]?["not_scanning"] ?? 0) > 0)
        #expect((counts["hall"]?["delivered"] ?? 0) >= 10)
        #expect(!FileManager.default.fileExists(atPath: sockets + "/hall.sock"))
    }

    /// The file: Yams recursed once per `[` and the simulator died of SIGSEGV.
    @Test func aScenarioNestedFiveThousandDeepExitsTwo() throws {
        let dir = try simDirectory("nested")
        let file = dir.appendingPathComponent("n.yaml")
        try (String(repeating: "[", count: 5000) + "\n").write(to: file, atomically: true, encoding: .utf8)
        let r = try baton("sim", "--scenario", file.path, "--sockets", dir.path + "/s")
        #expect(r.status == 2)
        #expect(r.stderr == "\(file.path):1: YAML nesting deeper than 64 levels (lists and sections inside each other): "
                + "is it the right file?\n")
        #expect(r.stdout.isEmpty)
    }

    @Test func aBadScenarioExitsTwoWithFileLineAndKey() throws {
        let dir = try simDirectory("bad")
        let file = dir.appendingPathComponent("bad.yaml")
        try "duration: 60\nrate: -3\nrooms: [{id: hall}]\ndevices: [{id: 5a0000000001, at: hall}]\n"
            .write(to: file, atomically: true, encoding: .utf8)
        let r = try baton("sim", "--scenario", file.path, "--sockets", dir.path + "/s")
        #expect(r.status == 2)
        #expect(r.stderr.contains("\(file.path):2: rate: must be more than 0"), "\(r.stderr)")
        #expect(r.stdout.isEmpty)
    }
}
