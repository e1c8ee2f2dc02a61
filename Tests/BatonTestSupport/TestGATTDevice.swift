// A device's GATT server for the tests (docs/esphome.md §11): the far end of a gateway's
// attribute channel, answering ATT requests (Core 5.4, Vol 3, Part F, §3.4) from a table of
// attributes, one PDU per SOCK_SEQPACKET record as the kernel's ATT socket delivers them. It is
// a thermometer: a Battery service (0x180F) with its level (read, notify) and a 128-bit
// service with a long writable value and a temperature (notify).
import BatonLibc
import BatonRelay
import CBlueZ  // its shim includes <sys/socket.h>: SOCK_SEQPACKET has one owner
import Glibc

public final class TestGATTDevice {
    public struct Attribute {
        public var handle: UInt16
        /// The attribute type, little-endian as on the air: 2 or 16 bytes.
        public var type: [UInt8]
        public var value: [UInt8]
    }

    /// The device's end of the channel; -1 once hung up.
    public private(set) var fd: Int32
    public var attributes: [Attribute]
    /// The server's receive MTU (what it answers an Exchange MTU Request with).
    public var mtu: UInt16
    /// Answers nothing (a device that stopped responding).
    public var silent = false
    /// Every request PDU it received, in order.
    public private(set) var received: [[UInt8]] = []
    /// The MTU agreed by the exchange (23 until then).
    public private(set) var agreedMTU: UInt16 = 23
    public private(set) var confirmations = 0

    public static let custom: [UInt8] = Array(0x10 ... 0x1F)  // a 128-bit UUID, little-endian
    public static let longValue: [UInt8] = Array(0 ..< 40)

    /// `fd`: the device's end of a SOCK_SEQPACKET pair.
    public init(fd: Int32, mtu: UInt16 = 247) {
        self.fd = fd
        self.mtu = mtu
        func u16(_ v: UInt16) -> [UInt8] { [UInt8(v & 0xFF), UInt8(v >> 8)] }
        attributes = [
            // Battery service, 1–4 (Vol 3, Part G, §3.1: the declaration's value is its UUID).
            Attribute(handle: 1, type: u16(0x2800), value: u16(0x180F)),
            // §3.3.1: properties (read 0x02 | notify 0x10), value handle, UUID 0x2A19.
            Attribute(handle: 2, type: u16(0x2803), value: [0x12] + u16(3) + u16(0x2A19)),
            Attribute(handle: 3, type: u16(0x2A19), value: [87]),
            Attribute(handle: 4, type: u16(0x2902), value: [0, 0]),
            // A 128-bit service, 5–10.
            Attribute(handle: 5, type: u16(0x2800), value: Self.custom),
            // read 0x02 | write without response 0x04 | write 0x08, 128-bit UUID.
            Attribute(handle: 6, type: u16(0x2803), value: [0x0E] + u16(7) + Self.custom.map { $0 ^ 0xFF }),
            Attribute(handle: 7, type: Self.custom.map { $0 ^ 0xFF }, value: Self.longValue),
            // notify 0x10 | indicate 0x20, the temperature (0x2A6E).
            Attribute(handle: 8, type: u16(0x2803), value: [0x30] + u16(9) + u16(0x2A6E)),
            Attribute(handle: 9, type: u16(0x2A6E), value: [0x34, 0x08]),
            Attribute(handle: 10, type: u16(0x2902), value: [0, 0]),
        ]
    }

    deinit { if fd >= 0 { close(fd) } }

    public func value(_ handle: UInt16) -> [UInt8]? { attributes.first { $0.handle == handle }?.value }

    /// Answers every request waiting on the channel.
    public func serve() {
        var buffer = [UInt8](repeating: 0, count: 1024)
        while fd >= 0 {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n <= 0 { return }
            let pdu = Array(buffer[..<n])
            if pdu[0] == 0x1E { confirmations += 1; continue }
            received.append(pdu)
            if silent { continue }
            if let answer = answer(pdu) { send(answer) }
        }
    }

    /// A notification (0x1B) or indication (0x1D) of `handle`'s new value.
    public func notify(_ handle: UInt16, _ value: [UInt8], indicate: Bool = false) {
        if let i = attributes.firstIndex(where: { $0.handle == handle }) { attributes[i].value = value }
        send([indicate ? 0x1D : 0x1B, UInt8(handle & 0xFF), UInt8(handle >> 8)] + value)
    }

    public func send(_ pdu: [UInt8]) {
        guard fd >= 0 else { return }
        _ = pdu.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    public func hangUp() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
    }

    // MARK: The server (§3.4)

    func error(_ request: UInt8, _ handle: UInt16, _ code: UInt8) -> [UInt8] {
        [0x01, request, UInt8(handle & 0xFF), UInt8(handle >> 8), code]
    }

    func answer(_ p: [UInt8]) -> [UInt8]? {
        func u16(_ at: Int) -> UInt16 { p.count >= at + 2 ? UInt16(p[at]) | UInt16(p[at + 1]) << 8 : 0 }
        let limit = Int(agreedMTU)
        switch p[0] {
        case 0x02:  // Exchange MTU Request → Response with the server's MTU
            agreedMTU = max(23, min(u16(1), mtu))
            return [0x03, UInt8(mtu & 0xFF), UInt8(mtu >> 8)]
        case 0x10:  // Read By Group Type: the primary services in [start, end]
            let start = u16(1), end = u16(3)
            var out: [UInt8] = [0x11, 0]
            var size = 0
            for (i, a) in attributes.enumerated() where a.type == [0x00, 0x28] && a.handle >= start && a.handle <= end {
                let groupEnd = attributes[(i + 1)...].first { $0.type == [0x00, 0x28] }.map { $0.handle - 1 } ?? attributes.last!.handle
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8), UInt8(groupEnd & 0xFF), UInt8(groupEnd >> 8)] + a.value
                if size == 0 { size = entry.count } else if entry.count != size { break }
                if out.count + entry.count > limit { break }
                out += entry
            }
            if size == 0 { return error(0x10, start, 0x0A) }
            out[1] = UInt8(size)
            return out
        case 0x08:  // Read By Type: attributes of the type in [start, end]
            let start = u16(1), end = u16(3), type = Array(p[5...])
            var out: [UInt8] = [0x09, 0]
            var size = 0
            for a in attributes where a.type == type && a.handle >= start && a.handle <= end {
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8)] + a.value
                if size == 0 { size = entry.count } else if entry.count != size { break }
                if out.count + entry.count > limit { break }
                out += entry
            }
            if size == 0 { return error(0x08, start, 0x0A) }
            out[1] = UInt8(size)
            return out
        case 0x04:  // Find Information: handles and types in [start, end], one format per response
            let start = u16(1), end = u16(3)
            var out: [UInt8] = [0x05, 0]
            for a in attributes where a.handle >= start && a.handle <= end {
                let format: UInt8 = a.type.count == 2 ? 1 : 2
                if out[1] == 0 { out[1] = format } else if out[1] != format { break }
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8)] + a.type
                if out.count + entry.count > limit { break }
                out += entry
            }
            if out[1] == 0 { return error(0x04, start, 0x0A) }
            return out
        case 0x0A, 0x0C:  // Read, Read Blob
            let handle = u16(1), offset = p[0] == 0x0C ? Int(u16(3)) : 0
            guard let v = value(handle) else { return error(p[0], handle, 0x01) }
            if offset > v.count { return error(p[0], handle, 0x07) }
            if p[0] == 0x0C, v.count <= limit - 1 { return error(0x0C, handle, 0x0B) }
            return [p[0] + 1] + Array(v[offset ..< min(v.count, offset + limit - 1)])
        case 0x12, 0x52:  // Write Request, Write Command
            let handle = u16(1)
            guard let i = attributes.firstIndex(where: { $0.handle == handle }) else {
                return p[0] == 0x12 ? error(0x12, handle, 0x01) : nil
            }
            attributes[i].value = Array(p[3...])
            return p[0] == 0x12 ? [0x13] : nil
        default:
            return p[0] & 0x40 != 0 ? nil : error(p[0], 0, 0x06)
        }
    }
}

// MARK: - The link to such devices

/// Each connect is a socketpair; the device's end serves `TestGATTDevice`.
public final class GATTTestDevices {
    public init() {}
    public var devices: [UInt64: TestGATTDevice] = [:]
    public var mtu: UInt16 = 247
    public var unreachable: Set<UInt64> = []
}

public struct GATTTestLink: DeviceLink {
    public let box: GATTTestDevices
    public init(box: GATTTestDevices) { self.box = box }
    public func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel { throw .unreachable("no PSM links here") }
    public func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        if box.unreachable.contains(device.address) { throw .unreachable("\(device) did not answer") }
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &pair) == 0 else { throw .os(Errno(Glibc.errno, call: "socketpair")) }
        box.devices[device.address] = TestGATTDevice(fd: pair[1], mtu: box.mtu)
        return LinkChannel(accepted: pair[0], peer: device, l2cap: false)
    }
    public var description: String { "test ATT socketpair" }
}

// MARK: - A device at the simulator's link socket

/// Devices behind a simulator's link socket (docs/protocol.md §5.5) that take attribute
/// channels: the connect message with PSM 0 is answered 00, and the channel is then a
/// `TestGATTDevice`'s.
public final class GATTLinkSocket {
    public let path: String
    let listener: Int32
    public private(set) var devices: [UInt64: TestGATTDevice] = [:]
    /// Every connect message's PSM, in order.
    public private(set) var psms: [UInt16] = []

    public init(path: String) throws {
        unlink(path)
        let listener = socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw Errno(Glibc.errno, call: "socket") }
        self.listener = listener
        var a = sockaddr_un()
        a.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &a.sun_path) { p in
            for (i, b) in path.utf8.prefix(p.count - 1).enumerated() { p[i] = b }
        }
        let bound = withUnsafePointer(to: &a) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, listen(listener, 8) == 0 else { throw Errno(Glibc.errno, call: "bind/listen") }
        self.path = path
    }

    deinit {
        close(listener)
        unlink(path)
    }

    /// Takes waiting connects (each answered 00 once its connect message came) and serves the
    /// devices' requests.
    public func serve(mtu: UInt16 = 247) {
        while true {
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { break }
            // The gateway sends its connect message at once: wait for it (bounded, 1 s).
            var m = [UInt8](repeating: 0, count: 16)
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&p, 1, 1000)
            let n = m.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            guard n == 10, m[0] == 0x4C else { close(fd); continue }
            var address: UInt64 = 0
            for k in 0 ..< 6 { address |= UInt64(m[2 + k]) << (8 * UInt64(k)) }
            psms.append(UInt16(m[8]) | UInt16(m[9]) << 8)
            _ = [UInt8(0)].withUnsafeBytes { send(fd, $0.baseAddress, 1, Int32(MSG_NOSIGNAL)) }
            devices[address] = TestGATTDevice(fd: fd, mtu: mtu)
        }
        for d in devices.values { d.serve() }
    }
}
