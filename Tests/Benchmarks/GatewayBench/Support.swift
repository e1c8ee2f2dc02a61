// What the three gateway measurements share: a scripted H4 controller on a Unix socket (the
// `sim:` radio source), a subscriber on our own MQTT client, reading /proc, and the small
// numeric helpers. Nothing here runs inside a counted window.
import BatonLibc
import BatonMQTT
import Foundation
import Glibc

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A scratch directory under $TMPDIR, removed when the bench ends.
func scratchDirectory() throws -> URL {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("baton-gwbench-\(getpid())")
    try? FileManager.default.removeItem(at: dir)
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir
}

func microseconds(_ d: Duration) -> Double {
    let (s, atto) = d.components
    return Double(s) * 1e6 + Double(atto) / 1e12
}

/// Nearest-rank percentile (the value at rank ⌈p·n⌉ of the sorted sample): a value that was
/// actually measured, never an interpolation.
func percentile(_ sorted: [Double], _ p: Double) -> Double {
    precondition(!sorted.isEmpty)
    let rank = Int((p * Double(sorted.count)).rounded(.up))
    return sorted[min(max(rank, 1), sorted.count) - 1]
}

// MARK: - The controller

/// The controller end of a `sim:` radio: listens on a Unix socket, answers the gateway's
/// init commands with Command Complete (Core 5.4, Vol 4, Part E, §7.7.14) as a Bluetooth 4.2
/// controller would, then sends whatever events the bench gives it. The gateway's own H4 path
/// (RadioH4) reads them byte for byte, as from a serial controller.
final class H4Controller {
    let path: String
    let listener: Int32
    var fd: Int32 = -1
    var pending: [UInt8] = []
    /// Opcodes of the commands received, in order.
    var commands: [UInt16] = []

    init(path: String) throws {
        self.path = path
        unlink(path)
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw BenchError("socket(AF_UNIX): Glibc.errno \(Glibc.errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(listener)
            throw BenchError("controller socket path \(path) is too long for a Unix socket")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
        let listening = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        } && listen(listener, 1) == 0
        guard listening else {
            close(listener)
            throw BenchError("cannot listen on \(path): Glibc.errno \(Glibc.errno)")
        }
    }

    deinit {
        if fd >= 0 { close(fd) }
        close(listener)
        unlink(path)
    }

    /// Waits for the gateway to connect, then answers its init sequence up to and including
    /// LE_Set_Scan_Enable (0x200C): from then on it is scanning.
    func acceptAndInitialise(timeout: Duration, log: () -> String) throws {
        var p = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, Int32(timeout.components.seconds * 1000)) > 0 else {
            throw BenchError("the gateway never connected to the controller socket \(path): \(log())")
        }
        fd = accept(listener, nil, nil)
        guard fd >= 0 else { throw BenchError("accept(): Glibc.errno \(Glibc.errno)") }
        guard serve(until: 0x200C, timeout: timeout) else {
            throw BenchError("the gateway's controller init never reached LE_Set_Scan_Enable (commands \(commands)): \(log())")
        }
    }

    /// Answers commands until one with `opcode` has been answered, or `timeout` passes.
    func serve(until opcode: UInt16, timeout: Duration) -> Bool {
        let deadline = Instant.now + timeout
        while Instant.now < deadline {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 50) >= 0 else { return false }
            if p.revents == 0 { continue }
            var buf = [UInt8](repeating: 0, count: 1024)
            let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { return false }
            pending += buf[..<n]
            // An H4 command: indicator 0x01, opcode (LE), parameter length, parameters.
            while pending.count >= 4, pending.count >= 4 + Int(pending[3]) {
                let frame = Array(pending[..<(4 + Int(pending[3]))])
                pending.removeFirst(frame.count)
                let op = UInt16(frame[1]) | UInt16(frame[2]) << 8
                commands.append(op)
                answer(op)
                if op == opcode { return true }
            }
        }
        return false
    }

    /// §7.7.14 Command Complete, status success, with the return parameters a 4.2 controller
    /// gives for Read_Local_Version_Information (§7.4.1) and LE_Read_Local_Supported_Features
    /// (§7.8.3); every other command gets the bare status.
    func answer(_ opcode: UInt16) {
        var extra: [UInt8] = []
        if opcode == 0x1001 { extra = [0x08, 0x00, 0x01, 0x08, 0x02, 0x00, 0x09, 0x22] }
        if opcode == 0x2003 { extra = [0x3F, 0, 0, 0, 0, 0, 0, 0] }
        send([0x04, 0x0E, UInt8(4 + extra.count), 0x01, UInt8(opcode & 0xFF), UInt8(opcode >> 8), 0x00] + extra)
    }

    /// Writes all of `bytes` (blocking: the gateway reads as fast as it can).
    func send(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            var done = 0
            while done < raw.count {
                let n = write(fd, raw.baseAddress! + done, raw.count - done)
                if n < 0 && Glibc.errno == EINTR { continue }
                guard n > 0 else { return }
                done += n
            }
        }
    }
}

// MARK: - The subscriber

/// A subscriber on BatonMQTT's own client, driven by a poll() loop of its own: what a Home
/// Assistant instance does on the other side of the broker.
final class Subscriber {
    var client: MQTTClient
    var patterns: [String] = []

    init(port: Int, clientID: String) throws {
        client = try MQTTClient(config: MQTTConfig(host: "127.0.0.1", port: port, clientID: clientID, keepalive: 60))
    }

    /// Connects and subscribes; returns once the connection is up (the SUBSCRIBE is sent).
    func connect(subscribing patterns: [String], timeout: Duration = .seconds(10)) throws {
        self.patterns = patterns
        client.start(now: .now)
        let deadline = Instant.now + timeout
        while !client.isConnected {
            guard Instant.now < deadline else { throw BenchError("the bench's subscriber did not connect to the broker") }
            pump(timeoutMs: 50) { _ in }
        }
        for p in patterns { try client.subscribe(p, qos: 1) }
        pump(timeoutMs: 0) { _ in }
    }

    /// One poll() on the broker socket (at most `timeoutMs`), then the client's work; each
    /// message received goes to `onMessage`.
    func pump(timeoutMs: Int32, _ onMessage: (MQTTMessage) -> Void) {
        let now = Instant.now
        var timeout = timeoutMs
        if let d = client.nextDeadline {
            let ms = d <= now ? 0 : Int32(min(Double(timeoutMs), microseconds(d - now) / 1000 + 1))
            timeout = min(timeout, ms)
        }
        var p = pollfd(fd: client.socket, events: Int16(POLLIN), revents: 0)
        if client.wantsWrite { p.events |= Int16(POLLOUT) }
        if p.fd >= 0 { _ = poll(&p, 1, timeout) } else if timeout > 0 { usleep(UInt32(timeout) * 1000) }
        let readable = p.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0
        let writable = p.revents & Int16(POLLOUT) != 0
        client.poll(now: .now, readable: readable, writable: writable) { event in
            if case .message(let m) = event { onMessage(m) }
        }
    }

    /// Pumps for `duration`, handing every message to `onMessage`.
    func pump(for duration: Duration, _ onMessage: (MQTTMessage) -> Void) {
        let end = Instant.now + duration
        while Instant.now < end { pump(timeoutMs: 20, onMessage) }
    }
}

/// The number after `"key":` in a flat JSON payload (the activity's `"seq"`), without a
/// JSON parser in the timed loop.
func jsonInteger(_ key: String, in payload: [UInt8]) -> Int? {
    let needle = Array("\"\(key)\":".utf8)
    guard payload.count > needle.count else { return nil }
    var i = 0
    while i + needle.count <= payload.count {
        if payload[i] == needle[0], payload[i..<(i + needle.count)].elementsEqual(needle) {
            var j = i + needle.count
            var value = 0
            var digits = 0
            while j < payload.count, payload[j] >= 0x30, payload[j] <= 0x39 {
                value = value * 10 + Int(payload[j] - 0x30)
                j += 1
                digits += 1
            }
            return digits > 0 ? value : nil
        }
        i += 1
    }
    return nil
}

func json(_ bytes: [UInt8]) -> [String: Any]? {
    try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
}

// MARK: - /proc

/// The memory lines of /proc/PID/status (proc(5)), in KiB.
struct ProcessMemory {
    /// Peak resident set size ("high water mark").
    var vmHWM: Int
    var vmRSS: Int
    /// Resident anonymous memory: the heap, stacks, and every allocation the process made.
    var rssAnon: Int
    /// Resident file-backed memory: the binary and the shared libraries' pages in use.
    var rssFile: Int

    init(pid: pid_t) throws {
        let path = "/proc/\(pid)/status"
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw BenchError("cannot read \(path)")
        }
        var fields: [String: Int] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { continue }
            let value = parts[1].split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Int($0) }
            if let value { fields[String(parts[0])] = value }
        }
        guard let hwm = fields["VmHWM"], let rss = fields["VmRSS"], let anon = fields["RssAnon"],
              let file = fields["RssFile"] else {
            throw BenchError("\(path) lacks VmHWM, VmRSS, RssAnon or RssFile")
        }
        vmHWM = hwm; vmRSS = rss; rssAnon = anon; rssFile = file
    }

    var json: String {
        "{\"vm_hwm_kib\": \(vmHWM), \"vm_rss_kib\": \(vmRSS), \"rss_anon_kib\": \(rssAnon), \"rss_file_kib\": \(rssFile)}"
    }
}

func readLog(_ path: String) -> String {
    let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    return text.isEmpty ? "(the gateway logged nothing)" : "gateway log:\n" + text.suffix(4000)
}
