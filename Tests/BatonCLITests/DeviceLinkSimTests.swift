// The simulator's side of device links (docs/protocol.md §5.5, docs/simulator.md "Device
// links"): `baton sim` as a child process, and a client that connects to `DIR/<room>.link` as a
// gateway does. The client writes and reads every SDU byte by byte from docs/protocol.md §5.1's
// table, not through BatonWire's codec, so these tests check the simulator against the spec.
import BatonLibc
import BatonHCI
import BatonSim
import BatonWire
import Foundation
import Glibc
import Testing

/// docs/protocol.md §5.5: `4C`, address type, address (LSB first), PSM (LE).
func connectMessage(address: UInt64, type: UInt8 = 1, psm: UInt16) -> [UInt8] {
    [0x4C, type] + (0..<6).map { UInt8(truncatingIfNeeded: address >> (8 * $0)) } + [UInt8(psm & 0xFF), UInt8(psm >> 8)]
}

func le16(_ v: UInt16) -> [UInt8] { [UInt8(v & 0xFF), UInt8(v >> 8)] }
func le32(_ v: UInt32) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
func readLE(_ b: [UInt8], _ at: Int, _ count: Int) -> UInt32 {
    (0..<count).reduce(UInt32(0)) { $0 | UInt32(b[at + $1]) << (8 * UInt32($1)) }
}

/// A gateway's end of one link: a Unix SOCK_SEQPACKET socket, one packet per SDU.
final class LinkClient {
    enum Received: Equatable {
        case sdu([UInt8])
        case closed
        case nothing
    }

    let fd: Int32

    init(_ path: String) throws {
        // Close-on-exec: tests in parallel spawn processes that must not inherit the link.
        fd = socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var unix = try #require(Syscall.unixAddress(path))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, unix.length) }
        }
        try #require(r == 0, "connect \(path): \(String(cString: strerror(Glibc.errno)))")
    }

    deinit {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    func send(_ bytes: [UInt8]) {
        let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        #expect(n == bytes.count, "send: \(String(cString: strerror(Glibc.errno)))")
    }

    /// The next SDU, the end of the link, or nothing within `seconds`.
    func receive(within seconds: Double = 10) -> Received {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, Int32(seconds * 1000)) > 0 else { return .nothing }
        var buffer = [UInt8](repeating: 0, count: 70_000)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n < 0, Glibc.errno == EAGAIN { return .nothing }
        guard n > 0 else { return .closed }
        return .sdu(Array(buffer[..<n]))
    }

    /// Sends the connect message and reads the status byte (nil: the link closed without one).
    func connect(address: UInt64, type: UInt8 = 1, psm: UInt16) -> UInt8? {
        send(connectMessage(address: address, type: type, psm: psm))
        guard case .sdu(let status) = receive() else { return nil }
        #expect(status.count == 1)
        return status.first
    }
}

/// `baton sim` on a scenario, and the same scenario's player in process: same seed, same
/// devices, same addresses, so the test knows what the simulator's devices must answer.
struct LinkSim {
    let sim: SimProcess
    let player: ScenarioPlayer
    let links: [String: String]
    let rooms: [String: String]

    init(_ yaml: String, name: String, noWait: Bool = true) throws {
        // Named apart from the other suites' directories: tests run in parallel in one process.
        let dir = try simDirectory("link-" + name)
        let file = dir.appendingPathComponent("s.yaml")
        try yaml.write(to: file, atomically: true, encoding: .utf8)
        player = ScenarioPlayer(try Scenario.parse(yaml: yaml, file: "s.yaml"))
        sim = try SimProcess(["sim", "--scenario", file.path, "--sockets", dir.path + "/s"] + (noWait ? ["--no-wait"] : []),
                             in: dir)
        let sim = self.sim
        #expect(sim.wait(seconds: 20) { sim.line("ready") != nil }, "\(sim.stderr)")
        let ready = try #require(sim.line("ready"))
        links = try #require(ready["links"] as? [String: String])
        rooms = try #require(ready["rooms"] as? [String: String])
    }

    func device(_ id: UInt64) throws -> Int { try #require(player.deviceIndex(id: id)) }

    /// A link to `room` connected to device `id` (status 00).
    func link(_ room: String, to id: UInt64) throws -> LinkClient {
        let d = try device(id)
        let c = try LinkClient(try #require(links[room]))
        try #require(c.connect(address: player.address(d), psm: player.beacon(d).psm) == 0)
        return c
    }

    /// SIGTERM, then the end line's counts for `room`.
    func end(_ room: String) throws -> [String: Int] {
        sim.process.terminate()
        #expect(sim.exitStatus(within: 10) == 0)
        let end = try #require(sim.line("end"), "\(sim.rawLines)")
        let counts = try #require(end["rooms"] as? [String: [String: Int]])
        return try #require(counts[room])
    }
}

/// Five devices in the hall of three rooms in a line; the office is out of range
/// (-85 dBm there, below -80).
let linkScenario = """
    seed: 7
    duration: 3600
    rate: 5
    radio: {heard-down-to: -80, noise: 0, loss: 0}
    rooms: [{id: hall}, {id: kitchen}, {id: office}]
    devices:
      - id: 5a0000000001
        name: reader
        title: Chapter 3
        type: com.example.reader.article
        web-url: true
        streams: true
        payload-bytes: 600
        at: hall
      - {id: 5a0000000002, name: no-link, link: false, at: hall}
      - id: 5a0000000003
        name: ghost
        at: hall
        script: [{at: 0, silent: true}]
      - id: 5a0000000004
        name: gone
        at: hall
        script: [{at: 0, invalidate: true}]
      - {id: 5a0000000005, name: plain, at: hall}
    """

let reader: UInt64 = 0x5A00_0000_0001

@Suite struct DeviceLinkSimTests {
    @Test func theConnectMessageIsTheSpecsTable() {
        // docs/protocol.md §5.5: random address C1:C2:C3:C4:C5:C6, PSM 0x0080.
        #expect(connectMessage(address: 0xC1C2_C3C4_C5C6, psm: 0x0080)
                == [0x4C, 0x01, 0xC6, 0xC5, 0xC4, 0xC3, 0xC2, 0xC1, 0x80, 0x00])
    }

    @Test func everyConnectStatus() throws {
        let s = try LinkSim(linkScenario, name: "status")
        // ghost's silence is a step at 0: wait until it happened.
        #expect(s.sim.wait(seconds: 10) { s.sim.lines.filter { $0["event"] as? String == "silent" }.count == 1 })
        let r = try s.device(reader), noLink = try s.device(0x5A00_0000_0002), ghost = try s.device(0x5A00_0000_0003)
        let address = s.player.address(r), psm = s.player.beacon(r).psm
        #expect(psm != 0 && s.player.beacon(noLink).psm == 0)
        func status(_ room: String, address: UInt64, type: UInt8 = 1, psm: UInt16) throws -> (UInt8?, LinkClient.Received) {
            let c = try LinkClient(try #require(s.links[room]))
            let status = c.connect(address: address, type: type, psm: psm)
            return (status, status == 0 ? .nothing : c.receive())
        }
        #expect(try status("hall", address: address, psm: psm).0 == 0x00)
        #expect(try status("kitchen", address: address, psm: psm).0 == 0x00)
        // After a non-zero status the link closes (§5.5).
        #expect(try status("hall", address: address ^ 1, psm: psm) == (0x01, .closed))
        #expect(try status("hall", address: address, type: 0, psm: psm) == (0x01, .closed))
        #expect(try status("office", address: address, psm: psm) == (0x02, .closed))
        #expect(try status("hall", address: address, psm: psm &+ 1) == (0x03, .closed))
        #expect(try status("hall", address: s.player.address(noLink), psm: 0) == (0x04, .closed))
        #expect(try status("hall", address: s.player.address(ghost), psm: s.player.beacon(ghost).psm) == (0x04, .closed))
        // Not a connect message: no status fits; the link closes.
        let stranger = try LinkClient(try #require(s.links["hall"]))
        stranger.send(Array("hello".utf8))
        #expect(stranger.receive() == .closed)
        let hall = try s.end("hall")
        #expect(hall["links"] == 1 && hall["links_refused"] == 5 && hall["link_errors"] == 1, "\(hall)")
    }

    @Test func aFetchAnswersThePayloadThePlayerComputes() throws {
        let s = try LinkSim(linkScenario, name: "fetch")
        let r = try s.device(reader)
        let expected = s.player.payload(device: r, sequence: 1)
        #expect(expected.count == 600)
        let link = try s.link("hall", to: reader)
        // The fetch asks for the sequence the beacon carried; asked again (or for another), the
        // device answers with its current sequence on the same link (§5.2).
        for asked: UInt16 in [1, 1, 9] {
            link.send([0x01] + le16(asked))
            let answer = link.receive()
            #expect(answer == .sdu([0x02] + le16(1) + expected))
        }
        // What a gateway (and a continuing device) reads in it.
        let content = try expected.withUnsafeBytes { ActivityPayloadContent(try ActivityPayload.validate($0)) }
        #expect(content.activityType == "com.example.reader.article")
        #expect(content.title == "Chapter 3")
        #expect(content.webpageURL == "https://example.com/reader")
        #expect(content.userInfo["position"] == .int(1))
        #expect(content.userInfo["padding"] != nil)

        // An invalidated activity: fetch-refused, not current (01).
        let gone = try s.link("hall", to: 0x5A00_0000_0004)
        #expect(s.sim.wait(seconds: 10) { s.sim.line("invalidate") != nil })
        gone.send([0x01] + le16(1))
        #expect(gone.receive() == .sdu([0x03] + le16(1) + [0x01]))
        let hall = try s.end("hall")
        #expect(hall["fetches"] == 4 && hall["links"] == 2, "\(hall)")
    }

    @Test func continuedBecomesAJSONLine() throws {
        let s = try LinkSim(linkScenario, name: "continued")
        let link = try s.link("kitchen", to: reader)
        link.send([0x04] + le16(1) + Array("office".utf8))
        #expect(s.sim.wait(seconds: 10) { s.sim.line("continued") != nil }, "\(s.sim.rawLines)")
        let line = try #require(s.sim.line("continued"))
        #expect(line["device"] as? String == "5a0000000001")
        #expect(line["name"] as? String == "reader")
        #expect(line["room"] as? String == "office")
        #expect(line["sequence"] as? Int == 1)
        #expect((line["unix_us"] as? Int ?? 0) > 1_700_000_000_000_000)
        // Nothing is answered, and the link stays open for more.
        #expect(link.receive(within: 0.2) == .nothing)
        link.send([0x01] + le16(1))
        guard case .sdu(let answer) = link.receive() else { Issue.record("no answer"); return }
        #expect(answer.first == 0x02)
        let kitchen = try s.end("kitchen")
        #expect(kitchen["continued"] == 1 && kitchen["fetches"] == 1, "\(kitchen)")
    }

    /// docs/protocol.md §5.3 from the gateway's side: 64 KiB in 1 KiB frames against the device's
    /// window, the echo read back in frames no larger than ours, and our window never exceeded.
    @Test func aStreamEchoesEveryByteWithinBothWindows() throws {
        let s = try LinkSim(linkScenario, name: "stream")
        let link = try s.link("hall", to: reader)
        let ourWindow: UInt32 = 4, ourMaxData = 100
        link.send([0x10] + le16(UInt16(ourWindow)) + le16(UInt16(ourMaxData)))
        guard case .sdu(let open) = link.receive(), open.count == 5, open[0] == 0x10 else {
            Issue.record("no open"); return
        }
        var deviceWindow = readLE(open, 1, 2)
        let deviceMaxData = Int(readLE(open, 3, 2))
        #expect(deviceWindow == 8 && deviceMaxData == 1024)

        var state = SplitMix64(seed: 64)
        let input = (0..<65536).map { _ in UInt8.random(in: 0...255, using: &state) }
        var sentFrames: UInt32 = 0, sentBytes = 0
        var deviceAcked: UInt32 = 0
        var echo: [UInt8] = [], echoNext: UInt32 = 0, ourAck: UInt32 = 0
        var deviceClose: UInt32?

        func sendWhatTheWindowAllows() {
            while sentBytes < input.count, sentFrames &- deviceAcked < deviceWindow {
                let k = min(deviceMaxData, input.count - sentBytes)
                link.send([0x11] + le32(sentFrames) + input[sentBytes..<(sentBytes + k)])
                sentFrames += 1; sentBytes += k
            }
        }
        /// Handles one SDU from the device; false at the end of the link or after 10 s of nothing.
        func take(acking: Bool) -> Bool {
            switch link.receive() {
            case .nothing, .closed: return false
            case .sdu(let m):
                switch m[0] {
                case 0x11:
                    let n = readLE(m, 1, 4)
                    #expect(n == echoNext, "echo frames in order")
                    #expect(m.count - 5 >= 1 && m.count - 5 <= ourMaxData, "an echo frame within our max data")
                    #expect(n &- ourAck < ourWindow, "frame \(n) with our ack at \(ourAck): beyond our window")
                    echo += m[5...]; echoNext = n + 1
                    if acking { link.send([0x12] + le32(echoNext) + le16(UInt16(ourWindow))); ourAck = echoNext }
                case 0x12:
                    let next = readLE(m, 1, 4)
                    #expect(next >= deviceAcked && next <= sentFrames, "ack \(next): sent \(sentFrames)")
                    deviceAcked = next; deviceWindow = readLE(m, 5, 2)
                case 0x13:
                    deviceClose = readLE(m, 1, 4)
                default:
                    Issue.record("unexpected \(m)")
                }
                return true
            }
        }

        // Backpressure: we ack no echo. The device sends our window of echo frames (4 × 100
        // bytes, less than our first 1 KiB frame) and stops; with its queue full it acks none
        // of ours, so we can send no more than its window.
        sendWhatTheWindowAllows()
        #expect(sentFrames == 8)
        while echoNext < ourWindow, take(acking: false) {}
        #expect(echoNext == ourWindow)
        #expect(link.receive(within: 0.3) == .nothing, "the device went past our window or acked a frame it keeps")
        #expect(deviceAcked == 0)

        // Now ack as a gateway does: everything flows, and each side stays within the other's window.
        link.send([0x12] + le32(echoNext) + le16(UInt16(ourWindow)))
        ourAck = echoNext
        while echo.count < input.count {
            sendWhatTheWindowAllows()
            guard take(acking: true) else { break }
        }
        #expect(echo.count == input.count)
        // Compared here, not in #expect: a failure names the first byte, not 128 KiB of them.
        let firstDifference = zip(echo, input).enumerated().first { $0.element.0 != $0.element.1 }?.offset
        #expect(firstDifference == nil, "the echo differs from byte \(firstDifference ?? 0)")
        // We close; the device closes its direction once its echo is all acknowledged, and the
        // stream being over, hangs up.
        link.send([0x13] + le32(sentFrames))
        while deviceClose == nil, take(acking: true) {}
        #expect(deviceClose == echoNext)
        #expect(deviceAcked == sentFrames)
        #expect(link.receive() == .closed)
        let hall = try s.end("hall")
        #expect(hall["streams"] == 1 && hall["link_errors"] == 0, "\(hall)")
    }

    /// A gateway with a large window that stops reading: the link's socket fills (a Unix
    /// socket queues a few packets), the device waits for it, and nothing is lost or reordered.
    @Test func aGatewayThatReadsSlowlyStillGetsEveryByte() throws {
        let s = try LinkSim(linkScenario, name: "slow")
        let link = try s.link("hall", to: reader)
        let ourWindow: UInt16 = 1000
        link.send([0x10] + le16(ourWindow) + le16(16))
        guard case .sdu(let open) = link.receive(), open.count == 5, open[0] == 0x10 else { Issue.record("no open"); return }
        let input = (0..<16384).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 8) }
        var sentFrames: UInt32 = 0, sentBytes = 0, deviceAcked: UInt32 = 0
        var echo: [UInt8] = [], echoNext: UInt32 = 0
        func sendWhatTheWindowAllows() {
            while sentBytes < input.count, sentFrames &- deviceAcked < 8 {
                link.send([0x11] + le32(sentFrames) + input[sentBytes..<(sentBytes + 1024)])
                sentFrames += 1; sentBytes += 1024
            }
        }
        sendWhatTheWindowAllows()
        usleep(300_000)
        while echo.count < input.count, case .sdu(let m) = link.receive() {
            if m[0] == 0x11 {
                #expect(readLE(m, 1, 4) == echoNext)
                echo += m[5...]; echoNext += 1
                link.send([0x12] + le32(echoNext) + le16(ourWindow))
            } else if m[0] == 0x12 {
                deviceAcked = readLE(m, 1, 4)
                sendWhatTheWindowAllows()
            }
        }
        #expect(echo.count == input.count)
        let firstDifference = zip(echo, input).enumerated().first { $0.element.0 != $0.element.1 }?.offset
        #expect(firstDifference == nil, "the echo differs from byte \(firstDifference ?? 0)")
    }

    @Test func aMessageThatBreaksTheProtocolGetsErrorTwoThenClose() throws {
        let s = try LinkSim(linkScenario, name: "garbage")
        func error(after messages: [[UInt8]], to id: UInt64 = reader) throws -> String? {
            let link = try s.link("hall", to: id)
            for m in messages { link.send(m) }
            var last: [UInt8] = []
            var end = LinkClient.Received.nothing
            while true {
                let r = link.receive()
                guard case .sdu(let m) = r else { end = r; break }
                last = m
            }
            #expect(end == .closed, "the link stayed open after \(last)")
            // Its last SDU was the error: type 15, reason 02, a detail of at most 100 bytes of UTF-8.
            guard last.count >= 2, last.count <= 102, last[0] == 0x15, last[1] == 0x02 else { return nil }
            return String(validating: last[2...], as: UTF8.self)
        }
        let garbage = try error(after: [[0xFF, 0x00, 0x01]])
        #expect(garbage != nil)
        // A fetch that is too long (§5.1: fetch is fixed-size).
        #expect(try error(after: [[0x01, 0x01, 0x00, 0x00]]) != nil)
        // Data before open.
        #expect(try error(after: [[0x11] + le32(0) + [1]]) != nil)
        // Nine frames into a window of eight (nothing is acked until echoed, and we take no echo).
        let open: [UInt8] = [0x10] + le16(1) + le16(1)
        let nine = (0..<9).map { [0x11] + le32(UInt32($0)) + [UInt8](repeating: 7, count: 1024) }
        #expect(try error(after: [open] + nine)?.contains("window") == true)
        // A data frame over the device's max data (1024), and an SDU longer than any message.
        #expect(try error(after: [open, [0x11] + le32(0) + [UInt8](repeating: 7, count: 1025)]) != nil)
        #expect(try error(after: [open, [0x11] + le32(0) + [UInt8](repeating: 7, count: 5000)])?.contains("5005") == true)
        // An ack for an echo frame never sent.
        #expect(try error(after: [open, [0x12] + le32(5) + le16(1)]) != nil)
        // A stream to a device whose beacon offers none.
        #expect(try error(after: [open], to: 0x5A00_0000_0005) != nil)
        let hall = try s.end("hall")
        #expect(hall["link_errors"] == 8, "\(hall)")
    }

    @Test func theLinksOfADeviceThatWalksOutOfRangeClose() throws {
        let yaml = """
            duration: 3600
            rate: 5
            radio: {heard-down-to: -80}
            rooms: [{id: hall}, {id: kitchen}, {id: office}]
            devices:
              - id: 5a0000000001
                at: hall
                script: [{at: 0.5, walk: office}]
            """
        // The clock waits for every room's gateway: the link is open before the walk.
        let s = try LinkSim(yaml, name: "walk", noWait: false)
        let link = try s.link("hall", to: 0x5A00_0000_0001)
        let gateways = try ["hall", "kitchen", "office"].map { try GatewayClient(try #require(s.rooms[$0])) }
        for g in gateways { g.scan() }
        #expect(s.sim.wait(seconds: 10, also: gateways) { s.sim.line("walk") != nil }, "\(s.sim.stderr)")
        #expect(link.receive() == .closed)
        // And it is out of range now: -85 dBm in the hall.
        let again = try LinkClient(try #require(s.links["hall"]))
        let d = try s.device(0x5A00_0000_0001)
        #expect(again.connect(address: s.player.address(d), psm: s.player.beacon(d).psm) == 0x02)
    }

    @Test func linksUpToTheCapacityAndOnePast() throws {
        let s = try LinkSim(linkScenario, name: "full")
        var open = try (0..<Building.linkCapacity).map { _ in try s.link("hall", to: reader) }
        // One past: closed at once, without a status.
        let past = try LinkClient(try #require(s.links["kitchen"]))
        #expect(past.receive() == .closed)
        // A slot freed is a slot for the next.
        open.removeLast()
        var next: LinkClient?
        for _ in 0..<100 where next == nil {
            let c = try LinkClient(try #require(s.links["hall"]))
            let d = try s.device(reader)
            if c.connect(address: s.player.address(d), psm: s.player.beacon(d).psm) == 0 { next = c } else { usleep(20_000) }
        }
        #expect(next != nil)
        let kitchen = try s.end("kitchen")
        #expect(kitchen["links_full"] == 1, "\(kitchen)")
        _ = open
    }

    @Test func linkLatencyDelaysTheAnswers() throws {
        let yaml = linkScenario.replacingOccurrences(of: "radio: {", with: "radio: {link-latency: 0.5, ")
        let s = try LinkSim(yaml, name: "latency")
        let d = try s.device(reader)
        let link = try LinkClient(try #require(s.links["hall"]))
        link.send(connectMessage(address: s.player.address(d), psm: s.player.beacon(d).psm))
        // Not before half a second (a slow machine only makes it later); then the status.
        #expect(link.receive(within: 0.2) == .nothing)
        #expect(link.receive() == .sdu([0x00]))
        link.send([0x01] + le16(1))
        #expect(link.receive(within: 0.2) == .nothing)
        guard case .sdu(let answer) = link.receive() else { Issue.record("no answer"); return }
        #expect(answer.count == 603 && answer[0] == 0x02)
    }
}
