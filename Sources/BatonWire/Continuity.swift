// Apple Continuity messages: manufacturer-specific data under company id 0x004C (Apple),
// a sequence of TLVs: type (1) | length (1) | value (length). The layouts are Apple's and
// unpublished; the ones below follow the public reverse engineering by Martin et al.,
// "Handoff All Your Privacy" (PETS 2019) and the furiousMAC/continuity dissectors, and are
// specified in docs/protocol.md §4. Nothing here decrypts anything: Handoff's payload stays
// the ciphertext it is, and is only counted and compared.

/// Apple's Bluetooth SIG company identifier (Assigned Numbers §7).
public let appleCompanyID: UInt16 = 0x004C

public enum ContinuityType {
    public static let iBeacon: UInt8 = 0x02
    public static let nearbyAction: UInt8 = 0x0F
    public static let handoff: UInt8 = 0x0C
    public static let nearbyInfo: UInt8 = 0x10

    /// The name a message type is counted under (`continuity` in `baton replay --json`).
    /// Types without a public description are counted as "other".
    public static func name(_ type: UInt8) -> StaticString {
        switch type {
        case 0x02: "ibeacon"
        case 0x03: "airprint"
        case 0x05: "airdrop"
        case 0x06: "homekit"
        case 0x07: "proximity-pairing"
        case 0x08: "hey-siri"
        case 0x09: "airplay-target"
        case 0x0A: "airplay-source"
        case 0x0B: "magic-switch"
        case 0x0C: "handoff"
        case 0x0D: "tethering-target"
        case 0x0E: "tethering-source"
        case 0x0F: "nearby-action"
        case 0x10: "nearby-info"
        case 0x12: "find-my"
        default: "other"
        }
    }
}

extension Malformed {
    /// A Continuity TLV whose length runs past the manufacturer data.
    public static let continuityOverlong = Malformed("continuity-overlong")
    /// A Continuity message shorter than its type's fixed part.
    public static let continuityShort = Malformed("continuity-short")
    /// Manufacturer data under 0x004C with no TLV in it.
    public static let continuityEmpty = Malformed("continuity-empty")
}

/// One TLV, borrowed from the manufacturer data it came from.
public struct ContinuityMessage {
    /// Offset of the type byte within the manufacturer value (after the company id).
    public let offset: Int
    public let type: UInt8
    public let value: UnsafeRawBufferPointer

    @inlinable
    public init(offset: Int, type: UInt8, value: UnsafeRawBufferPointer) {
        self.offset = offset; self.type = type; self.value = value
    }
}

/// Handoff (0x0C): the device has a current NSUserActivity. §4.2.
public struct Handoff {
    /// Byte 0: 0x08 when the universal clipboard has data (others reserved).
    public let clipboardStatus: UInt8
    /// Bytes 1–2 (LE): the sequence number that is also the AES-GCM IV; it changes when the
    /// activity does, which is how "changed N s ago" is known without a key.
    public let sequence: UInt16
    /// Byte 3: the first byte of the AES-GCM tag.
    public let authTag: UInt8
    /// Bytes 4…: the encrypted activity (10 bytes in every frame observed).
    public let encrypted: UnsafeRawBufferPointer

    public var hasClipboardData: Bool { clipboardStatus & 0x08 != 0 }
}

/// Nearby Info (0x10): device state, sent continuously by iPhones, iPads, Macs, Watches. §4.3.
public struct NearbyInfo {
    /// High nibble of byte 0.
    public let statusFlags: UInt8
    /// Low nibble of byte 0: the activity level (screen on, in a call, …).
    public let actionCode: UInt8
    /// Byte 1 (Wi-Fi on, AirDrop receiving, …).
    public let dataFlags: UInt8
    /// Bytes 2…: authentication tag and any newer extension bytes, kept as they are.
    public let rest: UnsafeRawBufferPointer
}

/// Nearby Action (0x0F): a device asking for something nearby (Wi-Fi password, setup). §4.4.
public struct NearbyAction {
    public let actionFlags: UInt8
    public let actionType: UInt8
    /// Bytes 2…: authentication tag and the action's parameters.
    public let rest: UnsafeRawBufferPointer
}

/// iBeacon (0x02, length 0x15). §4.5.
public struct IBeacon {
    public let uuid: InlineArray<16, UInt8>
    public let major: UInt16
    public let minor: UInt16
    /// Calibrated RSSI at 1 m, dBm.
    public let measuredPower: Int8
}

public enum ContinuityFrame {
    case handoff(Handoff)
    case nearbyInfo(NearbyInfo)
    case nearbyAction(NearbyAction)
    case iBeacon(IBeacon)
    /// Any other type, kept as (type, bytes).
    case other(type: UInt8, value: UnsafeRawBufferPointer)
}

extension ContinuityMessage {
    /// Decodes the value by type: fixed part checked first, tail kept.
    public func decode() throws(WireError) -> ContinuityFrame {
        var r = ByteReader(value)
        let at = offset + 2
        do throws(WireError) {
            switch type {
            case ContinuityType.handoff:
                guard value.count >= 4 else { throw WireError.malformed(at: 0, .continuityShort) }
                let clipboard = try r.readU8()
                let sequence = try r.readU16LE()
                let tag = try r.readU8()
                return .handoff(Handoff(clipboardStatus: clipboard, sequence: sequence, authTag: tag, encrypted: r.readRest()))
            case ContinuityType.nearbyInfo:
                guard value.count >= 2 else { throw WireError.malformed(at: 0, .continuityShort) }
                let b0 = try r.readU8()
                let flags = try r.readU8()
                return .nearbyInfo(NearbyInfo(statusFlags: b0 >> 4, actionCode: b0 & 0x0F, dataFlags: flags, rest: r.readRest()))
            case ContinuityType.nearbyAction:
                guard value.count >= 2 else { throw WireError.malformed(at: 0, .continuityShort) }
                let flags = try r.readU8()
                let type = try r.readU8()
                return .nearbyAction(NearbyAction(actionFlags: flags, actionType: type, rest: r.readRest()))
            case ContinuityType.iBeacon:
                // Fixed 21 bytes: UUID (16), major (2, BE), minor (2, BE), measured power (1).
                guard value.count == 21 else {
                    throw value.count < 21 ? WireError.malformed(at: 0, .continuityShort) : WireError.trailing(at: 21, count: value.count - 21)
                }
                let uuid = try r.readArray(InlineArray<16, UInt8>.self)
                let major = try r.readU16BE()
                let minor = try r.readU16BE()
                let power = try r.readI8()
                return .iBeacon(IBeacon(uuid: uuid, major: major, minor: minor, measuredPower: power))
            default:
                return .other(type: type, value: value)
            }
        } catch {
            throw error.shifted(by: at)
        }
    }
}

/// Walks the TLVs of Apple manufacturer data (the bytes after the company id).
/// Validates the whole chain before yielding anything, so a caller never acts on half a frame.
public struct ContinuityIterator {
    @usableFromInline var reader: ByteReader

    /// Throws if any TLV runs past the end or there is none.
    @inlinable
    public init(validating value: UnsafeRawBufferPointer) throws(WireError) {
        var r = ByteReader(value)
        guard !r.isAtEnd else { throw .malformed(at: 0, .continuityEmpty) }
        while !r.isAtEnd {
            let at = r.offset
            guard r.remaining >= 2 else { throw .truncated(at: at, need: 2 - r.remaining) }
            let type = try r.readU8()
            let length = ContinuityIterator.valueLength(type: type, lengthByte: try r.readU8())
            guard length <= r.remaining else { throw .malformed(at: at, .continuityOverlong) }
            try r.skip(length)
        }
        reader = ByteReader(value)
    }

    /// The value length a TLV's length byte gives. HomeKit (0x06) packs a 3-bit subtype into
    /// the top of it, "SubType-Length" (HomeKit Accessory Protocol R2, §7.4.2.1.1): bits 0–4 are
    /// the length. Real accessories send e.g. `06 31 …` (subtype 1, 17 bytes). protocol.md §4.
    @inlinable
    public static func valueLength(type: UInt8, lengthByte: UInt8) -> Int {
        type == 0x06 ? Int(lengthByte & 0x1F) : Int(lengthByte)
    }

    @inlinable
    public mutating func next() -> ContinuityMessage? {
        guard !reader.isAtEnd else { return nil }
        // Proof: init walked every TLV and showed each fits.
        do throws(WireError) {
            let at = reader.offset
            let type = try reader.readU8()
            let length = ContinuityIterator.valueLength(type: type, lengthByte: try reader.readU8())
            return ContinuityMessage(offset: at, type: type, value: try reader.readBytes(length))
        } catch {
            preconditionFailure("Continuity TLVs were validated in init")
        }
    }
}
