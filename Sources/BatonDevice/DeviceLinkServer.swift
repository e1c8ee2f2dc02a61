// The device's side of device links (docs/protocol.md §5): what a device that offers a link
// answers: fetches, was-continued, and echo streams. Two programs are that device: `baton
// device` (the real one, on L2CAP LE credit-based channels it accepts and `adopt`s) and the
// simulator's devices (BatonSim: every room listens on `DIR/<room>.link`, Unix SOCK_SEQPACKET,
// one packet = one SDU, as an L2CAP channel delivers them, §5.5's connect message first). What
// a device answers comes from a `LinkDeviceModel`: `baton device`'s one activity, or the
// simulator's scenario.
//
// Toolbox only (full Swift): the firmware is a gateway, never a device.
//
// The links share a fixed pool of `DeviceLinkServer.capacity` slots, each with its own echo
// buffer, all allocated at start; a connection beyond that is closed at once and counted.
// Nothing is queued per link beyond one pending answer: a slot builds its next SDU when the
// socket can take it, so a gateway that stops reading stops the device (the socket says
// EAGAIN) without the server growing.
import BatonLibc
public import BatonKeys
public import BatonWire
public import CLibc

/// What a device answers on its links (docs/protocol.md §5.2, §5.3, §5.5): the simulator's
/// devices (BatonSim's `ScenarioPlayer`) or `baton device`'s one activity. `device` is the
/// index the server was given for the link (the scenario's device index; always 0 for
/// `baton device`).
public protocol LinkDeviceModel: AnyObject {
    /// The answer to a fetch for `sequence`: the payload (at the current sequence, which may be
    /// newer than the one asked), or fetch-refused with its reason.
    func fetchAnswer(device: Int, asked sequence: UInt16) -> LinkFetchAnswer
    /// Whether the device's beacon says it supports streams; an open on a device that does not
    /// is a protocol error.
    func offersStreams(device: Int) -> Bool
    /// The device's beacon id and name, for the was-continued messages it hears.
    func linkDeviceID(_ device: Int) -> UInt64
    func linkDeviceName(_ device: Int) -> String
    /// A keyed group's device seals its streams (docs/security.md §5.2) with this; nil: the
    /// stream's bytes go as they are.
    func streamSealer(device: Int) -> SealedEnvelope?
    /// A link accepted on room `room`'s listener said §5.5's connect message (address type,
    /// address, PSM): the status byte to answer (`00` connected; `01` no such device, `02` out
    /// of reach, `03` wrong PSM, `04` accepts no link) and the device it names, if one.
    func connectStatus(addressType: UInt8, address: UInt64, psm: UInt16, room: Int) -> (status: UInt8, device: Int?)
    /// Whether `device` is still in reach of `room`: a link to one that is not is dropped, as a
    /// radio drops it.
    func inReach(device: Int, room: Int) -> Bool
}

extension LinkDeviceModel {
    /// An open group's device: nothing sealed.
    public func streamSealer(device: Int) -> SealedEnvelope? { nil }
    /// A device without listeners of its own (`baton device`: its channels are adopted
    /// connected) is never asked; if it were, it knows no address.
    public func connectStatus(addressType: UInt8, address: UInt64, psm: UInt16, room: Int) -> (status: UInt8, device: Int?) {
        (0x01, nil)
    }
    /// A real device is in reach while its link stays up.
    public func inReach(device: Int, room: Int) -> Bool { true }
}

/// A fetch's answer (docs/protocol.md §5.2).
public enum LinkFetchAnswer: Sendable, Equatable {
    case payload(sequence: UInt16, bytes: [UInt8])
    case refused(FetchRefusal)
}

/// What a room's link socket counted (the `end` line, docs/simulator.md "Device links").
public struct LinkCounts: Sendable, Equatable {
    /// Connections answered `00`.
    public var links = 0
    /// Connections answered a non-zero status (§5.5).
    public var refused = 0
    /// Connections closed at once: every link slot was in use.
    public var full = 0
    /// Fetches answered (payload or fetch-refused).
    public var fetches = 0
    /// Was-continued messages heard.
    public var continued = 0
    /// Streams opened.
    public var streams = 0
    /// Links closed for breaking docs/protocol.md §5 (an error `02` sent first).
    public var errors = 0
    public init() {}
}

/// A was-continued message a device heard (docs/protocol.md §5.2).
public struct LinkContinuation: Sendable, Equatable {
    public var device: Int
    public var deviceID: UInt64
    public var name: String
    /// The room the activity was continued in, as the gateway named it.
    public var room: String
    public var sequence: UInt16
    /// The room whose link carried it.
    public var linkRoom: Int
}

// MARK: - The links

/// One link: a connection to a room's link socket, from its connect message to its close.
struct LinkSlot {
    enum Phase: Equatable {
        case free
        /// Waiting for the connect message, or sending the status byte.
        case connecting
        /// Connected; the first message says what it is.
        case connected
        /// Carries fetches and was-continued messages.
        case fetch
        /// Carries one stream (docs/protocol.md §5.3).
        case stream
        /// Sending error `02`, then closing.
        case failing
        /// The stream is over and its close sent; waiting for the gateway to hang up (an
        /// adopted L2CAP channel: see `hangsUpFirst`), at most `closingGrace`.
        case closing
    }

    var fd: Int32 = -1
    var phase = Phase.free
    var room = 0
    var device = 0
    /// When the pending status or fetch answer may go (`radio.link-latency`).
    var due = Instant.now
    /// The status byte to send while connecting.
    var status: UInt8?
    /// The sequence a fetch asked for, while its answer is pending.
    var fetch: UInt16?
    /// The last send found the socket full: wait for POLLOUT.
    var blocked = false
    var errorDetail = ""
    /// Whether the device hangs up as soon as a stream is over. The simulator's Unix socket
    /// delivers what was sent before a close; an L2CAP channel does not: closing it drops the
    /// SDUs still waiting for the gateway's credits (seen on the real stack, docs/vm.md), the
    /// stream's close among them. So an adopted channel leaves the hang-up to the gateway,
    /// which hangs up once it has the close (docs/relay.md §7).
    var hangsUpFirst = true

    // The stream (docs/protocol.md §5.3), from the device's side.
    var openPending = false
    /// The gateway's window (frames) and largest data frame (bytes).
    var peerWindow: UInt32 = 0
    var peerMaxData = 0
    /// The next gateway frame expected.
    var received: UInt32 = 0
    /// Gateway frames echoed in full: what an ack may say.
    var echoed: UInt32 = 0
    /// What the last ack sent said.
    var acked: UInt32 = 0
    /// A duplicate came: acknowledge again.
    var reack = false
    /// The next echo frame number, and the gateway's last ack of them.
    var sent: UInt32 = 0
    var peerAcked: UInt32 = 0
    var peerClosed = false
    var closeSent = false
    /// The echo queue: a ring of bytes in the slot's part of the shared buffer, and the bytes
    /// left of each gateway frame in it (oldest first), so an ack follows the echo.
    var head = 0
    var queued = 0
    var frames = InlineArray<8, UInt16>(repeating: 0)
    var firstFrame = 0
    var frameCount = 0
    /// A sealed stream (docs/security.md §5.2): the gateway's frame 0 gave the stream nonce.
    var sealed = false
    var streamNonce: InlineArray<12, UInt8>?
    /// The id the stream was opened to (§5.2's context): a group-wide keyed device's id
    /// rotates on air during a stream, the stream's context does not.
    var streamDeviceID: UInt64 = 0
}

/// The device's side of device links (docs/protocol.md §5): fetch answers, was-continued, and
/// echo streams, for every link at once from one poll loop. The simulator's rooms accept on
/// their Unix sockets (§5.5 connect message first); `baton device` accepts L2CAP channels
/// itself and hands each to `adopt`, which starts it connected.
public final class DeviceLinkServer {
    public static let capacity = 64
    /// The device's side of a stream: 8 frames of 1 KiB buffered (docs/protocol.md §5.3 open).
    static let window = 8
    static let maxData = 1024
    static let ringBytes = window * maxData
    /// The largest SDU a gateway sends: a data frame (5 + max data); one more byte tells a
    /// longer one apart.
    static let receiveBytes = 5 + maxData + 1
    /// The receive MTU a real L2CAP channel asks for: the largest SDU a gateway sends.
    public static let receiveMTU = 5 + maxData
    /// The largest SDU a device sends: a payload message (3 + 65535).
    static let sendBytes = 3 + 65535
    /// How long an adopted channel waits for the gateway to hang up after the stream's close.
    static let closingGrace: Duration = .seconds(10)

    /// The listeners' socket paths, unlinked by `close`.
    public let paths: [String]
    let listeners: [Int32]
    var slots: [LinkSlot]
    private(set) var counts: [LinkCounts]
    /// What the devices answer, who is in reach, which PSM.
    let model: any LinkDeviceModel
    /// Real time a device takes to answer (the scenario's link-latency at its speed).
    let latency: Duration
    let ring: UnsafeMutableRawBufferPointer
    let rx: UnsafeMutableRawBufferPointer
    let tx: UnsafeMutableRawBufferPointer
    /// One echo frame's bytes, taken out of a ring in order.
    let chunk: UnsafeMutableRawBufferPointer
    /// A sealed stream's frame on its way out (an echo chunk sealed), or in (a frame opened).
    let sealedChunk: UnsafeMutableRawBufferPointer
    /// Which slot each polled descriptor after the listeners is, for the turn in progress.
    var polled: [Int] = []
    var pollBase = 0
    var closed = false

    /// `baton device`'s side: no listening sockets of its own (the caller accepts L2CAP channels
    /// and `adopt`s them), one device (index 0) answering from `model` without delay.
    public convenience init(device model: any LinkDeviceModel) {
        self.init(model: model, rooms: 1)
    }

    /// Links for `rooms` rooms. `listeners`: one listening socket per room, non-blocking, whose
    /// links start with §5.5's connect message (the simulator's `DIR/<room>.link`); closed, and
    /// `paths` unlinked, by `close`. `latency`: real time a device takes to answer.
    public init(model: any LinkDeviceModel, rooms: Int, listeners: [Int32] = [], paths: [String] = [], latency: Duration = .zero) {
        self.model = model
        self.listeners = listeners
        self.paths = paths
        counts = Array(repeating: LinkCounts(), count: rooms)
        slots = Array(repeating: LinkSlot(), count: Self.capacity)
        precondition(LinkSlot().frames.count == Self.window, "a slot keeps one length per frame of the window")
        self.latency = latency
        ring = .allocate(byteCount: Self.capacity * Self.ringBytes, alignment: 8)
        rx = .allocate(byteCount: Self.receiveBytes, alignment: 8)
        tx = .allocate(byteCount: Self.sendBytes, alignment: 8)
        chunk = .allocate(byteCount: Self.ringBytes, alignment: 8)
        sealedChunk = .allocate(byteCount: Self.receiveBytes + SealedEnvelope.overhead, alignment: 8)
        polled.reserveCapacity(Self.capacity)
    }

    deinit {
        close()
        ring.deallocate(); rx.deallocate(); tx.deallocate(); chunk.deallocate(); sealedChunk.deallocate()
    }

    /// What the links counted (`baton device`: one entry).
    public var linkCounts: [LinkCounts] { counts }

    /// Links open now.
    public var openLinks: Int { slots.reduce(0) { $0 + ($1.fd >= 0 ? 1 : 0) } }

    /// Takes a connected channel (an accepted L2CAP socket: non-blocking, one SDU per read) for
    /// `device`. It starts connected: the first message says whether it is a fetch or a stream
    /// link. False, and the descriptor closed, when every slot is in use (counted as `full`).
    @discardableResult
    public func adopt(fd: Int32, device: Int = 0) -> Bool {
        guard let i = slots.firstIndex(where: { $0.fd < 0 }) else {
            counts[0].full += 1
            CLibc.close(fd)
            return false
        }
        slots[i] = LinkSlot()
        slots[i].fd = fd
        slots[i].phase = .connected
        slots[i].device = device
        slots[i].hangsUpFirst = false
        counts[0].links += 1
        return true
    }

    public func close() {
        guard !closed else { return }
        closed = true
        for i in slots.indices where slots[i].fd >= 0 { hangUp(i) }
        for fd in listeners { CLibc.close(fd) }
        for path in paths { unlink(path) }
    }

    // MARK: The poll loop's side

    /// Appends the listeners and every link that waits for something.
    public func addPollFDs(_ fds: inout [pollfd]) {
        pollBase = fds.count
        for fd in listeners { fds.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0)) }
        polled.removeAll(keepingCapacity: true)
        let now = Instant.now
        for i in slots.indices where slots[i].fd >= 0 {
            let s = slots[i]
            var events: Int16 = 0
            if s.blocked { events |= Int16(POLLOUT) }
            // An answer waiting for its time reads nothing more meanwhile: one answer per link.
            let waiting = waitingToAnswer(i)
            if !waiting { events |= Int16(POLLIN) }
            if waiting, !s.blocked, s.due > now { events = 0 }
            // A hang-up is reported whatever the events; poll it anyway so it is noticed.
            fds.append(pollfd(fd: s.fd, events: events, revents: 0))
            polled.append(i)
        }
    }

    /// The nearest time a pending answer may go, if any. A blocked link waits for POLLOUT
    /// instead, so it does not count (else a full socket would spin the loop).
    public var nextDue: Instant? {
        var due: Instant?
        for i in slots.indices where slots[i].fd >= 0 && (slots[i].phase == .closing || !slots[i].blocked && waitingToAnswer(i)) {
            due = min(due ?? slots[i].due, slots[i].due)
        }
        return due
    }

    /// Accepts, reads and answers after a poll.
    public func handle(_ fds: [pollfd], continued: (LinkContinuation) -> Void) { handle(fds[...], continued: continued) }

    /// The loop's one verb (docs/architecture.md §2): what poll said of `pollDescriptors`'
    /// descriptors (the driver's slice, its indices the driver's), then what is due.
    public func serve(_ ready: ArraySlice<pollfd>, continued: (LinkContinuation) -> Void) {
        handle(ready, continued: continued)
        service()
    }

    func handle(_ fds: ArraySlice<pollfd>, continued: (LinkContinuation) -> Void) {
        for r in listeners.indices where fds[pollBase + r].revents != 0 { accept(room: r) }
        for (k, i) in polled.enumerated() {
            let revents = fds[pollBase + listeners.count + k].revents
            guard revents != 0, slots[i].fd >= 0 else { continue }
            // The gateway hung up while its answer waits: nobody will read it (and poll would
            // report the hang-up on every turn until then).
            if revents & Int16(POLLHUP | POLLERR) != 0, waitingToAnswer(i) { hangUp(i); continue }
            if revents & Int16(POLLOUT) != 0 { slots[i].blocked = false }
            read(i, continued: continued)
        }
    }

    /// Answers what is due, moves streams on, and drops the links of devices that walked out
    /// of range (the gateway sees its link drop, as with a radio).
    public func service() {
        let now = Instant.now
        for i in slots.indices where slots[i].fd >= 0 {
            let s = slots[i]
            if s.phase == .closing {
                if s.due <= now { hangUp(i) }  // the gateway did not hang up: do it now
                continue
            }
            if s.phase != .connecting, s.phase != .failing, !model.inReach(device: s.device, room: s.room) {
                hangUp(i)
                continue
            }
            if !s.blocked { pump(i) }
        }
    }

    // MARK: Connecting (docs/protocol.md §5.5)

    func accept(room r: Int) {
        while true {
            let fd: Int?
            do throws(Errno) {
                let listener = listeners[r]
                fd = try Syscall.call("accept") { Int(CLibc.accept(listener, nil, nil)) }
            } catch {
                return  // ECONNABORTED and the like: that gateway has gone already
            }
            guard let fd else { return }
            // accept4 is not in Glibc's Swift module; the simulator starts no processes
            // between the two calls (it is single-threaded), so nothing inherits fd meanwhile.
            _ = fcntl(Int32(fd), F_SETFD, FD_CLOEXEC)
            _ = fcntl(Int32(fd), F_SETFL, fcntl(Int32(fd), F_GETFL) | O_NONBLOCK)
            guard let i = slots.firstIndex(where: { $0.fd < 0 }) else {
                counts[r].full += 1
                CLibc.close(Int32(fd))
                continue
            }
            slots[i] = LinkSlot()
            slots[i].fd = Int32(fd)
            slots[i].phase = .connecting
            slots[i].room = r
        }
    }

    /// The connect message: `4C`, address type, address (6, LSB first), PSM (2, LE).
    func connect(_ i: Int, _ sdu: UnsafeRawBufferPointer) {
        guard sdu.count == 10, sdu[0] == 0x4C else {
            // Not a gateway speaking §5.5: there is no status for it; hang up.
            counts[slots[i].room].errors += 1
            hangUp(i)
            return
        }
        var address: UInt64 = 0
        for k in 0..<6 { address |= UInt64(sdu[2 + k]) << (8 * UInt64(k)) }
        let psm = UInt16(sdu[8]) | UInt16(sdu[9]) << 8
        let (status, device) = model.connectStatus(addressType: sdu[1], address: address, psm: psm, room: slots[i].room)
        if let device { slots[i].device = device }
        slots[i].status = status
        slots[i].due = .now + latency
        pump(i)
    }

    // MARK: Reading

    /// Reads the SDUs that are ready, each handled before the next; a link with an answer
    /// pending reads nothing more until it has answered (one answer at a time, in order).
    func read(_ i: Int, continued: (LinkContinuation) -> Void) {
        while slots[i].fd >= 0 {
            if waitingToAnswer(i) {
                pump(i)
                if slots[i].fd < 0 || waitingToAnswer(i) { return }
            }
            let s = slots[i]
            let n: Int?
            do throws(Errno) {
                // MSG_TRUNC: the SDU's whole length, so one longer than the buffer is seen as such.
                n = try Syscall.call("recv") { CLibc.recv(s.fd, rx.baseAddress, rx.count, Int32(MSG_TRUNC)) }
            } catch {
                hangUp(i)
                return
            }
            guard let n else { break }
            // 0: the gateway closed the link (a zero-length SDU carries no message either).
            guard n > 0 else { hangUp(i); return }
            guard n <= rx.count else {
                fail(i, "an SDU of \(n) bytes: more than a data frame of \(Self.maxData)")
                break
            }
            let sdu = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(rx)[..<n])
            if slots[i].phase == .connecting {
                connect(i, sdu)
            } else {
                message(i, sdu, continued: continued)
            }
        }
        if slots[i].fd >= 0, !slots[i].blocked { pump(i) }
    }

    /// A status, fetch answer or error waits to be sent (or for its time).
    func waitingToAnswer(_ i: Int) -> Bool {
        let s = slots[i]
        return (s.phase == .connecting && s.status != nil) || (s.phase == .fetch && s.fetch != nil) || s.phase == .failing
    }

    func message(_ i: Int, _ sdu: UnsafeRawBufferPointer, continued: (LinkContinuation) -> Void) {
        let m: LinkMessage
        do throws(WireError) {
            m = try LinkMessage.decode(sdu, payloadMax: Self.maxData)
        } catch {
            // Closing: whatever the gateway still says needs no answer, and must not restart
            // the grace (the gateway hangs up, or the grace ends it).
            if slots[i].phase != .closing { fail(i, "not a link message (docs/protocol.md 5.1): \(error)") }
            return
        }
        let r = slots[i].room, d = slots[i].device
        switch (m.type, slots[i].phase) {
        case (_, .closing):
            // The stream is over; whatever the gateway still says needs no answer.
            break
        case (.reset, _), (.error, _):
            // The gateway gave up: nothing to answer (§5.3).
            hangUp(i)
        case (.fetch, .connected), (.fetch, .fetch):
            slots[i].phase = .fetch
            slots[i].fetch = UInt16(truncatingIfNeeded: m.number)
            slots[i].due = .now + latency
        case (.continued, .connected), (.continued, .fetch):
            slots[i].phase = .fetch
            counts[r].continued += 1
            let room = String(decoding: UnsafeRawBufferPointer(rebasing: sdu[m.body]), as: UTF8.self)
            continued(LinkContinuation(device: d, deviceID: model.linkDeviceID(d), name: model.linkDeviceName(d), room: room,
                                       sequence: UInt16(truncatingIfNeeded: m.number), linkRoom: r))
        case (.open, .connected):
            guard model.offersStreams(device: d) else {
                fail(i, "this device offers no streams (its beacon says so)")
                return
            }
            slots[i].phase = .stream
            slots[i].peerWindow = UInt32(m.window)
            // Our echo chunks and their sealed envelopes are sized for our own max data.
            slots[i].peerMaxData = min(Int(m.maxData), Self.maxData)
            slots[i].openPending = true
            slots[i].sealed = model.streamSealer(device: d) != nil
            slots[i].streamNonce = nil
            slots[i].streamDeviceID = model.linkDeviceID(d)
            if slots[i].sealed, slots[i].peerMaxData <= SealedEnvelope.overhead {
                fail(i, "max data \(m.maxData) leaves no room for a sealed frame (docs/security.md §5.2)")
                return
            }
            counts[r].streams += 1
        case (.data, .stream):
            data(i, m, sdu)
        case (.ack, .stream):
            let s = slots[i]
            // Cumulative: from the last ack up to what was sent, no further (§5.3).
            guard m.number &- s.peerAcked <= s.sent &- s.peerAcked else {
                fail(i, "ack up to frame \(m.number), beyond the \(s.sent) frames sent")
                return
            }
            slots[i].peerAcked = m.number
            slots[i].peerWindow = UInt32(m.window)
        case (.close, .stream):
            guard !slots[i].peerClosed else { fail(i, "a second close"); return }
            guard m.number == slots[i].received else {
                fail(i, "close at frame \(m.number), but \(slots[i].received) frames arrived")
                return
            }
            slots[i].peerClosed = true
        default:
            let link = switch slots[i].phase {
            case .stream: "a stream link"
            case .fetch: "a fetch link"
            default: "a link before its first fetch or open"
            }
            fail(i, "a \(m.type) message on \(link) (docs/protocol.md 5.1)")
        }
    }

    /// A data frame from the gateway: queued for the echo, or a duplicate acknowledged again.
    func data(_ i: Int, _ m: LinkMessage, _ sdu: UnsafeRawBufferPointer) {
        let s = slots[i]
        if m.number &- s.received > UInt32.max / 2 {
            // Below the next expected: a duplicate (§5.3).
            slots[i].reack = true
            return
        }
        guard m.number == s.received else {
            fail(i, "data frame \(m.number) but \(s.received) was next (a link keeps order)")
            return
        }
        guard !s.peerClosed else { fail(i, "data frame \(m.number) after close"); return }
        // The gateway may have `window` frames past the last ack we sent in flight, no more.
        guard m.number &- s.acked < UInt32(Self.window) else {
            fail(i, "data frame \(m.number) beyond the window (acked up to \(s.acked), window \(Self.window))")
            return
        }
        var body = UnsafeRawBufferPointer(rebasing: sdu[m.body])
        if s.sealed {
            // docs/security.md §5.2: frame 0 is the endpoint's hello, whose nonce is the
            // stream's; every frame opens only for this stream, direction and number.
            guard let sealer = model.streamSealer(device: s.device) else { return fail(i, "the device lost its key") }
            if s.streamNonce == nil {
                guard m.number == 0, let n = StreamFrameContext.streamNonce(ofFrameZero: body) else {
                    return fail(i, "a sealed stream starts with the endpoint's hello (docs/security.md §5.2)")
                }
                slots[i].streamNonce = n
            }
            let context = StreamFrameContext(deviceID: s.streamDeviceID, streamNonce: slots[i].streamNonce!,
                                             direction: .up, frame: m.number)
            let n: Int
            do throws(SealError) { n = try sealer.openFrame(body, for: context, into: sealedChunk) } catch {
                return fail(i, "frame \(m.number) did not open: another group's key, not sealed, or altered")
            }
            body = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(sealedChunk)[..<n])
            if n == 0 {
                // Nothing to echo (the hello): taken and echoed at once, unless frames wait
                // before it, whose echo then covers it.
                if s.frameCount == 0 { slots[i].echoed &+= 1 } else {
                    slots[i].frames[(s.firstFrame + s.frameCount) % Self.window] = 0
                    slots[i].frameCount += 1
                }
                slots[i].received &+= 1
                return
            }
        }
        // Proof of room: queued frames = received - echoed ≤ received - acked < window, each at
        // most maxData bytes (decode's limit), and the ring holds window × maxData.
        precondition(s.frameCount < Self.window && s.queued + body.count <= Self.ringBytes, "echo queue overrun")
        let base = i * Self.ringBytes
        var at = (s.head + s.queued) % Self.ringBytes
        for b in body {
            ring[base + at] = b
            at = at + 1 == Self.ringBytes ? 0 : at + 1
        }
        slots[i].queued += body.count
        slots[i].frames[(s.firstFrame + s.frameCount) % Self.window] = UInt16(body.count)
        slots[i].frameCount += 1
        // Frame numbers are 32 bits on the wire (§5.1): they wrap, and every comparison above
        // is a wrapping distance.
        slots[i].received &+= 1
    }

    // MARK: Writing

    /// Sends what the slot has to say, while the socket takes it.
    func pump(_ i: Int) {
        let now = Instant.now
        while slots[i].fd >= 0, !slots[i].blocked {
            let s = slots[i]
            switch s.phase {
            case .free, .connected, .closing:
                return
            case .connecting:
                guard let status = s.status, s.due <= now else { return }
                guard send(i, count: 1, { w throws(WireError) in try w.reserve(1); w.write(status) }) else { return }
                if status == 0 {
                    slots[i].phase = .connected
                    counts[s.room].links += 1
                } else {
                    counts[s.room].refused += 1
                    hangUp(i)
                }
            case .failing:
                let detail = s.errorDetail
                _ = send(i, count: LinkMessage.encodedCount(.error, bodyCount: detail.utf8.count)) { w throws(WireError) in
                    try LinkMessage.encodeError(.protocolError, detail: detail, into: &w)
                }
                if slots[i].blocked { return }
                // As after a stream's close: closing an L2CAP channel drops what still waits
                // for the gateway's credits, the error among it, so an adopted channel leaves
                // the hang-up to the gateway (at most `closingGrace`).
                if slots[i].hangsUpFirst {
                    hangUp(i)
                } else {
                    slots[i].phase = .closing
                    slots[i].due = .now + Self.closingGrace
                }
            case .fetch:
                guard let asked = s.fetch, s.due <= now else { return }
                guard answer(i, asked) else { return }
                slots[i].fetch = nil
                counts[s.room].fetches += 1
                return
            case .stream:
                guard stream(i) else { return }
            }
        }
    }

    /// A fetch's answer (docs/protocol.md §5.2): the payload at the current sequence, or
    /// fetch-refused.
    func answer(_ i: Int, _ asked: UInt16) -> Bool {
        switch model.fetchAnswer(device: slots[i].device, asked: asked) {
        case .refused(let reason):
            return send(i, count: 4) { w throws(WireError) in try LinkMessage.encodeFetchRefused(sequence: asked, reason, into: &w) }
        case .payload(let sequence, let payload):
            // Empty, or over what one SDU carries (3 + 65535): refused (§5.2 `03`, `02`).
            guard !payload.isEmpty, payload.count <= Self.sendBytes - 3 else {
                let reason: FetchRefusal = payload.isEmpty ? .refused : .tooLarge
                return send(i, count: 4) { w throws(WireError) in try LinkMessage.encodeFetchRefused(sequence: asked, reason, into: &w) }
            }
            return payload.withUnsafeBytes { p in
                send(i, count: 3 + p.count) { w throws(WireError) in try LinkMessage.encodePayload(sequence: sequence, payload: p, into: &w) }
            }
        }
    }

    /// One step of the stream's sending side; false when there is nothing more to send now.
    func stream(_ i: Int) -> Bool {
        let s = slots[i]
        if s.openPending {
            guard send(i, count: 5, { w throws(WireError) in
                try LinkMessage.encodeOpen(window: UInt16(Self.window), maxData: UInt16(Self.maxData), into: &w)
            }) else { return false }
            slots[i].openPending = false
            return true
        }
        // Echo: at most the gateway's window of unacknowledged frames, each at most its max data.
        if s.queued > 0, !s.closeSent, s.sent &- s.peerAcked < s.peerWindow {
            let k = min(s.queued, s.sealed ? s.peerMaxData - SealedEnvelope.overhead : s.peerMaxData)
            let base = i * Self.ringBytes
            // The ring wraps at most once within k ≤ ringBytes bytes: copy them in order.
            let first = min(k, Self.ringBytes - s.head)
            chunk.baseAddress!.copyMemory(from: ring.baseAddress! + base + s.head, byteCount: first)
            if first < k { (chunk.baseAddress! + first).copyMemory(from: ring.baseAddress! + base, byteCount: k - first) }
            var bytes = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(chunk)[..<k])
            if s.sealed, let sealer = model.streamSealer(device: s.device), let nonce = s.streamNonce {
                let context = StreamFrameContext(deviceID: s.streamDeviceID, streamNonce: nonce,
                                                 direction: .down, frame: s.sent)
                // Proof: k ≤ peerMaxData − 29 ≤ maxData, and sealedChunk holds maxData + 35.
                guard let n = try? sealer.sealFrame(bytes, for: context, into: sealedChunk) else {
                    fail(i, "sealing the echo failed")
                    return false
                }
                bytes = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(sealedChunk)[..<n])
            }
            let body = bytes
            let sentOK = send(i, count: LinkMessage.encodedCount(.data, bodyCount: body.count)) { w throws(WireError) in
                try LinkMessage.encodeData(frame: s.sent, bytes: body, into: &w)
            }
            guard sentOK else { return false }
            consume(i, k)
            // Wraps as frame numbers do (§5.1).
            slots[i].sent &+= 1
            return true
        }
        if s.echoed != s.acked || s.reack {
            guard send(i, count: 7, { w throws(WireError) in
                try LinkMessage.encodeAck(next: s.echoed, window: UInt16(Self.window), into: &w)
            }) else { return false }
            slots[i].acked = s.echoed
            slots[i].reack = false
            return true
        }
        // §5.3 close: once the gateway closed and everything echoed is acknowledged.
        if s.peerClosed, !s.closeSent, s.queued == 0, s.peerAcked == s.sent {
            guard send(i, count: 5, { w throws(WireError) in try LinkMessage.encodeClose(end: s.sent, into: &w) }) else { return false }
            slots[i].closeSent = true
            // Both directions closed, every frame acknowledged: the stream is over.
            if slots[i].hangsUpFirst {
                hangUp(i)
            } else {
                slots[i].phase = .closing
                slots[i].due = .now + Self.closingGrace
            }
            return false
        }
        return false
    }

    /// Drops `k` echoed bytes from the queue; gateway frames echoed in full may be acknowledged.
    func consume(_ i: Int, _ k: Int) {
        var left = k
        slots[i].head = (slots[i].head + k) % Self.ringBytes
        slots[i].queued -= k
        while left > 0 {
            let f = slots[i].firstFrame
            let take = min(Int(slots[i].frames[f]), left)
            slots[i].frames[f] -= UInt16(take)
            left -= take
            if slots[i].frames[f] == 0 {
                slots[i].firstFrame = (f + 1) % Self.window
                slots[i].frameCount -= 1
                // Proof: echoed never passes received, which wraps as frame numbers do.
                slots[i].echoed &+= 1
            }
        }
    }

    /// Encodes one SDU into the shared buffer and sends it. False: not sent (the socket is full
    /// and the slot now waits for POLLOUT, or the link broke and is closed).
    func send(_ i: Int, count: Int, _ encode: (inout ByteWriter) throws(WireError) -> Void) -> Bool {
        var w = ByteWriter(tx)
        do throws(WireError) { try encode(&w) } catch { preconditionFailure("a device's SDU fits \(Self.sendBytes) bytes: \(error)") }
        precondition(w.count == count, "SDU of \(w.count) bytes, \(count) expected")
        let fd = slots[i].fd
        let sent: Int?
        do throws(Errno) {
            sent = try Syscall.call("send") { CLibc.send(fd, tx.baseAddress, count, Int32(MSG_NOSIGNAL)) }
        } catch {
            hangUp(i)  // EPIPE, ECONNRESET: the gateway has gone
            return false
        }
        guard sent != nil else { slots[i].blocked = true; return false }
        return true
    }

    /// A message that breaks docs/protocol.md §5: error `02` with what was wrong, then close.
    func fail(_ i: Int, _ detail: String) {
        counts[slots[i].room].errors += 1
        var text = detail
        // §5.1: the detail is at most 100 bytes (ours are ASCII).
        while text.utf8.count > 100 { text.removeLast() }
        slots[i].errorDetail = text
        slots[i].phase = .failing
        pump(i)
    }

    func hangUp(_ i: Int) {
        let fd = slots[i].fd
        guard fd >= 0 else { return }
        // shutdown: the gateway sees the end even if a child process holds a copy of fd.
        shutdown(fd, Int32(SHUT_RDWR))
        CLibc.close(fd)
        slots[i] = LinkSlot()
    }
}

/// A part of a poll loop (BatonLibc's `PollLoop`): the listeners and the links, and the nearest
/// answer due.
extension DeviceLinkServer: LoopPart {
    public func pollDescriptors(into fds: inout [pollfd]) { addPollFDs(&fds) }
    public var descriptorLimit: Int { listeners.count + Self.capacity }
    public var nextDeadline: Instant? { nextDue }
}
