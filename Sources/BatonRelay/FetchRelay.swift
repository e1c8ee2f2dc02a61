// Payload fetches (docs/relay.md): a request arrives on `<prefix>/fetch/<device>`, the gateway
// that owns the device asks the device over its link (docs/protocol.md §5.2), caches the
// answer by sequence, and answers on the requester's response topic.
//
// The rule the code keeps (docs/relay.md §4): every request this gateway takes gets exactly
// one answer — the payload or an error — by its deadline. A request leaves `pending` only
// through `take(_:)`, which every caller follows with the request's answer: the payload, or
// the error of whatever ended it (a timeout, a link failure, a newer request of the same
// requester, a stop). A request a full table cannot take is answered `busy` at once.
//
// Capacities are fixed at start (architecture.md §5): pending requests, links, cache
// entries and the cache's bytes (entries × `payloadMax`). Who answers what — owner, unknown
// device, not owner — is the gateway's decision (it knows the rooms); this type is handed a
// resolved target.

import BatonLibc
import BatonMQTT
import BatonWire
import CLibc

public struct RelayConfig: Sendable, Equatable {
    /// A request not answered by then is answered `timeout` (docs/relay.md §4).
    public var fetchTimeout: Duration
    /// A fetch link with nothing to do is closed after this.
    public var linkIdle: Duration
    /// Requests waiting for an answer at once; one more is answered `busy`.
    public var fetches: Int
    /// Payloads kept, by device and sequence.
    public var cache: Int
    /// Device links open at once.
    public var links: Int
    /// The largest payload relayed; a larger one is answered `too-large`.
    public var payloadMax: Int
    /// Streams carried at once (docs/relay.md §7); one more is refused `busy`.
    public var streams: Int
    /// Frames of the device's kept per stream until the endpoint acknowledges them, and the
    /// largest frame: the window and max data the device is told at most.
    public var streamWindow: Int
    public var streamMaxData: Int
    /// No ack for this long: the kept frames are sent again.
    public var streamRetry: Duration
    /// Nothing moved for this long: the stream ends with error `idle`.
    public var streamIdle: Duration

    public init(fetchTimeout: Duration = .seconds(5), linkIdle: Duration = .seconds(10), fetches: Int = 32,
                cache: Int = 32, links: Int = 8, payloadMax: Int = 4096, streams: Int = 16, streamWindow: Int = 16,
                streamMaxData: Int = 1024, streamRetry: Duration = .seconds(1), streamIdle: Duration = .seconds(60)) {
        self.fetchTimeout = fetchTimeout; self.linkIdle = linkIdle; self.fetches = fetches
        self.cache = cache; self.links = links; self.payloadMax = payloadMax
        self.streams = streams; self.streamWindow = streamWindow; self.streamMaxData = streamMaxData
        self.streamRetry = streamRetry; self.streamIdle = streamIdle
    }
}

/// An answer's status (docs/relay.md §3): `ok` or why not.
public enum FetchStatus: Int, Sendable, Equatable, CaseIterable {
    case ok, unknownDevice, notOwner, unreachable, tooLarge, timeout, badRequest, cancelled, busy

    /// The word on the wire and on the stats topic.
    public var name: String {
        switch self {
        case .ok: "ok"
        case .unknownDevice: "unknown-device"
        case .notOwner: "not-owner"
        case .unreachable: "unreachable"
        case .tooLarge: "too-large"
        case .timeout: "timeout"
        case .badRequest: "bad-request"
        case .cancelled: "cancelled"
        case .busy: "busy"
        }
    }
}

/// Where an answer goes and how it is written.
public struct FetchRoute: Sendable, Equatable {
    public var responseTopic: String
    /// Echoed as it came; at most `FetchRequest.maxCorrelation` bytes.
    public var correlation: [UInt8]
    public var format: FetchFormat
    /// The route came in MQTT v5 properties: the answer carries its status and correlation in
    /// properties too. Otherwise it came in the body (the v3.1.1 fallback) and the answer is a
    /// JSON envelope (docs/relay.md §3).
    public var usesProperties: Bool
    /// The body's `continue`: where the requester continues the activity (docs/relay.md §3).
    public var continuedAt: String?

    public init(responseTopic: String, correlation: [UInt8] = [], format: FetchFormat = .cbor, usesProperties: Bool,
                continuedAt: String? = nil) {
        self.responseTopic = responseTopic; self.correlation = correlation; self.format = format
        self.usesProperties = usesProperties; self.continuedAt = continuedAt
    }
}

/// A request read off the broker: where to answer, and whether the body was good.
public enum FetchIntake: Sendable, Equatable {
    /// Answerable: the route, and the body's fault if it had one (answer `bad-request`).
    case request(FetchRoute, bodyError: WireError?)
    /// No response topic anywhere: nobody can be answered; the reason is counted.
    case unanswerable(WireError?)

    /// Reads the route from the v5 properties, falling back on the body (docs/relay.md §1–§2).
    public init(_ message: MQTTMessage) {
        let decoded: Result<FetchRequest, WireError> = message.payload.withUnsafeBytes { bytes in
            do throws(WireError) { return .success(try FetchRequest.decode(bytes)) } catch { return .failure(error) }
        }
        let props = message.properties
        switch decoded {
        case .failure(let error):
            if let topic = props.responseTopic, Self.isAnswerable(topic) {
                let correlation = props.correlationData.map { Array($0.prefix(FetchRequest.maxCorrelation)) } ?? []
                self = .request(FetchRoute(responseTopic: topic, correlation: correlation, usesProperties: true),
                                bodyError: error)
            } else {
                // A v3.1.1 body that named its route before its mistake is still answered.
                let partial = message.payload.withUnsafeBytes { FetchRequest.routeBeforeError($0) }
                if let route = Self.bodyRoute(partial, message.payload) {
                    self = .request(route, bodyError: error)
                } else {
                    self = .unanswerable(error)
                }
            }
        case .success(let body):
            if let topic = props.responseTopic, Self.isAnswerable(topic) {
                let correlation = props.correlationData.map { Array($0.prefix(FetchRequest.maxCorrelation)) } ?? []
                self = .request(FetchRoute(responseTopic: topic, correlation: correlation, format: body.format,
                                           usesProperties: true,
                                           continuedAt: body.continuedAt.map { String(decoding: message.payload[$0], as: UTF8.self) }),
                                bodyError: nil)
            } else if let route = Self.bodyRoute(body, message.payload) {
                self = .request(route, bodyError: nil)
            } else {
                self = .unanswerable(nil)
            }
        }
    }

    /// The v3.1.1 fallback: the route in the body (docs/relay.md §2).
    static func bodyRoute(_ body: FetchRequest, _ bytes: [UInt8]) -> FetchRoute? {
        guard let range = body.responseTopic else { return nil }
        let topic = String(decoding: bytes[range], as: UTF8.self)
        var correlation: [UInt8] = []
        if let hex = body.correlationHex {
            var out = [UInt8](repeating: 0, count: FetchRequest.maxCorrelation)
            let n = bytes.withUnsafeBytes { all in
                out.withUnsafeMutableBytes {
                    FetchRequest.correlationBytes(UnsafeRawBufferPointer(rebasing: all[hex]), into: $0)
                }
            }
            correlation = Array(out.prefix(n))
        }
        return FetchRoute(responseTopic: topic, correlation: correlation, format: body.format, usesProperties: false,
                          continuedAt: body.continuedAt.map { String(decoding: bytes[$0], as: UTF8.self) })
    }

    /// A v5 Response Topic may not hold wildcards (MQTT 5.0 §3.3.2.3.5); the broker checks,
    /// but a bridge or a v3 client could still hand one over.
    static func isAnswerable(_ topic: String) -> Bool {
        !topic.isEmpty && topic.utf8.count <= FetchRequest.maxResponseTopic
            && !topic.utf8.contains(where: { $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "#") || $0 == 0 })
    }
}

/// What the gateway resolved a request to: the activity this gateway owns and can reach.
public struct FetchTarget: Sendable, Equatable {
    public var device: UInt64
    /// The sequence in the beacon the gateway last heard.
    public var sequence: UInt16
    public var link: LinkAddress
    public init(device: UInt64, sequence: UInt16, link: LinkAddress) {
        self.device = device; self.sequence = sequence; self.link = link
    }
}

public struct RelayCounters: Sendable, Equatable {
    /// Answers sent, by `FetchStatus.rawValue`.
    public var answers = [Int](repeating: 0, count: FetchStatus.allCases.count)
    /// `ok` answers served from the cache without touching a link.
    public var cacheHits = 0
    public var linkOpens = 0
    public var linkFailures = 0
    /// Answers that could not be published (broker gone); the requester times out.
    public var answersLost = 0
    /// Payloads sent to requesters that said `continue`, and `continued` messages delivered.
    public var continued = 0
    public var continuedTold = 0
    public init() {}
}

public struct FetchRelay: ~Copyable {
    public let config: RelayConfig
    /// nil: this gateway has no device link (`relay.link: none`, a capture): fetches it owns
    /// are answered `unreachable`.
    public let link: AnyDeviceLink?
    let gatewayID: String
    let room: String
    /// Where the was-continued events go; nil: none are published.
    let topics: Topics?

    /// A `continued` message owed to a device (docs/protocol.md §5.2), sent on its link as soon
    /// as one is open; given up (and counted) after `fetchTimeout`.
    struct Tell {
        var device: UInt64
        var sequence: UInt16
        var at: String
        var address: LinkAddress
        var deadline: Instant
    }
    var tells: [Tell?]
    public private(set) var tellCount = 0

    struct Pending {
        var device: UInt64
        var sequence: UInt16
        /// nil: the gateway's own fetch for the activity's title (docs/relay.md §4.1), answered
        /// into `ownAnswers` instead of on the broker.
        var route: FetchRoute?
        var deadline: Instant
        /// Where to open the link when the request had to wait for one (docs/relay.md §5).
        var address: LinkAddress
    }
    var pending: [Pending?]

    /// What a link is doing (its channel is the pool's). One per slot, made at start and
    /// reset for each link the slot holds.
    final class LinkSlot {
        var device: UInt64 = 0
        var address = LinkAddress(address: 0, addressType: 0, psm: 0)
        /// The sequence of the fetch sent and not yet answered.
        var asked: UInt16?
        /// Closed when idle past this (no pending request for its device).
        var idleSince = Instant(nanoseconds: 0)

        func reset(device: UInt64, address: LinkAddress, now: Instant) {
            self.device = device; self.address = address; asked = nil; idleSince = now
        }
    }
    var links: LinkPool<LinkSlot>

    struct CacheEntry {
        var device: UInt64
        var sequence: UInt16
        var count: Int
        var lastUsed: UInt64
    }
    var cache: [CacheEntry?]
    var useCounter: UInt64 = 0
    let cacheBytes: UnsafeMutableRawBufferPointer
    /// One receive buffer for every link (an SDU is read whole, then handled).
    let receive: UnsafeMutableRawBufferPointer
    /// Answers are written here: a payload rendered as JSON can be several times its size.
    let answerScratch: UnsafeMutableRawBufferPointer
    let sendScratch: UnsafeMutableRawBufferPointer

    public private(set) var counters = RelayCounters()
    /// Link messages dropped, by reason (stats `relay.drops`).
    public private(set) var drops = DropCounts()
    /// The last link failure, for the log.
    public private(set) var lastLinkError: String?

    /// `topics` (`Topics.continued`) and `room` are where and how the was-continued event is
    /// published (docs/relay.md §3); without topics no event is published.
    public init(config: RelayConfig, link: AnyDeviceLink?, gatewayID: String, room: String = "",
                topics: Topics? = nil) {
        self.config = config
        self.link = link
        self.gatewayID = gatewayID
        self.room = room
        self.topics = topics
        tells = Array(repeating: nil, count: config.fetches)
        pending = Array(repeating: nil, count: config.fetches)
        links = LinkPool(capacity: config.links) { _ in LinkSlot() }
        ownAnswers = []
        ownAnswers.reserveCapacity(config.fetches)
        cache = Array(repeating: nil, count: config.cache)
        cacheBytes = .allocate(byteCount: max(1, config.cache * config.payloadMax), alignment: 8)
        // One message header (3 bytes, docs/protocol.md §5.1) over the largest payload.
        receive = .allocate(byteCount: config.payloadMax + 3, alignment: 8)
        answerScratch = .allocate(byteCount: config.payloadMax * 6 + 1024, alignment: 8)
        sendScratch = .allocate(byteCount: 128, alignment: 8)
    }

    deinit {
        cacheBytes.deallocate()
        receive.deallocate()
        answerScratch.deallocate()
        sendScratch.deallocate()
    }

    /// Kept as counts, so an idle relay costs the loop nothing per turn (`nextDeadline`).
    public private(set) var pendingCount = 0
    public var openLinks: Int { links.count }

    // MARK: requests

    /// A request from `route`'s requester supersedes the one it is still waiting for (the
    /// seeds' user-cancelled case): that one is answered `cancelled`. Called for every request
    /// seen, whoever answers it: the earlier one may be this gateway's, the new one another's.
    public mutating func supersede(_ route: FetchRoute, mqtt: inout MQTTClient) {
        for i in pending.indices {
            guard let p = pending[i], p.route?.responseTopic == route.responseTopic else { continue }
            answer(slot: i, .cancelled, detail: "a newer request from the same requester replaced it", mqtt: &mqtt)
        }
    }

    /// The cached payload of `device` at `atLeast` or later, counted as a hit and a use: the
    /// least recently *used* entry is the one replaced (docs/relay.md §5). The bytes are the
    /// cache's, valid until the next fetch fills an entry.
    mutating func useCached(device: UInt64, atLeast: UInt16) -> (sequence: UInt16, bytes: UnsafeRawBufferPointer)? {
        guard let hit = cached(device: device, atLeast: atLeast) else { return nil }
        counters.cacheHits &+= 1
        useCounter &+= 1
        cache[hit]!.lastUsed = useCounter
        let entry = cache[hit]!
        return (entry.sequence, UnsafeRawBufferPointer(rebasing: cacheBytes[hit * config.payloadMax ..< hit * config.payloadMax + entry.count]))
    }

    /// Takes a request for an activity this gateway owns: answered from the cache, or queued
    /// for the device's link.
    public mutating func fetch(_ target: FetchTarget, route: FetchRoute, now: Instant,
                               mqtt: inout MQTTClient) {
        if let (sequence, bytes) = useCached(device: target.device, atLeast: target.sequence) {
            if sendPayload(bytes, sequence: sequence, device: target.device, route: route, mqtt: &mqtt),
               let at = route.continuedAt {
                continued(device: target.device, sequence: sequence, at: at, address: target.link, now: now, mqtt: &mqtt)
            }
            return
        }
        let free = pending.firstIndex(where: { $0 == nil })
        if let refusal = Admission.room(.fetch, hasLink: link != nil, free: free != nil, capacity: config.fetches) {
            return refuse(refusal, device: target.device, route: route, mqtt: &mqtt)
        }
        // Proof: `room` refuses when no slot is free.
        let slot = free!
        pending[slot] = Pending(device: target.device, sequence: target.sequence, route: route,
                                deadline: now + config.fetchTimeout, address: target.link)
        pendingCount += 1
        work(device: target.device, address: target.link, now: now, mqtt: &mqtt)
    }

    /// Answers a request that admission refused (`Admission.check`): its status and detail.
    public mutating func refuse(_ refusal: Refusal, device: UInt64?, route: FetchRoute, mqtt: inout MQTTClient) {
        send(refusal.fetchStatus, device: device, detail: refusal.description, route: route, mqtt: &mqtt)
    }

    /// The gateway's own fetch of an activity it owns, for its title (docs/relay.md §4.1): the
    /// same cache, links and pending table as a requester's, its one answer appended to
    /// `ownAnswers`. false when nothing was taken (no link, or every pending slot busy): the
    /// caller counts it and tries at the next save.
    public mutating func fetchOwn(_ target: FetchTarget, now: Instant, mqtt: inout MQTTClient) -> Bool {
        if let (sequence, bytes) = useCached(device: target.device, atLeast: target.sequence) {
            answerOwn(device: target.device, sequence: sequence, .ok, payload: bytes)
            return true
        }
        guard link != nil, ownAnswers.count + pendingOwn < ownAnswerCapacity,
              let free = pending.firstIndex(where: { $0 == nil }) else { return false }
        pending[free] = Pending(device: target.device, sequence: target.sequence, route: nil,
                                deadline: now + config.fetchTimeout, address: target.link)
        pendingCount += 1
        work(device: target.device, address: target.link, now: now, mqtt: &mqtt)
        return true
    }

    /// The gateway's own fetches answered since it last took them (`takeOwnAnswers`).
    public private(set) var ownAnswers: [OwnFetchAnswer]
    /// Every pending slot answers at most once: this many answers always fit between two takes.
    var ownAnswerCapacity: Int { config.fetches }
    var pendingOwn: Int { pending.reduce(0) { $0 + ($1 != nil && $1!.route == nil ? 1 : 0) } }

    /// The caller read `ownAnswers`: they are forgotten.
    public mutating func clearOwnAnswers() {
        ownAnswers.removeAll(keepingCapacity: true)
    }

    mutating func answerOwn(device: UInt64, sequence: UInt16, _ status: FetchStatus, payload: UnsafeRawBufferPointer?) {
        var a = OwnFetchAnswer(device: device, sequence: sequence, status: status)
        if let payload { a.described = ActivityDescription.read(payload, limits: PayloadLimits(maxBytes: config.payloadMax)) }
        // Proof of room: one answer per pending slot, and `fetchOwn` takes no slot while the
        // answers not yet taken and the own fetches pending could fill the list.
        guard ownAnswers.count < ownAnswerCapacity else { return drops.count("own-answer-full") }
        ownAnswers.append(a)
    }

    /// Answers a request this gateway decided about without a link (unknown device, not
    /// owner, bad request, …).
    public mutating func answer(_ status: FetchStatus, device: UInt64?, detail: String, route: FetchRoute,
                                mqtt: inout MQTTClient) {
        send(status, device: device, detail: detail, route: route, mqtt: &mqtt)
    }

    /// The activity changed (a newer sequence, invalidated, gone): its cached payloads are
    /// stale.
    public mutating func forget(device: UInt64) {
        for i in cache.indices where cache[i]?.device == device { cache[i] = nil }
    }

    /// A request or link message dropped without an answer, or answered `bad-request`, by reason.
    public mutating func dropped(_ reason: StaticString) { drops.count(reason) }

    /// Before a clean stop: every request still waiting is answered.
    public mutating func stop(mqtt: inout MQTTClient) {
        for i in pending.indices where pending[i] != nil {
            answer(slot: i, .unreachable, detail: "the gateway is stopping", mqtt: &mqtt)
        }
        for i in links.indices { links.close(i) }
    }

    // MARK: links

    /// Opens a link for `device`, or uses the open one, so its pending requests get asked.
    mutating func work(device: UInt64, address: LinkAddress, now: Instant, mqtt: inout MQTTClient) {
        if let s = links.first(where: { $0.device == device }) {
            return ask(slot: s, mqtt: &mqtt)
        }
        if links.isFull {
            // Every slot busy: close the link idle the longest, if one is idle. Idle = no request
            // waits for its device, even with a fetch still out (its requests timed out or were
            // cancelled): otherwise such a link would hold its slot for good.
            var best: Int?
            for i in links.indices {
                guard let l = links[i], !hasWork(l.device) else { continue }
                if best == nil || l.idleSince < links[best!]!.idleSince { best = i }
            }
            if let best { links.close(best) }
        }
        // No slot: the request waits; `tick` tries again as links close, until its deadline.
        guard !links.isFull, let link else { return }
        do throws(LinkError) {
            let channel = try link.connect(to: address)
            let slot = links.add(channel)
            slot.entry.reset(device: device, address: address, now: now)
            counters.linkOpens &+= 1
            ask(slot: slot.slot, mqtt: &mqtt)
        } catch {
            linkFailed(device: device, error, mqtt: &mqtt)
        }
    }

    /// Sends a fetch on an open link that has none outstanding.
    mutating func ask(slot: Int, mqtt: inout MQTTClient) {
        guard let l = links[slot], links[channel: slot].state == .open else { return }
        tell(slot: slot)
        guard l.asked == nil else { return }
        // The newest sequence any waiting request heard: the device answers it or newer.
        var sequence: UInt16?
        for p in pending { if let p, p.device == l.device { sequence = sequence.map { Self.newer(p.sequence, $0) } ?? p.sequence } }
        guard let sequence else { return }
        var w = ByteWriter(sendScratch)
        do throws(WireError) { try LinkMessage.encodeFetch(sequence: sequence, into: &w) } catch {
            preconditionFailure("a fetch message fits 128 bytes")
        }
        do throws(LinkError) {
            // A seqpacket socket with an empty send buffer takes 3 bytes; if it does not, the
            // link is stuck and the request times out.
            if try links[channel: slot].send(w.written) { l.asked = sequence }
        } catch {
            let device = l.device
            links.close(slot)
            linkFailed(device: device, error, mqtt: &mqtt)
        }
    }

    mutating func linkFailed(device: UInt64, _ error: LinkError, mqtt: inout MQTTClient) {
        for i in tells.indices where tells[i]?.device == device { dropTell(i) }
        counters.linkFailures &+= 1
        lastLinkError = "\(ActivityBeacon.deviceIDText(device)): \(error)"
        // The receive buffer is relay.payload-max + 3 bytes, exactly the largest payload message
        // (docs/protocol.md §5.1), so a payload over the limit arrives as an SDU the channel
        // cannot take: that is the device's `too-large` (docs/relay.md §3), not a broken link.
        let status: FetchStatus = if case .tooLarge = error { .tooLarge } else { .unreachable }
        answerAll(device: device, status, detail: error.description, mqtt: &mqtt)
    }

    /// Appends each link's descriptor and events to `fds`; `poll(fds:…)` takes them back in
    /// the same order.
    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        links.pollDescriptors(into: &fds)
    }

    /// The loop's one verb for the relay (docs/architecture.md §2): the links' readiness, then
    /// what is due.
    public mutating func serve(_ ready: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient) {
        if !ready.isEmpty { poll(fds: ready, now: now, mqtt: &mqtt) }
        if let due = nextDeadline, due <= now { tick(now: now, mqtt: &mqtt) }
    }

    /// Handles the links' readiness (`fds` is what `pollDescriptors` appended, after poll()):
    /// each link's messages, one at a time, then what they decided for it.
    public mutating func poll(fds: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient) {
        for (k, fd) in fds.enumerated() {
            guard let slot = links.ready(k, fd), let l = links[slot] else { continue }
            let wasOpen = links[channel: slot].state == .open
            let ready = LinkReadiness(fd)
            links[channel: slot].ready(readable: ready.readable, writable: ready.writable, buffer: receive)
            // A message never closes its own link (`received`): the next is read after it.
            while let sdu = links[channel: slot].next(into: receive) {
                received(sdu, slot: slot, now: now, mqtt: &mqtt)
            }
            switch links[channel: slot].state {
            case .open:
                if !wasOpen || l.asked == nil { ask(slot: slot, mqtt: &mqtt) }
            case .closed(let error):
                let device = l.device
                links.close(slot)
                // A link closed with requests waiting failed them; closed idle, it just ends.
                if hasWork(device) { linkFailed(device: device, error ?? .closed, mqtt: &mqtt) }
            case .connecting:
                break
            }
        }
        serveWaiting(now: now, mqtt: &mqtt)
    }

    /// One SDU from a link (docs/protocol.md §5.2).
    mutating func received(_ sdu: UnsafeRawBufferPointer, slot: Int, now: Instant, mqtt: inout MQTTClient) {
        guard let l = links[slot] else { return }
        let device = l.device
        let message: LinkMessage
        do throws(WireError) {
            message = try LinkMessage.decode(sdu, payloadMax: config.payloadMax)
        } catch {
            drops.count(error)
            if case .malformed(_, let reason) = error, reason == .linkTooLarge {
                answerAll(device: device, .tooLarge, detail: "the payload is larger than relay.payload-max (\(config.payloadMax) bytes)", mqtt: &mqtt)
            } else {
                answerAll(device: device, .unreachable, detail: "the device sent a malformed message: \(error)", mqtt: &mqtt)
            }
            l.asked = nil
            l.idleSince = now
            return
        }
        switch message.type {
        case .payload:
            let sequence = UInt16(truncatingIfNeeded: message.number)
            let body = UnsafeRawBufferPointer(rebasing: sdu[message.body])
            store(device: device, sequence: sequence, body)
            // Only the requests it satisfies (docs/relay.md §3: `ok` is for the sequence heard or
            // newer); one that heard a newer beacon meanwhile is asked for again (`poll` re-asks
            // once `asked` is cleared below).
            for i in pending.indices where pending[i]?.device == device {
                let heard = pending[i]!.sequence
                guard heard == sequence || Self.newer(sequence, heard) == sequence else { continue }
                guard let route = take(i).route else {
                    answerOwn(device: device, sequence: sequence, .ok, payload: body)
                    continue
                }
                if sendPayload(body, sequence: sequence, device: device, route: route, mqtt: &mqtt),
                   let at = route.continuedAt {
                    continued(device: device, sequence: sequence, at: at, address: l.address, onItsLink: true, now: now,
                              mqtt: &mqtt)
                }
            }
        case .fetchRefused:
            let sequence = UInt16(truncatingIfNeeded: message.number)
            switch FetchRefusal(rawValue: message.reason) {
            case .notCurrent:
                forget(device: device)
                answerAll(device: device, .unknownDevice, detail: "the device says activity \(sequence) is no longer current", mqtt: &mqtt)
            case .tooLarge:
                answerAll(device: device, .tooLarge, detail: "the device says its payload does not fit the link's MTU", mqtt: &mqtt)
            case .refused, nil:
                answerAll(device: device, .unreachable, detail: "the device refused the fetch", mqtt: &mqtt)
            }
        default:
            // Stream frames and was-continued do not come back on a fetch link.
            drops.count("link-unexpected")
            return
        }
        l.asked = nil
        l.idleSince = now
    }

    // MARK: time

    /// The nearest deadline: a request's, or an idle link's close.
    public var nextDeadline: Instant? {
        guard pendingCount > 0 || openLinks > 0 || tellCount > 0 else { return nil }
        var next: Instant?
        func consider(_ d: Instant) { if next.map({ d < $0 }) ?? true { next = d } }
        for p in pending { if let p { consider(p.deadline) } }
        for t in tells { if let t { consider(t.deadline) } }
        for i in links.indices { if let l = links[i], !hasWork(l.device) { consider(l.idleSince + config.linkIdle) } }
        return next
    }

    /// Answers what timed out, closes idle links, and gives waiting requests a link.
    public mutating func tick(now: Instant, mqtt: inout MQTTClient) {
        for i in tells.indices where tells[i].map({ $0.deadline <= now }) ?? false { dropTell(i) }
        for i in pending.indices {
            guard let p = pending[i], p.deadline <= now else { continue }
            answer(slot: i, .timeout, detail: "the device did not answer within relay.fetch-timeout (\(config.fetchTimeout.secondsDescription))", mqtt: &mqtt)
            // The link let its last request time out (silent, or never opened): close it. A fetch
            // link carries one fetch at a time, so only a fresh link asks the device again, and
            // its slot may be what another device's request is waiting for.
            if !hasWork(p.device), let s = links.first(where: { $0.device == p.device }) { links.close(s) }
        }
        for i in links.indices {
            guard let l = links[i] else { continue }
            if !hasWork(l.device), l.idleSince + config.linkIdle <= now { links.close(i) }
        }
        serveWaiting(now: now, mqtt: &mqtt)
    }

    /// Requests that found every link busy (docs/relay.md §5: they wait for one, within their
    /// deadline): opens their device's link if a slot is free or a link has nothing to do.
    mutating func serveWaiting(now: Instant, mqtt: inout MQTTClient) {
        for i in pending.indices {
            guard let p = pending[i], links.first(where: { $0.device == p.device }) == nil else { continue }
            work(device: p.device, address: p.address, now: now, mqtt: &mqtt)
        }
        for i in tells.indices {
            guard let t = tells[i], links.first(where: { $0.device == t.device }) == nil else { continue }
            work(device: t.device, address: t.address, now: now, mqtt: &mqtt)
        }
    }

    // MARK: was-continued (docs/relay.md §3, protocol.md §5.2)

    /// A payload went to a requester that continues the activity `at` somewhere: the event is
    /// published for automations, and the device is told over its link. `onItsLink`: the
    /// payload came over the device's link, which is open: `poll` asks it once its messages
    /// are read, and that sends the message.
    mutating func continued(device: UInt64, sequence: UInt16, at: String, address: LinkAddress,
                            onItsLink: Bool = false, now: Instant, mqtt: inout MQTTClient) {
        counters.continued &+= 1
        if let topics {
            var w = JSONWriter(answerScratch)
            do throws(WireError) {
                try w.beginObject()
                try w.key("device"); try w.string(ActivityBeacon.deviceIDText(device))
                try w.key("seq"); try w.int(Int64(sequence))
                try w.key("at"); try w.string(at)
                try w.key("gateway"); try w.string(gatewayID)
                try w.key("room"); try w.string(room)
                try w.endObject()
            } catch {
                preconditionFailure("a continued event fits \(answerScratch.count) bytes")
            }
            // QoS 1, not retained: an event, for whoever listens now.
            do throws(MQTTError) {
                try mqtt.publish(topic: topics.continued(device), payload: w.written, qos: 1,
                                 retain: false, properties: MQTTProperties(contentType: "application/json"))
            } catch {
                counters.answersLost &+= 1
            }
        }
        guard link != nil else { return }
        guard let free = tells.firstIndex(where: { $0 == nil }) else { return drops.count("continued-full") }
        tells[free] = Tell(device: device, sequence: sequence, at: at, address: address, deadline: now + config.fetchTimeout)
        tellCount += 1
        if !onItsLink { work(device: device, address: address, now: now, mqtt: &mqtt) }
    }

    /// Sends every `continued` owed to the device of an open link.
    mutating func tell(slot: Int) {
        guard tellCount > 0, let l = links[slot], links[channel: slot].state == .open else { return }
        for i in tells.indices {
            guard let t = tells[i], t.device == l.device else { continue }
            var w = ByteWriter(sendScratch)
            do throws(WireError) { try LinkMessage.encodeContinued(sequence: t.sequence, room: t.at, into: &w) } catch {
                preconditionFailure("a continued message of 64 bytes fits 128")
            }
            do throws(LinkError) {
                guard try links[channel: slot].send(w.written) else { return }
            } catch {
                return
            }
            tells[i] = nil
            tellCount -= 1
            counters.continuedTold &+= 1
        }
    }

    mutating func dropTell(_ i: Int) {
        guard tells[i] != nil else { return }
        tells[i] = nil
        tellCount -= 1
        drops.count("continued-undelivered")
    }

    // MARK: answers (docs/relay.md §3)

    mutating func answerAll(device: UInt64, _ status: FetchStatus, detail: String, mqtt: inout MQTTClient) {
        for i in pending.indices where pending[i]?.device == device {
            answer(slot: i, status, detail: detail, mqtt: &mqtt)
        }
    }

    mutating func answer(slot: Int, _ status: FetchStatus, detail: String, mqtt: inout MQTTClient) {
        guard pending[slot] != nil else { return }
        let p = take(slot)
        guard let route = p.route else { return answerOwn(device: p.device, sequence: p.sequence, status, payload: nil) }
        send(status, device: p.device, detail: detail, route: route, mqtt: &mqtt)
    }

    /// The only way a request leaves `pending`; each caller answers it at once.
    mutating func take(_ slot: Int) -> Pending {
        let p = pending[slot]!  // Proof: every caller checked the slot is taken.
        pending[slot] = nil
        pendingCount -= 1
        return p
    }

    /// The payload as the route asks for it; false when an error went instead (it cannot be
    /// rendered, or does not fit).
    @discardableResult
    mutating func sendPayload(_ payload: UnsafeRawBufferPointer, sequence: UInt16, device: UInt64, route: FetchRoute,
                              mqtt: inout MQTTClient) -> Bool {
        var w = JSONWriter(answerScratch)
        var body = payload
        var contentType = "application/cbor"
        do throws(WireError) {
            if route.format == .json {
                let view: ActivityPayloadView
                do throws(WireError) {
                    view = try ActivityPayload.validate(payload, limits: PayloadLimits(maxBytes: config.payloadMax))
                } catch {
                    send(.badRequest, device: device,
                         detail: "the payload cannot be rendered as JSON (sealed, or not a v1 payload: \(error)); ask for cbor",
                         route: route, mqtt: &mqtt)
                    return false
                }
                if route.usesProperties {
                    try view.renderJSON(into: &w)
                } else {
                    try envelope(.ok, device: device, route: route, into: &w) { w throws(WireError) in
                        try w.key("seq"); try w.int(Int64(sequence))
                        try w.key("payload"); try view.renderJSON(into: &w)
                    }
                }
                body = w.written
                contentType = "application/json"
            } else if !route.usesProperties {
                try envelope(.ok, device: device, route: route, into: &w) { w throws(WireError) in
                    try w.key("seq"); try w.int(Int64(sequence))
                    try w.key("cbor"); try w.base64(payload)
                }
                body = w.written
                contentType = "application/json"
            }
        } catch {
            send(.tooLarge, device: device, detail: "the answer does not fit \(answerScratch.count) bytes",
                 route: route, mqtt: &mqtt)
            return false
        }
        publish(.ok, body, contentType: contentType, sequence: sequence, device: device, route: route, mqtt: &mqtt)
        return true
    }

    /// An error answer: `{"status":"timeout","device":"5a…","gateway":"hall","detail":"…"}`,
    /// plus the correlation in the v3.1.1 envelope.
    mutating func send(_ status: FetchStatus, device: UInt64?, detail: String, route: FetchRoute, mqtt: inout MQTTClient) {
        precondition(status != .ok, "ok answers carry a payload")
        var w = JSONWriter(answerScratch)
        do throws(WireError) {
            try envelope(status, device: device, route: route, into: &w) { w throws(WireError) in
                try w.key("detail"); try w.string(detail)
            }
        } catch {
            preconditionFailure("an error answer fits \(answerScratch.count) bytes: \(error)")
        }
        publish(status, w.written, contentType: "application/json", sequence: nil, device: device, route: route, mqtt: &mqtt)
    }

    func envelope(_ status: FetchStatus, device: UInt64?, route: FetchRoute, into w: inout JSONWriter,
                  _ fields: (inout JSONWriter) throws(WireError) -> Void) throws(WireError) {
        try w.beginObject()
        try w.key("status"); try w.string(status.name)
        try w.key("device")
        if let device { try w.string(ActivityBeacon.deviceIDText(device)) } else { try w.null() }
        try w.key("gateway"); try w.string(gatewayID)
        if !route.usesProperties {
            try w.key("correlation")
            var hex = ""
            for b in route.correlation { hex += Hex.text(b, digits: 2) }
            try w.string(hex)
        }
        try fields(&w)
        try w.endObject()
    }

    mutating func publish(_ status: FetchStatus, _ body: UnsafeRawBufferPointer, contentType: String, sequence: UInt16?,
                          device: UInt64?, route: FetchRoute, mqtt: inout MQTTClient) {
        counters.answers[status.rawValue] &+= 1
        var properties: MQTTProperties?
        if route.usesProperties {
            var user = [MQTTUserProperty("status", status.name), MQTTUserProperty("gateway", gatewayID)]
            if let device { user.append(MQTTUserProperty("device", ActivityBeacon.deviceIDText(device))) }
            if let sequence { user.append(MQTTUserProperty("seq", String(sequence))) }
            properties = MQTTProperties(contentType: contentType,
                                        correlationData: route.correlation.isEmpty ? nil : route.correlation,
                                        userProperties: user)
        }
        do throws(MQTTError) {
            // QoS 1, not retained: an answer is for one requester, once (docs/relay.md §3).
            try mqtt.publish(topic: route.responseTopic, payload: body, qos: 1, retain: false, properties: properties)
        } catch {
            counters.answersLost &+= 1
        }
    }

    // MARK: stats (docs/mqtt.md, the stats topic's `relay`)

    /// This relay's members of the stats topic's `relay` object, in the order they are
    /// published: the link, the table's fill, the links, the answers by status, the drops.
    /// The caller writes the key and the braces around them.
    public func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.key("link"); try w.string(link?.description ?? "none")
        try w.key("pending"); try w.int(Int64(pendingCount))
        try w.key("links_open"); try w.int(Int64(openLinks))
        try w.key("link_opens"); try w.int(Int64(counters.linkOpens))
        try w.key("link_failures"); try w.int(Int64(counters.linkFailures))
        try w.key("cache_hits"); try w.int(Int64(counters.cacheHits))
        try w.key("answers"); try w.beginObject()
        for status in FetchStatus.allCases { try w.key(status.name); try w.int(Int64(counters.answers[status.rawValue])) }
        try w.endObject()
        try w.key("answers_lost"); try w.int(Int64(counters.answersLost))
        try w.key("continued"); try w.int(Int64(counters.continued))
        try w.key("continued_told"); try w.int(Int64(counters.continuedTold))
        try w.key("drops"); try w.beginObject()
        for d in drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
    }

    // MARK: cache

    func cached(device: UInt64, atLeast sequence: UInt16) -> Int? {
        for (i, e) in cache.enumerated() {
            if let e, e.device == device, e.sequence == sequence || Self.newer(e.sequence, sequence) == e.sequence {
                return i
            }
        }
        return nil
    }

    /// Keeps the newest payload per device, in the least recently used entry.
    mutating func store(device: UInt64, sequence: UInt16, _ bytes: UnsafeRawBufferPointer) {
        guard bytes.count <= config.payloadMax, !cache.isEmpty else { return }
        // A late answer for an older sequence does not replace a newer payload.
        if let held = cache.first(where: { $0?.device == device }) ?? nil, held.sequence != sequence,
           Self.newer(held.sequence, sequence) == held.sequence { return }
        var slot = cache.firstIndex(where: { $0?.device == device }) ?? cache.firstIndex(where: { $0 == nil })
        if slot == nil {
            var oldest = 0
            for (i, e) in cache.enumerated() where e!.lastUsed < cache[oldest]!.lastUsed { oldest = i }
            slot = oldest
        }
        let i = slot!
        useCounter &+= 1
        cache[i] = CacheEntry(device: device, sequence: sequence, count: bytes.count, lastUsed: useCounter)
        UnsafeMutableRawBufferPointer(rebasing: cacheBytes[i * config.payloadMax ..< i * config.payloadMax + bytes.count])
            .copyMemory(from: bytes)
    }

    func hasWork(_ device: UInt64) -> Bool {
        pending.contains { $0?.device == device } || tellCount > 0 && tells.contains { $0?.device == device }
    }

    /// The later of two 16-bit sequences (RFC 1982, docs/protocol.md §2.3).
    static func newer(_ a: UInt16, _ b: UInt16) -> UInt16 { SerialOrder(a, comparedTo: b) == .newer ? a : b }
}

/// The answer to one of the gateway's own fetches (`FetchRelay.fetchOwn`).
public struct OwnFetchAnswer: Sendable, Equatable {
    public var device: UInt64
    /// The sequence asked for, or the payload's (the same or newer) when `ok`.
    public var sequence: UInt16
    public var status: FetchStatus
    /// What the payload names; nil when not `ok`, or when it is no v1 payload the gateway can
    /// read (sealed for a keyed group, docs/security.md §5).
    public var described: ActivityDescription?
    public init(device: UInt64, sequence: UInt16, status: FetchStatus, described: ActivityDescription? = nil) {
        self.device = device; self.sequence = sequence; self.status = status; self.described = described
    }
}

/// What a payload says the activity is (docs/mqtt.md §2): type, title, webpage URL. Bounded so
/// the activity message stays small: a title is cut to `maxTitleBytes` at a character's edge,
/// a type or URL longer than its cap is left out.
public struct ActivityDescription: Sendable, Equatable {
    public var type: String?
    public var title: String?
    public var webpageURL: String?
    /// Home Assistant keeps a state of at most 255 characters.
    public static let maxTitleBytes = 255
    public static let maxTypeBytes = 255
    public static let maxURLBytes = 1024

    public init(type: String?, title: String?, webpageURL: String?) {
        self.type = type; self.title = title; self.webpageURL = webpageURL
    }

    /// nil when the bytes are no valid v1 payload (a sealed one is not).
    public static func read(_ payload: UnsafeRawBufferPointer, limits: PayloadLimits) -> ActivityDescription? {
        let view: ActivityPayloadView
        do throws(WireError) { view = try ActivityPayload.validate(payload, limits: limits) } catch { return nil }
        let type = view.activityType.count <= maxTypeBytes ? String(decoding: view.activityType, as: UTF8.self) : nil
        let url = view.webpageURL.flatMap { $0.count <= maxURLBytes ? String(decoding: $0, as: UTF8.self) : nil }
        return ActivityDescription(type: type, title: view.title.map(cut), webpageURL: url)
    }

    /// At most `maxTitleBytes` of valid UTF-8 (the validator checked it), cut before a
    /// character that would not fit.
    static func cut(_ p: UnsafeRawBufferPointer) -> String {
        guard p.count > maxTitleBytes else { return String(decoding: p, as: UTF8.self) }
        var end = maxTitleBytes
        // A continuation byte is 10xxxxxx: step back to the start of its character.
        while end > 0, p[end] & 0xC0 == 0x80 { end -= 1 }
        return String(decoding: UnsafeRawBufferPointer(rebasing: p[..<end]), as: UTF8.self)
    }
}

/// The loop drives the relay's links as one part (docs/architecture.md "The loop").
extension FetchRelay: LoopPart {
    /// One per link slot open to a device: free slots are not polled.
    public var descriptorLimit: Int { links.capacity }
}
