// Continuation streams (docs/relay.md §7): the owning gateway carries frames between a
// continuing endpoint on the broker and the originating device on a stream link.
//
//   endpoint --up (MQTT)--> [in order only]          --link--> device
//   endpoint <--down (MQTT)-- [kept until acked; resent] <--link-- device
//
// The link keeps order and loses nothing while it lives; the broker may lose messages (a
// restart without persistence). So the gateway forwards up frames to the device strictly in
// order and lets the endpoint resend what was lost, and keeps the device's frames until the
// endpoint acknowledges them, resending them itself (the device never resends on a link).
// Acks pass through end to end, so the window is the reader's and a slow reader slows the
// writer (docs/protocol.md §5.3).
//
// Capacities are fixed at start: stream slots, and per slot the down frames kept (window ×
// max data). Who takes an open is the gateway's decision (docs/relay.md §4).

import BatonMQTT
import BatonWire
import Glibc

/// The topics of one stream (docs/relay.md §7.1), spelled by the gateway's topic layout.
public struct StreamTopics: Sendable, Equatable {
    public var up: String
    public var down: String
    public var gateway: String
    public init(up: String, down: String, gateway: String) { self.up = up; self.down = down; self.gateway = gateway }
}

public struct StreamCounters: Sendable, Equatable {
    public var opened = 0
    /// Opens refused, by `StreamReason.rawValue` (busy, unreachable, protocol).
    public var refused = [Int](repeating: 0, count: 7)
    /// Streams that ended cleanly, and aborted (reset or error either way, link lost, idle).
    public var finished = 0
    public var aborted = 0
    public var framesUp = 0
    public var framesDown = 0
    /// Up frames that waited for the link's credits instead of going at once.
    public var framesQueued = 0
    /// Down frames sent again (no ack in time, or after a reconnect).
    public var resent = 0
    /// Streams of offline gateways this one told their endpoints about (`gone`).
    public var goneForOthers = 0
    public init() {}
}

public struct StreamRelay: ~Copyable {
    public let config: RelayConfig
    public let link: (any DeviceLink)?
    let gatewayID: String

    final class Slot {
        let id: String
        let device: UInt64
        let topics: StreamTopics
        var channel: LinkChannel
        /// The device's frames, kept until the endpoint acknowledges them.
        var down: StreamSender
        /// The endpoint's frames, taken in order.
        var up: StreamReceiver
        /// The endpoint's frames taken in order that the link had no room for yet.
        var upQueue: LinkQueue
        /// The endpoint's open, as the device is told it (clamped to what the gateway keeps).
        let endpointWindow: UInt16
        let endpointMaxData: UInt16
        var sentOpenToDevice = false
        /// The device's open as the endpoint is told it; nil until the device answered.
        var deviceOpen: (window: UInt16, maxData: UInt16)?
        /// The device's last ack of up frames (published again for a duplicate).
        var deviceAck: (next: UInt32, window: UInt16)?
        /// The endpoint's close has been passed to the device.
        var closeSentToDevice = false
        /// The device hung up after both closes (§5.3): what is left is the endpoint's acks of
        /// the device's last frames, which the gateway still resends.
        var deviceDone = false
        /// True while `poll` drains the channel into `fromDevice`. The channel is in use then
        /// (Swift's exclusive access: touching it again traps), so what a device frame decides
        /// for it waits until the drain returns: the error frame to send, and the hang-up.
        var draining = false
        var lastWords: [UInt8]?
        var hangUpAfterDrain = false
        var lastProgress: ContinuousClock.Instant
        var lastActivity: ContinuousClock.Instant

        /// Which stream this is, among every stream the relay opened.
        let serial: UInt64

        init(id: String, device: UInt64, topics: StreamTopics, channel: consuming LinkChannel, window: UInt16,
             maxData: UInt16, frames: UnsafeMutableRawBufferPointer, keep: Int, keepMaxData: Int,
             upFrames: UnsafeMutableRawBufferPointer, now: ContinuousClock.Instant, serial: UInt64) {
            self.id = id; self.device = device; self.topics = topics; self.channel = channel; self.serial = serial
            down = StreamSender(storage: frames, capacity: keep, maxData: keepMaxData)
            down.peerOpened(window: window, maxData: maxData)
            up = StreamReceiver()
            upQueue = LinkQueue(storage: upFrames, capacity: keep, maxFrame: keepMaxData + LinkMessage.dataHeaderBytes)
            endpointWindow = window; endpointMaxData = maxData
            lastProgress = now; lastActivity = now
        }
    }
    var slots: [Slot?]
    /// Slot and stream serial of each descriptor handed out by `pollDescriptors` (as in
    /// FetchRelay: a stream that ended and another that opened in its slot within one turn
    /// may share a descriptor number and an object address, never a serial).
    var polled: [(slot: Int, serial: UInt64)]
    var serials: UInt64 = 0
    let receive: UnsafeMutableRawBufferPointer
    let frameScratch: UnsafeMutableRawBufferPointer
    /// Every slot's kept frames (window × max data each), taken once at start
    /// (docs/config.md `relay`): a stream opening allocates no frame buffer.
    let frames: UnsafeMutableRawBufferPointer
    /// Every slot's queue of the endpoint's frames waiting for the link, also taken at start.
    let upFrames: UnsafeMutableRawBufferPointer

    /// Every stream of the building and the gateway carrying it (`<prefix>/streams/+/gateway`),
    /// so the first online gateway can tell the endpoints of a gateway that died. Bounded.
    public private(set) var directory: [String: String] = [:]
    public let directoryCapacity: Int

    public private(set) var counters = StreamCounters()
    public private(set) var drops = DropCounts()
    public private(set) var openCount = 0

    public init(config: RelayConfig, link: (any DeviceLink)?, gatewayID: String) {
        self.config = config
        self.link = link
        self.gatewayID = gatewayID
        slots = Array(repeating: nil, count: config.streams)
        polled = []
        polled.reserveCapacity(config.streams)
        // The largest link message of a stream (docs/protocol.md §5.1): a data message (type,
        // frame number, max data bytes) or an error with the longest detail (type, reason, 100
        // bytes), whichever is larger; open, ack, close and reset are shorter than the error.
        receive = .allocate(byteCount: max(config.streamMaxData + 5, 2 + LinkMessage.maxDetailBytes), alignment: 8)
        frameScratch = .allocate(byteCount: config.streamMaxData + 128, alignment: 8)
        frames = .allocate(byteCount: max(1, config.streams * config.streamWindow * config.streamMaxData), alignment: 8)
        upFrames = .allocate(byteCount: max(1, config.streams * Self.upQueueBytes(config)), alignment: 8)
        directoryCapacity = config.streams * 8
    }

    deinit {
        receive.deallocate()
        frameScratch.deallocate()
        frames.deallocate()
        upFrames.deallocate()
    }

    static func upQueueBytes(_ config: RelayConfig) -> Int {
        LinkQueue.bytes(capacity: config.streamWindow, maxFrame: config.streamMaxData + LinkMessage.dataHeaderBytes)
    }

    /// A frame or open dropped without a stream to end, by reason (stats `streams.drops`).
    public mutating func dropped(_ reason: StaticString) { drops.count(reason) }

    // MARK: opening (docs/relay.md §7.2)

    /// An endpoint's open for a device this gateway owns and can reach (`target`), or nil
    /// with the reason to refuse it.
    public mutating func open(id: String, topics: StreamTopics, frame: [UInt8], target: LinkAddress?,
                              refusal: String?, now: ContinuousClock.Instant, mqtt: inout MQTTClient) {
        if let s = slots.firstIndex(where: { $0?.id == id }), let slot = slots[s] {
            // The endpoint saw no open frame (the broker lost it): say it again.
            if let o = slot.deviceOpen { publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt) }
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
        if let refusal { return refuse(topics.down, .unreachable, refusal, mqtt: &mqtt) }
        guard let target, let link else {
            return refuse(topics.down, .unreachable, "this gateway has no device link (relay.link)", mqtt: &mqtt)
        }
        guard let free = slots.firstIndex(where: { $0 == nil }) else {
            return refuse(topics.down, .busy, "\(config.streams) streams are open (relay.streams)", mqtt: &mqtt)
        }
        let channel: LinkChannel
        do throws(LinkError) { channel = try link.connect(to: target) } catch {
            return refuse(topics.down, .unreachable, error.description, mqtt: &mqtt)
        }
        let window = min(message.window, UInt16(clamping: config.streamWindow))
        let maxData = min(message.maxData, UInt16(clamping: config.streamMaxData))
        serials &+= 1  // Proof: 2⁶⁴ streams are never opened.
        let keep = config.streamWindow * config.streamMaxData
        slots[free] = Slot(id: id, device: target.address, topics: topics, channel: channel, window: window,
                           maxData: maxData, frames: UnsafeMutableRawBufferPointer(rebasing: frames[free * keep ..< (free + 1) * keep]),
                           keep: config.streamWindow, keepMaxData: config.streamMaxData,
                           upFrames: UnsafeMutableRawBufferPointer(rebasing: upFrames[free * Self.upQueueBytes(config) ..< (free + 1) * Self.upQueueBytes(config)]),
                           now: now, serial: serials)
        openCount += 1
        counters.opened &+= 1
        do throws(MQTTError) {
            try mqtt.subscribe(topics.up, qos: 1)
        } catch {
            // The broker went away: `reconnected` subscribes again.
        }
        publishText(topics.gateway, gatewayID, retain: true, mqtt: &mqtt)
        sendOpenIfReady(free)
    }

    mutating func refuse(_ down: String, _ reason: StreamReason, _ detail: String, mqtt: inout MQTTClient) {
        counters.refused[Int(reason.rawValue)] &+= 1
        publishError(reason, detail, to: down, mqtt: &mqtt)
    }

    mutating func sendOpenIfReady(_ s: Int) {
        guard let slot = slots[s], !slot.sentOpenToDevice, slot.channel.state == .open else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) {
            try LinkMessage.encodeOpen(window: slot.endpointWindow, maxData: slot.endpointMaxData, into: &w)
        } catch { preconditionFailure("an open frame fits") }
        if sendToDevice(s, w.written) { slot.sentOpenToDevice = true }
    }

    // MARK: the endpoint's frames (…/S/up)

    /// A frame on `…/S/up` of a stream this gateway carries; false when it carries no such
    /// stream (the topic is someone else's, or the stream just ended).
    public mutating func fromEndpoint(id: String, _ bytes: [UInt8], now: ContinuousClock.Instant,
                                      mqtt: inout MQTTClient) -> Bool {
        guard let s = slots.firstIndex(where: { $0?.id == id }), let slot = slots[s] else { return false }
        slot.lastActivity = now
        let message: LinkMessage
        switch Self.decode(bytes, payloadMax: Int(slot.deviceOpen?.maxData ?? slot.endpointMaxData)) {
        case .success(let m): message = m
        case .failure(let error):
            drops.count(error)
            return abort(s, .protocolError, "the endpoint sent a malformed frame: \(error)", toEndpoint: true,
                         toDevice: true, mqtt: &mqtt) || true
        }
        switch message.type {
        case .data:
            counters.framesUp &+= 1
            if let end = slot.up.closeEnd, message.number &- end < 0x8000_0000 {
                return abort(s, .protocolError, "the endpoint sent frame \(message.number) after its close at \(end)",
                             toEndpoint: true, toDevice: true, mqtt: &mqtt) || true
            }
            if message.number == slot.up.next {
                // In order: to the device if the link takes it now, else behind the frames
                // already waiting for its credits (sent on POLLOUT). The endpoint's window is
                // at most the queue's capacity, so it fits; were it not to, the endpoint would
                // resend it (it is not acknowledged).
                let taken = bytes.withUnsafeBytes { b in
                    slot.upQueue.isEmpty && sendToDevice(s, b) ? true : queueUp(s, b)
                }
                if taken { _ = slot.up.arrive(message.number) } else { drops.count("stream-link-full") }
                forwardCloseIfDue(s)
            } else if slot.up.arrive(message.number) == .duplicate {
                // A resend (or a replay): dropped, and the device's ack said again.
                drops.count("stream-duplicate")
                republishDeviceAck(s, mqtt: &mqtt)
            } else {
                drops.count("stream-gap")
            }
        case .ack:
            do throws(StreamViolation) {
                if try slot.down.acknowledge(next: message.number, window: message.window) {
                    slot.lastProgress = now
                    var w = ByteWriter(frameScratch)
                    do throws(WireError) {
                        try LinkMessage.encodeAck(next: message.number, window: min(message.window, slot.endpointWindow),
                                                  into: &w)
                    } catch { preconditionFailure("an ack fits") }
                    _ = sendToDevice(s, w.written)
                }
            } catch {
                return abort(s, .protocolError, error.description, toEndpoint: true, toDevice: true, mqtt: &mqtt) || true
            }
            finishIfDone(s, mqtt: &mqtt)
        case .close:
            do throws(StreamViolation) { try slot.up.closed(end: message.number) } catch {
                return abort(s, .protocolError, error.description, toEndpoint: true, toDevice: true, mqtt: &mqtt) || true
            }
            forwardCloseIfDue(s)
            // The endpoint learns its close arrived from an ack sent after it (StreamSender).
            // Once the close is on the link (which loses nothing) and the device acknowledged
            // every frame before it, that ack is the device's last one, said again; a device
            // that acknowledged nothing (an empty direction) gets ack 0 said for it.
            if slot.closeSentToDevice, (slot.deviceAck?.next ?? 0) == message.number {
                if slot.deviceAck == nil { slot.deviceAck = (0, slot.deviceOpen?.window ?? 1) }
                republishDeviceAck(s, mqtt: &mqtt)
            }
        case .reset, .error:
            // The endpoint gave up: the device is told, the stream ends.
            _ = bytes.withUnsafeBytes { sendToDevice(s, $0) }
            end(s, clean: false, mqtt: &mqtt)
        default:
            drops.count("stream-unexpected")
        }
        return true
    }

    /// Queues an endpoint frame the link has no room for; false when the queue is full.
    mutating func queueUp(_ s: Int, _ frame: UnsafeRawBufferPointer) -> Bool {
        guard let slot = slots[s], slot.upQueue.push(frame) else { return false }
        counters.framesQueued &+= 1
        return true
    }

    /// Sends the queued endpoint frames the link takes now, oldest first.
    mutating func flushUp(_ s: Int) {
        guard let slot = slots[s] else { return }
        while let frame = slot.upQueue.first, sendToDevice(s, frame) { slot.upQueue.pop() }
    }

    mutating func forwardCloseIfDue(_ s: Int) {
        guard let slot = slots[s], !slot.closeSentToDevice, slot.upQueue.isEmpty, let end = slot.up.closeEnd,
              end == slot.up.next else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeClose(end: end, into: &w) } catch { preconditionFailure("a close fits") }
        if sendToDevice(s, w.written) { slot.closeSentToDevice = true }
    }

    mutating func republishDeviceAck(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = slots[s], let ack = slot.deviceAck else { return }
        var w = ByteWriter(frameScratch)
        do throws(WireError) { try LinkMessage.encodeAck(next: ack.next, window: ack.window, into: &w) } catch {
            preconditionFailure("an ack fits")
        }
        publish(w.written, to: slot.topics.down, mqtt: &mqtt)
    }

    // MARK: the device's frames (the link)

    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        polled.removeAll(keepingCapacity: true)
        for (i, slot) in slots.enumerated() {
            guard let slot, slot.channel.fd >= 0 else { continue }
            var events = Int16(POLLIN)
            if slot.channel.wantsWrite { events |= Int16(POLLOUT) }
            fds.append(pollfd(fd: slot.channel.fd, events: events, revents: 0))
            polled.append((i, slot.serial))
        }
    }

    public mutating func poll(fds: ArraySlice<pollfd>, now: ContinuousClock.Instant, mqtt: inout MQTTClient) {
        for (k, fd) in zip(polled.indices, fds) where fd.revents != 0 {
            let s = polled[k].slot
            guard let slot = slots[s], slot.serial == polled[k].serial else { continue }
            let readable = fd.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0
            let writable = fd.revents & Int16(POLLOUT) != 0
            slot.draining = true
            slot.channel.poll(readable: readable, writable: writable, buffer: receive) { sdu in
                fromDevice(s, sdu, now: now, mqtt: &mqtt)
            }
            slot.draining = false
            if slot.hangUpAfterDrain {
                // The stream ended on one of the device's frames (its slot is free already).
                if let words = slot.lastWords {
                    words.withUnsafeBytes { b in do throws(LinkError) { _ = try slot.channel.send(b) } catch {} }
                }
                slot.channel.close()
                continue
            }
            guard let slot = slots[s], slot.serial == polled[k].serial else { continue }
            switch slot.channel.state {
            case .open:
                sendOpenIfReady(s)
                flushUp(s)
                forwardCloseIfDue(s)
            case .closed(let error):
                if slot.down.closeEnd != nil, slot.closeSentToDevice, error == nil || error == .closed {
                    slot.deviceDone = true
                    finishIfDone(s, mqtt: &mqtt)
                } else {
                    _ = abort(s, .unreachable, "the link to the device dropped: \((error ?? .closed).description)",
                              toEndpoint: true, toDevice: false, mqtt: &mqtt)
                }
            case .connecting:
                break
            }
        }
    }

    mutating func fromDevice(_ s: Int, _ sdu: UnsafeRawBufferPointer, now: ContinuousClock.Instant, mqtt: inout MQTTClient) {
        guard let slot = slots[s] else { return }
        slot.lastActivity = now
        let message: LinkMessage
        do throws(WireError) { message = try LinkMessage.decode(sdu, payloadMax: Int(slot.endpointMaxData)) } catch {
            drops.count(error)
            _ = abort(s, .protocolError, "the device sent a malformed frame: \(error)", toEndpoint: true, toDevice: true,
                      mqtt: &mqtt)
            return
        }
        switch message.type {
        case .open:
            // The endpoint may have at most the queue's capacity in flight (`LinkQueue`).
            let o = (window: min(message.window, UInt16(clamping: config.streamWindow)),
                     maxData: min(message.maxData, UInt16(clamping: config.streamMaxData)))
            slot.deviceOpen = o
            publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt)
        case .data:
            // The device keeps the endpoint's window (as told) and numbers in order: the link
            // keeps order, so anything else is the device's bug.
            guard message.number == slot.down.next, slot.down.canSend else {
                _ = abort(s, .protocolError, "the device sent frame \(message.number) outside the window",
                          toEndpoint: true, toDevice: true, mqtt: &mqtt)
                return
            }
            if slot.down.allAcknowledged { slot.lastProgress = now }
            _ = slot.down.push(UnsafeRawBufferPointer(rebasing: sdu[message.body]))
            counters.framesDown &+= 1
            publish(sdu, to: slot.topics.down, mqtt: &mqtt)
        case .ack:
            // The window goes on capped at Wg, as the device's open was (§7.2): the endpoint
            // must never have more in flight than the up queue holds.
            slot.deviceAck = (message.number, min(message.window, UInt16(clamping: config.streamWindow)))
            republishDeviceAck(s, mqtt: &mqtt)
            finishIfDone(s, mqtt: &mqtt)
        case .close:
            guard message.number == slot.down.next else {
                _ = abort(s, .protocolError, "the device closed at \(message.number) after sending \(slot.down.next) frames",
                          toEndpoint: true, toDevice: true, mqtt: &mqtt)
                return
            }
            slot.down.close()
            publish(sdu, to: slot.topics.down, mqtt: &mqtt)
        case .reset, .error:
            publish(sdu, to: slot.topics.down, mqtt: &mqtt)
            end(s, clean: false, mqtt: &mqtt)
        default:
            drops.count("stream-unexpected")
        }
    }

    // MARK: ending

    /// Both directions closed, every frame acknowledged.
    func isDone(_ slot: Slot) -> Bool {
        slot.down.closeEnd != nil && slot.down.allAcknowledged && slot.closeSentToDevice
            && (slot.deviceDone || slot.deviceAck?.next == slot.up.closeEnd)
    }

    mutating func finishIfDone(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = slots[s], isDone(slot) else { return }
        end(s, clean: true, mqtt: &mqtt)
    }

    /// Tells one or both ends `reason` and ends the stream. Returns false (for `||` chains).
    mutating func abort(_ s: Int, _ reason: StreamReason, _ detail: String, toEndpoint: Bool, toDevice: Bool,
                        mqtt: inout MQTTClient) -> Bool {
        guard let slot = slots[s] else { return false }
        if toEndpoint { publishError(reason, detail, to: slot.topics.down, mqtt: &mqtt) }
        // A draining channel is open (it drains only while open) and is not touched now.
        if toDevice, slot.draining || slot.channel.state == .open {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeError(reason, detail: Self.cut(detail, 100), into: &w) } catch {
                preconditionFailure("an error frame of 100 bytes of detail fits")
            }
            if slot.draining { slot.lastWords = Array(w.written) } else { _ = sendToDevice(s, w.written) }
        }
        end(s, clean: false, mqtt: &mqtt)
        return false
    }

    mutating func end(_ s: Int, clean: Bool, mqtt: inout MQTTClient) {
        guard let slot = slots[s] else { return }
        if clean { counters.finished &+= 1 } else { counters.aborted &+= 1 }
        if slot.draining { slot.hangUpAfterDrain = true } else { slot.channel.close() }
        slots[s] = nil
        openCount -= 1
        do throws(MQTTError) { try mqtt.unsubscribe(slot.topics.up) } catch {}
        publishText(slot.topics.gateway, "", retain: true, mqtt: &mqtt)
    }

    // MARK: time and the broker

    public var nextDeadline: ContinuousClock.Instant? {
        guard openCount > 0 else { return nil }
        var next: ContinuousClock.Instant?
        func consider(_ d: ContinuousClock.Instant) { if next.map({ d < $0 }) ?? true { next = d } }
        for slot in slots {
            guard let slot else { continue }
            consider(slot.lastActivity + config.streamIdle)
            if !slot.down.allAcknowledged { consider(slot.lastProgress + config.streamRetry) }
        }
        return next
    }

    /// Resends what the endpoint has not acknowledged in time; ends idle streams.
    public mutating func tick(now: ContinuousClock.Instant, mqtt: inout MQTTClient) {
        for s in slots.indices {
            guard let slot = slots[s] else { continue }
            if slot.lastActivity + config.streamIdle <= now {
                _ = abort(s, .idle, "nothing moved for relay.stream-idle (\(config.streamIdle))", toEndpoint: true,
                          toDevice: true, mqtt: &mqtt)
                continue
            }
            if !slot.down.allAcknowledged, slot.lastProgress + config.streamRetry <= now {
                resend(s, mqtt: &mqtt)
                slot.lastProgress = now
            }
        }
    }

    /// Go-back-N: every unacknowledged down frame, then the close if said.
    mutating func resend(_ s: Int, mqtt: inout MQTTClient) {
        guard let slot = slots[s] else { return }
        var n = slot.down.unacked
        while n != slot.down.next {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeData(frame: n, bytes: slot.down.frame(n), into: &w) } catch {
                preconditionFailure("a kept frame fits its scratch")
            }
            publish(w.written, to: slot.topics.down, mqtt: &mqtt)
            counters.resent &+= 1
            n &+= 1
        }
        if let end = slot.down.closeEnd {
            var w = ByteWriter(frameScratch)
            do throws(WireError) { try LinkMessage.encodeClose(end: end, into: &w) } catch { preconditionFailure("a close fits") }
            publish(w.written, to: slot.topics.down, mqtt: &mqtt)
        }
    }

    /// After every (re)connect: the session is clean, so subscribe again, say again which
    /// gateway carries each stream, and resend what may have been lost with the old broker.
    public mutating func reconnected(now: ContinuousClock.Instant, mqtt: inout MQTTClient) {
        for s in slots.indices {
            guard let slot = slots[s] else { continue }
            do throws(MQTTError) { try mqtt.subscribe(slot.topics.up, qos: 1) } catch { return }
            publishText(slot.topics.gateway, gatewayID, retain: true, mqtt: &mqtt)
            if let o = slot.deviceOpen { publishOpen(o.window, o.maxData, to: slot.topics.down, mqtt: &mqtt) }
            republishDeviceAck(s, mqtt: &mqtt)
            resend(s, mqtt: &mqtt)
            slot.lastProgress = now
        }
    }

    /// A retained `<prefix>/streams/S/gateway`: who carries stream S (empty: it ended).
    public mutating func carried(stream id: String, by gateway: String) {
        if gateway.isEmpty {
            directory[id] = nil
        } else if directory[id] != nil || directory.count < directoryCapacity {
            directory[id] = gateway
        } else {
            drops.count("stream-directory-full")
        }
    }

    /// A gateway went offline; this one is the first online gateway: tell the endpoints of its
    /// streams (docs/relay.md §7.3) and clear their entries.
    public mutating func gatewayWentOffline(_ gateway: Substring, downTopic: (String) -> String,
                                            gatewayTopic: (String) -> String, mqtt: inout MQTTClient) {
        for (id, carrier) in directory where carrier == gateway && slots.allSatisfy({ $0?.id != id }) {
            publishError(.gone, "gateway \(gateway) went offline", to: downTopic(id), mqtt: &mqtt)
            publishText(gatewayTopic(id), "", retain: true, mqtt: &mqtt)
            directory[id] = nil
            counters.goneForOthers &+= 1
        }
    }

    /// Before a clean stop: every endpoint and device is told.
    public mutating func stop(mqtt: inout MQTTClient) {
        for s in slots.indices where slots[s] != nil {
            _ = abort(s, .gone, "the gateway is stopping", toEndpoint: true, toDevice: true, mqtt: &mqtt)
        }
    }

    // MARK: sending

    /// One SDU to the device; false when the link cannot take it now.
    mutating func sendToDevice(_ s: Int, _ sdu: UnsafeRawBufferPointer) -> Bool {
        guard let slot = slots[s], slot.channel.state == .open else { return false }
        do throws(LinkError) { return try slot.channel.send(sdu) } catch { return false }
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

    func publish(_ frame: UnsafeRawBufferPointer, to topic: String, mqtt: inout MQTTClient) {
        // QoS 1, not retained (docs/relay.md §7.1). A frame the broker did not take is resent
        // after the reconnect (down data) or by the endpoint (everything else).
        do throws(MQTTError) { try mqtt.publish(topic: topic, payload: frame, qos: 1, retain: false) } catch {}
    }

    func publishText(_ topic: String, _ text: String, retain: Bool, mqtt: inout MQTTClient) {
        // Array.withUnsafeBytes rethrows untyped: a failure is dropped here like `publish`'s.
        _ = try? Array(text.utf8).withUnsafeBytes { try mqtt.publish(topic: topic, payload: $0, qos: 1, retain: retain) }
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
