// Continuation streams (docs/relay.md §7). A stream slot plays one of two roles:
//
// The carrier (§7.2–7.3): the owning gateway carries frames between a continuing endpoint on
// the broker and the originating device on a stream link it dialed.
//
//   endpoint --…/S/up-->   [in order only]                --link--> device
//   endpoint <--…/S/down-- [kept until acked; resent]    <--link-- device
//
// The bridge (§7.5): a gateway in another room speaks for a phone that opened a stream link to
// the activity it re-advertises. It is the endpoint on the broker and the device to the phone:
// the carrier mirrored, with the topics swapped.
//
//   phone --link--> [kept until acked; resent]  --…/S/up-->   the carrier
//   phone <--link-- [in order only]             <--…/S/down-- the carrier
//
// The link keeps order and loses nothing while it lives; the broker may lose messages (a
// restart without persistence). So either role forwards the broker's frames to the link
// strictly in order and lets the broker side resend what was lost, and keeps the link's frames
// until the broker side acknowledges them, resending them itself (nobody resends on a link).
// Acks pass through end to end, so the window is the reader's and a slow reader slows the
// writer (docs/protocol.md §5.3).
//
// Capacities are fixed at start: stream slots (both roles share them), and per slot the link's
// frames kept (window × max data) and the broker's frames waiting for the link. Who takes an
// open is the gateway's decision (docs/relay.md §4).

import BatonLibc
import BatonMQTT
import BatonWire
import CLibc

/// The topics of one stream (docs/relay.md §7.1), spelled by the gateway's topic layout.
public struct StreamTopics: Sendable, Equatable {
    public var up: String
    public var down: String
    public var gateway: String
    public init(up: String, down: String, gateway: String) { self.up = up; self.down = down; self.gateway = gateway }
}

public struct StreamCounters: Sendable, Equatable {
    /// Endpoints' opens this gateway carries (§7.2).
    public var opened = 0
    /// Phones' stream links this gateway bridged to the broker (§7.5), and of those, the ones
    /// given up because no gateway answered the open within 2 × relay.fetch-timeout.
    public var bridged = 0
    public var unanswered = 0
    /// Opens refused, by `StreamReason.rawValue` (busy, unreachable, protocol); a phone's link
    /// refused for want of a slot counts under busy too.
    public var refused = [Int](repeating: 0, count: 7)
    /// Streams that ended cleanly, and aborted (reset or error either way, link lost, idle).
    public var finished = 0
    public var aborted = 0
    /// Data frames towards the originating device (the ones `…/up` carries) and towards the
    /// continuing endpoint (`…/down`), whichever role forwarded them.
    public var framesUp = 0
    public var framesDown = 0
    /// Frames from the broker that waited for the link's credits instead of going at once.
    public var framesQueued = 0
    /// The link's frames published again (no ack in time, or after a reconnect).
    public var resent = 0
    /// Streams of offline gateways this one told their endpoints about (`gone`).
    public var goneForOthers = 0
    public init() {}
}

public struct StreamRelay: ~Copyable {
    public let config: RelayConfig
    public let link: AnyDeviceLink?
    let gatewayID: String

    /// Which end of the stream this gateway plays on the broker (see the top).
    enum Role: Equatable {
        /// Takes `…/S/up`, publishes `…/S/down`; the link goes to the device.
        case carrier
        /// Takes `…/S/down`, publishes `…/S/up`; the link comes from a phone.
        case bridge
    }

    /// The link side of a stream, in the order it goes (docs/protocol.md §5.3): each state comes
    /// only after the one before it, so `>=` reads "at least this far".
    enum LinkSide: Int, Comparable {
        /// The open has not reached the link yet (a bridge waits for the carrier's answer).
        case unopened
        /// The open went to the link: frames flow.
        case open
        /// The broker side's close has been passed to the link.
        case closeSent
        /// The link side hung up after both closes (§5.3): what is left is the broker side's
        /// acks of its last frames, which the gateway still resends.
        case hungUp
        static func < (a: LinkSide, b: LinkSide) -> Bool { a.rawValue < b.rawValue }
    }

    /// A stream and what it is doing (its link's channel is the pool's). One per slot, made at
    /// start with the slot's share of the frame buffers, and reset for each stream it holds.
    final class Slot {
        var role = Role.carrier
        var id = ""
        var device: UInt64 = 0
        var topics = StreamTopics(up: "", down: "", gateway: "")
        /// The link side's frames, kept until the broker side acknowledges them.
        var toBroker: StreamSender
        /// The broker side's frames, taken in order.
        var toLink = StreamReceiver()
        /// The broker side's frames taken in order that the link had no room for yet.
        var linkQueue: LinkQueue
        /// The open the link side is told, clamped to what the gateway keeps: the endpoint's
        /// (carrier, known at once), the carrier's (bridge, nil until it answered).
        var linkOpen: (window: UInt16, maxData: UInt16)?
        /// How far the link side has got: each step needs the one before it.
        var linkSide = LinkSide.unopened
        /// The open the broker side is told, clamped likewise: the device's (carrier, nil until
        /// the device answered), the phone's (bridge, known at once).
        var brokerOpen: (window: UInt16, maxData: UInt16)?
        /// The link side's last ack (published again for a duplicate).
        var linkAck: (next: UInt32, window: UInt16)?
        /// The broker side's newest ack that the link had no room for (acks are cumulative: the
        /// newest says everything). It goes on POLLOUT; a link never resends, so one dropped
        /// here could leave the link side waiting for a window that already opened.
        var ackForLink: (next: UInt32, window: UInt16)?
        var lastProgress = Instant(nanoseconds: 0)
        var lastActivity = Instant(nanoseconds: 0)
        /// Bridge: `<prefix>/stream/<device>/S`, where the open goes again every
        /// relay.stream-retry until the carrier answers, and when the bridge gives up.
        var openTopic: String?
        var openAgainAt = Instant(nanoseconds: 0)
        var giveUpAt = Instant(nanoseconds: 0)

        init(frames: UnsafeMutableRawBufferPointer, keep: Int, keepMaxData: Int, queueFrames: UnsafeMutableRawBufferPointer) {
            toBroker = StreamSender(storage: frames, capacity: keep, maxData: keepMaxData)
            linkQueue = LinkQueue(storage: queueFrames, capacity: keep, maxFrame: keepMaxData + LinkMessage.dataHeaderBytes)
        }

        func reset(role: Role, id: String, device: UInt64, topics: StreamTopics, openTopic: String?,
                   linkOpen: (window: UInt16, maxData: UInt16)?, brokerOpen: (window: UInt16, maxData: UInt16)?,
                   now: Instant, openAgainAt: Instant, giveUpAt: Instant) {
            self.role = role; self.id = id; self.device = device; self.topics = topics; self.openTopic = openTopic
            toBroker.reset()
            if let linkOpen { toBroker.peerOpened(window: linkOpen.window, maxData: linkOpen.maxData) }
            toLink = StreamReceiver()
            linkQueue.reset()
            self.linkOpen = linkOpen; self.brokerOpen = brokerOpen
            linkSide = .unopened; linkAck = nil; ackForLink = nil
            lastProgress = now; lastActivity = now
            self.openAgainAt = openAgainAt; self.giveUpAt = giveUpAt
        }

        /// `…/S/up` for the carrier, `…/S/down` for the bridge: what this slot subscribes to.
        var brokerIn: String { role == .carrier ? topics.up : topics.down }
        /// The other one: where the link side's frames go.
        var brokerOut: String { role == .carrier ? topics.down : topics.up }
        /// A bridge whose open no carrier has answered yet.
        var awaitsAnswer: Bool { role == .bridge && linkOpen == nil }
        /// Who is on each side, for the details of error frames.
        var linkName: String { role == .carrier ? "the device" : "the phone" }
        var brokerName: String { role == .carrier ? "the endpoint" : "the carrying gateway" }
    }
    /// The streams, each with its link.
    var links: LinkPool<Slot>
    let receive: UnsafeMutableRawBufferPointer
    let frameScratch: UnsafeMutableRawBufferPointer
    /// Every slot's kept frames (window × max data each), taken once at start
    /// (docs/config.md `relay`): a stream opening allocates no frame buffer.
    let frames: UnsafeMutableRawBufferPointer
    /// Every slot's queue of the broker side's frames waiting for the link, also taken at start.
    let queueFrames: UnsafeMutableRawBufferPointer

    /// The stream directory (docs/relay.md §7.3): every stream of the building and the gateway
    /// carrying it, from `<prefix>/streams/+/gateway`, so the first online gateway can tell the
    /// endpoints of a gateway that died. Only what gateways write is taken (`carried`). Each
    /// carrier has at most `directoryPerCarrier` entries, and only a gateway whose status is
    /// online becomes a carrier, of which a building has at most rooms.gateways (RoomOwnership
    /// registers no more); so the directory holds at most relay.streams × rooms.gateways.
    var claims: [String: Claim] = [:]
    /// Entries per carrier, so the full rule needs no scan until it fires.
    var claimsPerCarrier: [String: Int] = [:]
    /// Stamps claims in arrival order: the full rule forgets a carrier's oldest.
    var claimOrder: UInt64 = 0
    /// When the full rule was last logged (at most once a minute: junk can make it fire often).
    var fullLoggedAt: Instant?
    public let directoryPerCarrier: Int

    struct Claim {
        var carrier: String
        var order: UInt64
    }

    /// The directory as stream → carrier (for tests and logs; allocates).
    public var directory: [String: String] { claims.mapValues { $0.carrier } }

    public private(set) var counters = StreamCounters()
    public private(set) var drops = DropCounts()
    /// Slots in use, carried and bridged streams together.
    public var openCount: Int { links.count }

    public init(config: RelayConfig, link: AnyDeviceLink?, gatewayID: String) {
        self.config = config
        self.link = link
        self.gatewayID = gatewayID
        // The largest link message of a stream (docs/protocol.md §5.1): a data message (type,
        // frame number, max data bytes) or an error with the longest detail (type, reason, 100
        // bytes), whichever is larger; open, ack, close and reset are shorter than the error.
        receive = .allocate(byteCount: max(config.streamMaxData + 5, 2 + LinkMessage.maxDetailBytes), alignment: 8)
        frameScratch = .allocate(byteCount: config.streamMaxData + 128, alignment: 8)
        frames = .allocate(byteCount: max(1, config.streams * config.streamWindow * config.streamMaxData), alignment: 8)
        queueFrames = .allocate(byteCount: max(1, config.streams * Self.queueBytes(config)), alignment: 8)
        let (frames, queueFrames) = (frames, queueFrames)
        let keep = config.streamWindow * config.streamMaxData
        let queue = Self.queueBytes(config)
        links = LinkPool(capacity: config.streams) { slot in
            Slot(frames: UnsafeMutableRawBufferPointer(rebasing: frames[slot * keep ..< (slot + 1) * keep]),
                 keep: config.streamWindow, keepMaxData: config.streamMaxData,
                 queueFrames: UnsafeMutableRawBufferPointer(rebasing: queueFrames[slot * queue ..< (slot + 1) * queue]))
        }
        // A gateway carries at most relay.streams streams (docs/relay.md §7.3 asks every gateway
        // of a building for the same); at least one, so a gateway that carries none itself can
        // still tell the endpoints of one that does.
        directoryPerCarrier = max(1, config.streams)
    }

    deinit {
        receive.deallocate()
        frameScratch.deallocate()
        frames.deallocate()
        queueFrames.deallocate()
    }

    static func queueBytes(_ config: RelayConfig) -> Int {
        LinkQueue.bytes(capacity: config.streamWindow, maxFrame: config.streamMaxData + LinkMessage.dataHeaderBytes)
    }

    /// A frame or open dropped without a stream to end, by reason (stats `streams.drops`).
    public mutating func dropped(_ reason: StaticString) { drops.count(reason) }

    /// The slot of stream `id` in `role`: the same gateway may carry stream S and bridge a
    /// stream S at once (an ownership flip), and `…/up` is the carrier's, `…/down` the bridge's.
    func slot(_ id: String, _ role: Role) -> Int? {
        links.first { $0.id == id && $0.role == role }
    }

    /// `open(window, maxData)` clamped to what this gateway keeps: Wg frames of Mg bytes.
    func clamped(_ window: UInt16, _ maxData: UInt16) -> (window: UInt16, maxData: UInt16) {
        (min(window, UInt16(clamping: config.streamWindow)), min(maxData, UInt16(clamping: config.streamMaxData)))
    }

    /// Takes a free slot for a stream on `channel` (the slot's share of the buffers was taken
    /// at start); returns the slot. The caller checked that one is free.
    mutating func take(role: Role, id: String, device: UInt64, topics: StreamTopics, openTopic: String?,
                       channel: consuming LinkChannel, linkOpen: (window: UInt16, maxData: UInt16)?,
                       brokerOpen: (window: UInt16, maxData: UInt16)?, now: Instant) -> Int {
        let (s, slot) = links.add(channel)
        slot.reset(role: role, id: id, device: device, topics: topics, openTopic: openTopic, linkOpen: linkOpen,
                   brokerOpen: brokerOpen, now: now, openAgainAt: now + config.streamRetry,
                   giveUpAt: now + config.fetchTimeout * 2)
        return s
    }

    // MARK: opening (docs/relay.md §7.2, §7.5)

    /// An endpoint's open, with what `Admission.check` said of its device: the device's link
    /// address, or why it is refused. Said again for a stream this gateway carries already;
    /// refused when the open frame is malformed, the admission refused it, or there is no room
    /// (`Admission.room`).
    public mutating func open(id: String, topics: StreamTopics, frame: [UInt8], admitted: Result<LinkAddress, Refusal>,
                              now: Instant, mqtt: inout MQTTClient) {
        if let s = slot(id, .carrier), let slot = links[s] {
            // The endpoint saw no open frame (the broker lost it): say it again.
            if let o = slot.brokerOpen { publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt) }
            return
        }
        let message: LinkMessage
        switch Self.decode(frame, payloadMax: config.streamMaxData) {
        case .success(let m): message = m
        case .failure(let error):
            drops.count(error)
            return refuse(topics.down, .protocolError, "the open frame is malformed: \(error)", mqtt: &mqtt)
        }
        guard message.type == .open else {
            drops.count("stream-not-open")
            return refuse(topics.down, .protocolError, "the first frame must be open (docs/protocol.md §5.3)", mqtt: &mqtt)
        }
        let target: LinkAddress
        switch admitted {
        case .success(let address): target = address
        case .failure(let refusal): return refuse(topics.down, refusal, mqtt: &mqtt)
        }
        if let refusal = Admission.room(.stream, hasLink: link != nil, free: !links.isFull, capacity: config.streams) {
            return refuse(topics.down, refusal, mqtt: &mqtt)
        }
        // Proof: `room` refuses without a link.
        let link = link!
        let channel: LinkChannel
        do throws(LinkError) { channel = try link.connect(to: target) } catch {
            return refuse(topics.down, .unreachable, error.description, mqtt: &mqtt)
        }
        let taken = take(role: .carrier, id: id, device: target.address, topics: topics, openTopic: nil, channel: channel,
                         linkOpen: clamped(message.window, message.maxData), brokerOpen: nil, now: now)
        counters.opened &+= 1
        do throws(MQTTError) {
            try mqtt.subscribe(topics.up, qos: 1)
        } catch {
            // The broker went away: `reconnected` subscribes again.
        }
        publishText(topics.gateway, gatewayID, retain: true, mqtt: &mqtt)
        sendOpenIfReady(taken)
    }

    mutating func refuse(_ down: String, _ refusal: Refusal, mqtt: inout MQTTClient) {
        refuse(down, refusal.streamReason, refusal.description, mqtt: &mqtt)
    }

    mutating func refuse(_ down: String, _ reason: StreamReason, _ detail: String, mqtt: inout MQTTClient) {
        counters.refused[Int(reason.rawValue)] &+= 1
        publishError(reason, detail, to: down, mqtt: &mqtt)
    }

    /// A phone's stream link to a re-advertised activity (docs/relay.md §7.5): `channel` is open
    /// and its first message was open(`window`, `maxData`). This gateway becomes the stream's
    /// endpoint on the broker under id `id` (its own pick) and asks on `openTopic`
    /// (`<prefix>/stream/<device>/S`) for the device's gateway to carry it.
    public mutating func bridge(channel: consuming LinkChannel, device: UInt64, id: String, topics: StreamTopics,
                                openTopic: String, window: UInt16, maxData: UInt16,
                                now: Instant, mqtt: inout MQTTClient) {
        var channel = channel
        guard window > 0, maxData > 0 else {
            // The decoder refuses such an open (protocol.md §5.1 `link-window`); said here too
            // so no caller can publish an open that no gateway takes.
            return refuse(&channel, .protocolError, "an open with window or max data 0 (docs/protocol.md §5.1)")
        }
        guard !links.isFull else {
            let full = Refusal.full(.stream, capacity: config.streams)
            return refuse(&channel, full.streamReason, full.description)
        }
        let phoneOpen = clamped(window, maxData)
        _ = take(role: .bridge, id: id, device: device, topics: topics, openTopic: openTopic, channel: channel,
             linkOpen: nil, brokerOpen: phoneOpen, now: now)
        counters.bridged &+= 1
        // §7.1: subscribe to …/S/down before publishing the open, so the answer finds us.
        do throws(MQTTError) {
            try mqtt.subscribe(topics.down, qos: 1)
        } catch {
            // The broker went away: `reconnected` subscribes again and repeats the open.
        }
        publishOpen(phoneOpen.window, phoneOpen.maxData, to: openTopic, mqtt: &mqtt)
    }

    /// A phone's link refused before it took a slot: it is told why, and hung up.
    mutating func refuse(_ channel: inout LinkChannel, _ reason: StreamReason, _ detail: String) {
        counters.refused[Int(reason.rawValue)] &+= 1
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeError(reason, detail: Self.cut(detail, 100), into: &w) } catch {
            preconditionFailure("an error frame of 100 bytes of detail fits")
        }
        // A fresh link has room for one frame; if not, the hang-up alone says it.
        do throws(LinkError) { _ = try channel.send(w.written) } catch {}
        channel.close()
    }

    /// The open the link side is told, once known and the link is open; it goes before
    /// anything else on the link.
    mutating func sendOpenIfReady(_ s: Int) {
        guard let slot = links[s], slot.linkSide == .unopened, let o = slot.linkOpen, links[channel: s].state == .open else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeOpen(window: o.window, maxData: o.maxData, into: &w) } catch {
            preconditionFailure("an open frame fits")
        }
        if sendToLink(s, w.written) { slot.linkSide = .open }
    }

    // MARK: the broker side's frames (…/S/up to a carrier, …/S/down to a bridge)

    /// A frame on `…/S/up` of a stream this gateway carries; false when it carries no such
    /// stream (the topic is someone else's, or the stream just ended).
    public mutating func fromEndpoint(id: String, _ bytes: [UInt8], now: Instant,
                                      mqtt: inout MQTTClient) -> Bool {
        fromBroker(id: id, .up, bytes, now: now, mqtt: &mqtt)
    }

    /// A frame from the broker on `…/S/up` (`.up`: the streams this gateway carries) or
    /// `…/S/down` (`.down`: the streams it bridges for phones, §7.5), as `Topics.classify`
    /// says; false when no stream of that role has id `id` (the topic is someone else's, or the
    /// stream just ended).
    public mutating func fromBroker(id: String, _ side: StreamSide, _ bytes: [UInt8], now: Instant,
                                    mqtt: inout MQTTClient) -> Bool {
        let role: Role
        switch side {
        case .up: role = .carrier
        case .down: role = .bridge
        }
        guard let s = slot(id, role), let slot = links[s] else { return false }
        slot.lastActivity = now
        let message: LinkMessage
        // The broker side sends data of at most the max data it was told (brokerOpen); before
        // the device answered a carrier, the endpoint has no business sending data at all.
        let payloadMax = slot.brokerOpen?.maxData ?? slot.linkOpen?.maxData ?? UInt16(clamping: config.streamMaxData)
        switch Self.decode(bytes, payloadMax: Int(payloadMax)) {
        case .success(let m): message = m
        case .failure(let error):
            drops.count(error)
            abort(s, .protocolError, "\(slot.brokerName) sent a malformed frame: \(error)", toBroker: true,
                  toLink: true, mqtt: &mqtt)
            return true
        }
        if slot.awaitsAnswer {
            switch message.type {
            case .open:
                // The carrier's answer (§7.5): the phone is told it, clamped to what this
                // gateway keeps of the phone's frames; the phone's frames may flow.
                let o = clamped(message.window, message.maxData)
                slot.linkOpen = o
                slot.toBroker.peerOpened(window: o.window, maxData: o.maxData)
                slot.lastProgress = now
                sendOpenIfReady(s)
                return true
            case .reset, .error:
                break  // to the phone, below
            default:
                // The carrier speaks only after its open; what came before it was lost with
                // the open (the carrier resends it).
                drops.count("stream-before-open")
                return true
            }
        }
        switch message.type {
        case .data:
            if slot.role == .carrier { counters.framesUp &+= 1 } else { counters.framesDown &+= 1 }
            if let end = slot.toLink.closeEnd, message.number &- end < 0x8000_0000 {
                abort(s, .protocolError, "\(slot.brokerName) sent frame \(message.number) after its close at \(end)",
                      toBroker: true, toLink: true, mqtt: &mqtt)
                return true
            }
            if message.number == slot.toLink.next {
                // In order: to the link if it takes it now, else behind the frames already
                // waiting for its credits (sent on POLLOUT), and never before the open. The
                // broker side's window is at most the queue's capacity, so it fits; were it not
                // to, the broker side would resend it (it is not acknowledged).
                let taken = bytes.withUnsafeBytes { b in
                    slot.linkSide >= .open && slot.linkQueue.isEmpty && sendToLink(s, b) ? true : queueForLink(s, b)
                }
                if taken { _ = slot.toLink.arrive(message.number) } else { drops.count("stream-link-full") }
                forwardCloseIfDue(s)
            } else if slot.toLink.arrive(message.number) == .duplicate {
                // A resend (or a replay): dropped, and the link side's ack said again.
                drops.count("stream-duplicate")
                republishLinkAck(s, mqtt: &mqtt)
            } else {
                drops.count("stream-gap")
            }
        case .ack:
            do throws(StreamViolation) {
                if try slot.toBroker.acknowledge(next: message.number, window: message.window) {
                    slot.lastProgress = now
                    // Capped at the window the link side was told: what the gateway keeps.
                    slot.ackForLink = (message.number, min(message.window, slot.linkOpen?.window ?? 1))
                    flushToLink(s)
                }
            } catch {
                abort(s, .protocolError, error.description, toBroker: true, toLink: true, mqtt: &mqtt)
                return true
            }
            finishIfDone(s, mqtt: &mqtt)
        case .close:
            do throws(StreamViolation) { try slot.toLink.closed(end: message.number) } catch {
                abort(s, .protocolError, error.description, toBroker: true, toLink: true, mqtt: &mqtt)
                return true
            }
            forwardCloseIfDue(s)
            // The broker side learns its close arrived from an ack sent after it (StreamSender).
            // Once the close is on the link (which loses nothing) and the link side acknowledged
            // every frame before it, that ack is the link side's last one, said again; a link
            // side that acknowledged nothing (an empty direction) gets ack 0 said for it.
            if slot.linkSide >= .closeSent, (slot.linkAck?.next ?? 0) == message.number {
                if slot.linkAck == nil { slot.linkAck = (0, slot.brokerOpen?.window ?? 1) }
                republishLinkAck(s, mqtt: &mqtt)
            }
        case .open where slot.role == .bridge:
            // The carrier's open said again (it answers every repeat of ours, and says it
            // after its reconnects): the phone has it already.
            break
        case .reset, .error:
            // The broker side gave up: the link side is told, the stream ends.
            _ = bytes.withUnsafeBytes { sendToLink(s, $0) }
            end(s, clean: false, mqtt: &mqtt)
        default:
            drops.count("stream-unexpected")
        }
        return true
    }

    /// Queues a broker frame the link has no room for; false when the queue is full.
    mutating func queueForLink(_ s: Int, _ frame: UnsafeRawBufferPointer) -> Bool {
        guard let slot = links[s], slot.linkQueue.push(frame) else { return false }
        counters.framesQueued &+= 1
        return true
    }

    /// Sends what waits for the link and the link takes now: the broker side's newest ack, then
    /// the queued frames, oldest first. Nothing goes before the open.
    mutating func flushToLink(_ s: Int) {
        guard let slot = links[s], slot.linkSide >= .open else { return }
        if let ack = slot.ackForLink {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeAck(next: ack.next, window: ack.window, into: &w) } catch {
                preconditionFailure("an ack fits")
            }
            guard sendToLink(s, w.written) else { return }
            slot.ackForLink = nil
        }
        while let frame = slot.linkQueue.first, sendToLink(s, frame) { slot.linkQueue.pop() }
    }

    mutating func forwardCloseIfDue(_ s: Int) {
        guard let slot = links[s], slot.linkSide == .open, slot.linkQueue.isEmpty,
              let end = slot.toLink.closeEnd, end == slot.toLink.next else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeClose(end: end, into: &w) } catch { preconditionFailure("a close fits") }
        if sendToLink(s, w.written) { slot.linkSide = .closeSent }
    }

    mutating func republishLinkAck(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = links[s], let ack = slot.linkAck else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeAck(next: ack.next, window: ack.window, into: &w) } catch {
            preconditionFailure("an ack fits")
        }
        publish(w.written, to: slot.brokerOut, mqtt: &mqtt)
    }

    // MARK: the link side's frames (the device's, or the phone's)

    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        links.pollDescriptors(into: &fds)
    }

    /// The loop's one verb for the stream relay (docs/architecture.md §2): the links'
    /// readiness, then what is due.
    public mutating func serve(_ ready: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient) {
        if !ready.isEmpty { poll(fds: ready, now: now, mqtt: &mqtt) }
        if let due = nextDeadline, due <= now { tick(now: now, mqtt: &mqtt) }
    }

    /// The link side's readiness: its frames, one at a time. A frame that ends the stream
    /// hangs the link up (`end`): what else it sent this turn is read and dropped, the error
    /// frame if any is said, and no more is read.
    public mutating func poll(fds: ArraySlice<pollfd>, now: Instant, mqtt: inout MQTTClient) {
        for (k, fd) in fds.enumerated() {
            guard let s = links.ready(k, fd), let serial = links.serial(s) else { continue }
            let ready = LinkReadiness(fd)
            links[channel: s].ready(readable: ready.readable, writable: ready.writable, buffer: receive)
            while links.holds(s, serial: serial), let sdu = links[channel: s].next(into: receive) {
                fromLink(s, sdu, now: now, mqtt: &mqtt)
            }
            guard links.holds(s, serial: serial), let slot = links[s] else { continue }
            switch links[channel: s].state {
            case .open:
                sendOpenIfReady(s)
                flushToLink(s)
                forwardCloseIfDue(s)
                finishIfDone(s, mqtt: &mqtt)
            case .closed(let error):
                if slot.toBroker.closeEnd != nil, slot.linkSide >= .closeSent, error == nil || error == .closed {
                    slot.linkSide = .hungUp
                    finishIfDone(s, mqtt: &mqtt)
                } else {
                    let why = (error ?? .closed).description
                    abort(s, .unreachable,
                              slot.role == .carrier ? "the link to the device dropped: \(why)" : "the phone's link dropped: \(why)",
                              toBroker: true, toLink: false, mqtt: &mqtt)
                }
            case .connecting:
                break
            }
        }
    }

    mutating func fromLink(_ s: Int, _ sdu: UnsafeRawBufferPointer, now: Instant, mqtt: inout MQTTClient) {
        guard let slot = links[s] else { return }
        slot.lastActivity = now
        let message: LinkMessage
        let payloadMax = slot.linkOpen?.maxData ?? UInt16(clamping: config.streamMaxData)
        do throws(WireError) { message = try LinkMessage.decode(sdu, payloadMax: Int(payloadMax)) } catch {
            drops.count(error)
            abort(s, .protocolError, "\(slot.linkName) sent a malformed frame: \(error)", toBroker: true, toLink: true,
                      mqtt: &mqtt)
            return
        }
        switch message.type {
        case .open where slot.role == .carrier:
            // The broker side may have at most the queue's capacity in flight (`LinkQueue`).
            let o = clamped(message.window, message.maxData)
            slot.brokerOpen = o
            publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt)
        case .data:
            // The link side keeps the window it was told and numbers in order: the link keeps
            // order, so anything else is its bug (a phone's data before the carrier's open too).
            guard message.number == slot.toBroker.next, slot.toBroker.canSend else {
                abort(s, .protocolError, "\(slot.linkName) sent frame \(message.number) outside the window",
                          toBroker: true, toLink: true, mqtt: &mqtt)
                return
            }
            if slot.toBroker.allAcknowledged { slot.lastProgress = now }
            _ = slot.toBroker.push(UnsafeRawBufferPointer(rebasing: sdu[message.body]))
            if slot.role == .carrier { counters.framesDown &+= 1 } else { counters.framesUp &+= 1 }
            publish(sdu, to: slot.brokerOut, mqtt: &mqtt)
        case .ack:
            // The window goes on capped at Wg, as the link side's open was (§7.2): the broker
            // side must never have more in flight than the queue holds.
            slot.linkAck = (message.number, min(message.window, UInt16(clamping: config.streamWindow)))
            republishLinkAck(s, mqtt: &mqtt)
            finishIfDone(s, mqtt: &mqtt)
        case .close:
            guard message.number == slot.toBroker.next else {
                abort(s, .protocolError,
                          "\(slot.linkName) closed at \(message.number) after sending \(slot.toBroker.next) frames",
                          toBroker: true, toLink: true, mqtt: &mqtt)
                return
            }
            slot.toBroker.close()
            publish(sdu, to: slot.brokerOut, mqtt: &mqtt)
        case .reset, .error:
            publish(sdu, to: slot.brokerOut, mqtt: &mqtt)
            end(s, clean: false, mqtt: &mqtt)
        default:
            // A phone's second open among them: its first one opened the stream (§7.5).
            drops.count("stream-unexpected")
        }
    }

    // MARK: ending

    /// Both directions closed, every frame acknowledged, the last ack on the link.
    func isDone(_ slot: Slot) -> Bool {
        slot.toBroker.closeEnd != nil && slot.toBroker.allAcknowledged && slot.linkSide >= .closeSent
            && (slot.linkSide == .hungUp || (slot.linkAck?.next == slot.toLink.closeEnd && slot.ackForLink == nil))
    }

    mutating func finishIfDone(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = links[s], isDone(slot) else { return }
        end(s, clean: true, mqtt: &mqtt)
    }

    /// Tells one or both sides `reason` and ends the stream.
    mutating func abort(_ s: Int, _ reason: StreamReason, _ detail: String, toBroker: Bool, toLink: Bool,
                        mqtt: inout MQTTClient) {
        guard let slot = links[s] else { return }
        if toBroker { publishError(reason, detail, to: slot.brokerOut, mqtt: &mqtt) }
        var lastWords: UnsafeRawBufferPointer?
        if toLink {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeError(reason, detail: Self.cut(detail, 100), into: &w) } catch {
                preconditionFailure("an error frame of 100 bytes of detail fits")
            }
            lastWords = w.written
        }
        end(s, clean: false, lastWords: lastWords, mqtt: &mqtt)
    }

    /// Ends the stream: the link is hung up, saying `lastWords` (an error frame) if it is open.
    mutating func end(_ s: Int, clean: Bool, lastWords: UnsafeRawBufferPointer? = nil, mqtt: inout MQTTClient) {
        guard let slot = links[s] else { return }
        if clean { counters.finished &+= 1 } else { counters.aborted &+= 1 }
        var channel = links.remove(s)
        channel.hangUp(lastWords: lastWords, buffer: receive)
        do throws(MQTTError) { try mqtt.unsubscribe(slot.brokerIn) } catch {}
        // `…/S/gateway` is the carrier's claim; a bridge never said it.
        if slot.role == .carrier { publishText(slot.topics.gateway, "", retain: true, mqtt: &mqtt) }
    }

    // MARK: time and the broker

    public var nextDeadline: Instant? {
        guard openCount > 0 else { return nil }
        var next: Instant?
        func consider(_ d: Instant) { if next.map({ d < $0 }) ?? true { next = d } }
        for s in links.indices {
            guard let slot = links[s] else { continue }
            if slot.awaitsAnswer {
                consider(slot.openAgainAt)
                consider(slot.giveUpAt)
            } else {
                consider(slot.lastActivity + config.streamIdle)
            }
            if !slot.toBroker.allAcknowledged { consider(slot.lastProgress + config.streamRetry) }
        }
        return next
    }

    /// Resends what the broker side has not acknowledged in time; repeats a bridge's open and
    /// gives it up; ends idle streams.
    public mutating func tick(now: Instant, mqtt: inout MQTTClient) {
        for s in links.indices {
            guard let slot = links[s] else { continue }
            if slot.awaitsAnswer, let openTopic = slot.openTopic, let o = slot.brokerOpen {
                // §7.5: no carrier answered. Not idle (nothing can move yet): the open is said
                // again every relay.stream-retry, as `baton stream` repeats it (§7.4), until
                // 2 × relay.fetch-timeout.
                if slot.giveUpAt <= now {
                    counters.unanswered &+= 1
                    // As `baton stream` does when it gives up: a carrier that took the open late
                    // lets its device go.
                    publishReset(.cancelled, to: slot.topics.up, mqtt: &mqtt)
                    abort(s, .unreachable,
                              "no gateway answered the stream open within 2 × relay.fetch-timeout (\((config.fetchTimeout * 2).secondsDescription))",
                              toBroker: false, toLink: true, mqtt: &mqtt)
                    continue
                }
                if slot.openAgainAt <= now {
                    publishOpen(o.window, o.maxData, to: openTopic, mqtt: &mqtt)
                    slot.openAgainAt = now + config.streamRetry
                }
            } else if slot.lastActivity + config.streamIdle <= now {
                abort(s, .idle, "nothing moved for relay.stream-idle (\(config.streamIdle.secondsDescription))", toBroker: true,
                          toLink: true, mqtt: &mqtt)
                continue
            }
            if !slot.toBroker.allAcknowledged, slot.lastProgress + config.streamRetry <= now {
                resend(s, mqtt: &mqtt)
                slot.lastProgress = now
            }
        }
    }

    /// Go-back-N: every unacknowledged link frame, then the close if said.
    mutating func resend(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = links[s] else { return }
        var n = slot.toBroker.unacked
        while n != slot.toBroker.next {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeData(frame: n, bytes: slot.toBroker.frame(n), into: &w) } catch {
                preconditionFailure("a kept frame fits its scratch")
            }
            publish(w.written, to: slot.brokerOut, mqtt: &mqtt)
            counters.resent &+= 1
            n &+= 1
        }
        if let end = slot.toBroker.closeEnd {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeClose(end: end, into: &w) } catch { preconditionFailure("a close fits") }
            publish(w.written, to: slot.brokerOut, mqtt: &mqtt)
        }
    }

    /// After every (re)connect: the session is clean, so subscribe again, say again which
    /// gateway carries each stream (a bridge: ask again for a carrier if none answered yet),
    /// and resend what may have been lost with the old broker.
    public mutating func reconnected(now: Instant, mqtt: inout MQTTClient) {
        for s in links.indices {
            guard let slot = links[s] else { continue }
            do throws(MQTTError) { try mqtt.subscribe(slot.brokerIn, qos: 1) } catch { return }
            switch slot.role {
            case .carrier:
                publishText(slot.topics.gateway, gatewayID, retain: true, mqtt: &mqtt)
                if let o = slot.brokerOpen { publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt) }
            case .bridge:
                if slot.awaitsAnswer, let openTopic = slot.openTopic, let o = slot.brokerOpen {
                    publishOpen(o.window, o.maxData, to: openTopic, mqtt: &mqtt)
                    slot.openAgainAt = now + config.streamRetry
                }
            }
            republishLinkAck(s, mqtt: &mqtt)
            resend(s, mqtt: &mqtt)
            slot.lastProgress = now
        }
    }

    /// A message on `<prefix>/streams/S/gateway` (docs/relay.md §7.3, "The stream directory").
    /// Taken only as a gateway writes it: retained, and either empty (the stream ended: its
    /// entry goes) or the id of a gateway (docs/config.md `gateway.id`) whose status is online
    /// (`isOnline`). Anything else is dropped and counted by reason. `retained` is the
    /// message's retain flag, nil when the connection cannot tell (MQTT 3.1.1 clears it on
    /// messages to a subscription that exists, §3.3.1.3; MQTT v5 keeps it for a subscription
    /// made with Retain As Published, §3.8.3.1).
    ///
    /// Full: a carrier with `directoryPerCarrier` entries (relay.streams) claims one more. Its
    /// oldest claim is forgotten, counted as `stream-directory-full`: a gateway says its claims
    /// again at every reconnect, so the newest are the likeliest to be live. Returns the line to
    /// log then, naming the knob, at most once a minute.
    public mutating func carried(stream id: String, payload: [UInt8], retained: Bool?,
                                 isOnline: (Substring) -> Bool, now: Instant) -> String? {
        guard retained ?? true else {
            drops.count("stream-carrier-not-retained")
            return nil
        }
        guard !payload.isEmpty else {
            forget(id)
            return nil
        }
        guard Self.isGatewayID(payload) else {
            drops.count("stream-carrier-malformed")
            return nil
        }
        let carrier = String(decoding: payload, as: UTF8.self)
        guard isOnline(Substring(carrier)) else {
            drops.count("stream-carrier-offline")
            return nil
        }
        claimOrder &+= 1  // Proof: 2⁶⁴ claims never arrive.
        if claims[id]?.carrier == carrier {
            claims[id]?.order = claimOrder
            return nil
        }
        forget(id)
        var warning: String?
        if claimsPerCarrier[carrier, default: 0] >= directoryPerCarrier {
            var oldest: (id: String, order: UInt64)?
            for (other, claim) in claims where claim.carrier == carrier && claim.order < (oldest?.order ?? .max) {
                oldest = (other, claim.order)
            }
            // Proof: the carrier has directoryPerCarrier ≥ 1 entries, so one is the oldest.
            forget(oldest!.id)
            drops.count("stream-directory-full")
            if fullLoggedAt.map({ now - $0 >= .seconds(60) }) ?? true {
                fullLoggedAt = now
                warning = "gateway \(carrier) claims more than relay.streams (\(directoryPerCarrier)) streams; its oldest claim is"
                    + " forgotten (junk on …/streams/+/gateway, or a gateway with a larger relay.streams: give every gateway the same)"
            }
        }
        claims[id] = Claim(carrier: carrier, order: claimOrder)
        claimsPerCarrier[carrier, default: 0] += 1
        return warning
    }

    /// Removes stream `id`'s entry, if any.
    mutating func forget(_ id: String) {
        guard let old = claims.removeValue(forKey: id) else { return }
        let left = claimsPerCarrier[old.carrier, default: 1] - 1
        claimsPerCarrier[old.carrier] = left > 0 ? left : nil
    }

    /// docs/config.md `gateway.id`: 1–64 of `a-z 0-9 _ -`.
    static func isGatewayID(_ bytes: [UInt8]) -> Bool {
        !bytes.isEmpty && bytes.count <= 64
            && bytes.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F }
    }

    /// A gateway went offline; this one is the first online gateway: tell the endpoints of its
    /// streams (docs/relay.md §7.3) and clear their entries. A stream this gateway bridges is
    /// told too: the `gone` on its `…/S/down` reaches the phone.
    public mutating func gatewayWentOffline(_ gateway: Substring, topics: Topics, mqtt: inout MQTTClient) {
        for (id, claim) in claims where claim.carrier == gateway && slot(id, .carrier) == nil {
            let stream = topics.stream(id)
            publishError(.gone, "gateway \(gateway) went offline", to: stream.down, mqtt: &mqtt)
            publishText(stream.gateway, "", retain: true, mqtt: &mqtt)
            forget(id)
            counters.goneForOthers &+= 1
        }
    }

    /// Before a clean stop: every endpoint, device, carrier and phone is told.
    public mutating func stop(mqtt: inout MQTTClient) {
        for s in links.indices where links[s] != nil {
            abort(s, .gone, "the gateway is stopping", toBroker: true, toLink: true, mqtt: &mqtt)
        }
    }

    // MARK: stats (docs/mqtt.md, the stats topic's `relay.streams`)

    /// This relay's members of the stats topic's `relay.streams` object, in the order they are
    /// published; the caller writes the key and the braces around them.
    public func writeStats(into w: inout JSONWriter) throws(WireError) {
        let sc = counters
        try w.key("open"); try w.int(Int64(openCount))
        try w.key("capacity"); try w.int(Int64(config.streams))
        try w.key("opened"); try w.int(Int64(sc.opened))
        try w.key("refused"); try w.int(Int64(sc.refused.reduce(0, +)))
        try w.key("finished"); try w.int(Int64(sc.finished))
        try w.key("aborted"); try w.int(Int64(sc.aborted))
        try w.key("frames_up"); try w.int(Int64(sc.framesUp))
        try w.key("frames_down"); try w.int(Int64(sc.framesDown))
        try w.key("frames_queued"); try w.int(Int64(sc.framesQueued))
        try w.key("resent"); try w.int(Int64(sc.resent))
        try w.key("gone_for_others"); try w.int(Int64(sc.goneForOthers))
        try w.key("bridged"); try w.int(Int64(sc.bridged))
        try w.key("unanswered"); try w.int(Int64(sc.unanswered))
        try w.key("drops"); try w.beginObject()
        for d in drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
    }

    // MARK: sending

    /// One SDU to the link; false when the link cannot take it now.
    mutating func sendToLink(_ s: Int, _ sdu: UnsafeRawBufferPointer) -> Bool {
        guard links[s] != nil, links[channel: s].state == .open else { return false }
        do throws(LinkError) { return try links[channel: s].send(sdu) } catch { return false }
    }

    mutating func publishOpen(_ window: UInt16, _ maxData: UInt16, to topic: String, mqtt: inout MQTTClient) {
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeOpen(window: window, maxData: maxData, into: &w) } catch {
            preconditionFailure("an open frame fits")
        }
        publish(w.written, to: topic, mqtt: &mqtt)
    }

    mutating func publishError(_ reason: StreamReason, _ detail: String, to topic: String, mqtt: inout MQTTClient) {
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeError(reason, detail: Self.cut(detail, 100), into: &w) } catch {
            preconditionFailure("an error frame of 100 bytes of detail fits")
        }
        publish(w.written, to: topic, mqtt: &mqtt)
    }

    mutating func publishReset(_ reason: StreamReason, to topic: String, mqtt: inout MQTTClient) {
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeReset(reason, into: &w) } catch { preconditionFailure("a reset fits") }
        publish(w.written, to: topic, mqtt: &mqtt)
    }

    func publish(_ frame: UnsafeRawBufferPointer, to topic: String, mqtt: inout MQTTClient) {
        // QoS 1, not retained (docs/relay.md §7.1). A frame the broker did not take is resent
        // after the reconnect (the link's data) or by the broker side (everything else).
        do throws(MQTTError) { try mqtt.publish(topic: topic, payload: frame, qos: 1, retain: false) } catch {}
    }
    func publishText(_ topic: String, _ text: String, retain: Bool, mqtt: inout MQTTClient) {
        // A failure is dropped here like `publish`'s; the result travels out of withUnsafeBytes
        // as a value because it rethrows untyped (an existential Embedded Swift cannot hold).
        Array(text.utf8).withUnsafeBytes { bytes in
            do throws(MQTTError) { try mqtt.publish(topic: topic, payload: bytes, qos: 1, retain: retain) } catch {}
        }
    }

    /// A frame from the broker, decoded (Array.withUnsafeBytes rethrows untyped: the result
    /// travels out as a value).
    static func decode(_ bytes: [UInt8], payloadMax: Int) -> Result<LinkMessage, WireError> {
        bytes.withUnsafeBytes { b in
            do throws(WireError) { return .success(try LinkMessage.decode(b, payloadMax: payloadMax)) } catch {
                return .failure(error)
            }
        }
    }

    /// At most `bytes` bytes of UTF-8, cut at a character boundary (an error frame's detail).
    static func cut(_ text: String, _ bytes: Int) -> String {
        var out = ""
        for c in text {
            guard out.utf8.count + String(c).utf8.count <= bytes else { break }
            out.append(c)
        }
        return out
    }
}

/// The loop drives the streams' links as one part (docs/architecture.md "The loop").
extension StreamRelay: LoopPart {
    /// One per link slot open to a stream: free slots are not polled.
    public var descriptorLimit: Int { links.capacity }
}
