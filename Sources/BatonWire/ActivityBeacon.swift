// Activity beacon v1: docs/protocol.md §2. One legacy advertisement (31 bytes) carries the
// Flags AD (3 bytes) and one manufacturer-specific AD (28 bytes): Length 0x1B, type 0xFF,
// company id (2, LE) and the 24-byte beacon value below. All integers little-endian.
//
//   value  size  field
//   0      1     version (1)
//   1      1     flags: b0 supports streams, b1 has web URL, b2 invalidated, b3 relayed;
//                b4–b7 reserved: written 0, ignored on receipt (protocol.md §2.2)
//   2      2     sequence (bumped on every save; serial-number arithmetic, RFC 1982)
//   4      4     activity-type hash (FNV-1a 32 of the type's UTF-8, protocol.md §2.3)
//   8      4     group hash (who may continue)
//   12     6     rotating device id (an RPA-shaped value: hash in bits 0–23, prand 24–47)
//   18     2     L2CAP PSM to fetch from (0: the device offers no link)
//   20     4     authentication tag over company id + value[0..<20] (protocol.md §2.4)

public struct BeaconFlags: OptionSet, Hashable, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let supportsStreams = BeaconFlags(rawValue: 0x01)
    public static let hasWebURL = BeaconFlags(rawValue: 0x02)
    public static let invalidated = BeaconFlags(rawValue: 0x04)
    public static let relayed = BeaconFlags(rawValue: 0x08)
    /// Bits this version defines; the rest are reserved.
    public static let known = BeaconFlags(rawValue: 0x0F)
}

/// Computes the key-dependent tag of a beacon. The security issue supplies a keyed
/// implementation (AES-CCM, docs/security.md); the layout does not change with it.
public protocol BeaconAuthenticator {
    /// The 4-byte tag over `signed`: the company id (2 bytes, LE) and value bytes 0..<20.
    func tag(signed: UnsafeRawBufferPointer) -> UInt32
}

/// A group with no key: the tag is zero and proves nothing (protocol.md §2.4).
public struct OpenGroup: BeaconAuthenticator {
    public init() {}
    public func tag(signed: UnsafeRawBufferPointer) -> UInt32 { 0 }
}

extension Malformed {
    /// A PSM outside the LE range 0x0001–0x00FF (Core 5.4, Vol 3, Part A, §4.22).
    public static let beaconBadPSM = Malformed("beacon-bad-psm")
    /// Manufacturer data under the beacon company id that is not 24 bytes long.
    public static let beaconLength = Malformed("beacon-length")
}

public struct ActivityBeacon: Hashable, Sendable {
    public static let version: UInt8 = 1
    /// 0xFFFF: the company id the Bluetooth SIG reserves for testing (Assigned Numbers §7).
    public static let defaultCompanyID: UInt16 = 0xFFFF
    /// Bytes after the company id.
    public static let valueLength = 24
    /// Bytes the authentication tag covers: company id + value[0..<20].
    public static let signedLength = 22
    /// Flags AD (3) + manufacturer AD header (4) + value (24) = 31, one legacy advertisement.
    public static let advertisementLength = 31

    public var flags: BeaconFlags
    public var sequence: UInt16
    public var activityTypeHash: UInt32
    public var groupHash: UInt32
    /// 48 bits; printed most significant byte first, like a Bluetooth address.
    public var deviceID: UInt64
    public var psm: UInt16
    public var tag: UInt32

    public init(flags: BeaconFlags = [], sequence: UInt16, activityTypeHash: UInt32, groupHash: UInt32,
                deviceID: UInt64, psm: UInt16, tag: UInt32 = 0) {
        self.flags = flags
        self.sequence = sequence
        self.activityTypeHash = activityTypeHash
        self.groupHash = groupHash
        self.deviceID = deviceID & 0xFFFF_FFFF_FFFF
        self.psm = psm
        self.tag = tag
    }

    /// A device id as topics, logs and the simulator print it: 12 lowercase hex digits, most
    /// significant first (docs/mqtt.md §2; docs/protocol.md §2.4 prints it the same way, with
    /// colons). The one place that spelling lives.
    public static func deviceIDText(_ id: UInt64) -> String {
        Hex.text(id & 0xFFFF_FFFF_FFFF, digits: 12)
    }

    /// Decodes the 24-byte value of a manufacturer AD whose company id was already matched.
    /// Fixed part first (the version decides the layout), then the exact length, then fields.
    public static func decode(value: UnsafeRawBufferPointer) throws(WireError) -> ActivityBeacon {
        var r = ByteReader(value)
        let version = try r.peekU8()
        guard version == ActivityBeacon.version else { throw .unsupported(at: 0, value: UInt64(version)) }
        guard value.count == valueLength else {
            if value.count < valueLength { throw .truncated(at: value.count, need: valueLength - value.count) }
            throw .trailing(at: valueLength, count: value.count - valueLength)
        }
        _ = try r.readU8()
        let flags = BeaconFlags(rawValue: try r.readU8() & BeaconFlags.known.rawValue)
        let sequence = try r.readU16LE()
        let typeHash = try r.readU32LE()
        let groupHash = try r.readU32LE()
        let idLow = UInt64(try r.readU32LE())
        let idHigh = UInt64(try r.readU16LE())
        let psmAt = r.offset
        let psm = try r.readU16LE()
        guard psm <= 0x00FF else { throw .malformed(at: psmAt, .beaconBadPSM) }
        let tag = try r.readU32LE()
        return ActivityBeacon(flags: flags, sequence: sequence, activityTypeHash: typeHash, groupHash: groupHash,
                              deviceID: idLow | idHigh << 32, psm: psm, tag: tag)
    }

    /// Finds and decodes the beacon in advertising data. Nil when no manufacturer AD carries
    /// `companyID`; throws when the AD data is malformed or the beacon under that id is.
    public static func find(inAdvertisingData data: UnsafeRawBufferPointer,
                            companyID: UInt16 = defaultCompanyID) throws(WireError) -> ActivityBeacon? {
        var it = ADIterator(data)
        while let ad = try it.next() {
            guard let m = ad.manufacturer, m.companyID == companyID else { continue }
            do {
                return try decode(value: m.value)
            } catch {
                // Re-anchor offsets to the advertising data, so a user sees where it went wrong.
                throw error.shifted(by: ad.offset + 4)
            }
        }
        return nil
    }

    /// Writes the 31-byte legacy advertisement: Flags AD (LE General Discoverable, BR/EDR
    /// not supported: 0x06) and the manufacturer AD, with the tag from `authenticator`.
    public func encodeAdvertisement(companyID: UInt16 = defaultCompanyID, authenticator: some BeaconAuthenticator,
                                    into w: inout ByteWriter) throws(WireError) {
        try w.reserve(ActivityBeacon.advertisementLength)
        w.write(0x02); w.write(ADType.flags); w.write(0x06)
        w.write(UInt8(ActivityBeacon.valueLength + 3)); w.write(ADType.manufacturerSpecificData)
        let signedStart = w.count
        w.writeU16LE(companyID)
        w.write(ActivityBeacon.version)
        w.write(flags.rawValue & BeaconFlags.known.rawValue)
        w.writeU16LE(sequence)
        w.writeU32LE(activityTypeHash)
        w.writeU32LE(groupHash)
        w.writeU32LE(UInt32(truncatingIfNeeded: deviceID))
        w.writeU16LE(UInt16(truncatingIfNeeded: deviceID >> 32))
        w.writeU16LE(psm)
        let signed = UnsafeRawBufferPointer(rebasing: w.written[signedStart...])
        precondition(signed.count == ActivityBeacon.signedLength)
        w.writeU32LE(authenticator.tag(signed: signed))
    }

    /// True when the tag matches what `authenticator` computes for this beacon.
    public func verify(companyID: UInt16 = defaultCompanyID, authenticator: some BeaconAuthenticator) -> Bool {
        var buf: InlineArray<31, UInt8> = .init(repeating: 0)
        var span = buf.mutableSpan
        return span.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            // Proof: 31 bytes is exactly advertisementLength.
            do throws(WireError) { try encodeAdvertisement(companyID: companyID, authenticator: authenticator, into: &w) } catch { preconditionFailure("31 bytes fit") }
            return UInt32(raw[27]) | UInt32(raw[28]) << 8 | UInt32(raw[29]) << 16 | UInt32(raw[30]) << 24 == tag
        }
    }
}

/// FNV-1a, 32 bits: the activity-type hash (protocol.md §2.3). Chosen because every phone
/// and microcontroller computes it in five lines; it identifies, it does not protect.
public func activityTypeHash(_ utf8: some Sequence<UInt8>) -> UInt32 {
    var h: UInt32 = 0x811C_9DC5
    for b in utf8 { h = (h ^ UInt32(b)) &* 0x0100_0193 }
    return h
}

/// FNV-1a, 64 bits (draft-eastlake-fnv), fed byte by byte: the fingerprints that tell two
/// things apart without keeping them (an Apple Handoff frame, protocol.md §4.2; a retained
/// message a gateway published, docs/rooms.md §7). It identifies, it does not protect.
public struct FNV1a64: Sendable {
    public private(set) var value: UInt64 = 0xCBF2_9CE4_8422_2325
    public init() {}

    @inline(__always)
    public mutating func add(_ b: UInt8) {
        // Proof: wrapping multiplication is FNV's definition.
        value = (value ^ UInt64(b)) &* 0x0000_0100_0000_01B3
    }

    @inline(__always)
    public mutating func add(_ bytes: some Sequence<UInt8>) {
        for b in bytes { add(b) }
    }
}

extension WireError {
    /// The same error with its byte offset moved by `delta`, for a decoder run on a slice.
    public func shifted(by delta: Int) -> WireError {
        switch self {
        case .truncated(let at, let need): .truncated(at: at + delta, need: need)
        case .badLength(let at, let length): .badLength(at: at + delta, length: length)
        case .trailing(let at, let count): .trailing(at: at + delta, count: count)
        case .unsupported(let at, let value): .unsupported(at: at + delta, value: value)
        case .malformed(let at, let reason): .malformed(at: at + delta, reason)
        case .noRoom: self
        }
    }
}

/// RFC 1982 serial-number order of two 16-bit sequence numbers (docs/protocol.md §2.3).
public enum SerialOrder: Sendable, Equatable {
    case older, same, newer

    /// §3.2: `s` is newer than `than` when `0 < s − than < 2¹⁵` (mod 2¹⁶), older when the
    /// difference is above 2¹⁵. The comparison is undefined at exactly 2¹⁵; we call it older,
    /// so only a beacon that is unambiguously newer can change an entry.
    public init(_ s: UInt16, comparedTo than: UInt16) {
        // Proof: the difference is meant to wrap: that is the serial arithmetic.
        let d = s &- than
        self = d == 0 ? .same : d < 0x8000 ? .newer : .older
    }
}
