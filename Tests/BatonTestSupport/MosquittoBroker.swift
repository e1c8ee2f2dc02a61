// A real mosquitto for the tests that need a broker (docs/architecture.md §4): no
// mocks. Each broker gets its own temporary directory (config, log, password file) and a free
// port on 127.0.0.1, so tests run side by side. The reference clients (mosquitto_sub,
// mosquitto_pub, mosquitto_passwd, from mosquitto-clients / mosquitto) read and inject
// messages, so a test checks our client against someone else's.
import Foundation
import Glibc

/// Why the harness could not give a test its broker; the text says what to install or read.
public struct BrokerError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A real mosquitto the test starts on 127.0.0.1 and a free port, without persistence, and
/// stops when the test ends (also on failure).
public final class MosquittoBroker: @unchecked Sendable {
    public let port: Int
    /// The broker's temporary directory: mosquitto.conf, mosquitto.log, stderr.log, passwd.
    public let directory: URL
    /// Login for the helper clients (`retained`, `publish`) on a broker that wants one.
    public var helperLogin: (username: String, password: String)?

    private var process: ChildProcess?
    private let configPath: String

    public static let mosquitto = "/usr/sbin/mosquitto"

    /// `extraConfig` lines go into its mosquitto.conf (e.g. password_file, allow_anonymous false).
    /// They follow the `listener` line, so listener settings (certfile, keyfile…) apply to it.
    public convenience init(extraConfig: [String] = []) throws {
        try self.init(extra: extraConfig, users: [:])
    }

    /// A broker that wants a login: `users` (name → password) go into a password file made by
    /// mosquitto_passwd, and anonymous clients are refused. `helperLogin` is set to the first
    /// user in name order, for `retained` and `publish`.
    public convenience init(users: [String: String], extraConfig: [String] = []) throws {
        try self.init(extra: extraConfig, users: users)
    }

    private init(extra: [String], users: [String: String]) throws {
        guard FileManager.default.isExecutableFile(atPath: Self.mosquitto) else {
            throw BrokerError("\(Self.mosquitto) is missing: install the mosquitto package (scripts/setup)")
        }
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("baton-mosquitto-\(getpid())-\(UInt64.random(in: 0...UInt64.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        configPath = directory.appendingPathComponent("mosquitto.conf").path
        var extraConfig = extra
        if !users.isEmpty {
            let passwd = directory.appendingPathComponent("passwd").path
            try Self.writePasswordFile(at: passwd, users: users)
            extraConfig = ["allow_anonymous false", "password_file \(passwd)"] + extra
            if let first = users.keys.sorted().first, let password = users[first] {
                helperLogin = (first, password)
            }
        }

        // The free port is the kernel's choice for a bind to port 0. Another process could take
        // it between our close and mosquitto's bind; then mosquitto exits and we try another.
        var lastError: (any Error)?
        for _ in 0..<3 {
            let candidate = try Self.freePort()
            do {
                try Self.writeConfig(at: configPath, port: candidate, directory: directory, extra: extraConfig)
                process = try Self.launch(configPath: configPath, port: candidate, directory: directory)
                port = candidate
                return
            } catch {
                lastError = error
            }
        }
        try? FileManager.default.removeItem(at: directory)
        throw lastError ?? BrokerError("mosquitto did not start")
    }

    deinit {
        // SIGKILL, not stop(): with persistence off nothing is lost, and mosquitto takes up to
        // a second to leave its main loop after SIGTERM, which every test would wait out.
        kill()
        try? FileManager.default.removeItem(at: directory)
    }

    /// SIGKILL, as a crash or power cut would.
    public func kill() {
        guard let process else { return }
        process.signal(SIGKILL)
        process.wait(timeout: .seconds(5))
        self.process = nil
    }

    /// Starts again on the same port, with nothing retained (no persistence).
    public func restart() throws {
        stop()
        // mosquitto sets SO_REUSEADDR, so a port in TIME_WAIT binds again; retry briefly in
        // case the old listener is still being torn down.
        var lastError: (any Error)?
        for _ in 0..<10 {
            do {
                process = try Self.launch(configPath: configPath, port: port, directory: directory)
                return
            } catch {
                lastError = error
                usleep(100_000)
            }
        }
        throw lastError ?? BrokerError("mosquitto did not restart")
    }

    /// SIGTERM: mosquitto closes its clients' connections and exits (within about a second).
    public func stop() {
        guard let process else { return }
        process.signal(SIGTERM)
        if process.wait(timeout: .seconds(3)) == nil {
            process.signal(SIGKILL)
            process.wait(timeout: .seconds(5))
        }
        self.process = nil
    }

    /// Everything the broker logged so far (log_type all).
    public var log: String {
        (try? String(contentsOf: directory.appendingPathComponent("mosquitto.log"), encoding: .utf8)) ?? ""
    }

    /// Waits up to `timeout` for a log line containing `text`; true if it appeared.
    public func waitForLog(_ text: String, timeout: Duration = .seconds(5)) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if log.contains(text) { return true }
            usleep(20_000)
        }
        return log.contains(text)
    }

    /// The reference clients on this broker, with `helperLogin`.
    public var clients: ReferenceClients {
        ReferenceClients(port: port, directory: directory, login: helperLogin)
    }

    /// `ReferenceClients.retained`: what a fresh subscriber to `pattern` is sent.
    public func retained(_ pattern: String = "#") throws -> [String: [UInt8]] {
        try clients.retained(pattern)
    }

    /// `ReferenceClients.publish`: one message with mosquitto_pub.
    public func publish(topic: String, payload: [UInt8], retain: Bool = false, qos: Int = 0) throws {
        try clients.publish(topic: topic, payload: payload, retain: retain, qos: qos)
    }

    /// Publishes many retained messages over one connection, QoS 0, and returns once the broker
    /// has stored them all. One `mosquitto_pub` per message costs a process each (5,000 orphans
    /// would take minutes), and `mosquitto_pub -l` sends every line to one topic.
    ///
    /// A plain MQTT 3.1.1 client on a TCP socket: CONNECT, the PUBLISH packets back to back,
    /// then PINGREQ. mosquitto handles one client's packets in the order they arrive, so its
    /// PINGRESP comes after every PUBLISH before it is in the retained store (3.1.1 §3.12).
    ///
    /// `qos` 1 stores them as a gateway publishes its activities (QoS 1, so a subscriber at
    /// QoS 1 gets them at QoS 1, through its inflight window and queue: docs/broker.md
    /// "Retained floods"); the broker's PUBACKs are read and skipped before the PINGRESP.
    public func publishRetained(_ messages: [(topic: String, payload: [UInt8])], qos: Int = 0) throws {
        precondition(qos == 0 || qos == 1, "publishRetained sends QoS 0 or 1")
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BrokerError("socket(): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        guard connected else { throw BrokerError("connect(127.0.0.1:\(port)): \(String(cString: strerror(errno)))") }

        // 3.1.1 §3.1: protocol name, level 4, flags (clean session, login if any), keepalive 60 s.
        var connectBody: [UInt8] = Self.utf8String("MQTT") + [4, 0x02, 0, 60]
        connectBody += Self.utf8String("baton-test-bulk-\(UInt32.random(in: 0...UInt32.max))")
        if let helperLogin {
            connectBody[7] |= 0xC0
            connectBody += Self.utf8String(helperLogin.username) + Self.utf8String(helperLogin.password)
        }
        try Self.send(fd, Self.packet(0x10, connectBody))
        let connack = try Self.receive(fd, count: 4)
        guard connack == [0x20, 0x02, 0x00, 0x00] else { throw BrokerError("CONNECT refused: \(connack)") }

        var bytes: [UInt8] = []
        for (i, m) in messages.enumerated() {
            // 3.1.1 §3.3.1: PUBLISH, QoS 0 or 1, RETAIN set; QoS 1 carries a packet id (1…65535).
            if qos == 0 {
                bytes += Self.packet(0x31, Self.utf8String(m.topic) + m.payload)
            } else {
                let id = UInt16(i % 65535 + 1)
                bytes += Self.packet(0x33, Self.utf8String(m.topic) + [UInt8(id >> 8), UInt8(id & 0xFF)] + m.payload)
            }
            if bytes.count >= 1 << 16 {
                try Self.send(fd, bytes)
                bytes.removeAll(keepingCapacity: true)
            }
        }
        try Self.send(fd, bytes + [0xC0, 0x00])                   // PINGREQ
        var pingresp = try Self.receive(fd, count: 2)
        while qos == 1 && pingresp == [0x40, 0x02] {              // a PUBACK: skip its packet id
            _ = try Self.receive(fd, count: 2)
            pingresp = try Self.receive(fd, count: 2)
        }
        guard pingresp == [0xD0, 0x00] else { throw BrokerError("expected PINGRESP, got \(pingresp)") }
        try Self.send(fd, [0xE0, 0x00])                           // DISCONNECT: no will, a clean close
    }

    /// The broker-wide settings of `board/mosquitto-building.conf` (docs/broker.md "Retained
    /// floods"), for `extraConfig`: every setting but those that belong to an installation
    /// (listeners, persistence, logins, ACLs, TLS files), so a test runs the building's limits
    /// on its own throwaway broker.
    public static func buildingConfig(file: String = #filePath) throws -> [String] {
        // …/Tests/<target>/<file>.swift → the package root.
        var root = URL(fileURLWithPath: file)
        for _ in 0 ..< 3 { root.deleteLastPathComponent() }
        let path = root.appendingPathComponent("board/mosquitto-building.conf").path
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let installation: Set<Substring> = ["persistence", "persistence_location", "listener", "allow_anonymous",
                                            "password_file", "acl_file", "cafile", "certfile", "keyfile", "user"]
        return text.split(separator: "\n").compactMap { line in
            let trimmed = line.drop { $0 == " " || $0 == "\t" }
            guard !trimmed.isEmpty, !trimmed.hasPrefix("#"),
                  let key = trimmed.split(separator: " ").first, !installation.contains(key) else { return nil }
            return String(trimmed)
        }
    }

    /// Writes a mosquitto password file with `mosquitto_passwd -b` (hashed the broker's way).
    public static func writePasswordFile(at path: String, users: [String: String]) throws {
        for (index, (user, password)) in users.sorted(by: { $0.key < $1.key }).enumerated() {
            let status = try ChildProcess.run("/usr/bin/mosquitto_passwd",
                                              (index == 0 ? ["-c"] : []) + ["-b", path, user, password])
            guard status == 0 else {
                throw BrokerError("mosquitto_passwd -b \(path) \(user) failed (\(status))")
            }
        }
    }

    // MARK: - Internals

    private static func launch(configPath: String, port: Int, directory: URL) throws -> ChildProcess {
        let stderrPath = directory.appendingPathComponent("stderr.log").path
        let p = try ChildProcess(Self.mosquitto, ["-c", configPath], stderr: stderrPath)

        // Ready when the port takes a TCP connection; bounded, and a broker that exited
        // (bad config, port taken) is reported with what it said.
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if accepts(port: port) { return p }
            if p.wait(timeout: .milliseconds(20)) != nil { break }
        }
        let logPath = directory.appendingPathComponent("mosquitto.log").path
        let said = ((try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "")
        p.signal(SIGKILL)
        p.wait(timeout: .seconds(5))
        throw BrokerError("mosquitto did not accept connections on 127.0.0.1:\(port) within 5 s: \(said)")
    }

    private static func writeConfig(at path: String, port: Int, directory: URL, extra: [String]) throws {
        var lines = [
            "# Written by BatonTestSupport.MosquittoBroker",
            "persistence false",
            "log_dest file \(directory.appendingPathComponent("mosquitto.log").path)",
            "log_type all",
            "connection_messages true",
        ]
        // As root, mosquitto would switch to the "mosquitto" user, which cannot write our
        // temporary directory; as anyone else the option has no effect.
        if geteuid() == 0 { lines.append("user root") }
        // allow_anonymous is global (per_listener_settings false); a later line in `extra` wins.
        lines.append("allow_anonymous true")
        lines.append("listener \(port) 127.0.0.1")
        lines += extra
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
    }

    /// Binds 127.0.0.1:0, reads the port the kernel chose, closes.
    private static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BrokerError("socket(): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else { throw BrokerError("bind(127.0.0.1:0): \(String(cString: strerror(errno)))") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// True if something accepts a TCP connection on 127.0.0.1:`port` now.
    private static func accepts(port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// 3.1.1 §1.5.3: a two-byte length, then the bytes.
    private static func utf8String(_ s: String) -> [UInt8] {
        let b = Array(s.utf8)
        return [UInt8(b.count >> 8), UInt8(b.count & 0xFF)] + b
    }

    /// 3.1.1 §2.2.3: the fixed header's remaining length, 7 bits a byte, least significant first.
    private static func packet(_ header: UInt8, _ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [header]
        var n = body.count
        repeat {
            var byte = UInt8(n & 0x7F)
            n >>= 7
            if n > 0 { byte |= 0x80 }
            out.append(byte)
        } while n > 0
        return out + body
    }

    private static func send(_ fd: Int32, _ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw BrokerError("send(): \(String(cString: strerror(errno)))") }
            sent += n
        }
    }

    private static func receive(_ fd: Int32, count: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < count {
            let n = out.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + got, count - got, 0) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw BrokerError("recv(): \(n == 0 ? "closed by the broker" : String(cString: strerror(errno)))") }
            got += n
        }
        return out
    }
}
