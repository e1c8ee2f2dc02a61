// Links that continuing devices (phones, laptops in this room) open to the activities this
// gateway re-advertises (docs/relay.md §9). On such a link this gateway plays the device:
// it speaks docs/protocol.md §5 to the phone, and relays through the broker to the gateway
// that owns the activity, as any MQTT requester would.
//
//   phone --fetch(seq)--> [request on <prefix>/fetch/<device>] --> owner
//   phone <--payload(seq, bytes) / fetch-refused-- [its answer on <prefix>/answers/<gw>/<link>]
//   phone --open--> StreamRelay.bridge (docs/relay.md §7.5): the stream goes through the broker
//
// A fetch from a phone is a continuation: the request carries `continue` with this room's name,
// so the owner tells the originating device and publishes was-continued (relay.md §3), as
// Handoff tells the Mac when the iPhone takes its activity.
//
// Capacity is fixed at start: `relay.links` links at once; one more is hung up and counted.

import BatonLibc
import BatonMQTT
import BatonWire
import CLibc

public struct ContinuingCounters: Sendable, Equatable {
    /// Links phones opened (accepted), and refused for want of a slot.
    public var links = 0
    public var refused = 0
    /// Fetches asked by phones, answered with the payload, and answered fetch-refused
    /// (including the ones the owner did not answer in time). An answer counts when it is sent
    /// or waits for the link's room; one replaced by a newer answer while waiting counts too.
    public var fetches = 0
    public var payloads = 0
    public var refusals = 0
    /// Stream links handed to the stream relay.
    public var streams = 0
    public init() {}
}

public struct ContinuingLinks: ~Copyable {
    public let config: RelayConfig
    /// Each link's answers come to `topics.answer(link:)` with its serial.
    let topics: Topics
    /// The body of every fetch after the route: `"format":"cbor","continue":"<room>"`.
    let requestTail: String

    /// What a phone's link is doing (its channel is the pool's). One per slot, made at start
    /// and reset for each link the slot holds.
    final class Link {
        var device: UInt64 = 0
        /// The pool's serial of the link: its answers come to `topics.answer(link:)` with it.
        var serial: UInt64 = 0
        /// The fetch sent for the phone and not yet answered.
        var asked: (sequence: UInt16, correlation: [UInt8], deadline: Instant)?
        var idleSince = Instant(nanoseconds: 0)
        var messages: UInt64 = 0
        /// The answer the link had no room for (no credits): sent on POLLOUT, before anything else.
        var owed: [UInt8]?

        func reset(device: UInt64, serial: UInt64, now: Instant) {
            self.device = device; self.serial = serial; asked = nil; idleSince = now; messages = 0; owed = nil
        }
    }
    var links: LinkPool<Link>
    var correlations: UInt64 = 0
    /// One receive buffer for every link, and one for what goes to a phone: a payload message
    /// (3 bytes of header and `relay.payload-max`).
    let receive: UnsafeMutableRawBufferPointer
    let sendScratch: UnsafeMutableRawBufferPointer

    public private(set) var counters = ContinuingCounters()
    /// Link messages and answers dropped, by reason (stats `relay.readvertise.drops`).
    public private(set) var drops = DropCounts()
    public var openLinks: Int { links.count }

    /// `room` is what the owner is told the activity was continued at.
    public init(config: RelayConfig, topics: Topics, room: String) {
        self.config = config
        self.topics = topics
        // The request body allows no escapes (docs/relay.md §2), so a room name is said without
        // the characters that would need one, cut to 64 bytes.
        var at = ""
        for c in room.unicodeScalars where c != "\"" && c != "\\" && c.value >= 0x20 {
            guard at.utf8.count + String(c).utf8.count <= LinkMessage.maxRoomBytes else { break }
            at.unicodeScalars.append(c)
        }
        requestTail = at.isEmpty ? #""format":"cbor"}"# : #""format":"cbor","continue":"\#(at)"}"#
        // Random starts: an answer meant for a link of an earlier run (late, after a restart)
        // matches no link of this one.
        var random = SystemRandomNumberGenerator()
        links = LinkPool(capacity: config.links, firstSerial: random.next() >> 16) { _ in Link() }
        correlations = random.next()
        receive = .allocate(byteCount: config.payloadMax + 3, alignment: 8)
        sendScratch = .allocate(byteCount: config.payloadMax + 3, alignment: 8)
    }

    deinit {
        receive.deallocate()
        sendScratch.deallocate()
    }

    /// Where the answers come: subscribe to this while the gateway re-advertises.
    public var answerPattern: String { topics.answerPattern }

    /// A link a phone opened to the re-advertised activity of `device`. False when every slot
    /// is taken: the link is hung up and counted.
    @discardableResult
    public mutating func adopt(_ channel: consuming LinkChannel, device: UInt64, now: Instant) -> Bool {
        guard !links.isFull else {
            channel.close()
            counters.refused &+= 1
            drops.count("continuing-full")
            return false
        }
        let (slot, link) = links.add(channel)
        // Proof: the slot was just taken.
        link.reset(device: device, serial: links.serial(slot)!, now: now)
        counters.links &+= 1
        return true
    }

    /// A phone connected to a slot that just left the air: hung up, and counted.
    public mutating func refusedGone() {
        counters.refused &+= 1
        drops.count("continuing-gone")
    }

    // MARK: the phones' messages

    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        links.pollDescriptors(into: &fds) { $0.owed != nil }
    }

    /// What a phone's message decides for its link.
    enum Next {
        /// Go on: read the next message.
        case more
        /// A stream link (its first message was open): to the stream relay once read.
        case stream(window: UInt16, maxData: UInt16)
        /// It broke protocol.md §5: hung up.
        case hangUp
    }

    /// The loop's one verb for the phones' links (docs/architecture.md §2): their readiness
    /// (an open goes to `streams`), then what is due.
    public mutating func serve(_ ready: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient, streams: inout StreamRelay) {
        if !ready.isEmpty { poll(fds: ready, now: now, mqtt: &mqtt, streams: &streams) }
        if let due = nextDeadline, due <= now { tick(now: now) }
    }

    /// Handles the links' readiness; a link whose first message is an open goes to `streams`.
    public mutating func poll(fds: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient,
                              streams: inout StreamRelay) {
        for (k, fd) in fds.enumerated() {
            guard let s = links.ready(k, fd), let l = links[s] else { continue }
            let ready = LinkReadiness(fd)
            links[channel: s].ready(readable: ready.readable, writable: ready.writable, buffer: receive)
            var decided = Next.more
            while let sdu = links[channel: s].next(into: receive) {
                decided = received(sdu, link: l, now: now, mqtt: &mqtt)
                guard case .more = decided else { break }
            }
            if ready.writable, let owed = l.owed {
                let sent: Bool = owed.withUnsafeBytes { send(s, $0) }
                if sent { l.owed = nil }
            }
            switch decided {
            case .more:
                if case .closed = links[channel: s].state { links.close(s) }
            case .hangUp:
                // What else the phone sent this turn is read and dropped first: it sees an end,
                // not a reset.
                var channel = links.remove(s)
                channel.hangUp(buffer: receive)
            case .stream(let window, let maxData):
                // A stream link (protocol.md §5.3): the stream relay carries it from here. What
                // else the phone sent with its open is not for this gateway's fetches.
                links[channel: s].discardReady(buffer: receive)
                var channel = links.remove(s)
                // A phone that said open and hung up in the same breath wants no stream: the
                // owner is not asked to wake the device for it.
                guard channel.state == .open, window > 0, maxData > 0 else {
                    channel.close()
                    drops.count("continuing-gone-before-open")
                    continue
                }
                counters.streams &+= 1
                // The phone is the continuing endpoint; this gateway speaks for it on the
                // broker under a stream id of its own (docs/relay.md §7.1, §7.5).
                let id = Self.streamID()
                streams.bridge(channel: channel, device: l.device, id: id, topics: topics.stream(id),
                               openTopic: topics.streamOpen(device: l.device, stream: id),
                               window: window, maxData: maxData, now: now, mqtt: &mqtt)
            }
        }
    }

    mutating func received(_ sdu: UnsafeRawBufferPointer, link l: Link, now: Instant, mqtt: inout MQTTClient) -> Next {
        l.messages &+= 1  // Proof: a link ends long before 2⁶⁴ messages.
        let message: LinkMessage
        do throws(WireError) { message = try LinkMessage.decode(sdu, payloadMax: config.payloadMax) } catch {
            drops.count(error)
            return .hangUp
        }
        switch message.type {
        case .fetch:
            ask(l, sequence: UInt16(truncatingIfNeeded: message.number), now: now, mqtt: &mqtt)
            return .more
        case .open where l.messages == 1:
            // Only as a link's first message: a fetch link never turns into a stream link.
            return .stream(window: message.window, maxData: message.maxData)
        default:
            // A phone sends fetches and streams; anything else breaks protocol.md §5.
            drops.count("continuing-unexpected")
            return .hangUp
        }
    }

    /// Asks the owner for the phone: the v5 route in properties and the v3.1.1 route in the body
    /// (docs/relay.md §1–2), as `baton fetch` does, so either kind of broker connection works.
    mutating func ask(_ l: Link, sequence: UInt16, now: Instant, mqtt: inout MQTTClient) {
        correlations &+= 1  // Wraps from a random start: harmless, it only has to differ from the last.
        // A second fetch before the first was answered supersedes it: the owner answers the
        // first `cancelled` (same response topic), which no longer matches and is dropped.
        let correlation = (0..<8).map { UInt8(truncatingIfNeeded: correlations >> (8 * UInt64($0))) }
        l.asked = (sequence, correlation, now + config.fetchTimeout + Self.deliveryAllowance)
        counters.fetches &+= 1
        let topic = topics.answer(link: l.serial)
        let hex = correlation.map { Hex.text($0, digits: 2) }.joined()
        let body = #"{"response_topic":"\#(topic)","correlation":"\#(hex)","#+requestTail
        let fetchTopic = topics.fetch(l.device)
        // Array.withUnsafeBytes rethrows untyped: a failure comes out as a value.
        let sent: Bool = Array(body.utf8).withUnsafeBytes { b in
            do throws(MQTTError) {
                try mqtt.publish(topic: fetchTopic, payload: b, qos: 1, retain: false,
                                 properties: MQTTProperties(responseTopic: topic, correlationData: correlation))
                return true
            } catch {
                return false
            }
        }
        // No broker now: the phone is told at the deadline, as for an owner that never answers.
        if !sent { drops.count("continuing-not-sent") }
    }

    /// The owner's answer takes the owner's deadline plus this for the broker's delivery.
    static var deliveryAllowance: Duration { .seconds(1) }

    // MARK: the owners' answers

    /// An answer on `topics.answer(link:)` (`InboundTopic.answer`; nil: not a number): its
    /// status (`ok` or a reason of docs/relay.md §3), the payload's sequence and bytes for `ok`.
    public mutating func answered(link serial: UInt64?, correlation: [UInt8], status: String, sequence: UInt16?,
                                  payload: [UInt8], now: Instant) {
        guard let serial, let s = links.slot(serial: serial), let l = links[s], let asked = l.asked else {
            return drops.count("continuing-answer-unknown")
        }
        guard correlation == asked.correlation else { return drops.count("continuing-answer-stale") }
        l.asked = nil
        l.idleSince = now
        if status == "ok", let sequence, !payload.isEmpty, payload.count <= config.payloadMax {
            var w = ByteWriter(sendScratch)
            let written: Bool = payload.withUnsafeBytes { p in
                do throws(WireError) { try LinkMessage.encodePayload(sequence: sequence, payload: p, into: &w) } catch {
                    return false
                }
                return true
            }
            if written, answer(s, w.written) {
                counters.payloads &+= 1
                return
            }
            // Larger than the phone's MTU: it is told so, as a device would (protocol.md §5.2).
            return refuse(s, .tooLarge, sequence: sequence)
        }
        // The owner's reasons in the device's words (protocol.md §5.2): gone, too large, or no.
        let reason: FetchRefusal = switch status {
        case "unknown-device": .notCurrent
        case "too-large", "ok": .tooLarge
        default: .refused
        }
        refuse(s, reason, sequence: sequence ?? asked.sequence)
    }

    mutating func refuse(_ s: Int, _ reason: FetchRefusal, sequence: UInt16) {
        var w = ByteWriter(sendScratch)
        do throws(WireError) { try LinkMessage.encodeFetchRefused(sequence: sequence, reason, into: &w) } catch {
            preconditionFailure("a fetch-refused message fits")
        }
        if answer(s, w.written) { counters.refusals &+= 1 }
    }

    /// One message to the phone; false when it could not go (the link is full or broken: the
    /// phone asks again or hangs up).
    mutating func send(_ s: Int, _ sdu: UnsafeRawBufferPointer) -> Bool {
        guard links[channel: s].state == .open else { return false }
        do throws(LinkError) { return try links[channel: s].send(sdu) } catch { return false }
    }

    /// An answer to the phone: now, or when the link has room again (POLLOUT); the phone asks
    /// one thing at a time, so one answer is owed at most. False: it cannot go at all (too
    /// large for the phone's MTU, or the link broke).
    mutating func answer(_ s: Int, _ sdu: UnsafeRawBufferPointer) -> Bool {
        // Proof: every caller found the slot taken.
        let l = links[s]!
        guard links[channel: s].state == .open else { return false }
        // One is owed already: this newer one takes its place (it answers the phone's newer
        // fetch), and goes when the link has room, not before it.
        if l.owed != nil {
            guard sdu.count <= links[channel: s].sendMTU else { return false }
            l.owed = Array(sdu)
            return true
        }
        do throws(LinkError) {
            if try links[channel: s].send(sdu) { return true }
        } catch {
            return false  // too large for the phone's MTU, or the link broke
        }
        // A newer answer replaces one still owed: it answers the phone's newer fetch.
        l.owed = Array(sdu)
        return true
    }

    // MARK: time

    public var nextDeadline: Instant? {
        guard openLinks > 0 else { return nil }
        var next: Instant?
        func consider(_ d: Instant) { if next.map({ d < $0 }) ?? true { next = d } }
        for s in links.indices {
            guard let l = links[s] else { continue }
            if let asked = l.asked { consider(asked.deadline) } else { consider(l.idleSince + config.linkIdle) }
        }
        return next
    }

    /// Tells phones whose fetch no owner answered in time, and hangs up idle links.
    public mutating func tick(now: Instant) {
        for s in links.indices {
            guard let l = links[s] else { continue }
            if let asked = l.asked {
                guard asked.deadline <= now else { continue }
                l.asked = nil
                l.idleSince = now
                drops.count("continuing-timeout")
                refuse(s, .refused, sequence: asked.sequence)
            } else if l.idleSince + config.linkIdle <= now {
                links.close(s)
            }
        }
    }

    /// Before a clean stop: every phone's link is hung up.
    public mutating func stop() {
        for s in links.indices { links.close(s) }
    }

    // MARK: stats (docs/mqtt.md, the stats topic's `relay.readvertise`)

    /// The phones' members of the stats topic's `relay.readvertise` object, in the order they
    /// are published (after the re-advertiser's own); the caller writes the braces around them.
    public func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.key("phone_links"); try w.int(Int64(counters.links))
        try w.key("phone_links_open"); try w.int(Int64(openLinks))
        try w.key("phone_links_refused"); try w.int(Int64(counters.refused))
        try w.key("phone_fetches"); try w.int(Int64(counters.fetches))
        try w.key("phone_payloads"); try w.int(Int64(counters.payloads))
        try w.key("phone_refusals"); try w.int(Int64(counters.refusals))
        try w.key("phone_streams"); try w.int(Int64(counters.streams))
    }

    /// The phones' drops, as members of `relay.readvertise.drops` (after the re-advertiser's).
    public func writeDrops(into w: inout JSONWriter) throws(WireError) {
        for d in drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
    }

    // MARK: names

    /// A stream id of docs/relay.md §7.1: 16 random hex digits, as `baton stream` picks.
    static func streamID() -> String {
        var random = SystemRandomNumberGenerator()
        return Hex.text(random.next() as UInt64, digits: 16)
    }
}

/// The loop drives the phones' links as one part (docs/architecture.md "The loop").
extension ContinuingLinks: LoopPart {
    /// One per link slot open to a phone: free slots are not polled.
    public var descriptorLimit: Int { links.capacity }
}
