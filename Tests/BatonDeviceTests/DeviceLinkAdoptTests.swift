// `baton device`'s side of real L2CAP channels (docs/radio.md "baton device", links):
// BatonDevice's `DeviceLinkServer` with one device answering from a `LinkDeviceModel`, given
// accepted channels by `adopt`. Here the accepted channel is one end of a Unix SOCK_SEQPACKET
// pair, which keeps SDU boundaries as an L2CAP LE credit-based channel does; the test is the
// gateway on the other end and writes the SDUs byte by byte from docs/protocol.md §5.1. The
// kernel's own channel runs in the VM test (Tests/VM/bluez-test.sh).
import BatonLibc
import BatonDevice
import BatonHCI
import BatonTestSupport
import BatonWire
import Glibc
import Testing

/// A device of one activity, as `baton device` has.
final class OneActivity: LinkDeviceModel {
    var sequence: UInt16 = 7
    var start: UInt16 = 7
    var payload: [UInt8] = hx("A2 00 01 01 63 61 2E 62")
    var ended = false
    var streams = true
    func fetchAnswer(device: Int, asked: UInt16) -> LinkFetchAnswer {
        if ended || Int16(bitPattern: asked &- start) < 0 { return .refused(.notCurrent) }
        return .payload(sequence: sequence, bytes: payload)
    }
    func offersStreams(device: Int) -> Bool { streams }
    func linkDeviceID(_ device: Int) -> UInt64 { 0x5A12_3456_789A }
    func linkDeviceName(_ device: Int) -> String { "5a123456789a" }
}

/// The server's poll loop, run by the test between its own sends and reads.
struct ServerLoop {
    let server: DeviceLinkServer
    var continued: [LinkContinuation] = []

    /// `n` turns of the tests' loop (`TestLoop`), the server one part of it as in `baton device`,
    /// each waiting at most 5 ms.
    mutating func turns(_ n: Int = 20) {
        var part = server
        var heard: [LinkContinuation] = []
        var loop = TestLoop(parts: 1, descriptors: part.descriptorLimit, longestWait: .milliseconds(5))
        loop.turns(n) { driver in
            let slot = driver.add(&part)
            driver.wait()
            part.serve(driver.ready(slot)) { heard.append($0) }
        }
        continued += heard
    }
}

/// The gateway's end of an adopted channel, and the device's end handed to the server.
func adoptedPair(_ server: DeviceLinkServer) throws -> LinkEnd {
    var fds: [Int32] = [-1, -1]
    try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
    _ = Glibc.fcntl(fds[1], F_SETFL, Glibc.fcntl(fds[1], F_GETFL) | O_NONBLOCK)
    try #require(server.adopt(fd: fds[1]))
    return LinkEnd(fd: fds[0])
}

final class LinkEnd {
    private(set) var fd: Int32
    init(fd: Int32) { self.fd = fd }
    deinit { hangUp() }
    func hangUp() {
        if fd >= 0 { close(fd) }
        fd = -1
    }
    func send(_ bytes: [UInt8]) {
        #expect(bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count)
    }
    /// One SDU if one is waiting now; [] at end of stream; nil when nothing is there.
    func receive() -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 70_000)
        let n = buffer.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n < 0 { return nil }
        return Array(buffer[..<n])
    }
}

@Suite struct DeviceLinkAdoptTests {
    @Test func anAdoptedChannelStartsConnected_fetchAndContinued() throws {
        let model = OneActivity()
        var loop = ServerLoop(server: DeviceLinkServer(device: model))
        let gateway = try adoptedPair(loop.server)
        // No §5.5 connect message and no status byte: the first SDU is already a §5.1 message.
        gateway.send(hx("01 07 00"))                      // fetch, sequence 7
        loop.turns()
        #expect(gateway.receive() == hx("02 07 00") + model.payload)  // payload at 7
        model.sequence = 9                                 // saved twice since
        gateway.send(hx("01 07 00"))
        loop.turns()
        #expect(gateway.receive() == hx("02 09 00") + model.payload)  // answers for the newer one
        gateway.send(hx("01 06 00"))                      // before this activity began
        loop.turns()
        #expect(gateway.receive() == hx("03 06 00 01"))   // fetch-refused, not current
        gateway.send(hx("04 09 00") + Array("Office TV".utf8))
        loop.turns()
        #expect(loop.continued.map(\.room) == ["Office TV"])
        #expect(loop.continued.first?.deviceID == 0x5A12_3456_789A)
        #expect(loop.continued.first?.sequence == 9)
        model.ended = true
        gateway.send(hx("01 09 00"))
        loop.turns()
        #expect(gateway.receive() == hx("03 09 00 01"))
        let counts = loop.server.linkCounts[0]
        #expect(counts.links == 1 && counts.fetches == 4 && counts.continued == 1)
    }

    @Test func aStreamEndsWithTheGatewayHangingUp() throws {
        // On L2CAP, closing drops the SDUs still waiting for credits (docs/vm.md): the device
        // sends its close and leaves the hang-up to the gateway.
        let model = OneActivity()
        var loop = ServerLoop(server: DeviceLinkServer(device: model))
        let gateway = try adoptedPair(loop.server)
        gateway.send(hx("10 04 00 00 04"))                // open: window 4, max data 1024
        loop.turns()
        #expect(gateway.receive() == hx("10 08 00 00 04"))  // the device's open: 8 × 1024
        gateway.send(hx("11 00 00 00 00") + Array("hello".utf8))
        gateway.send(hx("13 01 00 00 00"))                // close after frame 0
        loop.turns()
        #expect(gateway.receive() == hx("11 00 00 00 00") + Array("hello".utf8))  // the echo
        #expect(gateway.receive() == hx("12 01 00 00 00 08 00"))  // ack: frame 0 consumed
        gateway.send(hx("12 01 00 00 00 04 00"))          // the gateway acks the echo
        loop.turns()
        #expect(gateway.receive() == hx("13 01 00 00 00"))  // the device's close
        #expect(gateway.receive() == nil, "the device hung up first")  // still open: nothing, not EOF
        #expect(loop.server.openLinks == 1)
        gateway.hangUp()
        loop.turns()
        #expect(loop.server.openLinks == 0)
    }

    @Test func linksUpToTheCapacityAndOnePast() throws {
        let loop = ServerLoop(server: DeviceLinkServer(device: OneActivity()))
        var ends: [LinkEnd] = []
        for _ in 0 ..< DeviceLinkServer.capacity { ends.append(try adoptedPair(loop.server)) }
        #expect(loop.server.openLinks == DeviceLinkServer.capacity)
        var fds: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &fds) == 0)
        #expect(loop.server.adopt(fd: fds[1]) == false)
        // The server closed its end: the gateway sees the end of the stream.
        let one = LinkEnd(fd: fds[0])
        #expect(one.receive() == [])
        #expect(loop.server.linkCounts[0].full == 1)
        #expect(loop.server.linkCounts[0].links == DeviceLinkServer.capacity)
    }

    @Test func aDeviceWithoutStreamsRefusesAnOpenWithErrorTwo() throws {
        let model = OneActivity()
        model.streams = false
        var loop = ServerLoop(server: DeviceLinkServer(device: model))
        let gateway = try adoptedPair(loop.server)
        gateway.send(hx("10 04 00 00 04"))
        loop.turns()
        let error = try #require(gateway.receive())
        #expect(Array(error.prefix(2)) == hx("15 02"))
        #expect(String(decoding: error.dropFirst(2), as: UTF8.self) == "this device offers no streams (its beacon says so)")
        // On L2CAP, closing would drop the error still waiting for credits (docs/vm.md): the
        // device leaves the hang-up to the gateway, as after a stream's close.
        #expect(gateway.receive() == nil, "the device hung up first")
        #expect(loop.server.openLinks == 1)
        gateway.hangUp()
        loop.turns()
        #expect(loop.server.openLinks == 0)
    }

    @Test func theReceiveMTUHoldsTheLargestSDUAGatewaySends() {
        // A data frame of the device's max data (docs/protocol.md §5.1: type, frame, bytes).
        #expect(DeviceLinkServer.receiveMTU == 5 + 1024)
    }
}
