// Device links (docs/protocol.md §5): a channel to the device that advertises an activity, one
// SDU per link message. Two implementations: BlueZ L2CAP LE credit-based channels
// (`L2CAPLink`) and the simulator's Unix SOCK_SEQPACKET link (`SimulatedLink`, §5.5). Both end
// in the same `LinkChannel`: once connected, an L2CAP CoC socket and the simulator's socket
// behave alike, one read = one SDU and one write = one SDU.
//
// Why SOCK_SEQPACKET keeps SDU boundaries on both:
//   * L2CAP: an LE credit-based channel carries SDUs, segmented into K-frames and reassembled
//     by the kernel (Core 5.4, Vol 3, Part A, §3.4 and §10.1). Linux queues each reassembled
//     SDU as one skb and `bt_sock_recvmsg` hands out one skb per read; `l2cap_chan_send` takes
//     one write as one SDU and refuses one above the peer's MTU (EMSGSIZE)
//     (net/bluetooth/l2cap_sock.c, l2cap_core.c, af_bluetooth.c).
//   * Unix: SOCK_SEQPACKET is "connection-oriented and preserves message boundaries" (unix(7)).
//
// One thread, no blocking (architecture.md §5.7): every descriptor is non-blocking and
// close-on-exec; `LinkChannel.poll` moves a channel on when the caller's poll() says so, and
// every syscall goes through BatonLibc's `Syscall` wrapper (EINTR retried, EAGAIN a value).

import BatonLibc
import BatonWire
import CLibc
import CBlueZ  // its shim includes <sys/socket.h>: import it explicitly so SOCK_* have one owner

/// Where a link goes: the device's LE address as the advertising report gave it, and the
/// beacon's PSM.
public struct LinkAddress: Sendable, Equatable, CustomStringConvertible {
    /// 48 bits, as HCI carries it (least significant byte first on the wire).
    public var address: UInt64
    /// The advertising report's address type: 0 public, 1 random (Core 5.4, Vol 4, Part E, §7.7.65.2).
    public var addressType: UInt8
    public var psm: UInt16
    public init(address: UInt64, addressType: UInt8, psm: UInt16) {
        self.address = address; self.addressType = addressType; self.psm = psm
    }
    /// `AA:BB:CC:DD:EE:FF (random) psm 0x0080`
    public var description: String { "\(deviceName) psm 0x\(hex(psm))" }

    /// `AA:BB:CC:DD:EE:FF (random)`: the address most significant byte first, as BlueZ's
    /// `ba2str` and every phone's settings screen print it.
    public var deviceName: String {
        var text = ""
        for i in stride(from: 5, through: 0, by: -1) {
            text += hex(UInt8(truncatingIfNeeded: address >> (8 * UInt64(i))))
            if i > 0 { text += ":" }
        }
        let kind = switch addressType {
        case 0: "public"
        case 1: "random"
        case 2: "public identity"
        case 3: "random identity"
        default: "address type 0x\(hex(addressType))"
        }
        return "\(text) (\(kind))"
    }

    /// Whether the device is reached at a random address (Core 5.4, Vol 4, Part E, §7.7.65.2):
    /// 0 public and 2 public identity are public; 1 random and 3 random (static) identity are
    /// random (types 2 and 3 are the identity a controller resolved a private address to).
    /// `nil` for 0xFF (anonymous advertising): there is no address to connect to.
    var isRandom: Bool? {
        switch addressType {
        case 0, 2: false
        case 1, 3: true
        default: nil
        }
    }

    /// The error for an address that cannot be connected to at all.
    var anonymousError: LinkError {
        .unreachable("\(deviceName) advertises without an address (anonymous advertising), so no link can be opened to it")
    }
}

/// Why a link could not be opened or broke. Says whose fault it is and what a user can do.
public enum LinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kernel has no Bluetooth (EAFNOSUPPORT) or the adapter is absent/down.
    case noBluetooth(String)
    /// The device did not answer, refused the PSM, or is out of range (the text says which).
    case unreachable(String)
    /// The peer closed the channel.
    case closed
    /// An SDU larger than the channel's MTU.
    case tooLarge(size: Int, mtu: Int)
    /// Any other OS error.
    case os(Errno)
    /// The device side (`L2CAPListener`) cannot listen where it was asked to (the text says why).
    case cannotListen(String)
    public var description: String {
        switch self {
        case .noBluetooth(let text):
            text
        case .unreachable(let text):
            "cannot reach the device: \(text)"
        case .closed:
            "the device closed the link"
        case .tooLarge(let size, let mtu):
            "a link message of \(size) bytes is larger than the link's MTU of \(mtu) bytes (docs/protocol.md §5: a device sends nothing above the gateway's MTU, relay.payload-max + 3, and accepts at least 512)"
        case .os(let e):
            "device link: \(e)"
        case .cannotListen(let text):
            "cannot offer a device link: \(text)"
        }
    }
}

/// Opens channels to devices. The gateway holds one, chosen by `relay.link` (docs/relay.md).
public protocol DeviceLink {
    /// Starts connecting (non-blocking). The channel is `.connecting` until its `poll`
    /// finds it open; failures that are known at once throw.
    func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel
    /// Starts connecting to the device's Attribute Protocol (the ATT fixed channel, CID 4:
    /// Core 5.4, Vol 3, Part F), the channel Home Assistant's GATT requests go over
    /// (docs/esphome.md §11). One read is one ATT PDU, one write one PDU. `device.psm` is not
    /// used.
    func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel
    /// "bluez hci0", "sim /tmp/b/hall.link": for logs.
    var description: String { get }
}

extension DeviceLink {
    /// A link that reaches no attribute channel (a test's).
    public func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        throw .unreachable("\(description) opens no GATT connections")
    }
}

/// A `DeviceLink` held by value, as the relays keep theirs: Embedded Swift has no existentials
/// (`any DeviceLink`), so the chosen link is kept as its `connect` and its description.
public struct AnyDeviceLink: CustomStringConvertible {
    public let description: String
    private let open: (LinkAddress) throws(LinkError) -> LinkChannel
    private let openAttributes: (LinkAddress) throws(LinkError) -> LinkChannel

    public init(_ link: some DeviceLink) {
        description = link.description
        open = { (device: LinkAddress) throws(LinkError) -> LinkChannel in try link.connect(to: device) }
        openAttributes = { (device: LinkAddress) throws(LinkError) -> LinkChannel in try link.connectAttributes(to: device) }
    }

    public func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel { try open(device) }
    public func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel { try openAttributes(device) }
}

/// An exchange a link makes on a connected socket before its channel is open: one request
/// record, then one answer record that the link judges. The simulator's link has one
/// (`SimulatedLink`, docs/protocol.md §5.5); an L2CAP channel is open once connected.
public struct LinkHandshake {
    /// What came back for the request.
    public enum Answer {
        /// One record: its first bytes (at most the receive buffer), and its real size.
        case record(UnsafeRawBufferPointer, size: Int)
        /// The peer closed before answering.
        case hungUp
        /// Sending the request or reading the answer failed.
        case failed(Errno)
    }
    /// Sent once the socket is connected.
    public let request: [UInt8]
    /// nil: the channel is open; else why it is not (a `.failed` it leaves to the channel:
    /// `.os`, by returning nil).
    public let judge: (Answer) -> LinkError?
    public init(request: [UInt8], judge: @escaping (Answer) -> LinkError?) {
        self.request = request; self.judge = judge
    }
}

/// One open (or opening) channel. Owns its descriptor.
///
/// Driving it from the poll loop: poll `fd` for POLLIN, and for POLLOUT too while `wantsWrite`.
/// After poll(), hand it what came back (`ready(readable:writable:buffer:)`: readable = POLLIN,
/// POLLHUP or POLLERR, writable = POLLOUT), then ask for the peer's messages one at a time
/// (`next(into:)`) until there is none: each is read only when asked for, so whoever handles
/// one may send on the channel or hang it up before the next is read. A channel that closes
/// (by error or by `close()`) has already closed its descriptor and reports `fd == -1`, which
/// poll() ignores.
public struct LinkChannel: ~Copyable {
    public enum State: Sendable, Equatable {
        case connecting
        case open
        case closed(LinkError?)
    }

    /// What the channel is doing.
    enum Phase {
        /// connect(2) is under way: its end is POLLOUT, SO_ERROR says how it went.
        case connecting
        /// Connected; the link's own exchange (`LinkHandshake`) before the channel is open: its
        /// request not yet sent (`sent` false), or its answer awaited.
        case handshaking(LinkHandshake, sent: Bool)
        /// Open, nothing known to be waiting.
        case open
        /// Open, and poll() said readable: `next` reads until the socket has nothing more.
        /// `resetSeen`: the one ECONNRESET a peer's close leaves before its last records.
        case reading(resetSeen: Bool)
        /// Closed, and why (nil: closed by this side).
        case closed(LinkError?)
    }

    /// The descriptor, or -1 once the channel is closed (the channel closed it).
    public private(set) var fd: Int32
    private(set) var phase: Phase
    /// The largest SDU this side may send (the peer's MTU; for the simulator `sendMTU` given).
    public private(set) var sendMTU: Int

    /// The last send found no room in the socket; cleared by POLLOUT or a send that fits.
    private var sendBlocked = false
    /// Who is on the other end, for messages (set by the `DeviceLink` that connected).
    var peer: LinkAddress?
    /// L2CAP: read the peer's MTU from the kernel (BT_SNDMTU) when the channel opens.
    var readsSendMTUFromKernel = false

    /// Takes `fd`, a connecting SOCK_SEQPACKET socket (an L2CAP one: it is open once POLLOUT
    /// comes with SO_ERROR 0), and makes it non-blocking and close-on-exec (the `DeviceLink`s
    /// create it so already). The channel closes it.
    public init(fd: Int32, sendMTU: Int) {
        precondition(fd >= 0, "LinkChannel needs an open descriptor")
        precondition(sendMTU > 0, "sendMTU must be positive")
        // Neither fcntl fails on a descriptor that is open (EBADF is our bug, as the wrapper says).
        _ = try? Syscall.setNonBlocking(fd)
        _ = try? Syscall.call("fcntl(F_SETFD)") { Int(fcntl(fd, F_SETFD, FD_CLOEXEC)) }
        self.fd = fd
        self.phase = .connecting
        self.sendMTU = sendMTU
    }

    /// Takes `fd`, a connected socket on which the link makes its own exchange (`handshake`)
    /// before the channel is open (the simulator's, `SimulatedLink`). The request goes at once
    /// if the socket takes it, else on POLLOUT.
    public init(connected fd: Int32, handshake: LinkHandshake, sendMTU: Int) {
        self.init(fd: fd, sendMTU: sendMTU)
        phase = .handshaking(handshake, sent: false)
        sendHandshakeRequest()
    }

    /// A channel a listener accepted: open at once. `l2cap`: an L2CAP CoC socket, whose send
    /// MTU the kernel says (BT_SNDMTU); otherwise (a Unix socket) `sendMTU` is it.
    public init(accepted fd: Int32, peer: LinkAddress?, l2cap: Bool, sendMTU: Int = 65_535) {
        self.init(fd: fd, sendMTU: sendMTU)
        self.peer = peer
        readsSendMTUFromKernel = l2cap
        becomeOpen()
    }

    public var state: State {
        switch phase {
        case .connecting, .handshaking: .connecting
        case .open, .reading: .open
        case .closed(let error): .closed(error)
        }
    }

    /// True while connecting (waiting for POLLOUT) or a send was refused for lack of room.
    public var wantsWrite: Bool {
        switch phase {
        case .connecting: true                          // a non-blocking connect ends in POLLOUT
        case .handshaking(_, let sent): !sent           // after the request, the answer is a POLLIN
        case .open, .reading: sendBlocked
        case .closed: false
        }
    }

    /// What poll() said of the descriptor: moves a connecting channel on (reading a
    /// handshake's answer into `buffer`), takes POLLOUT as room to send, and POLLIN (or
    /// POLLHUP, POLLERR) as messages for `next` to read.
    public mutating func ready(readable: Bool, writable: Bool, buffer: UnsafeMutableRawBufferPointer) {
        precondition(buffer.count > 0, "the receive buffer must hold at least one byte")
        switch phase {
        case .closed:
            return
        case .connecting, .handshaking:
            advanceConnecting(readable: readable, writable: writable, buffer: buffer)
            guard case .open = phase else { return }
        case .open, .reading:
            break
        }
        if writable { sendBlocked = false }
        if readable { phase = .reading(resetSeen: false) }
    }

    /// The peer's next SDU, read into `buffer` (the receive MTU; one buffer may serve every
    /// channel): its bytes, valid until `buffer` is read into again. nil when nothing more is
    /// there now (poll again), or the channel closed: EOF or an error closes it, and so does an
    /// SDU longer than `buffer` (`.tooLarge`). Reads only after `ready` said readable.
    public mutating func next(into buffer: UnsafeMutableRawBufferPointer) -> UnsafeRawBufferPointer? {
        precondition(buffer.count > 0, "the receive buffer must hold at least one byte")
        while case .reading(let resetSeen) = phase {
            let got: Int?
            do {
                got = try Self.receive(fd, into: buffer)
            } catch {
                // A peer that closed with our messages unread leaves ECONNRESET on our socket,
                // and recv reports it before the records still queued (net/core/datagram.c
                // checks sock_error first): the peer's last words, a device's error frame among
                // them, come on the next read. Once.
                if error.code == ECONNRESET, !resetSeen {
                    phase = .reading(resetSeen: true)
                    continue
                }
                fail(linkBroke(error))
                return nil
            }
            guard let got else {
                phase = .open  // EAGAIN: all read (the socket keeps nothing back for a later turn)
                return nil
            }
            if got == 0 {
                // End of stream: the peer closed (a link message is never empty, §5.1, so a
                // zero-length record cannot be one either).
                fail(.closed)
                return nil
            }
            if got > buffer.count {
                fail(.tooLarge(size: got, mtu: buffer.count))
                return nil
            }
            return UnsafeRawBufferPointer(rebasing: buffer[0 ..< got])
        }
        return nil
    }

    /// Reads and drops what the peer sent that is still unread this turn.
    public mutating func discardReady(buffer: UnsafeMutableRawBufferPointer) {
        while next(into: buffer) != nil {}
    }

    /// Ends the channel from this side: drops what is still unread this turn (so the peer sees
    /// an orderly end, not a reset for messages it sent), says `lastWords` if the channel is
    /// open (an error frame; a link with no room for it hangs up without), and closes.
    public mutating func hangUp(lastWords: UnsafeRawBufferPointer? = nil, buffer: UnsafeMutableRawBufferPointer) {
        discardReady(buffer: buffer)
        if let lastWords, case .open = phase {
            do throws(LinkError) { _ = try send(lastWords) } catch {}
        }
        close()
    }

    /// Sends one SDU. False: no room in the socket now (poll for writable, send again).
    /// Throws when the channel is not open or the SDU exceeds `sendMTU`.
    ///
    /// Too large leaves the channel open (the caller may send something smaller); a broken
    /// link closes it and throws why. Sending on a channel still connecting is ENOTCONN, as the
    /// kernel would say. Link messages are never empty (docs/protocol.md §5.1).
    public mutating func send(_ sdu: UnsafeRawBufferPointer) throws(LinkError) -> Bool {
        switch phase {
        case .open, .reading:
            break
        case .connecting, .handshaking:
            throw .os(Errno(ENOTCONN, call: "send"))
        case .closed(let error):
            throw error ?? .closed
        }
        precondition(!sdu.isEmpty, "a link message is never empty (docs/protocol.md §5.1)")
        guard sdu.count <= sendMTU else { throw .tooLarge(size: sdu.count, mtu: sendMTU) }
        let sent: Int?
        do {
            sent = try Syscall.send(fd, sdu)  // MSG_NOSIGNAL: a closed peer is EPIPE, not SIGPIPE
        } catch {
            // l2cap_chan_send: an SDU above the peer's MTU (a peer that lowered it is not
            // possible on LE CoC, but the kernel has the last word).
            if error.code == EMSGSIZE { throw .tooLarge(size: sdu.count, mtu: sendMTU) }
            let broken = linkBroke(error)
            // The peer hung up. What it sent before is still in the socket, and may be its last
            // words (a device's error frame, docs/protocol.md §5.4): `next` reads them, then the
            // end. Closing here would throw them away unread.
            if error.code == EPIPE || error.code == ECONNRESET { throw broken }
            fail(broken)
            throw broken
        }
        guard let sent else {
            sendBlocked = true  // EAGAIN: no room (Unix: the send buffer; L2CAP: no credits)
            return false
        }
        // SOCK_SEQPACKET sends a record whole or not at all (unix(7); l2cap_chan_send returns
        // the SDU's length), so a short count is impossible.
        precondition(sent == sdu.count, "SOCK_SEQPACKET sent \(sent) of \(sdu.count) bytes")
        sendBlocked = false
        return true
    }

    /// Closes the descriptor (idempotent); the state becomes `.closed(nil)` unless already closed.
    public mutating func close() {
        if case .closed = phase {} else { phase = .closed(nil) }
        releaseDescriptor()
    }

    deinit { if fd >= 0 { Syscall.close(fd) } }

    // MARK: - Connecting

    private mutating func advanceConnecting(readable: Bool, writable: Bool, buffer: UnsafeMutableRawBufferPointer) {
        switch phase {
        case .connecting:
            // A non-blocking connect(2) reports its end as POLLOUT, a failure also as
            // POLLERR/POLLHUP; SO_ERROR says which (connect(2), EINPROGRESS). On Bluetooth,
            // bt_sock_poll gives no POLLOUT while the channel is still connecting.
            guard readable || writable else { return }
            let error = pendingError()
            if error != 0 {
                fail(Self.connectFailure(error, peer: peer))
            } else if writable {
                becomeOpen()
            }
        case .handshaking(let handshake, let sent):
            if !sent, readable || writable { sendHandshakeRequest() }
            if readable, case .handshaking(_, true) = phase { readHandshakeAnswer(handshake, buffer) }
        case .open, .reading, .closed:
            break
        }
    }

    /// Sends the handshake's request if the socket takes it now. Called once at connect time,
    /// then again on POLLOUT if the socket had no room.
    private mutating func sendHandshakeRequest() {
        guard case .handshaking(let handshake, false) = phase else { return }
        // Array.withUnsafeBytes rethrows untyped: the outcome comes out as a value.
        let fd = fd
        let sent: Result<Int?, Errno> = handshake.request.withUnsafeBytes { bytes in
            do throws(Errno) { return .success(try Syscall.send(fd, bytes)) } catch { return .failure(error) }
        }
        switch sent {
        case .success(let count):
            if count != nil { phase = .handshaking(handshake, sent: true) }  // nil: EAGAIN, wait for POLLOUT
        case .failure(let error):
            fail(handshake.judge(.failed(error)) ?? .os(error))
        }
    }

    /// The handshake's answer: one record, judged by the link.
    private mutating func readHandshakeAnswer(_ handshake: LinkHandshake, _ buffer: UnsafeMutableRawBufferPointer) {
        let got: Int?
        do {
            got = try Self.receive(fd, into: buffer)
        } catch {
            fail(handshake.judge(.failed(error)) ?? .os(error))
            return
        }
        guard let got else { return }  // EAGAIN: nothing yet
        let answer: LinkHandshake.Answer = if got == 0 { .hungUp }
            else { .record(UnsafeRawBufferPointer(rebasing: buffer[0 ..< min(got, buffer.count)]), size: got) }
        if let refused = handshake.judge(answer) {
            fail(refused)
        } else {
            becomeOpen()
        }
    }

    private mutating func becomeOpen() {
        phase = .open
        guard readsSendMTUFromKernel else { return }
        // The peer's MTU arrived in its LE Credit Based Connection Response (Core 5.4, Vol 3,
        // Part A, §4.23); l2cap_sock_getsockopt(BT_SNDMTU) hands it out as a u16 once connected.
        var mtu: UInt16 = 0
        var length = socklen_t(MemoryLayout<UInt16>.size)
        do {
            _ = try Syscall.call("getsockopt(BT_SNDMTU)") {
                Int(getsockopt(fd, SOL_BLUETOOTH, BT_SNDMTU, &mtu, &length))
            }
        } catch {
            fail(.os(error))
            return
        }
        sendMTU = Int(mtu)
    }

    /// SO_ERROR: the outcome of a non-blocking connect (0 while fine or still going).
    private func pendingError() -> Int32 {
        var code: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        do {
            _ = try Syscall.call("getsockopt(SO_ERROR)") { Int(getsockopt(fd, SOL_SOCKET, SO_ERROR, &code, &length)) }
        } catch {
            return error.code
        }
        return code
    }

    // MARK: - Reading

    /// One record into `buffer`: its full length (which may exceed `buffer.count`, the record
    /// then being cut short and dropped), 0 at end of stream, nil when nothing is there.
    /// MSG_TRUNC makes recvmsg return the record's real length (unix(7) since Linux 3.4;
    /// `bt_sock_recvmsg`); the MSG_TRUNC bit in msg_flags marks a cut record on kernels that
    /// only set that, so it counts as one byte more than the buffer.
    static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int? {
        var vector = iovec(iov_base: buffer.baseAddress, iov_len: buffer.count)
        var header = msghdr()
        let got = try withUnsafeMutablePointer(to: &vector) { vector throws(Errno) -> Int? in
            header.msg_iov = vector
            header.msg_iovlen = 1
            return try Syscall.call("recvmsg") { recvmsg(fd, &header, Int32(MSG_TRUNC)) }
        }
        guard let got else { return nil }
        if got <= buffer.count, header.msg_flags & Int32(MSG_TRUNC) != 0 {
            return buffer.count + 1
        }
        return got
    }

    // MARK: - Closing

    private mutating func fail(_ error: LinkError) {
        phase = .closed(error)
        releaseDescriptor()
    }

    private mutating func releaseDescriptor() {
        guard fd >= 0 else { return }
        Syscall.close(fd)
        fd = -1
    }

    /// An error on an open link: who ended it.
    private func linkBroke(_ error: Errno) -> LinkError {
        switch error.code {
        case ECONNRESET, EPIPE, ENOTCONN, ECONNABORTED:
            .closed
        case ETIMEDOUT, EHOSTDOWN, EHOSTUNREACH:
            // The kernel's teardown error for a lost LE connection: bt_to_errno of the HCI
            // reason, 0x08 Connection Timeout being the usual one (the device walked away).
            .unreachable("the link to \(peerDeviceName) dropped (out of range?): \(error.message)")
        default:
            .os(error)
        }
    }

    /// A failed L2CAP connect (SO_ERROR, or connect(2) itself). The kernel turns the HCI or
    /// L2CAP result into an errno (net/bluetooth/lib.c `bt_to_errno`, l2cap_core.c): a refused
    /// LE_PSM (result 0x0002, Core 5.4, Vol 3, Part A, §4.23) is ECONNREFUSED; a device that
    /// never answers the connection attempt ends in EHOSTDOWN, ETIMEDOUT or ENOTCONN.
    static func connectFailure(_ code: Int32, peer: LinkAddress?) -> LinkError {
        let device = peer?.deviceName ?? "the device"
        let psm = peer.map { "PSM 0x\(hex($0.psm))" } ?? "its PSM"
        let reason = String(cString: strerror(code))
        return switch code {
        case ECONNREFUSED:
            .unreachable("\(device) refused the channel on \(psm) (nothing listens there now): \(reason)")
        case EHOSTDOWN, ETIMEDOUT, ENOTCONN, EHOSTUNREACH:
            .unreachable("\(device) did not answer (out of range, asleep, or not accepting connections): \(reason)")
        default:
            .unreachable("\(device) on \(psm): \(reason)")
        }
    }

    // MARK: - Names for messages

    /// The peer as the `DeviceLink` named it.
    private var peerDeviceName: String { peer?.deviceName ?? "the device" }
}

/// BlueZ L2CAP LE credit-based channels (docs/protocol.md §5; BlueZ l2cap.h, bluetooth.h).
///
/// The gateway connects as the central: the kernel creates the LE connection to the device
/// (net/bluetooth/l2cap_core.c `l2cap_chan_connect` → `hci_connect_le_scan`), then asks for
/// the channel with an LE Credit Based Connection Request (Core 5.4, Vol 3, Part A, §4.22).
/// No capability is needed (net/bluetooth/l2cap_sock.c: `l2cap_sock_create` asks for
/// CAP_NET_RAW only for SOCK_RAW; bind with PSM 0 takes a dynamic PSM, so no
/// CAP_NET_BIND_SERVICE).
public struct L2CAPLink: DeviceLink {
    public let adapter: String
    public let receiveMTU: Int
    /// `adapter` "hci0" or an address; the channel asks for `receiveMTU` (BT_RCVMTU).
    /// `receiveMTU` is 23…65535 (Core 5.4, Vol 3, Part A, §4.22: the MTU field's range).
    public init(adapter: String = "hci0", receiveMTU: Int) {
        precondition(receiveMTU >= Self.minimumMTU && receiveMTU <= 65_535,
                     "an LE credit-based channel's MTU is 23…65535 (Core 5.4, Vol 3, Part A, §4.22), not \(receiveMTU)")
        self.adapter = adapter; self.receiveMTU = receiveMTU
    }

    public func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        guard let random = device.isRandom else { throw device.anonymousError }
        // Core 5.4, Vol 3, Part A, §4.22: an LE credit-based channel's SPSM is 0x0001…0x00FF
        // (0x0080 and up dynamic); the kernel refuses anything else with EINVAL.
        guard device.psm >= 0x0001, device.psm <= 0x00FF else {
            throw .unreachable("\(device.deviceName) names PSM 0x\(hex(device.psm)) in its beacon, which is not an LE PSM (0x0001 to 0x00FF, Core 5.4, Vol 3, Part A, §4.22)")
        }
        return try open(device, random: random, cid: 0, receiveMTU: receiveMTU, sendMTU: Self.minimumMTU,
                        without: "so no L2CAP device link can be opened: run the gateway on a machine with BlueZ, or link to the simulator (relay.link)")
    }

    /// The ATT fixed channel (CID 4) to `device`: the kernel makes the LE connection as for a
    /// credit-based channel, and the socket is the connection's ATT bearer (one SDU one PDU,
    /// Core 5.4, Vol 3, Part A, §2.1: fixed channels carry no credits). A client ATT socket
    /// holds the connection's ATT channel, and bluetoothd's listening one is given a new
    /// connection's fixed channel only when no client holds it (net/bluetooth/l2cap_core.c
    /// `l2cap_connect_cfm`: "Client fixed channels should override server ones"), so bluetoothd
    /// may run beside the gateway (docs/esphome.md §11.1).
    /// The ATT MTU is the GATT client's to exchange (Vol 3, Part F, §3.4.2), not the socket's.
    public func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        guard let random = device.isRandom else { throw device.anonymousError }
        // The largest ATT PDU a GATT client takes (517: a 512-byte value and its header).
        return try open(LinkAddress(address: device.address, addressType: device.addressType, psm: 0), random: random,
                        cid: Self.attributeCID, receiveMTU: nil, sendMTU: Self.attributeMTU,
                        without: "so no GATT connection can be made: run the gateway on a machine with BlueZ")
    }

    /// An L2CAP socket to `device`, connecting: to its PSM (`cid` 0: an LE credit-based channel,
    /// asking for `receiveMTU`), or to the fixed channel `cid`. `without`: what a kernel without
    /// Bluetooth means for the caller.
    func open(_ device: LinkAddress, random: Bool, cid: UInt16, receiveMTU: Int?, sendMTU: Int,
              without: String) throws(LinkError) -> LinkChannel {
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        let fd = socket(AF_BLUETOOTH, type, BTPROTO_L2CAP)
        if fd < 0 {
            let e = errno
            if e == EAFNOSUPPORT { throw .noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable), " + without) }
            throw .os(Errno(e, call: "socket(AF_BLUETOOTH, BTPROTO_L2CAP)"))
        }
        // From here the channel owns the descriptor: a throw below closes it (deinit).
        // Until a channel's peer MTU is known, assume the least an LE channel accepts (§4.22).
        var channel = LinkChannel(fd: fd, sendMTU: sendMTU)
        channel.peer = device
        channel.readsSendMTUFromKernel = receiveMTU != nil

        // Bind to the adapter with an LE source address type. PSM 0 makes the kernel pick a
        // dynamic one (l2cap_add_psm), and a bound LE PSM switches the channel to
        // L2CAP_MODE_LE_FLOWCTL (l2cap_sock_bind), the mode BT_RCVMTU applies to; a CID binds
        // the fixed channel instead.
        var local = sockaddr_l2()
        local.l2_family = sa_family_t(AF_BLUETOOTH)
        local.l2_bdaddr = try Self.adapterAddress(adapter)
        local.l2_cid = cid.littleEndian
        local.l2_bdaddr_type = UInt8(BDADDR_LE_PUBLIC)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                // The C size (14, with the tail padding), as the kernel copies min(alen, sizeof).
                CLibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_l2>.stride))
            }
        }
        if bound < 0 { throw .os(Errno(errno, call: "bind(L2CAP)")) }

        if let receiveMTU {
            // The receive MTU goes out in our LE Credit Based Connection Request (§4.22), so it is
            // set before connect; l2cap_sock_setsockopt(BT_RCVMTU) copies a u16.
            var mtu = UInt16(receiveMTU)
            if setsockopt(fd, SOL_BLUETOOTH, BT_RCVMTU, &mtu, socklen_t(MemoryLayout<UInt16>.size)) < 0 {
                throw .os(Errno(errno, call: "setsockopt(BT_RCVMTU)"))
            }
        }

        var remote = Self.remoteAddress(device, random: random)
        remote.l2_cid = cid.littleEndian
        let connected = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                CLibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_l2>.stride))
            }
        }
        if connected < 0 {
            let e = errno
            // EINPROGRESS: the kernel is connecting; SO_ERROR and POLLOUT tell the end.
            if e != EINPROGRESS { throw LinkChannel.connectFailure(e, peer: device) }
        }
        return channel
    }

    /// The ATT fixed channel's CID (Core 5.4, Vol 3, Part A, §2.1, Table 2.3).
    static let attributeCID: UInt16 = 0x0004
    /// The largest ATT PDU: opcode, handle and a 512-byte value, plus an offset (Vol 3, Part F,
    /// §3.2.9: attribute values are at most 512 bytes), what BlueZ's own client asks for.
    public static let attributeMTU = 517

    public var description: String { "bluez \(adapter)" }

    /// The least MTU an LE credit-based channel accepts (Core 5.4, Vol 3, Part A, §4.22).
    static let minimumMTU = 23

    /// The device's side of the connect: <bluetooth/l2cap.h> `struct sockaddr_l2`.
    /// `l2_psm` is little-endian (`htobs`); `bdaddr_t.b[0]` is the least significant byte, as
    /// HCI carries addresses; the address type is BlueZ's BDADDR_LE_PUBLIC (1) or
    /// BDADDR_LE_RANDOM (2) (<bluetooth/bluetooth.h>), not HCI's 0/1.
    static func remoteAddress(_ device: LinkAddress, random: Bool) -> sockaddr_l2 {
        var remote = sockaddr_l2()
        remote.l2_family = sa_family_t(AF_BLUETOOTH)
        remote.l2_psm = device.psm.littleEndian
        let a = device.address
        remote.l2_bdaddr = bdaddr_t(b: (UInt8(truncatingIfNeeded: a), UInt8(truncatingIfNeeded: a >> 8),
                                        UInt8(truncatingIfNeeded: a >> 16), UInt8(truncatingIfNeeded: a >> 24),
                                        UInt8(truncatingIfNeeded: a >> 32), UInt8(truncatingIfNeeded: a >> 40)))
        remote.l2_bdaddr_type = UInt8(random ? BDADDR_LE_RANDOM : BDADDR_LE_PUBLIC)
        return remote
    }

    /// The adapter's own address through libbluetooth, which takes "hciN" or an address
    /// (lib/hci.c `hci_devid`, `hci_devba`; both only find adapters that are up).
    static func adapterAddress(_ adapter: String) throws(LinkError) -> bdaddr_t {
        var address = bdaddr_t()
        let id = hci_devid(adapter)
        if id < 0 || hci_devba(id, &address) < 0 {
            let e = errno
            switch e {
            case ENODEV:
                throw .noBluetooth("no Bluetooth adapter named \(adapter) (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)")
            case ENETDOWN:
                throw .noBluetooth("Bluetooth adapter \(adapter) is down (`bluetoothctl power on`)")
            case EAFNOSUPPORT:
                throw .noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable)")
            default:
                throw .os(Errno(e, call: "hci_devinfo"))
            }
        }
        return address
    }
}

/// The device's side of BlueZ L2CAP LE credit-based channels: a listening socket on the
/// beacon's PSM (docs/protocol.md §5). `baton device` holds one; each gateway that opens a
/// link is one accepted socket, which behaves exactly as the gateway's own channel: one read is
/// one SDU, one write is one SDU.
///
/// The kernel accepts the LE Credit Based Connection Request itself (l2cap_core.c
/// `l2cap_le_connect_req`, matching the listening channel by PSM, source address and an LE
/// source address type) and answers it with the MTU set here (BT_RCVMTU, inherited by every
/// accepted channel in `l2cap_sock_init`). Security level low: no pairing is asked for, as a
/// gateway connects without bonding (docs/security.md: payloads are sealed end to end instead).
/// Listening on a PSM below 0x0080 needs CAP_NET_BIND_SERVICE (l2cap_sock_bind); the dynamic
/// range 0x0080…0x00FF, or PSM 0 (the kernel picks one of them), needs nothing.
public struct L2CAPListener: ~Copyable {
    public let fd: Int32
    /// The PSM listened on (the kernel's choice when 0 was asked for).
    public let psm: UInt16
    public let adapter: String

    /// Listens on `adapter` ("hci1" or its address) at `psm` (0: a dynamic PSM the kernel picks),
    /// taking SDUs up to `receiveMTU` bytes (23…65535, Core 5.4, Vol 3, Part A, §4.22).
    public init(adapter: String, psm: UInt16, receiveMTU: Int, backlog: Int32 = 8) throws(LinkError) {
        precondition(receiveMTU >= L2CAPLink.minimumMTU && receiveMTU <= 65_535,
                     "an LE credit-based channel's MTU is 23…65535 (Core 5.4, Vol 3, Part A, §4.22), not \(receiveMTU)")
        guard psm <= 0x00FF else {
            throw .cannotListen("PSM 0x\(hex(psm)) is not an LE PSM (0x0001 to 0x00FF, Core 5.4, Vol 3, Part A, §4.22)")
        }
        try self.init(adapter: adapter, psm: psm, cid: 0, receiveMTU: receiveMTU, backlog: backlog)
    }

    /// The ATT fixed channel (CID 4) of `adapter`'s LE connections: each central that connects
    /// to this controller is one accepted socket, its ATT bearer (l2cap_core.c
    /// `l2cap_connect_cfm` gives a new connection's fixed channels to the sockets listening on
    /// them; bluetoothd listens on CID 4 too, so only one of them can: EADDRINUSE). One read
    /// is one ATT PDU. What `baton sim sensor` serves its GATT database on (docs/esphome.md §11).
    public init(attributesOn adapter: String, backlog: Int32 = 8) throws(LinkError) {
        try self.init(adapter: adapter, psm: 0, cid: L2CAPLink.attributeCID, receiveMTU: nil, backlog: backlog)
    }

    init(adapter: String, psm: UInt16, cid: UInt16, receiveMTU: Int?, backlog: Int32) throws(LinkError) {
        // The adapter's public address; all zero (BDADDR_ANY) when it has none and advertises
        // from a static random address, which the kernel then matches as "any".
        let address = try L2CAPLink.adapterAddress(adapter)
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        let fd = socket(AF_BLUETOOTH, type, BTPROTO_L2CAP)
        if fd < 0 {
            let e = errno
            if e == EAFNOSUPPORT { throw .noBluetooth("this kernel has no Bluetooth (AF_BLUETOOTH unavailable)") }
            throw .os(Errno(e, call: "socket(AF_BLUETOOTH, BTPROTO_L2CAP)"))
        }
        func fail(_ error: LinkError) -> LinkError { Syscall.close(fd); return error }
        var local = sockaddr_l2()
        local.l2_family = sa_family_t(AF_BLUETOOTH)
        local.l2_psm = psm.littleEndian
        local.l2_cid = cid.littleEndian
        local.l2_bdaddr = address
        // An LE address type makes this an LE listener (l2cap_sock_bind: LE_FLOWCTL mode);
        // public or random does not matter for matching (l2cap_global_chan_by_psm only asks "LE").
        local.l2_bdaddr_type = UInt8(BDADDR_LE_PUBLIC)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                CLibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_l2>.stride))
            }
        }
        if bound < 0 {
            let e = errno
            switch e {
            case EADDRINUSE where cid != 0:
                throw fail(.cannotListen("the ATT channel of \(adapter) is taken by another program (bluetoothd's GATT server: stop bluetooth.service, or use another adapter)"))
            case EADDRINUSE: throw fail(.cannotListen("PSM 0x\(hex(psm)) on \(adapter) is taken by another program (choose another with --psm, or 0 for any)"))
            case EACCES: throw fail(.cannotListen("PSM 0x\(hex(psm)) is below 0x0080 and needs CAP_NET_BIND_SERVICE (use 0x0080…0x00FF, or 0 for any)"))
            default: throw fail(.os(Errno(e, call: "bind(L2CAP)")))
            }
        }
        if let receiveMTU {
            var mtu = UInt16(receiveMTU)
            if setsockopt(fd, SOL_BLUETOOTH, BT_RCVMTU, &mtu, socklen_t(MemoryLayout<UInt16>.size)) < 0 {
                throw fail(.os(Errno(errno, call: "setsockopt(BT_RCVMTU)")))
            }
        }
        if CLibc.listen(fd, backlog) < 0 { throw fail(.os(Errno(errno, call: "listen(L2CAP)"))) }
        // The PSM the kernel gave (l2cap_add_psm picks a free dynamic one for 0).
        var bound2 = sockaddr_l2()
        var length = socklen_t(MemoryLayout<sockaddr_l2>.stride)
        let named = withUnsafeMutablePointer(to: &bound2) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        if named < 0 { throw fail(.os(Errno(errno, call: "getsockname(L2CAP)"))) }
        self.fd = fd
        self.psm = UInt16(littleEndian: bound2.l2_psm)
        self.adapter = adapter
    }

    deinit { Syscall.close(fd) }

    /// Accepts one waiting gateway: its socket (non-blocking, close-on-exec, owned by the
    /// caller) and its address. Nil when nobody is waiting.
    public func accept() throws(LinkError) -> (fd: Int32, peer: LinkAddress)? {
        var peer = sockaddr_l2()
        var length = socklen_t(MemoryLayout<sockaddr_l2>.stride)
        let listener = fd
        let got: Int?
        do throws(Errno) {
            got = try Syscall.call("accept(L2CAP)") {
                withUnsafeMutablePointer(to: &peer) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Int(CLibc.accept(listener, $0, &length)) }
                }
            }
        } catch {
            // ECONNABORTED: the gateway gave up before we took it; nothing to serve.
            if error.code == ECONNABORTED { return nil }
            throw .os(error)
        }
        guard let got else { return nil }
        let child = Int32(got)
        // accept4 is not in Glibc's Swift module; this program starts no processes, so nothing
        // inherits the descriptor between the two calls.
        _ = fcntl(child, F_SETFD, FD_CLOEXEC)
        _ = fcntl(child, F_SETFL, fcntl(child, F_GETFL) | O_NONBLOCK)
        let b = peer.l2_bdaddr.b
        let address = UInt64(b.0) | UInt64(b.1) << 8 | UInt64(b.2) << 16 | UInt64(b.3) << 24
            | UInt64(b.4) << 32 | UInt64(b.5) << 40
        // BlueZ's BDADDR_LE_RANDOM (2) is HCI's random (1) (<bluetooth/bluetooth.h>).
        let random = peer.l2_bdaddr_type == UInt8(BDADDR_LE_RANDOM)
        return (child, LinkAddress(address: address, addressType: random ? 1 : 0, psm: psm))
    }
}

/// The simulator's link (docs/protocol.md §5.5).
public struct SimulatedLink: DeviceLink {
    public let path: String
    public let sendMTU: Int
    public init(path: String, sendMTU: Int = 65_535) { self.path = path; self.sendMTU = sendMTU }

    public func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        guard let random = device.isRandom else { throw device.anonymousError }
        guard var unix = Syscall.unixAddress(path) else {
            throw .unreachable("the simulator's link socket path \(path) is longer than a Unix socket path may be (107 bytes): use a shorter --sockets directory")
        }
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        let fd = socket(AF_UNIX, type, 0)
        if fd < 0 { throw .os(Errno(errno, call: "socket(AF_UNIX, SOCK_SEQPACKET)")) }
        // Closed here until the channel owns it.
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { CLibc.connect(fd, $0, unix.length) }
        }
        if r < 0 {
            // A Unix connect completes at once or fails; EAGAIN is a full listen backlog.
            let e = errno
            Syscall.close(fd)
            switch e {
            case ENOENT, ECONNREFUSED:
                throw .unreachable("no simulator listening on \(path) (is `baton sim --scenario … --sockets DIR` running?)")
            case EAGAIN:
                throw .unreachable("the simulator on \(path) takes no more connections now (its listen backlog is full)")
            default:
                throw .os(Errno(e, call: "connect(simulator link)"))
            }
        }
        // Connected: the channel sends the connect message at once (on POLLOUT if the socket has
        // no room) and is open once the simulator's status byte says 00.
        let handshake = LinkHandshake(request: Self.connectMessage(device, random: random)) { answer in
            Self.judge(answer, device: device)
        }
        var channel = LinkChannel(connected: fd, handshake: handshake, sendMTU: sendMTU)
        channel.peer = device
        return channel
    }

    /// The simulator's attribute channel: the connect message with PSM 0 (docs/protocol.md
    /// §5.5), then ATT PDUs, one packet each.
    public func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        try connect(to: LinkAddress(address: device.address, addressType: device.addressType, psm: 0))
    }

    public var description: String { "sim \(path)" }

    /// The connect message (docs/protocol.md §5.5): `4C`, address type (00 public, 01 random),
    /// the address least significant byte first, the PSM little-endian.
    static func connectMessage(_ device: LinkAddress, random: Bool) -> [UInt8] {
        var m = [UInt8](repeating: 0, count: 10)
        m[0] = 0x4C
        m[1] = random ? 0x01 : 0x00
        for i in 0 ..< 6 { m[2 + i] = UInt8(truncatingIfNeeded: device.address >> (8 * UInt64(i))) }
        m[8] = UInt8(truncatingIfNeeded: device.psm)
        m[9] = UInt8(truncatingIfNeeded: device.psm >> 8)
        return m
    }

    /// The simulator's answer to the connect message (§5.5): exactly one status byte, 00 open.
    static func judge(_ answer: LinkHandshake.Answer, device: LinkAddress) -> LinkError? {
        switch answer {
        case .hungUp:
            return .unreachable("the simulator hung up before answering the connect message for \(device)")
        case .failed(let error):
            switch error.code {
            case ECONNRESET, EPIPE, ENOTCONN:
                return .unreachable("the simulator hung up before answering the connect message for \(device)")
            default:
                return .os(error)
            }
        case .record(let bytes, let size):
            guard size == 1 else {
                return .unreachable("the simulator answered the connect message with \(size) bytes instead of one status byte (docs/protocol.md §5.5)")
            }
            return bytes[0] == 0 ? nil : .unreachable(statusText(bytes[0], device: device))
        }
    }

    /// §5.5's status table, in the user's words.
    static func statusText(_ status: UInt8, device: LinkAddress) -> String {
        let name = device.deviceName
        return switch status {
        case 1: "the simulator has no device \(name)"
        case 2: "\(name) is out of range: the simulator does not hear it in this room (its mean RSSI is below heard-down-to)"
        case 3: "\(name) offers no channel on PSM 0x\(hex(device.psm))"
        case 4: "\(name) is silent: it does not answer"
        default: "the simulator answered the connect message for \(name) with unknown status 0x\(hex(status)) (docs/protocol.md §5.5 defines 00 to 04)"
        }
    }
}

/// Upper-case hex, two digits per byte of the value's type, as the Core spec prints PSMs.
private func hex<V: FixedWidthInteger>(_ value: V) -> String { Hex.text(value, digits: V.bitWidth / 4, uppercase: true) }
