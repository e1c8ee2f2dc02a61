import BatonLibc
import ArgumentParser
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire
import Foundation
import Glibc

/// `baton fetch DEVICE`: asks the building for a device's activity payload and prints it
/// (docs/relay.md §6). It is an ordinary MQTT client, doing what an app or a Node-RED flow
/// would: MQTT v5 request/response, with the v3.1.1 fallback in the body as well, so it works
/// through a v3.1.1 broker or bridge too.
struct FetchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fetch",
        abstract: "Fetch a device's current activity payload through the building's gateways.",
        discussion: """
            Prints the payload rendered as JSON, or its CBOR bytes with --cbor. Exit status: 0 the \
            payload; 1 an error answer (its reason on stderr: unknown-device, not-owner, unreachable, \
            too-large, timeout, bad-request, cancelled, busy); 3 no answer in time.
            """)

    @Argument(help: "The device id: 12 hex digits, as in <prefix>/activities/<device> (colons allowed).")
    var device: String
    @OptionGroup var options: BrokerOptions
    @Flag(name: .long, help: "Write the payload's CBOR bytes to stdout instead of JSON.")
    var cbor = false
    @Option(name: .long, help: "Seconds to wait for the answer (gateways answer within relay.fetch-timeout, 5 s by default).")
    var timeout: Double = 10
    @Option(name: .customLong("continue"),
            help: "Say the activity is continued here (a room or device name, 1–64 bytes): the device is told, and the event is published.")
    var continuedAt: String?
    @Option(name: .long, help: "A file holding the group secret (BATON-GROUP-V1:…): open a sealed payload (docs/security.md §5).")
    var key: String?

    func run() throws {
        let deviceText = device.lowercased().filter { $0 != ":" }
        guard deviceText.count == 12, deviceText.allSatisfy({ $0.isHexDigit }), let deviceID = UInt64(deviceText, radix: 16) else {
            throw ValidationError("DEVICE must be 12 hex digits like 5a123456789a, got \"\(device)\"")
        }
        guard timeout > 0, timeout <= 3600 else { throw ValidationError("--timeout must be 0–3600 seconds") }
        // The payload key comes from the group secret; gateways never hold it (docs/security.md §6).
        let opener: SealedEnvelope?
        if let key {
            do {
                opener = try SealedEnvelope(key: GroupKeys.derive(secret: GroupSecret.load(path: key)).payloadKey)
            } catch {
                throw ValidationError("--key \(key): \(error)")
            }
        } else {
            opener = nil
        }
        // Sealed bytes cannot be rendered by a gateway: ask for them as they are.
        let format = cbor || opener != nil ? "cbor" : "json"
        var random = SystemRandomNumberGenerator()
        let tag = String(UInt64.random(in: .min ... .max, using: &random), radix: 16)
        var client = try options.client(id: "baton-fetch-\(getpid())-\(tag)", reconnectMax: .seconds(1))
        let topics = Topics(prefix: options.prefix), broker = options.broker
        // Under the prefix, so a bridge that carries `<prefix>/#` carries the answer too
        // (docs/relay.md §1).
        let responseTopic = topics.answers(to: "baton-fetch-\(tag)")
        let correlation = (0..<8).map { _ in UInt8.random(in: 0...255, using: &random) }
        let correlationHex = correlation.map { String(format: "%02x", $0) }.joined()
        var body = #"{"format":"\#(format)","response_topic":"\#(responseTopic)","correlation":"\#(correlationHex)""#
        if let continuedAt {
            // The body allows no escapes (docs/relay.md §2): refuse what would need one.
            guard (1...64).contains(continuedAt.utf8.count),
                  !continuedAt.unicodeScalars.contains(where: { $0 == "\"" || $0 == "\\" || $0.value < 0x20 }) else {
                throw ValidationError("--continue must be 1–64 bytes without quotes, backslashes or control characters")
            }
            body += #","continue":"\#(continuedAt)""#
        }
        body += "}"

        client.start(now: .now)
        let deadline = Instant.now + .milliseconds(Int64(timeout * 1000))
        var asked = false
        while Instant.now < deadline {
            var fd = pollfd(fd: client.socket, events: Int16(POLLIN), revents: 0)
            if client.wantsWrite { fd.events |= Int16(POLLOUT) }
            _ = Glibc.poll(&fd, 1, 100)
            var events: [MQTTEvent] = []
            client.poll(now: .now, readable: fd.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                        writable: fd.revents & Int16(POLLOUT) != 0) { events.append($0) }
            for event in events {
                switch event {
                case .connected:
                    guard !asked else { continue }
                    asked = true
                    do {
                        // The subscription is in place before the request: the broker handles
                        // one connection's packets in order.
                        try client.subscribe(responseTopic, qos: 1)
                        try Array(body.utf8).withUnsafeBytes { bytes in
                            try client.publish(topic: topics.fetch(deviceID), payload: bytes, qos: 1,
                                               properties: MQTTProperties(responseTopic: responseTopic,
                                                                          correlationData: correlation))
                        }
                    } catch {
                        throw ValidationError("asking the broker: \(error)")
                    }
                case .refused(let reason), .disconnected(let reason):
                    Stderr.say("fetch", "\(reason)")
                case .message(let m) where m.topic == responseTopic:
                    if let code = try answer(m, correlation: correlation, correlationHex: correlationHex,
                                             device: UInt64(deviceText, radix: 16)!, opener: opener) {
                        client.disconnect()
                        if code != 0 { throw ExitCode(code) }
                        return
                    }
                case .message:
                    break
                }
            }
        }
        client.disconnect()
        Stderr.say("fetch", "no answer within \(timeout) s (is a gateway of this building running and connected to \(broker)? docs/relay.md)")
        throw ExitCode(3)
    }

    /// Prints an answer meant for us and returns the exit status; nil for someone else's.
    func answer(_ m: MQTTMessage, correlation: [UInt8], correlationHex: String, device: UInt64,
                opener: SealedEnvelope?) throws -> Int32? {
        let status: String
        var payload: Data
        var detail = ""
        var gateway = "?"
        var sequence: UInt16?
        if let user = m.properties.userProperties.first(where: { $0.name == "status" }) {
            // An MQTT v5 answer: status and correlation in properties (docs/relay.md §3).
            guard m.properties.correlationData == correlation else { return nil }
            status = user.value
            gateway = m.properties.userProperties.first { $0.name == "gateway" }?.value ?? "?"
            sequence = m.properties.userProperties.first { $0.name == "seq" }.flatMap { UInt16($0.value) }
            payload = Data(m.payload)
            if status != "ok", let o = try? JSONSerialization.jsonObject(with: payload) as? [String: Any] {
                detail = o["detail"] as? String ?? ""
            }
        } else {
            // The v3.1.1 envelope.
            guard let o = try? JSONSerialization.jsonObject(with: Data(m.payload)) as? [String: Any],
                  o["correlation"] as? String == correlationHex else { return nil }
            status = o["status"] as? String ?? "?"
            gateway = o["gateway"] as? String ?? "?"
            detail = o["detail"] as? String ?? ""
            sequence = (o["seq"] as? Int).flatMap { UInt16(exactly: $0) }
            if cbor || opener != nil {
                payload = Data(base64Encoded: o["cbor"] as? String ?? "") ?? Data()
            } else {
                payload = (try? JSONSerialization.data(withJSONObject: o["payload"] ?? NSNull(), options: [.sortedKeys])) ?? Data()
            }
        }
        guard status == "ok" else {
            Stderr.say("fetch", "\(status): \(detail) (gateway \(gateway))")
            return 1
        }
        if let opener {
            guard let sequence, let plain = Self.open(payload, opener, device: device, sequence: sequence) else {
                Stderr.say("fetch", "the payload did not open with this key (another group's key, or not sealed, or altered on the way)")
                return 1
            }
            payload = cbor ? plain : Self.rendered(plain) ?? Data()
            if payload.isEmpty {
                Stderr.say("fetch", "the opened payload is not an activity payload v1 (docs/payload.md)")
                return 1
            }
        }
        if !cbor { payload.append(UInt8(ascii: "\n")) }
        FileHandle.standardOutput.write(payload)
        return 0
    }

    /// The plaintext of an envelope sealed for (device, sequence), or nil (docs/security.md §5.3).
    static func open(_ envelope: Data, _ opener: SealedEnvelope, device: UInt64, sequence: UInt16) -> Data? {
        let sealed = [UInt8](envelope)
        guard sealed.count >= SealedEnvelope.overhead else { return nil }
        var out = [UInt8](repeating: 0, count: sealed.count)
        let n = sealed.withUnsafeBytes { e in
            out.withUnsafeMutableBytes { o in
                try? opener.openPayload(e, for: PayloadContext(deviceID: device, sequence: sequence), into: o)
            }
        }
        return n.map { Data(out[..<$0]) }
    }

    /// A payload rendered as JSON (docs/payload.md §4), as a gateway would, or nil.
    static func rendered(_ plain: Data) -> Data? {
        let bytes = [UInt8](plain)
        var scratch = [UInt8](repeating: 0, count: bytes.count * 6 + 1024)
        let count: Int? = bytes.withUnsafeBytes { p in
            scratch.withUnsafeMutableBytes { s in
                var w = JSONWriter(s)
                do throws(WireError) {
                    let view = try ActivityPayload.validate(p, limits: PayloadLimits(maxBytes: max(p.count, 1)))
                    try view.renderJSON(into: &w)
                    return w.count
                } catch {
                    return nil
                }
            }
        }
        return count.map { Data(scratch[..<$0]) }
    }
}
