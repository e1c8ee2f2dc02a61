// The far ends of the relays' device links, played by the tests byte for byte (shared by
// FetchRelayTests and StreamRelayTests).
//
// A relay gets a `DeviceLink` whose `connect` makes a SOCK_SEQPACKET socketpair: the relay's
// end is a connecting `LinkChannel` (it opens on the first POLLOUT, as an L2CAP
// channel does), the test keeps the device's end. On it the test reads the link messages the
// relay sends and writes the device's as literal bytes (docs/protocol.md §5.1), or stays
// silent, or hangs up.

import BatonLibc
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Testing
import BatonHCI
import BatonMQTT
import BatonRelay

// MARK: - The devices, played by the test

/// The far ends of the relay's links. Each `connect` makes a socketpair; the device's end is
/// non-blocking and close-on-exec (tests in parallel spawn brokers: a child holding a copy of
/// a descriptor would keep a link open), and hangs up with shutdown() at the end.
final class Devices {
    struct End {
        let address: UInt64
        let fd: Int32
        /// Every record the relay sent on this link, in order.
        var received: [[UInt8]] = []
        /// The relay closed its end (EOF), or the test hung up this one.
        var closed = false
    }
    private(set) var ends: [End] = []
    /// `connect` throws this for an address, as a device out of range makes a link fail.
    var refuse: [UInt64: LinkError] = [:]
    /// While true the devices read nothing: the relay's sends fill the link until it refuses
    /// them, as an L2CAP channel without credits does.
    var paused = false
    /// SO_SNDBUF of the relay's end of new links: a connected Unix pair is bounded only by the
    /// sender's buffer, so a small one makes the link refuse after a few frames.
    var sendBuffer: Int32?

    deinit {
        for e in ends {
            shutdown(e.fd, Int32(SHUT_RDWR))
            close(e.fd)
        }
    }

    func connect(_ device: LinkAddress) throws(LinkError) -> LinkChannel {
        if let error = refuse[device.address] { throw error }
        let pair = try makePair(device)
        // The channel makes its end non-blocking itself (LinkChannel.init).
        return LinkChannel(fd: pair[0], sendMTU: 65_535)
    }

    /// A socketpair for a link to `address`: the far end kept here (non-blocking), the near
    /// end returned with `sendBuffer` applied.
    func makePair(_ address: LinkAddress) throws(LinkError) -> [Int32] {
        var pair: [Int32] = [-1, -1]
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, type, 0, &pair) == 0 else { throw .os(Errno(Glibc.errno, call: "socketpair")) }
        _ = Glibc.fcntl(pair[1], F_SETFL, Glibc.fcntl(pair[1], F_GETFL) | O_NONBLOCK)
        if var size = sendBuffer {
            _ = setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        ends.append(End(address: address.address, fd: pair[1]))
        return pair
    }

    /// Reads whatever the relay sent on every open link; never blocks.
    func pump() {
        guard !paused else { return }
        var buffer = [UInt8](repeating: 0, count: 70_000)
        for i in ends.indices where !ends[i].closed {
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(ends[i].fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if n > 0 {
                    ends[i].received.append(Array(buffer[..<n]))
                } else {
                    if n == 0 || (Glibc.errno != EAGAIN && Glibc.errno != EWOULDBLOCK) { ends[i].closed = true }
                    break
                }
            }
        }
    }

    /// The descriptors to wake the loop for: a record from the relay, or its hang-up.
    var pollDescriptors: [pollfd] {
        ends.filter { !$0.closed }.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
    }

    /// Every record the relay sent to `device`, over all its links.
    func received(_ device: LinkAddress) -> [[UInt8]] {
        ends.filter { $0.address == device.address }.flatMap(\.received)
    }

    /// Links the relay opened to `device`.
    func links(_ device: LinkAddress) -> Int { ends.count(where: { $0.address == device.address }) }

    /// The device's newest link has been closed by the relay.
    func isClosed(_ device: LinkAddress) -> Bool {
        ends.last { $0.address == device.address }?.closed ?? false
    }

    /// The device writes one link message on its newest link.
    func send(_ device: LinkAddress, _ message: [UInt8]) throws {
        let end = try #require(ends.last { $0.address == device.address }, "the relay opened no link to \(device)")
        let n = message.withUnsafeBytes { Glibc.send(end.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        try #require(n == message.count, "the device's send: \(String(cString: strerror(Glibc.errno)))")
    }

    /// The device hangs up its newest link.
    func hangUp(_ device: LinkAddress) throws {
        let i = try #require(ends.lastIndex { $0.address == device.address })
        shutdown(ends[i].fd, Int32(SHUT_RDWR))
        ends[i].closed = true
    }
}

struct TestLink: DeviceLink {
    let devices: Devices
    func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel { try devices.connect(device) }
    var description: String { "test socketpair" }
}



// MARK: - Phones that open links to the gateway (docs/relay.md §7.5)

extension Devices {
    /// A phone in the gateway's room opens a link to a re-advertised activity: the gateway's
    /// listener accepted it, so the gateway's end is open at once (`LinkChannel(accepted:)`).
    /// The phone's end is kept like a device's: `received`, `send`, `hangUp`, `paused` and
    /// `sendBuffer` (SO_SNDBUF of the gateway's end) work on it by the phone's address.
    func accept(_ phone: LinkAddress) throws(LinkError) -> LinkChannel {
        let pair = try makePair(phone)
        return LinkChannel(accepted: pair[0], peer: phone, l2cap: false)
    }
}
