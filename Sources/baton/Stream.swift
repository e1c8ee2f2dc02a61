import BatonLibc
import ArgumentParser
import BatonGateway
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire
import Foundation
import Glibc

/// `baton stream DEVICE`: a continuation stream to a device, stdin to the device and the
/// device's bytes to stdout (docs/relay.md §7). It is the endpoint of §7.1: an ordinary MQTT
/// client, doing what an app on the continuing device would.
struct StreamCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Open a continuation stream to a device: stdin goes to it, its bytes come to stdout.",
        discussion: """
            Exit status: 0 both directions closed cleanly (stdin reached its end, the device closed \
            and everything was written); 1 the stream was refused or aborted (the reason on stderr: \
            unreachable, busy, protocol, idle, gone, cancelled); 3 no gateway answered the open in \
            time; 130 interrupted (the device is told: reset cancelled). With --key, every frame's \
            data is sealed for the device's group (docs/security.md §5.2): the gateways and the \
            broker carry ciphertext only.
            """)

    @Argument(help: "The device id: 12 hex digits, as in <prefix>/activities/<device> (colons allowed).")
    var device: String
    @OptionGroup var options: BrokerOptions
    @Option(name: .long, help: "Seconds to wait for a gateway to answer the open.")
    var timeout: Double = 10
    @Option(name: .long, help: "Frames in flight each way (1–1024): taken from the device before stdout takes them, and sent to it before it acknowledges them.")
    var window = 16
    @Option(name: .customLong("max-data"), help: "Bytes per frame each way (1–65535).")
    var maxData = 1024
    @Option(name: .long, help: "The group secret file (BATON-GROUP-V1:…, docs/security.md §1): seal and open every frame's data, for a keyed group's device.")
    var key: String?

    /// DEVICE as topics spell it: 12 lowercase hex digits.
    var deviceText: String { device.lowercased().filter { $0 != ":" } }

    func validate() throws {
        guard deviceText.count == 12, deviceText.allSatisfy({ $0.isHexDigit }), UInt64(deviceText, radix: 16) != nil else {
            throw ValidationError("DEVICE must be 12 hex digits like 5a123456789a, got \"\(device)\"")
        }
        guard timeout > 0, timeout <= 3600 else { throw ValidationError("--timeout must be 0–3600 seconds") }
        guard (1...1024).contains(window) else { throw ValidationError("--window must be 1–1024 frames, got \(window)") }
        guard (1...65535).contains(maxData) else { throw ValidationError("--max-data must be 1–65535 bytes, got \(maxData)") }
    }

    func run() throws {
        // §7.1: 16 random hex digits, unique enough among the streams of one building.
        var random = SystemRandomNumberGenerator()
        let id = String(format: "%016llx", UInt64.random(in: .min ... .max, using: &random))
        let client = try options.client(id: "baton-stream-\(id)", reconnectMax: .seconds(2))
        // Ctrl-C and SIGTERM become a byte on a pipe the loop polls, so the loop can still tell
        // the device (reset cancelled); SIGPIPE is ignored, so a closed stdout is an error we report.
        let stop = StopSignals()
        // The payload key comes from the group secret; gateways never hold it (docs/security.md §6).
        var sealer: SealedEnvelope? = nil
        if let key {
            do {
                sealer = try SealedEnvelope(key: GroupKeys.derive(secret: GroupSecret.load(path: key)).payloadKey)
            } catch {
                throw ValidationError("--key \(key): \(error)")
            }
            guard maxData > SealedEnvelope.overhead else {
                throw ValidationError("--max-data must be more than \(SealedEnvelope.overhead) with --key: a sealed frame carries that much besides its data")
            }
        }
        var session = StreamSession(client: client, device: deviceText, id: id, prefix: options.prefix,
                                    broker: options.broker, window: window, maxData: maxData,
                                    timeout: timeout, sealer: sealer)
        let status = session.run(stop: stop)
        if status != 0 { throw ExitCode(status) }
    }
}

/// One stream seen from its endpoint (docs/relay.md §7; frames: docs/protocol.md §5.3).
///
///   up    stdin → `StreamSender` → `<prefix>/streams/S/up`: read only while the device's
///         window has room, kept until acknowledged, resent from the first unacknowledged
///         frame (go-back-N) after `retry` without progress and after every reconnect;
///   down  `<prefix>/streams/S/down` → `StreamReceiver` → stdout: taken in order only, into
///         one slot per frame; acknowledged only once written to stdout, so a slow reader of
///         stdout stops the acks and, through the window, the device (§5.3 backpressure).
///
/// Memory is allocated once: `window` × `maxData` bytes each way, plus one frame read from stdin.
struct StreamSession: ~Copyable {
    var client: MQTTClient
    /// stdin towards the device: what we keep for resending is our own window × max data,
    /// however large a window the device offers.
    var up: StreamSender
    /// The device's frames towards stdout.
    var down = StreamReceiver()
    let window: Int
    let maxData: Int
    let device: String
    let id: String
    let broker: String
    let openTopic: String
    let upTopic: String
    let downTopic: String
    /// `<prefix>/streams/S/gateway`: who carries the stream (docs/relay.md §7.1).
    let carrierTopic: String
    /// The building's topics: where the carrier's status is.
    let topics: Topics
    /// The carrier `…/S/gateway` names now, whose status we follow (§7.4): its going offline
    /// ends the stream even when no gateway is left to send error gone.
    var carrier: String?
    /// When the carrier's status stopped saying `online`, while connected since. Its end is
    /// heard `carrierGrace` later: mosquitto sends every client's will when it shuts down
    /// (a broker restart), just before it closes our connection too, and such an `offline`
    /// is not the carrier's end. The disconnect forgets it; a real one comes again, retained.
    var carrierOfflineSince: Instant?
    /// `--timeout`: no open frame from a gateway by then, and the stream is given up.
    let timeout: Duration
    let timeoutSeconds: Double

    /// stdin into frames, the device's frames onto stdout (`StdioFrames`).
    var io: StdioFrames
    /// Frames written whole to stdout: what we may acknowledge.
    var written: UInt32 { io.written }
    /// The last ack we published: the device has at most `window` frames past it in flight.
    var acked: UInt32 = 0
    var ackedOnce = false

    var openSentAt: Instant?
    /// When the unacknowledged up frames are resent if no ack moves them on before.
    var retryAt: Instant?
    var everConnected = false
    /// Device frames dropped because one before them was lost (the gateway resends them).
    var gaps = 0
    /// With `--key`: seals our frames and opens the device's (docs/security.md §5.2); the
    /// stream nonce is our frame 0's, set when it is sent.
    var sealer: SealedEnvelope? { io.sealer }

    /// An open with no open frame back is published again after this: the broker may have
    /// lost it (docs/relay.md §7.2).
    static let openRetry = Duration.seconds(2)
    /// `relay.stream-retry`'s default (docs/relay.md §7.3): the endpoint resends as the gateway does.
    static let retry = Duration.seconds(1)
    /// How long the carrier's `offline` must stand, connected, before it ends the stream.
    static let carrierGrace = Duration.seconds(1)

    init(client: consuming MQTTClient, device: String, id: String, prefix: String, broker: String,
         window: Int, maxData: Int, timeout seconds: Double, sealer: SealedEnvelope? = nil) {
        self.client = client
        io = StdioFrames(window: window, maxData: maxData, sealer: sealer, deviceID: UInt64(device, radix: 16) ?? 0)
        up = StreamSender(capacity: window, maxData: maxData)
        self.window = window
        self.maxData = maxData
        self.device = device
        self.id = id
        self.broker = broker
        topics = Topics(prefix: prefix)
        // `device` is `baton stream`'s validated DEVICE: 12 hex digits.
        openTopic = topics.streamOpen(device: UInt64(device, radix: 16) ?? 0, stream: id)
        let stream = topics.stream(id)
        upTopic = stream.up
        downTopic = stream.down
        carrierTopic = stream.gateway
        timeout = .milliseconds(Int64(seconds * 1000))
        timeoutSeconds = seconds
    }

    /// Runs the stream to its end; the exit status.
    mutating func run(stop: borrowing StopSignals) -> Int32 {
        let giveUp = Instant.now + timeout
        client.start(now: .now)
        var fds = [pollfd](repeating: pollfd(fd: -1, events: 0, revents: 0), count: 4)
        while true {
            let reading = !io.inputEnded && up.canSend
            let writing = written != down.next
            fds[0] = pollfd(fd: client.socket, events: Int16(POLLIN) | (client.wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            fds[1] = pollfd(fd: stop.fd, events: Int16(POLLIN), revents: 0)
            fds[2] = pollfd(fd: reading ? STDIN_FILENO : -1, events: Int16(POLLIN), revents: 0)
            fds[3] = pollfd(fd: writing ? STDOUT_FILENO : -1, events: Int16(POLLOUT), revents: 0)
            _ = Glibc.poll(&fds, 4, waitMilliseconds(giveUp: giveUp))
            let now = Instant.now

            if fds[1].revents != 0, stop.drain() {
                send(Self.reset(.cancelled))
                return end(130)
            }
            var events: [MQTTEvent] = []
            client.poll(now: now, readable: fds[0].revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                        writable: fds[0].revents & Int16(POLLOUT) != 0) { events.append($0) }
            for event in events {
                if let status = handle(event, now: now) { return end(status) }
            }
            // Events may have narrowed the window since the poll (a smaller window in an ack).
            if reading, up.canSend, fds[2].revents != 0, let status = readInput(now: now) { return end(status) }
            if writing, fds[3].revents != 0, let status = writeOutput() { return end(status) }

            if !up.opened {
                if now >= giveUp {
                    let why = everConnected
                        ? "no gateway answered the open of stream \(id) to device \(device) within \(timeoutSeconds) s (is a gateway of this building running and connected to \(broker), and does it hear the device? docs/relay.md §7)"
                        : "could not reach the broker \(broker) within \(timeoutSeconds) s"
                    say(why)
                    // A gateway that took the stream late frees its slot.
                    send(Self.reset(.cancelled))
                    return end(3)
                }
                if client.isConnected, let sent = openSentAt, now - sent >= Self.openRetry { publishOpen(now: now) }
            }
            if let since = carrierOfflineSince, let carrier, client.isConnected, now - since >= Self.carrierGrace {
                say("gone: gateway \(carrier) went offline (its status says so; docs/relay.md §7.4)")
                // As when it gives up: a carrier that was only cut off lets its device go when
                // it is back.
                send(Self.reset(.cancelled))
                return end(1)
            }
            if let at = retryAt, now >= at {
                if up.inFlight > 0 {
                    resendUp()
                    retryAt = now + Self.retry
                } else {
                    retryAt = nil
                }
            }
            // §5.3: both directions closed and every frame acknowledged, ours by the device
            // and the device's by us, once written.
            if up.closeEnd != nil, up.allAcknowledged, down.finished, written == down.next, acked == written {
                return end(0)
            }
        }
    }

    /// Until the nearest thing due: the client's next deadline, the open's resend or give-up,
    /// the retry. At most a second, so nothing depends on a deadline computed a turn ago.
    func waitMilliseconds(giveUp: Instant) -> Int32 {
        let now = Instant.now
        var next = now + .seconds(1)
        if let d = client.nextDeadline { next = min(next, d) }
        if !up.opened {
            next = min(next, giveUp)
            if let sent = openSentAt { next = min(next, sent + Self.openRetry) }
        }
        if let r = retryAt { next = min(next, r) }
        if let since = carrierOfflineSince { next = min(next, since + Self.carrierGrace) }
        return (next - now).pollMilliseconds()
    }

    // MARK: - The broker

    mutating func handle(_ event: MQTTEvent, now: Instant) -> Int32? {
        switch event {
        case .connected:
            everConnected = true
            // A clean session: subscriptions end with the connection (docs/broker.md). The
            // broker handles one connection's packets in order, so the subscription is in
            // place before anything we publish next.
            do throws(MQTTError) {
                try client.subscribe(downTopic, qos: 1)
                // The carrier's claim, retained: it comes again at once, and with it the
                // carrier's status below (docs/relay.md §7.4).
                try client.subscribe(carrierTopic, qos: 1)
                if let carrier { try client.subscribe(statusTopic(carrier), qos: 1) }
            } catch {
                say("subscribing to \(downTopic): \(error)")
                return nil  // the connection is going; the next .connected tries again
            }
            if !up.opened {
                publishOpen(now: now)
            } else {
                // What the broker lost with the old connection: everything not acknowledged
                // (go-back-N, §5.3), the close, and our last ack (the device may be waiting for it).
                resendUp()
                if ackedOnce { send(Self.ack(acked, window: window)) }
                retryAt = up.inFlight > 0 ? now + Self.retry : nil
            }
        case .refused(let reason), .disconnected(let reason):
            say(reason)
            carrierOfflineSince = nil
        case .message(let m) where m.topic == downTopic:
            return take(m.payload, now: now)
        case .message(let m) where m.topic == carrierTopic:
            carried(by: m.payload)
        case .message(let m) where carrier.map({ m.topic == statusTopic($0) }) ?? false:
            // docs/mqtt.md §1: `online`, or the will `offline`; anything else is not online either.
            carrierOfflineSince = m.payload.elementsEqual("online".utf8) ? nil : (carrierOfflineSince ?? now)
        case .message:
            break
        }
        return nil
    }

    func statusTopic(_ gateway: String) -> String { topics.status(of: gateway) }

    /// `…/S/gateway` named the stream's carrier (empty: the stream ended there, and its frames
    /// say how). The watch moves to the named gateway's status.
    mutating func carried(by payload: [UInt8]) {
        // A gateway id (docs/config.md `gateway.id`), or nothing to follow.
        let named = payload.count <= 64 && payload.allSatisfy {
            (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F
        } ? String(decoding: payload, as: UTF8.self) : ""
        guard named != (carrier ?? "") else { return }
        do throws(MQTTError) {
            if let carrier { try client.unsubscribe(statusTopic(carrier)) }
            carrier = named.isEmpty ? nil : named
            carrierOfflineSince = nil
            if let carrier { try client.subscribe(statusTopic(carrier), qos: 1) }
        } catch {
            // The connection is going: the next .connected subscribes to the carrier's status.
            carrier = named.isEmpty ? nil : named
            carrierOfflineSince = nil
        }
    }

    mutating func publishOpen(now: Instant) {
        let open = Self.message(.open) { w throws(WireError) in
            try LinkMessage.encodeOpen(window: UInt16(window), maxData: UInt16(maxData), into: &w)
        }
        publish(openTopic, open)
        openSentAt = now
    }

    /// One frame from the gateway (docs/relay.md §7.3).
    mutating func take(_ payload: [UInt8], now: Instant) -> Int32? {
        let m: LinkMessage
        do {
            // Our max data bounds a data frame: a larger one breaks our open (§5.3).
            m = try payload.withUnsafeBytes { try LinkMessage.decode($0, payloadMax: maxData) }
        } catch {
            return breach("a malformed frame on \(downTopic): \(error)")
        }
        switch m.type {
        case .open:
            // A repeat (answering our repeated open) says the same again.
            up.peerOpened(window: m.window, maxData: m.maxData)
            if sealer != nil, up.maxData <= SealedEnvelope.overhead {
                return breach("the device's max data \(up.maxData) leaves no room for a sealed frame (\(SealedEnvelope.overhead) bytes besides the data)")
            }
            if let sealer, io.streamNonce == nil { return sendHello(sealer, now: now) }
        case .data:
            return payload.withUnsafeBytes { take(frame: m.number, bytes: UnsafeRawBufferPointer(rebasing: $0[m.body])) }
        case .ack:
            do throws(StreamViolation) {
                if try up.acknowledge(next: m.number, window: m.window) {
                    retryAt = up.inFlight > 0 ? now + Self.retry : nil
                }
            } catch {
                return breach(error.description)
            }
        case .close:
            do throws(StreamViolation) { try down.closed(end: m.number) } catch {
                return breach(error.description)
            }
            // Everything up to the close is written: say so again, after the close, so the
            // gateway's resent close gets its ack too.
            if down.finished, written == down.next { acknowledge() }
        case .reset:
            let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
            say("\(reason): the device or its gateway reset the stream")
            return 1
        case .error:
            let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
            let detail = payload.withUnsafeBytes { String(decoding: UnsafeRawBufferPointer(rebasing: $0[m.body]), as: UTF8.self) }
            // UTF-8 (decode checked), but someone else's: no control characters reach the terminal.
            let shown = String(detail.map { $0.unicodeScalars.contains { $0.properties.generalCategory == .control } ? "?" : $0 })
            say("\(reason): \(shown)")
            return 1
        case .fetch, .payload, .fetchRefused, .continued:
            return breach("a \(m.type) message is not a stream frame (docs/protocol.md §5.1)")
        }
        return nil
    }

    /// Sealed streams (docs/security.md §5.2): our frame 0 is an empty envelope whose nonce is
    /// the stream nonce; the device sends no data before it has it.
    mutating func sendHello(_ sealer: SealedEnvelope, now: Instant) -> Int32? {
        let n: Int
        do throws(SealError) { n = try sealer.sealHello(deviceID: io.deviceID, into: io.sealed) } catch {
            say("sealing: \(error)")
            send(Self.reset(.cancelled))
            return 1
        }
        let hello = UnsafeRawBufferPointer(rebasing: io.sealed[..<n])
        io.streamNonce = StreamFrameContext.streamNonce(ofFrameZero: hello)
        return pushUp(hello, now: now)
    }

    /// One frame's bytes (sealed already, if sealing) into `up`, kept for resending, and out.
    mutating func pushUp(_ bytes: UnsafeRawBufferPointer, now: Instant) -> Int32? {
        if up.inFlight == 0 { retryAt = now + Self.retry }
        let number = up.push(bytes)
        let data = Self.message(.data, body: bytes.count) { w throws(WireError) in
            try LinkMessage.encodeData(frame: number, bytes: bytes, into: &w)
        }
        send(data)
        return nil
    }

    /// A data frame from the device: into its slot when it is the next one.
    mutating func take(frame n: UInt32, bytes: UnsafeRawBufferPointer) -> Int32? {
        switch io.take(frame: n, bytes: bytes, acked: acked, down: &down) {
        case .held:
            return nil
        case .duplicate:
            // A resend: our ack was lost or is on its way. Say it again.
            acknowledge()
            return nil
        case .gap:
            gaps += 1
            return nil
        case .breach(let detail):
            return breach(detail)
        case .notOpened(let why):
            send(Self.error(.protocolError, detail: "frame \(n) did not open"))
            say(why)
            return 1
        }
    }

    /// Up frames not acknowledged, from the first (go-back-N, §5.3), then the close if said.
    mutating func resendUp() {
        var n = up.unacked
        while n != up.next {
            let frame = up.frame(n)
            let data = Self.message(.data, body: frame.count) { w throws(WireError) in
                try LinkMessage.encodeData(frame: n, bytes: frame, into: &w)
            }
            send(data)
            n &+= 1  // Proof: n runs from unacked up to next, and unacked ≤ next.
        }
        if let end = up.closeEnd { send(Self.close(end)) }
    }

    // MARK: - stdin and stdout

    /// One read from stdin, as one data frame; its end, as the close.
    mutating func readInput(now: Instant) -> Int32? {
        switch io.readStdin(number: up.next, room: up.maxData) {
        case .nothing:
            return nil
        case .ended:
            up.close()
            if let end = up.closeEnd { send(Self.close(end)) }
            return nil
        case .frame(let bytes):
            return pushUp(bytes, now: now)
        case .failed(let why):
            say(why)
            send(Self.reset(.cancelled))
            return 1
        }
    }

    /// Writes what stdout takes now, then acknowledges the frames written whole.
    mutating func writeOutput() -> Int32? {
        let before = written
        if let why = io.writeStdout(upTo: down.next) {
            say(why)
            send(Self.reset(.cancelled))
            return 1
        }
        if written != before {
            // Once per batch: acks are cumulative (§5.3).
            acknowledge()
        }
        return nil
    }

    // MARK: - Frames out

    /// Acknowledges the frames written to stdout: consumed, not merely arrived (§5.3), with
    /// our whole window, since the frames held here are never more than it.
    mutating func acknowledge() {
        send(Self.ack(written, window: window))
        acked = written
        ackedOnce = true
    }

    /// A frame that breaks §5.3 ends the stream with error `protocol`, on both sides.
    mutating func breach(_ detail: String) -> Int32 {
        send(Self.error(.protocolError, detail: detail))
        say("protocol: \(detail) (the gateway broke docs/protocol.md §5.3)")
        return 1
    }

    /// On `…/S/up`, QoS 1. A frame the broker does not take now (we are between connections)
    /// is not lost: the reconnect resends what is unacknowledged, our close and our last ack.
    mutating func send(_ frame: [UInt8]) { publish(upTopic, frame) }

    mutating func publish(_ topic: String, _ frame: [UInt8]) {
        guard client.isConnected else { return }
        frame.withUnsafeBytes { bytes in
            do throws(MQTTError) { try client.publish(topic: topic, payload: bytes, qos: 1) } catch {
                // The connection broke under the publish: .disconnected follows, then the resend.
            }
        }
    }

    mutating func end(_ status: Int32) -> Int32 {
        if gaps > 0 {
            say("frames from the device dropped after a lost one: \(gaps) (the gateway resent them)")
        }
        client.disconnect()
        return status
    }

    func say(_ text: String) {
        Stderr.say("stream", text)
    }

    /// One frame's bytes (docs/protocol.md §5.1): measured, then written.
    static func message(_ type: LinkMessageType, body: Int = 0,
                        _ encode: (inout ByteWriter) throws(WireError) -> Void) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: LinkMessage.encodedCount(type, bodyCount: body))
        bytes.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            do { try encode(&w) } catch {
                // Every argument is checked before: window, max data, detail length.
                preconditionFailure("a \(type) frame did not fit its own length: \(error)")
            }
        }
        return bytes
    }

    static func ack(_ next: UInt32, window: Int) -> [UInt8] {
        message(.ack) { w throws(WireError) in try LinkMessage.encodeAck(next: next, window: UInt16(window), into: &w) }
    }

    static func close(_ end: UInt32) -> [UInt8] {
        message(.close) { w throws(WireError) in try LinkMessage.encodeClose(end: end, into: &w) }
    }

    static func reset(_ reason: StreamReason) -> [UInt8] {
        message(.reset) { w throws(WireError) in try LinkMessage.encodeReset(reason, into: &w) }
    }

    /// The detail cut to what §5.1 allows (100 bytes), at a character boundary.
    static func error(_ reason: StreamReason, detail: String) -> [UInt8] {
        var text = Substring(detail)
        while text.utf8.count > LinkMessage.maxDetailBytes { text = text.dropLast() }
        return message(.error, body: text.utf8.count) { w throws(WireError) in
            try LinkMessage.encodeError(reason, detail: text, into: &w)
        }
    }
}
