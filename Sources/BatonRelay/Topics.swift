// The MQTT topic layout: the contract written down in docs/mqtt.md and docs/relay.md. Every
// topic the gateway, the relays and the `baton` tools publish, subscribe to or read is spelled
// here and nowhere else; what a message heard is comes from `classify`, one total function, so
// receiving is a `switch` over `InboundTopic`.
//
// Why BatonRelay: it is the lowest module that speaks Baton over MQTT. The relays publish and
// subscribe to these topics themselves (answers, was-continued events, stream topics), so the
// layout cannot sit above them; BatonMQTT is the libmosquitto wrapper and knows no layout (nor
// BatonWire's device id text); BatonWire is bytes on the air and on links, with no MQTT in it.

import BatonWire

/// What a message heard on the broker is, by its topic alone (docs/mqtt.md, docs/relay.md).
/// The payload is the receiver's to judge.
public enum InboundTopic: Sendable, Equatable {
    /// `<prefix>/gateways/<gateway>/status` (docs/mqtt.md §1).
    case status(gateway: Substring)
    /// `<prefix>/sightings/<gateway>/<device>` (docs/rooms.md §2).
    case sighting(gateway: Substring, device: UInt64)
    /// Under `<prefix>/sightings/` but not `<gateway>/<12 lowercase hex digits>`.
    case malformedSighting
    /// `<prefix>/fetch/<anything>` (docs/relay.md §1): nil when the rest is not one device id,
    /// which is answered `bad-request`, not ignored.
    case fetch(device: UInt64?)
    /// `<prefix>/stream/<device>/<stream>` (docs/relay.md §7.1); device nil when that level is
    /// not 12 lowercase hex digits (refused, not ignored).
    case streamOpen(device: UInt64?, stream: String)
    /// `<prefix>/streams/<stream>/up`, `…/down`, `…/gateway` (docs/relay.md §7.1).
    case streamUp(stream: String)
    case streamDown(stream: String)
    case streamCarrier(stream: String)
    /// Under `<prefix>/stream/` or `<prefix>/streams/`, but no stream topic of §7.1.
    case malformedStream
    /// `<prefix>/answers/<this gateway>/<link>`: an owner's answer to a fetch asked for a phone
    /// (docs/relay.md §9); link nil when the last level is not a number.
    case answer(link: UInt64?)
    /// `<prefix>/activities/<device>` (docs/mqtt.md §2).
    case activity(device: UInt64)
    /// `<prefix>/apple/<id>` (docs/mqtt.md §3).
    case apple(UInt32)
    /// `<prefix>/continued/<device>` (docs/relay.md §3).
    case continued(device: UInt64)
    /// `<prefix>/rooms/<gateway>` or `<prefix>/building/<gateway>`: a sighting batch
    /// (docs/rooms.md §8, docs/protocol.md §6).
    case batch(BatchTopic)
    /// Anything else: another prefix, another gateway's answers, a level we do not read, or one
    /// of ours whose id is malformed. Ignored.
    case unknown
}

/// A sighting batch's topic (docs/rooms.md §8): which gateway sent it, and to whom.
public enum BatchTopic: Sendable, Equatable {
    /// `<prefix>/rooms/<gateway>`: the gateway's batch for its neighbourhood, every tick it
    /// owes sightings. Read by the gateways that hear the same devices (its neighbours).
    case neighbourhood(gateway: Substring)
    /// `<prefix>/building/<gateway>`: the low-rate building-wide batch (newcomers and the
    /// answers to them, docs/rooms.md §8.3). Read by every gateway.
    case building(gateway: Substring)
    /// Under `<prefix>/rooms/` or `<prefix>/building/` but not one gateway id (empty, or with
    /// more levels): counted as `batch-topic`, as `sighting-topic` is.
    case malformed

    /// The building-wide channel, whose order a receiver checks apart (docs/rooms.md §8.3).
    public var isBuildingWide: Bool {
        if case .building = self { return true }
        return false
    }
}

public struct Topics: Sendable, Equatable {
    public let prefix: String
    public let discoveryPrefix: String
    public let gatewayID: String

    public init(prefix: String, discoveryPrefix: String, gatewayID: String) {
        self.prefix = prefix
        self.discoveryPrefix = discoveryPrefix
        self.gatewayID = gatewayID
    }

    /// A client's view (the `baton` tools): the building's topics. A client is no gateway, so
    /// the topics of one gateway's own (`status`, `sighting`, `answer(link:)`…) are not its to use.
    public init(prefix: String) {
        self.init(prefix: prefix, discoveryPrefix: "", gatewayID: "")
    }

    // MARK: what a message is

    /// Total: any string in, never a trap. Each level is matched whole, so no topic is two
    /// things; within a level a well-formed topic wins over the level's `malformed…`.
    public func classify(_ topic: String) -> InboundTopic {
        guard let (level, rest) = Self.level(of: topic, after: prefix) else { return .unknown }
        switch level {
        case "gateways":
            guard rest.hasSuffix("/status") else { return .unknown }
            let id = rest.dropLast(7)  // "/status"
            return id.isEmpty || id.contains("/") ? .unknown : .status(gateway: id)
        case "sightings":
            guard let slash = rest.lastIndex(of: "/") else { return .malformedSighting }
            let gateway = rest[..<slash]
            guard !gateway.isEmpty, !gateway.contains("/"), let id = Self.deviceID(rest[rest.index(after: slash)...]) else {
                return .malformedSighting
            }
            return .sighting(gateway: gateway, device: id)
        case "fetch":
            return .fetch(device: Self.deviceID(rest))
        case "stream":
            guard let slash = rest.firstIndex(of: "/") else { return .malformedStream }
            let id = rest[rest.index(after: slash)...]
            guard Self.isStreamID(id) else { return .malformedStream }
            return .streamOpen(device: Self.deviceID(rest[..<slash]), stream: String(id))
        case "streams":
            guard let slash = rest.lastIndex(of: "/") else { return .malformedStream }
            let id = rest[..<slash]
            guard Self.isStreamID(id) else { return .malformedStream }
            switch rest[rest.index(after: slash)...] {
            case "up": return .streamUp(stream: String(id))
            case "down": return .streamDown(stream: String(id))
            case "gateway": return .streamCarrier(stream: String(id))
            default: return .malformedStream
            }
        case "answers":
            guard !gatewayID.isEmpty, rest.hasPrefix(gatewayID), rest.dropFirst(gatewayID.count).hasPrefix("/") else {
                return .unknown
            }
            return .answer(link: UInt64(rest.dropFirst(gatewayID.count + 1)))
        case "activities":
            return Self.deviceID(rest).map { .activity(device: $0) } ?? .unknown
        case "apple":
            return Self.appleID(rest).map { .apple($0) } ?? .unknown
        case "continued":
            return Self.deviceID(rest).map { .continued(device: $0) } ?? .unknown
        case "rooms", "building":
            return classifyBatch(topic).map { .batch($0) } ?? .unknown
        default:
            return .unknown
        }
    }

    /// A batch topic, or nil for any other topic (docs/rooms.md §8). Total, like `classify`,
    /// which returns what it says as `.batch`.
    public func classifyBatch(_ topic: String) -> BatchTopic? {
        guard let (level, rest) = Self.level(of: topic, after: prefix) else { return nil }
        guard level == "rooms" || level == "building" else { return nil }
        guard !rest.isEmpty, !rest.contains("/") else { return .malformed }
        return level == "rooms" ? .neighbourhood(gateway: rest) : .building(gateway: rest)
    }

    /// The level after `<prefix>/` and everything after it and its slash.
    static func level(of topic: String, after prefix: String) -> (Substring, Substring)? {
        guard topic.hasPrefix(prefix) else { return nil }
        let rest = topic.dropFirst(prefix.count)
        guard rest.first == "/" else { return nil }
        let levels = rest.dropFirst()
        guard let slash = levels.firstIndex(of: "/") else { return nil }
        return (levels[..<slash], levels[levels.index(after: slash)...])
    }

    // MARK: the gateway (docs/mqtt.md §1)

    /// Retained `online`; the last will says `offline` (docs/mqtt.md §1).
    public var status: String { status(of: gatewayID) }
    /// Any gateway's status: the carrier of a stream is followed by it (docs/relay.md §7.4).
    public func status(of gateway: String) -> String { "\(prefix)/gateways/\(gateway)/status" }
    /// Every gateway's status, for the ownership rule (docs/rooms.md §4).
    public var statusPattern: String { "\(prefix)/gateways/+/status" }
    /// Retained JSON beside the status: room, version, uptime, counters (docs/mqtt.md §1).
    public var stats: String { "\(prefix)/gateways/\(gatewayID)/stats" }

    // MARK: activities and Apple devices (docs/mqtt.md §2–3)

    /// Retained JSON of a device's current activity; empty when it ends (docs/mqtt.md §2).
    public func activity(_ deviceID: UInt64) -> String { "\(prefix)/activities/\(Self.deviceText(deviceID))" }
    public var activityPattern: String { "\(prefix)/activities/+" }
    /// Retained JSON of an Apple device seen through Continuity frames (docs/mqtt.md §3).
    public func apple(_ id: UInt32) -> String { "\(prefix)/apple/\(Self.appleText(id))" }
    public var applePattern: String { "\(prefix)/apple/+" }

    // MARK: rooms (docs/rooms.md)

    /// This gateway's sighting of a device: QoS 0, not retained (docs/rooms.md §2).
    public func sighting(_ deviceID: UInt64) -> String {
        "\(prefix)/sightings/\(gatewayID)/\(Self.deviceText(deviceID))"
    }
    public var sightingPattern: String { "\(prefix)/sightings/+/+" }

    /// This gateway's sighting batches for its neighbourhood: QoS 0, not retained
    /// (docs/rooms.md §8, body docs/protocol.md §6).
    public var batch: String { batch(of: gatewayID) }
    /// A neighbour's batches: a gateway subscribes to each neighbour's, and to its own.
    public func batch(of gateway: String) -> String { "\(prefix)/rooms/\(gateway)" }
    /// Every gateway's batches: the layout without neighbourhoods (every gateway reads all).
    public var batchPattern: String { "\(prefix)/rooms/+" }
    /// This gateway's building-wide batches (docs/rooms.md §8.3): QoS 1, not retained.
    public var buildingBatch: String { "\(prefix)/building/\(gatewayID)" }
    /// Every gateway's building-wide batches: every gateway subscribes.
    public var buildingBatchPattern: String { "\(prefix)/building/+" }

    // MARK: the relay (docs/relay.md)

    /// Payload fetch requests (docs/relay.md §1): any client, any device.
    public func fetch(_ deviceID: UInt64) -> String { "\(prefix)/fetch/\(Self.deviceText(deviceID))" }
    public var fetchPattern: String { "\(prefix)/fetch/+" }
    /// A requester's answers, under the prefix so a bridge that carries `<prefix>/#` carries
    /// them too (docs/relay.md §1): `baton fetch` names itself here.
    public func answers(to requester: String) -> String { "\(prefix)/answers/\(requester)" }
    /// Where the owners answer the fetches this gateway asks for a phone's link (docs/relay.md §9).
    public func answer(link: UInt64) -> String { answers(to: "\(gatewayID)/\(link)") }
    public var answerPattern: String { answers(to: "\(gatewayID)/+") }
    /// Was-continued events: `<prefix>/continued/<device>` (docs/relay.md §3).
    public func continued(_ deviceID: UInt64) -> String { "\(prefix)/continued/\(Self.deviceText(deviceID))" }
    public var continuedPattern: String { "\(prefix)/continued/+" }
    /// Stream opens (docs/relay.md §7.1): `<prefix>/stream/<device>/<stream>`.
    public func streamOpen(device: UInt64, stream id: String) -> String {
        "\(prefix)/stream/\(Self.deviceText(device))/\(id)"
    }
    public var streamOpenPattern: String { "\(prefix)/stream/+/+" }
    /// Who carries each stream: `<prefix>/streams/<stream>/gateway`, retained.
    public var streamCarrierPattern: String { "\(prefix)/streams/+/gateway" }
    public func stream(_ id: String) -> StreamTopics {
        let base = "\(prefix)/streams/\(id)/"
        return StreamTopics(up: base + "up", down: base + "down", gateway: base + "gateway")
    }
    /// 1–32 of `a-z 0-9 - _` (docs/relay.md §7.1).
    public static func isStreamID(_ id: Substring) -> Bool {
        !id.isEmpty && id.utf8.count <= 32
            && id.utf8.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F }
    }

    // MARK: Home Assistant (docs/mqtt.md §4)

    // MQTT discovery: <discovery>/<component>/<node>/<object>/config.
    public var gatewayNode: String { "baton_\(gatewayID)" }
    public var gatewayConnectivityConfig: String { "\(discoveryPrefix)/binary_sensor/\(gatewayNode)/connectivity/config" }
    public static func deviceNode(_ deviceID: UInt64) -> String { "baton_\(deviceText(deviceID))" }
    public func deviceRoomConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/sensor/\(Self.deviceNode(deviceID))/room/config"
    }
    public func deviceActivityConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/sensor/\(Self.deviceNode(deviceID))/activity/config"
    }
    /// A device named by its IRK (`apple.irks`): a person's phone or watch, one Room sensor.
    public static func personNode(_ appleID: UInt32) -> String { "baton_apple_\(appleText(appleID))" }
    public func personRoomConfig(_ appleID: UInt32) -> String {
        "\(discoveryPrefix)/sensor/\(Self.personNode(appleID))/room/config"
    }
    /// The device trackers (docs/mqtt.md §4): one per tracked device and per named device.
    public func deviceTrackerConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/device_tracker/\(Self.deviceNode(deviceID))/tracker/config"
    }
    public func personTrackerConfig(_ appleID: UInt32) -> String {
        "\(discoveryPrefix)/device_tracker/\(Self.personNode(appleID))/tracker/config"
    }
    /// `<prefix>/trackers/<device>` and `…/apple-<id>`: the room as plain text, or `not_home`
    /// (docs/mqtt.md §4): Home Assistant's MQTT device tracker takes its location from the raw
    /// payload, so it cannot read a JSON field.
    public func tracker(_ deviceID: UInt64) -> String { "\(prefix)/trackers/\(Self.deviceText(deviceID))" }
    public func tracker(apple appleID: UInt32) -> String { "\(prefix)/trackers/apple-\(Self.appleText(appleID))" }

    // MARK: ids in topics

    /// A device id in topics: 12 lowercase hex digits, most significant byte first
    /// (docs/protocol.md §2.4 prints it the same way, with colons).
    public static func deviceText(_ id: UInt64) -> String { ActivityBeacon.deviceIDText(id) }
    public static func appleText(_ id: UInt32) -> String { Hex.text(id, digits: 8) }

    /// 12 lowercase hex digits, as `deviceText` writes them; nothing else.
    static func deviceID(_ text: Substring) -> UInt64? {
        guard text.utf8.count == 12, text.utf8.allSatisfy(isLowerHex) else { return nil }
        return UInt64(text, radix: 16)
    }

    /// 8 lowercase hex digits, as `appleText` writes them; nothing else.
    static func appleID(_ text: Substring) -> UInt32? {
        guard text.utf8.count == 8, text.utf8.allSatisfy(isLowerHex) else { return nil }
        return UInt32(text, radix: 16)
    }

    static func isLowerHex(_ c: UInt8) -> Bool { (0x30...0x39).contains(c) || (0x61...0x66).contains(c) }
}

/// Which of a stream's two broker topics a frame came on (docs/relay.md §7.1): `up` from the
/// endpoint to the carrier, `down` from the carrier to the endpoint.
public enum StreamSide: Sendable, Equatable {
    case up, down
}
