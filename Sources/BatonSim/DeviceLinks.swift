// The simulator's devices on their links (docs/protocol.md §5.5, docs/simulator.md "Device
// links"): simulated devices answer fetches, hear was-continued, and echo continuation streams
// through BatonDevice's `DeviceLinkServer`, the same server `baton device` runs on real L2CAP
// channels. Here: what the scenario's devices answer (`ScenarioPlayer: LinkDeviceModel`), the
// payload they send, and each room's link socket, `DIR/<room>.link` (Unix SOCK_SEQPACKET: one
// packet = one SDU, as an L2CAP LE credit-based channel delivers them).
//
// The links of a building share the server's fixed pool of `Building.linkCapacity` slots.
import BatonLibc
import BatonDevice
import BatonHCI
import BatonKeys
import BatonWire
import CLibc

extension ScenarioPlayer {
    /// The scenario index of the device with this id (scenario devices, then the crowd).
    public func deviceIndex(id: UInt64) -> Int? { indexByID[id] }

    /// The device with this LE address (random static, address type 1), if any.
    func deviceIndex(address: UInt64) -> Int? { indexByAddress[address] }

    /// The activity payload (deterministic CBOR, docs/payload.md) device `device` answers a
    /// fetch with when its activity is at `sequence`. A pure function of the scenario, the
    /// device and the sequence, so a test computes the bytes a fetch must return.
    /// Empty when the device's activity cannot be a payload (an activity type that is not
    /// reverse DNS, possible only in a `Scenario` built in code): the device refuses the fetch.
    public func payload(device: Int, sequence: UInt16) -> [UInt8] {
        let d = devices[device]
        return SimulatedPayload.encoded(type: d.type, title: d.title, name: d.name, webURL: d.webURL,
                                        sequence: sequence, payloadBytes: d.payloadBytes) ?? []
    }

    /// The device's current beacon sequence.
    public func sequence(device: Int) -> UInt16 { devices[device].beacon.sequence }

    /// Whether a fetch for `sequence` finds the device's activity gone (docs/protocol.md §5.2):
    /// invalidated, or replaced by a newer activity since that sequence.
    func activityGone(device: Int, asked sequence: UInt16) -> Bool {
        let d = devices[device]
        if d.beacon.flags.contains(.invalidated) { return true }
        // Sequences wrap (docs/protocol.md §2.3): older means less than half the circle behind.
        return Int16(bitPattern: sequence &- d.activityStart) < 0
    }

    func offersLink(_ device: Int) -> Bool { devices[device].link }
    func isSilent(_ device: Int) -> Bool { devices[device].silent }
    func supportsStreams(_ device: Int) -> Bool { devices[device].beacon.flags.contains(.supportsStreams) }
    func deviceName(_ device: Int) -> String { devices[device].name }
}

extension ScenarioPlayer: LinkDeviceModel {
    public func streamSealer(device d: Int) -> SealedEnvelope? { devices[d].sealer }

    public func fetchAnswer(device d: Int, asked: UInt16) -> LinkFetchAnswer {
        if activityGone(device: d, asked: asked) { return .refused(.notCurrent) }
        let sequence = self.sequence(device: d)
        var payload = self.payload(device: d, sequence: sequence)
        if let sealer = devices[d].sealer, !payload.isEmpty {
            // A keyed group's device seals for (its id, the sequence): gateways relay ciphertext
            // (docs/security.md §5.2).
            var sealed = [UInt8](repeating: 0, count: SealedEnvelope.sealedLength(plaintextCount: payload.count))
            let context = PayloadContext(deviceID: devices[d].id, sequence: sequence)
            let n = payload.withUnsafeBytes { p in
                sealed.withUnsafeMutableBytes { out in try? sealer.sealPayload(p, for: context, into: out) }
            }
            payload = n.map { Array(sealed[..<$0]) } ?? []
        }
        return payload.isEmpty ? .refused(.refused) : .payload(sequence: sequence, bytes: payload)
    }
    public func offersStreams(device: Int) -> Bool { supportsStreams(device) }
    public func linkDeviceID(_ device: Int) -> UInt64 { deviceID(device) }
    public func linkDeviceName(_ device: Int) -> String { deviceName(device) }

    public func connectStatus(addressType: UInt8, address: UInt64, psm: UInt16, room r: Int) -> (status: UInt8, device: Int?) {
        // Simulated devices have random static addresses (address type 1) only.
        guard addressType == 1, let d = deviceIndex(address: address) else { return (0x01, nil) }
        // A silent device is not connectable, and one without a link accepts none, wherever
        // the gateway is; a device in reach refuses a PSM that is not its own.
        if !offersLink(d) || isSilent(d) { return (0x04, d) }
        if !inReach(device: d, room: r) { return (0x02, d) }
        if psm != beacon(d).psm { return (0x03, d) }
        return (0x00, d)
    }

    /// A device is in reach of a room's link while the room hears it (`heard-down-to`).
    public func inReach(device: Int, room: Int) -> Bool {
        meanRSSI(device: device, room: room) >= scenario.radio.heardDownTo
    }
}

extension DeviceLinkServer {
    /// Every room of the player's scenario listening on `DIR/<room>.link`, its devices
    /// answering after the scenario's link-latency (at its speed).
    convenience init(player: ScenarioPlayer, directory base: String) throws(BuildingError) {
        let scenario = player.scenario
        let paths = scenario.rooms.map { base + "/" + $0.id + ".link" }
        var listeners: [Int32] = []
        for path in paths {
            do throws(BuildingError) {
                // Non-blocking: accept runs until EAGAIN.
                listeners.append(try Building.listen(path, type: Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue)))
            } catch {
                for fd in listeners { CLibc.close(fd) }
                for path in paths { unlink(path) }
                throw error
            }
        }
        self.init(model: player, rooms: scenario.rooms.count, listeners: listeners, paths: paths,
                  latency: .seconds(scenario.radio.linkLatency / scenario.speed))
    }
}

extension Building {
    /// Each room's link socket, `DIR/<room>.link`, in the scenario's order.
    public var linkPaths: [String] { links.paths }
    /// Links open at once in a building, all rooms together; one more is closed at once and
    /// counted as `links_full`.
    public static let linkCapacity = DeviceLinkServer.capacity
    /// What each room's link counted, in the scenario's order.
    public var linkCounts: [LinkCounts] { links.linkCounts }
}

// MARK: - The payload

/// The payload a simulated device sends (docs/simulator.md "Device links"): its activity type,
/// title, web URL when `web-url` is set, and userInfo `{"position": sequence}`, padded with a
/// `"padding"` data value to exactly `payload-bytes` when that is set.
enum SimulatedPayload {
    /// The smallest padding entry: the key `"padding"` (1 + 7 bytes) and an empty data value (1).
    static let leastPadding = 9
    /// Room for the largest padded payload (`payload-bytes` at most 65535).
    static let limits = PayloadLimits(maxBytes: Scenario.payloadBytesRange.upperBound)

    static func content(type: String, title: String, name: String, webURL: Bool, sequence: UInt16) -> ActivityPayloadContent {
        ActivityPayloadContent(activityType: type, title: title,
                               webpageURL: webURL ? "https://example.com/" + percentEncoded(name) : nil,
                               userInfo: ["position": .int(Int64(sequence))])
    }

    /// The payload without padding; empty when it cannot be encoded (see `payload(device:sequence:)`).
    static func unpadded(type: String, title: String, name: String, webURL: Bool, sequence: UInt16) -> [UInt8] {
        (try? content(type: type, title: title, name: name, webURL: webURL, sequence: sequence).encoded(limits: limits)) ?? []
    }

    /// The payload, exactly `payloadBytes` long when that is at least the unpadded size plus
    /// `leastPadding` (Scenario.parse checks it); otherwise unpadded.
    static func encoded(type: String, title: String, name: String, webURL: Bool, sequence: UInt16,
                        payloadBytes: Int?) -> [UInt8]? {
        var c = content(type: type, title: title, name: name, webURL: webURL, sequence: sequence)
        guard let bare = try? c.encoded(limits: limits) else { return nil }
        guard let target = payloadBytes, target >= bare.count + leastPadding else { return bare }
        // Adding the entry keeps userInfo's map head one byte (2 entries), so the entry alone
        // must take `room` bytes: key (8) + the value. A data value of n bytes takes n plus its
        // head (RFC 8949 §4.2.1: 1 byte up to 23, 2 up to 255, 3 up to 65535); sizes no head
        // reaches (25 and 258: one byte past each jump) take an array of one data value, whose
        // own head adds the byte.
        let room = target - bare.count - 8
        var value: UserInfoValue
        if let n = dataLength(taking: room) {
            value = .data(filler(n))
        } else {
            guard let n = dataLength(taking: room - 1) else { preconditionFailure("one of two adjacent sizes has a data length") }
            value = .array([.data(filler(n))])
        }
        c.userInfo["padding"] = value
        guard let padded = try? c.encoded(limits: limits) else { return nil }
        precondition(padded.count == target, "padding sized \(padded.count) for \(target)")
        return padded
    }

    /// n with n + head(n) == size, when there is one.
    static func dataLength(taking size: Int) -> Int? {
        for head in [1, 2, 3, 5] {
            let n = size - head
            if n >= 0, CBOR.headLength(argument: UInt64(n)) == head { return n }
        }
        return nil
    }

    static func filler(_ n: Int) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0) } }

    /// RFC 3986 §2.3: unreserved characters as they are, every other byte `%XX`, so any
    /// device name makes a URL a gateway accepts (docs/payload.md §2.2).
    static func percentEncoded(_ s: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                 UInt8(ascii: "~"):
                out.append(b)
            default:
                out += [UInt8(ascii: "%"), hex[Int(b >> 4)], hex[Int(b & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
