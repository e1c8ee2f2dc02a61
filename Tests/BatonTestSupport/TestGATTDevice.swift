// A device's GATT server for the tests (docs/esphome.md §11): the simulator's thermometer
// (`GATTServerModel`) at the far end of a gateway's attribute channel, one PDU per
// SOCK_SEQPACKET record as the kernel's ATT socket delivers them.
import BatonLibc
import BatonRelay
import BatonSim
import CBlueZ  // its shim includes <sys/socket.h>: SOCK_SEQPACKET has one owner
import Glibc

/// The thermometer's server (`GATTServerModel`) at a socket's far end, for the tests.
public final class TestGATTDevice {
    /// The device's end of the channel; -1 once hung up.
    public private(set) var fd: Int32
    public var model: GATTServerModel
    /// Answers nothing (a device that stopped responding).
    public var silent = false
    /// Answers a request itself before the model does (a device that breaks the protocol).
    public var intercept: (([UInt8]) -> [UInt8]?)?
    /// Every request PDU it received, in order.
    public private(set) var received: [[UInt8]] = []
    public private(set) var confirmations = 0

    public static var longValue: [UInt8] { GATTServerModel.longValue }

    /// `fd`: the device's end of a SOCK_SEQPACKET pair.
    public init(fd: Int32, mtu: UInt16 = 247) {
        self.fd = fd
        model = .thermometer(mtu: mtu)
    }

    deinit { if fd >= 0 { close(fd) } }

    public func value(_ handle: UInt16) -> [UInt8]? { model.value(handle) }

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
            if let intercept, let answer = intercept(pdu) { send(answer); continue }
            if let answer = model.answer(pdu) { send(answer) }
        }
    }

    /// A notification (0x1B) or indication (0x1D) of `handle`'s new value.
    public func notify(_ handle: UInt16, _ value: [UInt8], indicate: Bool = false) {
        send(model.notification(handle, value, indicate: indicate))
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
}

// MARK: - The link to such devices

/// Each connect is a socketpair; the device's end serves `TestGATTDevice`.
public final class GATTTestDevices {
    public init() {}
    public var devices: [UInt64: TestGATTDevice] = [:]
    public var mtu: UInt16 = 247
    public var unreachable: Set<UInt64> = []
    /// Devices whose connect never completes (the far end never answers).
    public var neverAnswer: Set<UInt64> = []
    /// Devices made silent (they read but answer nothing until told otherwise).
    public var silentAtFirst = false
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
        box.devices[device.address]!.silent = box.silentAtFirst
        if box.neverAnswer.contains(device.address) {
            // Connecting until an answer that never comes, as an LE connect to a device that is gone.
            box.devices[device.address]!.silent = true
            return LinkChannel(connected: pair[0], handshake: LinkHandshake(request: [0x4C]) { _ in nil }, sendMTU: 517)
        }
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
