// Device links (docs/protocol.md §5): the simulator's link (§5.5) against a test-local
// SOCK_SEQPACKET listener that plays the simulator, byte for byte; the L2CAP-style connect
// (`.none`: writable + SO_ERROR) over real sockets; and L2CAP itself as far as a kernel without
// Bluetooth allows (the clear error, the sockaddr_l2 the kernel would get). The real L2CAP
// path runs in the qemu VM.
//
// Waits are bounded poll() calls with generous deadlines; nothing asserts a time.

import BatonLibc
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Testing
import BatonTestSupport
import BatonHCI
@testable import BatonRelay

// MARK: - Helpers

/// Waits up to `timeoutMs` for `events` on `fd`; the revents, or 0 on timeout.
private func waitFor(_ fd: Int32, _ events: Int32, timeoutMs: Int32 = 2000) -> Int16 {
    var p = pollfd(fd: fd, events: Int16(events), revents: 0)
    guard Glibc.poll(&p, 1, timeoutMs) > 0 else { return 0 }
    return p.revents
}

/// The simulator's side of §5.5: a listening SOCK_SEQPACKET socket in a fresh directory.
/// Every socket is close-on-exec and hangs up with shutdown(): tests in parallel spawn brokers
/// and gateways, and a child holding a copy of a descriptor would keep a connection open.
private final class FakeSimulator {
    let directory: String
    let path: String
    private let listener: Int32
    private var peers: [Int32] = []

    init() throws {
        var template = Array("/tmp/baton-link-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        try #require(made != nil, "mkdtemp: \(String(cString: strerror(Glibc.errno)))")
        directory = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        path = directory + "/hall.link"
        listener = socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try #require(listener >= 0)
        var unix = try #require(Syscall.unixAddress(path))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, unix.length) }
        }
        try #require(r == 0, "bind \(path): \(String(cString: strerror(Glibc.errno)))")
        try #require(listen(listener, 8) == 0)
    }

    deinit {
        for fd in peers {
            shutdown(fd, Int32(SHUT_RDWR))
            close(fd)
        }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        unlink(path)
        rmdir(directory)
    }

    /// The next gateway connection, non-blocking.
    func accept() throws -> Int32 {
        try #require(waitFor(listener, POLLIN) != 0, "no gateway connected")
        let fd = Glibc.accept(listener, nil, nil)
        try #require(fd >= 0, "accept: \(String(cString: strerror(Glibc.errno)))")
        _ = Glibc.fcntl(fd, F_SETFD, FD_CLOEXEC)
        _ = Glibc.fcntl(fd, F_SETFL, Glibc.fcntl(fd, F_GETFL) | O_NONBLOCK)
        peers.append(fd)
        return fd
    }

    /// The next record from `fd` (one SDU), waiting up to 2 s; nil if none came.
    func receive(_ fd: Int32) -> [UInt8]? {
        guard waitFor(fd, POLLIN) & Int16(POLLIN) != 0 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 70_000)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n >= 0 ? Array(buffer[..<n]) : nil
    }

    /// Reads every record waiting on `fd`; how many.
    func drain(_ fd: Int32) -> Int {
        var count = 0
        var buffer = [UInt8](repeating: 0, count: 70_000)
        while buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }) > 0 {
            count += 1
        }
        return count
    }

    func send(_ fd: Int32, _ record: [UInt8]) throws {
        let n = record.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        try #require(n == record.count, "send: \(String(cString: strerror(Glibc.errno)))")
    }

    func hangUp(_ fd: Int32) {
        shutdown(fd, Int32(SHUT_RDWR))
    }

    /// Accepts the gateway, checks its connect message is `expected`, answers `status`.
    func answer(expected: [UInt8]? = nil, status: UInt8) throws -> Int32 {
        let fd = try accept()
        let message = try #require(receive(fd), "no connect message")
        if let expected { #expect(spacedHex(message) == spacedHex(expected)) }
        try send(fd, [status])
        return fd
    }
}

/// One turn of the caller's loop for `channel`: poll() its descriptor as docs/radio.md says,
/// hand the channel what came back (`ready`), then take its SDUs one at a time (`next`).
/// False when nothing came within `timeoutMs`.
@discardableResult
private func turn(_ channel: inout LinkChannel, _ buffer: UnsafeMutableRawBufferPointer, timeoutMs: Int32 = 2000,
                  _ onSDU: (UnsafeRawBufferPointer) -> Void = { _ in Issue.record("unexpected SDU") }) -> Bool {
    let revents = waitFor(channel.fd, POLLIN | (channel.wantsWrite ? POLLOUT : 0), timeoutMs: timeoutMs)
    guard revents != 0 else { return false }
    channel.ready(readable: revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                  writable: revents & Int16(POLLOUT) != 0, buffer: buffer)
    while let sdu = channel.next(into: buffer) { onSDU(sdu) }
    return true
}

/// A receive buffer for the tests, freed by the caller.
private func makeBuffer(_ count: Int) -> UnsafeMutableRawBufferPointer {
    .allocate(byteCount: count, alignment: 8)
}

private let randomDevice = LinkAddress(address: 0xAA_BB_CC_DD_EE_FF, addressType: 1, psm: 0x0080)
private let publicDevice = LinkAddress(address: 0x00_11_22_33_44_55, addressType: 0, psm: 0x00C1)

/// Sends `sdu` on `channel`, with untyped throws for #require.
private func send(_ channel: inout LinkChannel, _ sdu: [UInt8]) throws -> Bool {
    try sdu.withUnsafeBytes { try channel.send($0) }
}

/// Opens a simulated link to `device` against `sim`: the open channel, and in `peer` the
/// simulator's descriptor.
private func openChannel(_ sim: FakeSimulator, _ device: LinkAddress = randomDevice, sendMTU: Int = 65_535,
                         buffer: UnsafeMutableRawBufferPointer, peer: inout Int32) throws -> LinkChannel {
    var channel = try SimulatedLink(path: sim.path, sendMTU: sendMTU).connect(to: device)
    peer = try sim.answer(status: 0x00)
    try #require(turn(&channel, buffer))
    try #require(channel.state == .open)
    return channel
}

// MARK: - Tests

@Suite("Device links (docs/protocol.md §5)")
struct DeviceLinkTests {
    @Test("An address prints most significant byte first, with its type and the PSM")
    func addressText() {
        #expect(randomDevice.description == "AA:BB:CC:DD:EE:FF (random) psm 0x0080")
        #expect(publicDevice.description == "00:11:22:33:44:55 (public) psm 0x00C1")
        #expect(LinkAddress(address: 0x0A_0B_0C_0D_0E_0F, addressType: 3, psm: 0x1001).description ==
            "0A:0B:0C:0D:0E:0F (random identity) psm 0x1001")
        #expect(LinkAddress(address: 1, addressType: 0xFF, psm: 0x80).description ==
            "00:00:00:00:00:01 (address type 0xFF) psm 0x0080")
    }

    @Test("Errors say what happened and what to do")
    func errorText() {
        #expect(LinkError.closed.description == "the device closed the link")
        #expect(LinkError.unreachable("no simulator listening on /x").description ==
            "cannot reach the device: no simulator listening on /x")
        #expect(LinkError.tooLarge(size: 5000, mtu: 4099).description ==
            "a link message of 5000 bytes is larger than the link's MTU of 4099 bytes (docs/protocol.md §5: a device sends nothing above the gateway's MTU, relay.payload-max + 3, and accepts at least 512)")
        #expect(LinkError.os(Errno(EIO, call: "recvmsg")).description ==
            "device link: recvmsg: Input/output error (errno 5)")
        #expect(LinkError.noBluetooth("this kernel has no Bluetooth").description == "this kernel has no Bluetooth")
    }

    @Test("§5.5: the connect message is 4C, the address type, the address LSB first, the PSM LE",
          arguments: [(randomDevice, "4C 01 FF EE DD CC BB AA 80 00"),
                      (publicDevice, "4C 00 55 44 33 22 11 00 C1 00")])
    func connectMessage(device: LinkAddress, expected: String) throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var channel = try SimulatedLink(path: sim.path).connect(to: device)
        #expect(channel.state == .connecting)
        #expect(channel.fd >= 0)
        _ = try sim.answer(expected: hx(expected), status: 0x00)
        try #require(turn(&channel, buffer))
        #expect(channel.state == .open)
        #expect(channel.wantsWrite == false)
    }

    @Test("Status 00: open; SDUs both ways with their exact bytes and boundaries")
    func sdusBothWays() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(4099)
        defer { buffer.deallocate() }
        var channel = try SimulatedLink(path: sim.path).connect(to: randomDevice)
        let peer = try sim.answer(status: 0x00)
        // The status and three SDUs are all waiting before the gateway's first turn: one turn
        // opens the channel and hands over every SDU, in order, each whole (§5.1 messages).
        let sent = [hx("02 02 01 A1 A2 A3"), hx("03 02 01 01"), hx("15 03 6F 6B")]
        for sdu in sent { try sim.send(peer, sdu) }
        var received: [[UInt8]] = []
        try #require(turn(&channel, buffer) { received.append(Array($0)) })
        #expect(channel.state == .open)
        #expect(received.map(spacedHex) == sent.map(spacedHex))

        // Gateway → device: each send is one record on the far side.
        let out = [hx("01 02 01"), hx("04 02 01 6F 66 66 69 63 65"), hx("10 08 00 F4 01")]
        for sdu in out { #expect(try send(&channel, sdu)) }
        for sdu in out { #expect(sim.receive(peer).map(spacedHex) == spacedHex(sdu)) }

        // Nothing more is waiting: another turn finds nothing and leaves the channel open.
        #expect(!turn(&channel, buffer, timeoutMs: 50))
        #expect(channel.state == .open)
    }

    @Test("Status 01…04 and unknown ones close the channel with the §5.5 reason",
          arguments: [(UInt8(0x01), "the simulator has no device AA:BB:CC:DD:EE:FF (random)"),
                      (0x02, "AA:BB:CC:DD:EE:FF (random) is out of range: the simulator does not hear it in this room (its mean RSSI is below heard-down-to)"),
                      (0x03, "AA:BB:CC:DD:EE:FF (random) offers no channel on PSM 0x0080"),
                      (0x04, "AA:BB:CC:DD:EE:FF (random) is silent: it does not answer"),
                      (0x05, "the simulator answered the connect message for AA:BB:CC:DD:EE:FF (random) with unknown status 0x05 (docs/protocol.md §5.5 defines 00 to 04)")])
    func refusedStatus(status: UInt8, text: String) throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var channel = try SimulatedLink(path: sim.path).connect(to: randomDevice)
        let peer = try sim.answer(status: status)
        sim.hangUp(peer)  // §5.5: the connection closes after a non-zero status
        try #require(turn(&channel, buffer))
        #expect(channel.state == .closed(.unreachable(text)))
        #expect(channel.fd == -1)
        #expect(channel.wantsWrite == false)
    }

    @Test("The simulator hangs up before answering: unreachable, saying so")
    func hangUpBeforeStatus() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var channel = try SimulatedLink(path: sim.path).connect(to: publicDevice)
        let peer = try sim.accept()
        #expect(sim.receive(peer) != nil)
        sim.hangUp(peer)
        try #require(turn(&channel, buffer))
        #expect(channel.state == .closed(.unreachable(
            "the simulator hung up before answering the connect message for 00:11:22:33:44:55 (public) psm 0x00C1")))
    }

    @Test("No simulator: no socket file (ENOENT) and a stale one (ECONNREFUSED) both throw unreachable")
    func noListener() throws {
        let sim = try FakeSimulator()
        let missing = sim.directory + "/nobody.link"
        // A stale socket file: bound once, never listening, its socket gone.
        let stale = sim.directory + "/stale.link"
        let fd = socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var unix = try #require(Syscall.unixAddress(stale))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, unix.length) }
        }
        close(fd)
        try #require(r == 0)
        defer { unlink(stale) }
        for path in [missing, stale] {
            do {
                _ = try SimulatedLink(path: path).connect(to: randomDevice)
                Issue.record("connecting to \(path) succeeded")
            } catch {
                #expect(error == .unreachable(
                    "no simulator listening on \(path) (is `baton sim --scenario … --sockets DIR` running?)"))
            }
        }
    }

    @Test("Receive buffer: an SDU of exactly its size arrives; one byte more closes with tooLarge")
    func receiveCapacity() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(16)
        defer { buffer.deallocate() }
        var peer: Int32 = -1
        var channel = try openChannel(sim, buffer: buffer, peer: &peer)
        let fits = [UInt8](0 ..< 16)
        try sim.send(peer, fits)
        var received: [[UInt8]] = []
        try #require(turn(&channel, buffer) { received.append(Array($0)) })
        #expect(received == [fits])
        #expect(channel.state == .open)

        try sim.send(peer, [UInt8](0 ..< 17))
        try #require(turn(&channel, buffer))
        #expect(channel.state == .closed(.tooLarge(size: 17, mtu: 16)))
        #expect(channel.fd == -1)
    }

    @Test("The device closes: closed(.closed); sending then throws .closed")
    func peerCloses() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var peer: Int32 = -1
        var channel = try openChannel(sim, buffer: buffer, peer: &peer)
        sim.hangUp(peer)
        try #require(turn(&channel, buffer))
        #expect(channel.state == .closed(.closed))
        #expect(channel.fd == -1)
        do {
            _ = try send(&channel, [0x01, 0x02, 0x01])
            Issue.record("send on a closed channel succeeded")
        } catch {
            #expect(error as? LinkError == .closed)
        }
    }

    @Test("Sending on a channel closed by the gateway, or still connecting, throws")
    func sendWhenNotOpen() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var connecting = try SimulatedLink(path: sim.path).connect(to: randomDevice)
        _ = try sim.accept()  // and no answer: the channel stays connecting
        #expect(throws: LinkError.os(Errno(ENOTCONN, call: "send"))) { _ = try send(&connecting, [0x01, 0x00, 0x00]) }
        #expect(connecting.state == .connecting)

        var peer: Int32 = -1
        var channel = try openChannel(sim, buffer: buffer, peer: &peer)
        channel.close()
        #expect(channel.state == .closed(nil))
        #expect(channel.fd == -1)
        channel.close()  // idempotent
        #expect(channel.state == .closed(nil))
        #expect(throws: LinkError.closed) { _ = try send(&channel, [0x01, 0x00, 0x00]) }
    }

    @Test("sendMTU: an SDU of exactly sendMTU goes; one byte more throws tooLarge and the channel stays open")
    func sendCapacity() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var peer: Int32 = -1
        var channel = try openChannel(sim, sendMTU: 8, buffer: buffer, peer: &peer)
        #expect(channel.sendMTU == 8)
        #expect(throws: LinkError.tooLarge(size: 9, mtu: 8)) { _ = try send(&channel, [UInt8](repeating: 0x11, count: 9)) }
        #expect(channel.state == .open)
        #expect(try send(&channel, [UInt8](repeating: 0x11, count: 8)))
        #expect(sim.receive(peer) == [UInt8](repeating: 0x11, count: 8))
    }

    @Test("A full socket: send returns false and wantsWrite is set; after the device reads, send goes again")
    func backpressure() throws {
        let sim = try FakeSimulator()
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var peer: Int32 = -1
        var channel = try openChannel(sim, buffer: buffer, peer: &peer)
        let sdu = [UInt8](repeating: 0x11, count: 1000)
        var accepted = 0
        var refused = false
        // The send buffer (net.core.wmem_default, 208 KiB by default) fills long before this.
        for _ in 0 ..< 100_000 {
            if try send(&channel, sdu) { accepted += 1 } else { refused = true; break }
        }
        try #require(refused, "the socket never filled")
        #expect(channel.wantsWrite == true)
        #expect(channel.state == .open)

        #expect(sim.drain(peer) == accepted)
        // The loop polls for POLLOUT because wantsWrite said so; the turn clears it.
        try #require(turn(&channel, buffer))
        #expect(channel.wantsWrite == false)
        #expect(try send(&channel, sdu))
        #expect(sim.receive(peer) == sdu)
    }

    @Test("Anonymous advertisers (address type 0xFF) cannot be linked to")
    func anonymous() throws {
        let sim = try FakeSimulator()
        let device = LinkAddress(address: 0, addressType: 0xFF, psm: 0x0080)
        let text = "00:00:00:00:00:00 (address type 0xFF) advertises without an address (anonymous advertising), so no link can be opened to it"
        #expect(throws: LinkError.unreachable(text)) { _ = try SimulatedLink(path: sim.path).connect(to: device) }
        #expect(throws: LinkError.unreachable(text)) { _ = try L2CAPLink(receiveMTU: 4099).connect(to: device) }
    }
}

@Suite("Device links: the L2CAP-style connect (writable + SO_ERROR) and L2CAP on this kernel")
struct L2CAPLinkTests {
    @Test("Handshake .none: writable with SO_ERROR 0 opens; SDUs then flow both ways")
    func noneOpens() throws {
        var pair: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
        let device = pair[1]
        defer { shutdown(device, Int32(SHUT_RDWR)); close(device) }
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var channel = LinkChannel(fd: pair[0], sendMTU: 100)
        #expect(channel.state == .connecting)
        #expect(channel.wantsWrite == true)
        try #require(turn(&channel, buffer))
        #expect(channel.state == .open)
        #expect(channel.sendMTU == 100)
        #expect(try send(&channel, hx("01 02 01")))
        var got = [UInt8](repeating: 0, count: 16)
        let n = got.withUnsafeMutableBytes { recv(device, $0.baseAddress, $0.count, 0) }
        #expect(spacedHex(got[..<max(n, 0)]) == "01 02 01")
        let answer = hx("03 02 01 01")
        _ = answer.withUnsafeBytes { Glibc.send(device, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var received: [[UInt8]] = []
        try #require(turn(&channel, buffer) { received.append(Array($0)) })
        #expect(received == [answer])
    }

    @Test("A device's last words survive its hang-up: closing with our messages unread (ECONNRESET first), or after our send failed (EPIPE)")
    func lastWordsBeforeAHangUp() throws {
        for sendAfter in [false, true] {
            var pair: [Int32] = [-1, -1]
            try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
            let device = pair[1]
            let buffer = makeBuffer(64)
            defer { buffer.deallocate() }
            var channel = LinkChannel(fd: pair[0], sendMTU: 100)
            try #require(turn(&channel, buffer))
            // The gateway's frame, which the device never reads: closing leaves ECONNRESET here.
            #expect(try send(&channel, hx("13 00 00 00 00")))
            let error = hx("02 02 62 61 64")  // error protocol "bad"
            _ = error.withUnsafeBytes { Glibc.send(device, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            shutdown(device, Int32(SHUT_RDWR))
            close(device)
            if sendAfter {
                // The peer is gone: the send fails, and the channel still holds what it said.
                #expect(throws: LinkError.self) { try send(&channel, hx("12 00 00 00 00 08 00")) }
                #expect(channel.state == .open, "closed on EPIPE: the device's error would be thrown away")
            }
            var received: [[UInt8]] = []
            try #require(turn(&channel, buffer) { received.append(Array($0)) })
            #expect(received == [error], "sendAfter \(sendAfter)")
            #expect(channel.state == .closed(.closed))
        }
    }

    @Test("Handshake .none: a refused connect (SO_ERROR ECONNREFUSED) closes with unreachable, naming the PSM")
    func noneRefused() throws {
        // A TCP port bound but not listening answers SYN with RST: the same SO_ERROR path a
        // refused L2CAP PSM takes (bt_to_errno → ECONNREFUSED), on a kernel without Bluetooth.
        let holder = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(holder) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &address) { a in
            try a.withMemoryRebound(to: sockaddr.self, capacity: 1) { s in
                try #require(bind(holder, s, length) == 0)
                try #require(getsockname(holder, s, &length) == 0)
            }
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let r = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, length) }
        }
        let e = Glibc.errno
        try #require(r == -1 && e == EINPROGRESS, "connect returned \(r), errno \(e)")
        let buffer = makeBuffer(64)
        defer { buffer.deallocate() }
        var channel = LinkChannel(fd: fd, sendMTU: 23)
        channel.peer = randomDevice
        try #require(turn(&channel, buffer))
        #expect(channel.state == .closed(.unreachable(
            "AA:BB:CC:DD:EE:FF (random) refused the channel on PSM 0x0080 (nothing listens there now): Connection refused")))
        #expect(channel.fd == -1)
    }

    @Test("Connect failures from the kernel, in the user's words")
    func connectFailureText() {
        #expect(LinkChannel.connectFailure(EHOSTDOWN, peer: publicDevice) == .unreachable(
            "00:11:22:33:44:55 (public) did not answer (out of range, asleep, or not accepting connections): Host is down"))
        #expect(LinkChannel.connectFailure(ETIMEDOUT, peer: publicDevice) == .unreachable(
            "00:11:22:33:44:55 (public) did not answer (out of range, asleep, or not accepting connections): Connection timed out"))
        #expect(LinkChannel.connectFailure(EACCES, peer: nil) == .unreachable("the device on its PSM: Permission denied"))
    }

    @Test("sockaddr_l2: PSM little-endian, b[0] the least significant byte, BDADDR_LE_RANDOM 2 / BDADDR_LE_PUBLIC 1")
    func remoteAddress() {
        let random = L2CAPLink.remoteAddress(randomDevice, random: true)
        #expect(random.l2_family == sa_family_t(AF_BLUETOOTH))
        #expect(withUnsafeBytes(of: random.l2_psm) { Array($0) } == [0x80, 0x00])
        #expect(withUnsafeBytes(of: random.l2_bdaddr) { Array($0) } == hx("FF EE DD CC BB AA"))
        #expect(random.l2_bdaddr_type == 2)
        #expect(random.l2_cid == 0)
        let pub = L2CAPLink.remoteAddress(publicDevice, random: false)
        #expect(withUnsafeBytes(of: pub.l2_psm) { Array($0) } == [0xC1, 0x00])
        #expect(withUnsafeBytes(of: pub.l2_bdaddr) { Array($0) } == hx("55 44 33 22 11 00"))
        #expect(pub.l2_bdaddr_type == 1)
        // The C layout the kernel copies (min(alen, sizeof(struct sockaddr_l2)) = 14 bytes).
        #expect(MemoryLayout<sockaddr_l2>.stride == 14)
        #expect(MemoryLayout<sockaddr_l2>.offset(of: \.l2_bdaddr_type) == 12)
    }

    @Test("Our bugs are preconditions: a receive MTU outside 23…65535, an empty link message")
    func preconditions() async {
        await #expect(processExitsWith: .failure) { _ = L2CAPLink(receiveMTU: 22) }
        await #expect(processExitsWith: .failure) { _ = L2CAPLink(receiveMTU: 65_536) }
        await #expect(processExitsWith: .failure) {
            var pair: [Int32] = [-1, -1]
            guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &pair) == 0 else { return }
            var channel = LinkChannel(fd: pair[0], sendMTU: 100)
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16, alignment: 8)
            channel.ready(readable: false, writable: true, buffer: buffer)
            guard channel.state == .open else { return }  // exits 0: the test fails
            _ = try? channel.send(UnsafeRawBufferPointer(start: nil, count: 0))
        }
    }

    @Test("A PSM outside 0x0001…0x00FF is refused before any socket (Core 5.4, Vol 3, Part A, §4.22)",
          arguments: [(UInt16(0x0000), "0000"), (0x0100, "0100"), (0x1001, "1001")])
    func psmRange(psm: UInt16, printed: String) {
        let device = LinkAddress(address: 0xAA_BB_CC_DD_EE_FF, addressType: 1, psm: psm)
        let text = "AA:BB:CC:DD:EE:FF (random) names PSM 0x\(printed) in its beacon, which is not an LE PSM (0x0001 to 0x00FF, Core 5.4, Vol 3, Part A, §4.22)"
        #expect(throws: LinkError.unreachable(text)) { _ = try L2CAPLink(receiveMTU: 4099).connect(to: device) }
    }

    @Test("On this kernel: no AF_BLUETOOTH says so and names it; with Bluetooth, hci99 is not found")
    func onThisKernel() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_L2CAP)
        let probeErrno = Glibc.errno
        if probe < 0 {
            // A kernel without Bluetooth (these build machines).
            try #require(probeErrno == EAFNOSUPPORT, "socket(AF_BLUETOOTH) failed with errno \(probeErrno), not EAFNOSUPPORT")
            for adapter in ["hci0", "00:11:22:33:44:55"] {
                do {
                    _ = try L2CAPLink(adapter: adapter, receiveMTU: 4099).connect(to: randomDevice)
                    Issue.record("an L2CAP link through \(adapter) opened without AF_BLUETOOTH")
                } catch {
                    #expect(error == .noBluetooth(
                        "this kernel has no Bluetooth (AF_BLUETOOTH unavailable), so no L2CAP device link can be opened: run the gateway on a machine with BlueZ, or link to the simulator (relay.link)"))
                    #expect(error.description.contains("AF_BLUETOOTH"))
                }
            }
            // Home Assistant's connections (docs/esphome.md §11) say what they cannot do.
            #expect(throws: LinkError.noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable), so no GATT connection can be made: run the gateway on a machine with BlueZ")) {
                _ = try L2CAPLink(adapter: "hci0", receiveMTU: 4099).connectAttributes(to: randomDevice)
            }
        } else {
            // A kernel with Bluetooth (the qemu VM): a non-existent adapter is named as such.
            close(probe)
            do {
                _ = try L2CAPLink(adapter: "hci99", receiveMTU: 4099).connect(to: randomDevice)
                Issue.record("an L2CAP link through hci99 opened")
            } catch {
                #expect(error == .noBluetooth(
                    "no Bluetooth adapter named hci99 (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)"))
            }
            #expect(throws: LinkError.noBluetooth("no Bluetooth adapter named hci99 (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)")) {
                _ = try L2CAPLink(adapter: "hci99", receiveMTU: 4099).connectAttributes(to: randomDevice)
            }
        }
    }
}
