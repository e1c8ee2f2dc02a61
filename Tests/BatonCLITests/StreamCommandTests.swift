// `baton stream` as a user runs it (docs/relay.md §7.4): the built binary against a real
// mosquitto, with the gateway's side played by the test byte for byte (docs/protocol.md §5.1)
// through mosquitto_sub and mosquitto_pub, the reference clients. Every wait is bounded with a
// generous limit; no test asserts how long anything took.

import BatonLibc
import BatonTestSupport
import Foundation
import Glibc
import Testing

/// The gateway's side of one broker: sees the endpoint's opens (`<prefix>/stream/<device>/S`)
/// and everything it sends on `…/S/up`, and publishes frames on `…/S/down`.
private final class ScriptedGateway {
    let broker: MosquittoBroker
    private let sub: ChildProcess
    private let seen: String

    init(_ broker: MosquittoBroker) throws {
        self.broker = broker
        seen = broker.directory.appendingPathComponent("seen-\(UInt64.random(in: 0...UInt64.max)).txt").path
        // One line per message: its topic and its bytes in hex, so every byte survives.
        sub = try ChildProcess("/usr/bin/mosquitto_sub",
                               ["-h", "127.0.0.1", "-p", "\(broker.port)", "-q", "1", "-F", "%t %x",
                                "-t", "baton/stream/+/+", "-t", "baton/streams/+/up"], stdout: seen)
        guard broker.waitForLog("baton/streams/+/up") else {
            throw BrokerError("mosquitto_sub did not subscribe: \(broker.log)")
        }
    }

    deinit {
        sub.signal(SIGKILL)
        sub.wait(timeout: .seconds(5))
    }

    /// Every message seen so far, in order: topic and bytes as hex.
    var messages: [(topic: String, hex: String)] {
        let text = (try? String(contentsOfFile: seen, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            let parts = line.split(separator: " ", maxSplits: 1)
            return parts.count == 2 ? (String(parts[0]), String(parts[1])) : nil
        }
    }

    /// The opens seen: stream id and the frame in hex.
    var opens: [(stream: String, hex: String)] {
        messages.compactMap { m in
            let levels = m.topic.split(separator: "/")
            guard levels.count == 4, levels[1] == "stream" else { return nil }
            return (String(levels[3]), m.hex)
        }
    }

    /// The frames sent on `…/S/up`, in hex.
    func up(_ stream: String) -> [String] {
        messages.filter { $0.topic == "baton/streams/\(stream)/up" }.map(\.hex)
    }

    /// Waits for the first open; its stream id.
    func awaitOpen() throws -> String {
        guard within10s({ !opens.isEmpty }), let open = opens.first else {
            throw BrokerError("no open frame on baton/stream/+/+ within 10 s")
        }
        return open.stream
    }

    /// Waits until a frame on `…/S/up` is `hex` (spaces ignored).
    @discardableResult
    func awaitUp(_ stream: String, _ hex: String) -> Bool {
        let wanted = hex.filter { !$0.isWhitespace }
        return awaitUp(stream) { $0 == wanted }
    }

    /// Waits until a frame on `…/S/up` passes `check`.
    func awaitUp(_ stream: String, where check: (String) -> Bool) -> Bool {
        within10s { up(stream).contains(where: check) }
    }

    /// Publishes one frame on `…/S/down`, written in hex.
    func down(_ stream: String, _ hex: String) throws {
        try broker.publish(topic: "baton/streams/\(stream)/down", payload: hx(hex))
    }
}

/// Polls `condition` for up to 10 s; whether it came true.
private func within10s(_ condition: () -> Bool) -> Bool {
    let deadline = Instant.now + .seconds(10)
    while Instant.now < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

/// The frame numbers of the acks among `frames` (§5.1 ack: 12 | next (4, LE) | window (2)).
private func acks(_ frames: [String]) -> [UInt32] {
    frames.map(hx).filter { $0.count == 7 && $0[0] == 0x12 }.map { b in
        b[1...4].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
    }
}

/// The command as a user types it, against `broker`.
private func stream(_ broker: MosquittoBroker, _ arguments: String...) throws -> Run {
    try run(binaries.appendingPathComponent("baton"),
            ["stream", "5a0000000001", "--broker", "mqtt://127.0.0.1:\(broker.port)"] + arguments)
}

/// A broker, the gateway's side played on it, and `baton stream` against it (`arguments`, stdin
/// `input`), once the gateway has seen its open: `s`, the stream's id.
private func openedStream(_ arguments: [String] = [], input: [UInt8]? = nil) throws
    -> (broker: MosquittoBroker, gateway: ScriptedGateway, run: StreamRun, s: String) {
    let broker = try MosquittoBroker()
    let gateway = try ScriptedGateway(broker)
    let run = try StreamRun(broker, arguments, input: input)
    return (broker, gateway, run, try gateway.awaitOpen())
}

/// `baton stream` in the background, stdin from a file (or /dev/null), stdout and stderr to files.
private final class StreamRun {
    let child: ChildProcess
    let out: String
    let err: String

    /// `output`: where stdout goes (a FIFO the test reads, say); a file of its own otherwise.
    init(_ broker: MosquittoBroker, _ arguments: [String] = [], input: [UInt8]? = nil, output: String? = nil) throws {
        let dir = broker.directory.appendingPathComponent("stream-\(UInt64.random(in: 0...UInt64.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        out = output ?? dir.appendingPathComponent("out").path
        err = dir.appendingPathComponent("err").path
        var stdin = "/dev/null"
        if let input {
            stdin = dir.appendingPathComponent("in").path
            try Data(input).write(to: URL(fileURLWithPath: stdin))
        }
        let command = ([binaries.appendingPathComponent("baton").path, "stream", "5a0000000001",
                        "--broker", "mqtt://127.0.0.1:\(broker.port)"] + arguments).map { "'\($0)'" }
        // exec: the shell only sets up stdin; the pid is baton's, for signals and the status.
        child = try ChildProcess("/bin/sh", ["-c", "exec \(command.joined(separator: " ")) < '\(stdin)'"],
                                 stdout: out, stderr: err)
    }

    /// The exit status, or nil if it did not end within the bound.
    func status(within seconds: Int64 = 20) -> Int32? {
        guard let raw = child.wait(timeout: .seconds(seconds)) else {
            child.signal(SIGKILL)
            return nil
        }
        // WIFEXITED / WEXITSTATUS (sys/wait.h macros, not imported into Swift).
        return raw & 0x7F == 0 ? (raw >> 8) & 0xFF : -1
    }

    var stdout: [UInt8] { Array(FileManager.default.contents(atPath: out) ?? Data()) }
    var stderr: String { (try? String(contentsOfFile: err, encoding: .utf8)) ?? "" }
}

@Suite("baton stream (docs/relay.md §7)")
struct StreamCommandTests {

    @Test("No gateway answers: exit 3 with a message, after an open frame with the defaults and a reset on up")
    func noGateway() throws {
        let broker = try MosquittoBroker()
        let gateway = try ScriptedGateway(broker)
        let r = try stream(broker, "--timeout", "1")
        #expect(r.status == 3, "\(r.stderr)")
        #expect(r.stderr.contains("baton stream: no gateway answered the open"), "\(r.stderr)")

        let opens = gateway.opens
        #expect(!opens.isEmpty, "no open frame seen: \(gateway.messages)")
        // §5.1 open: 10 | window 16 LE | max data 1024 LE.
        for open in opens {
            #expect(open.hex == "1010000004")
            #expect(open.stream.count == 16 && open.stream.allSatisfy(\.isHexDigit), "stream id \(open.stream)")
        }
        // A gateway that took the stream late frees its slot: reset cancelled (§5.4 01).
        if let stream = opens.first?.stream {
            #expect(gateway.awaitUp(stream, "1401"), "up: \(gateway.up(stream))")
        }
    }

    @Test("An open nobody answers is published again, on the same stream")
    func openRepeated() throws {
        let broker = try MosquittoBroker()
        let gateway = try ScriptedGateway(broker)
        // The open is repeated 2 s after the first; 4.5 s leaves room for two repeats.
        let r = try stream(broker, "--timeout", "4.5")
        #expect(r.status == 3, "\(r.stderr)")
        let opens = gateway.opens
        #expect(opens.count >= 2, "opens: \(opens)")
        #expect(Set(opens.map(\.stream)).count == 1, "one stream id for every open: \(opens)")
    }

    @Test("The largest window and max data are taken and said in the open (one more: badArguments)")
    func largestOptions() throws {
        let broker = try MosquittoBroker()
        let gateway = try ScriptedGateway(broker)
        let r = try stream(broker, "--timeout", "1", "--window", "1024", "--max-data", "65535")
        #expect(r.status == 3, "\(r.stderr)")
        // 10 | 1024 = 00 04 | 65535 = ff ff.
        #expect(gateway.opens.first?.hex == "100004ffff", "\(gateway.opens)")
    }

    @Test("Bad arguments are usage errors (exit 64) that say what to write",
          arguments: [
            (["5a00000001"], "DEVICE must be 12 hex digits"),
            (["5a000000000g"], "DEVICE must be 12 hex digits"),
            (["5a0000000001", "--window", "0"], "--window must be 1–1024"),
            (["5a0000000001", "--window", "1025"], "--window must be 1–1024"),
            (["5a0000000001", "--max-data", "0"], "--max-data must be 1–65535"),
            (["5a0000000001", "--max-data", "65536"], "--max-data must be 1–65535"),
            (["5a0000000001", "--timeout", "0"], "--timeout must be"),
          ])
    func badArguments(arguments: [String], says: String) throws {
        let r = try run(binaries.appendingPathComponent("baton"), ["stream"] + arguments)
        #expect(r.status == 64, "\(r.stderr)")
        #expect(r.stderr.contains(says), "\(r.stderr)")
    }

    @Test("A whole stream with a scripted gateway: stdin in frames of the gateway's max data, stdout acknowledged once written")
    func wholeStream() throws {
        let (_, gateway, run, s) = try openedStream(["--timeout", "10"], input: Array("hello device".utf8))

        // The device takes 4 frames of at most 8 bytes (§7.2 step 3).
        try gateway.down(s, "10 0400 0800")
        // stdin in frames of 8 bytes, then the close at 2 (§5.3).
        #expect(gateway.awaitUp(s, "11 00000000" + hexString("hello de".utf8)), "up: \(gateway.up(s))")
        #expect(gateway.awaitUp(s, "11 01000000" + hexString("vice".utf8)), "up: \(gateway.up(s))")
        #expect(gateway.awaitUp(s, "1302000000"), "up: \(gateway.up(s))")
        try gateway.down(s, "12 02000000 0400")

        // Frame 1 first: after a gap, dropped; then 0 and 1 in order, then the close at 2.
        try gateway.down(s, "11 01000000" + hexString("ld".utf8))
        try gateway.down(s, "11 00000000" + hexString("wor".utf8))
        try gateway.down(s, "11 01000000" + hexString("ld".utf8))
        try gateway.down(s, "13 02000000")

        #expect(run.status() == 0, "\(run.stderr)")
        #expect(run.stdout == Array("world".utf8))
        #expect(run.stderr.contains("frames from the device dropped after a lost one: 1"), "\(run.stderr)")
        // Acknowledged as written, with our window of 16, up to the close. The command has
        // sent that ack before it exits; mosquitto_sub may write it down a moment later.
        #expect(gateway.awaitUp(s, "12 02000000 1000"), "up: \(gateway.up(s))")
        let up = gateway.up(s)
        // Cumulative and never past what was written: 0, 1 or 2, in order.
        let acked = acks(up)
        #expect(acked == acked.sorted() && acked.allSatisfy { $0 <= 2 }, "acks: \(acked)")
        // Nothing in the stream was a breach: no error frame went up.
        #expect(!up.contains { $0.hasPrefix("15") }, "up: \(up)")
    }

    @Test("Refused or aborted by the gateway: exit 1 with the reason and its detail",
          arguments: [
            ("15 03" + hexString("no link to the device".utf8), "baton stream: unreachable: no link to the device"),
            ("15 05" + hexString("8 streams are open".utf8), "baton stream: busy: 8 streams are open"),
            ("14 06", "baton stream: gone: the device or its gateway reset the stream"),
          ])
    func refused(frame: String, says: String) throws {
        let (_, gateway, run, s) = try openedStream()
        try gateway.down(s, frame)
        #expect(run.status() == 1, "\(run.stderr)")
        #expect(run.stderr.contains(says), "\(run.stderr)")
    }

    @Test("A gateway that breaks §5.3 ends the stream with error protocol, both ways",
          arguments: [
            ("12 05000000 0400", "an ack for frame 5"),                 // nothing was sent
            ("11 10000000 00", "beyond our window"),                    // frame 16, window 16, nothing acknowledged
            ("11 00000000 " + String(repeating: "00", count: 1025), "link-too-large"),  // max data 1024 + 1
            ("01 0100", "not a stream frame"),
          ])
    func breach(frame: String, says: String) throws {
        let (_, gateway, run, s) = try openedStream()
        try gateway.down(s, "10 0400 0800")
        try gateway.down(s, frame)
        #expect(run.status() == 1, "\(run.stderr)")
        #expect(run.stderr.contains("baton stream: protocol: "), "\(run.stderr)")
        #expect(run.stderr.contains(says), "\(run.stderr)")
        #expect(gateway.awaitUp(s) { $0.hasPrefix("1502") }, "up: \(gateway.up(s))")
    }

    @Test("Ctrl-C: the device is told (reset cancelled) and the exit status is 130")
    func interrupted() throws {
        let (_, gateway, run, s) = try openedStream()
        try gateway.down(s, "10 0400 0800")
        // stdin is empty: the close at 0 says the open was taken.
        #expect(gateway.awaitUp(s, "1300000000"), "up: \(gateway.up(s))")
        run.child.signal(SIGINT)
        #expect(run.status() == 130, "\(run.stderr)")
        #expect(gateway.awaitUp(s, "1401"), "up: \(gateway.up(s))")
    }

    @Test("No ack for a second: every unacknowledged frame is sent again, from the first, with the close")
    func resendWithoutAcks() throws {
        let (_, gateway, run, s) = try openedStream(input: Array("abcdef".utf8))
        try gateway.down(s, "10 0400 0300")
        let first = ["1100000000" + hexString("abc".utf8), "1101000000" + hexString("def".utf8), "1302000000"]
        #expect(gateway.awaitUp(s, first[2]), "up: \(gateway.up(s))")
        // The gateway stays silent: go-back-N (§5.3) sends 0, 1 and the close again.
        #expect(within10s { gateway.up(s).count >= 6 }, "up: \(gateway.up(s))")
        let up = gateway.up(s)
        #expect(Array(up.prefix(6)) == first + first, "up: \(up)")
        // Acknowledged: nothing more is resent, and once the device closes the stream is over.
        try gateway.down(s, "12 02000000 0400")
        try gateway.down(s, "13 00000000")
        #expect(run.status() == 0, "\(run.stderr)")
        #expect(run.stdout.isEmpty)
    }

    @Test("Backpressure: a stdout nobody reads stops the acks; once read, everything is acknowledged")
    func backpressure() throws {
        let broker = try MosquittoBroker()
        let gateway = try ScriptedGateway(broker)
        let fifo = broker.directory.appendingPathComponent("stdout.fifo").path
        #expect(mkfifo(fifo, 0o600) == 0)
        // Our end, opened first so the child's open for writing does not wait; one page of
        // pipe (F_SETPIPE_SZ's least), so 4 frames of 1024 bytes fill it.
        let reader = Glibc.open(fifo, O_RDONLY | O_NONBLOCK)
        try #require(reader >= 0)
        defer { close(reader) }
        // F_SETPIPE_SZ (Glibc.fcntl(2), Linux): 1031 in <fcntl.h>, behind _GNU_SOURCE, so not in Glibc's module.
        try #require(Glibc.fcntl(reader, 1031, 4096) == 4096)

        let run = try StreamRun(broker, output: fifo)
        let s = try gateway.awaitOpen()
        try gateway.down(s, "10 0400 0800")
        // A whole window of the device's frames: 16 of our max data, 1024 bytes.
        var sent: [UInt8] = []
        for n in 0..<16 {
            let frame = (0..<1024).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ n) }
            sent += frame
            try gateway.down(s, String(format: "11 %02x000000", n) + hexString(frame))
        }
        // Whatever went into the pipe is acknowledged, and no more: give it a moment to be wrong.
        #expect(gateway.awaitUp(s) { $0.hasPrefix("12") }, "up: \(gateway.up(s))")
        usleep(1_000_000)
        let stalled = acks(gateway.up(s))
        #expect(stalled.allSatisfy { $0 <= 4 }, "acks past what stdout took: \(stalled)")

        // The reader reads: the rest is written and acknowledged.
        var got: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = Instant.now + .seconds(10)
        while got.count < sent.count, Instant.now < deadline {
            let n = read(reader, &buffer, buffer.count)
            if n > 0 { got += buffer[..<n] } else { usleep(5_000) }
        }
        #expect(got == sent)
        #expect(gateway.awaitUp(s, "12 10000000 1000"), "acks: \(acks(gateway.up(s)))")
        // stdin was empty: our close at 0 went up first; the gateway acknowledges it (§5.3).
        try gateway.down(s, "12 00000000 0400")
        try gateway.down(s, "13 10000000")
        #expect(run.status() == 0, "\(run.stderr)")
    }

    @Test("A broker restart: the close and the last ack are said again on the new connection, and the stream completes")
    func brokerRestart() throws {
        let (broker, gateway, run, s) = try openedStream(input: Array("abc".utf8))
        try gateway.down(s, "10 0400 0800")
        #expect(gateway.awaitUp(s, "1301000000"), "up: \(gateway.up(s))")
        // Everything acknowledged both ways; only the device's close is missing. Nothing is in
        // flight, so no retry timer resends anything: what follows the restart is the reconnect's.
        try gateway.down(s, "12 01000000 0400")
        try gateway.down(s, "11 00000000" + hexString("ok".utf8))
        #expect(gateway.awaitUp(s, "12 01000000 1000"), "up: \(gateway.up(s))")

        try broker.restart()
        // Seen by the broker itself (its log), since mosquitto_sub may come back after baton.
        let published = "'baton/streams/\(s)/up'"
        func upAfterRestart() -> [Substring] {
            let log = broker.log
            let restarted = log.range(of: "mosquitto version", options: .backwards)?.upperBound ?? log.startIndex
            return log[restarted...].split(separator: "\n").filter { $0.contains("Received PUBLISH") && $0.contains(published) }
        }
        _ = within10s { upAfterRestart().count >= 2 }
        let again = upAfterRestart()
        #expect(again.contains { $0.contains("(5 bytes)") }, "the close again: \(again)\n\(broker.log)")
        #expect(again.contains { $0.contains("(7 bytes)") }, "the last ack again: \(again)")

        // The device closes: the stream is over.
        try gateway.down(s, "13 01000000")
        #expect(run.status() == 0, "\(run.stderr)")
        #expect(run.stdout == Array("ok".utf8))
    }
}
