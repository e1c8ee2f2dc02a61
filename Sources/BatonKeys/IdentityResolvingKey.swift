// Identity Resolving Keys of a user's own phones and watches (docs/security.md §10).
//
// A phone with BLE privacy advertises from a resolvable private address that changes about
// every 15 minutes: prand (24 bits, top bits 0b01) and hash = ah(IRK, prand) (Core 5.4, Vol 6,
// Part B, §1.3.2.2; Vol 3, Part H, §2.2.2). Whoever holds the device's IRK can tell that every
// one of those addresses is that device. Users of ESPresense, room-assistant, Bermuda and Home
// Assistant's Private BLE Device integration already extract IRKs (from macOS Keychain, or by
// pairing with an ESP32); a gateway given one follows the device across rotation, under a name.
import BatonWire
import CCrypto

/// Why a text is not an IRK.
public enum IRKTextError: Error, Equatable, CustomStringConvertible {
    /// Neither 32 hex digits nor base64 of 16 bytes.
    case notHexOrBase64
    /// Base64 (or hex) of the wrong number of bytes.
    case wrongLength(Int)

    public var description: String {
        switch self {
        case .notHexOrBase64:
            "expected an IRK as 32 hex digits, or as base64 ending in \"=\" (from macOS Keychain)"
        case .wrongLength(let n):
            "an IRK is 16 bytes, this is \(n)"
        }
    }
}

/// A device's IRK, most significant byte first: the order Core 5.4, Vol 3, Part H, §2.2.1
/// prints keys in and `ah` uses.
public struct IdentityResolvingKey: Sendable, Equatable, CustomStringConvertible {
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) {
        precondition(bytes.count == 16, "an IRK is 16 bytes")
        self.bytes = bytes
    }

    /// The two forms users paste, as Home Assistant's Private BLE Device reads them: an
    /// optional `irk:` prefix, then 32 hex digits (most significant byte first, as ESPresense
    /// and Bermuda print it), or base64 ending in `=` (macOS Keychain's copy, which stores the
    /// key least significant byte first, so it is reversed).
    public init(text: String) throws(IRKTextError) {
        var t = Substring(text.trimmingWhitespace())
        if t.lowercased().hasPrefix("irk:") { t = t.dropFirst(4) }
        if t.hasSuffix("=") {
            guard let decoded = Base64.decode(t) else { throw .notHexOrBase64 }
            guard decoded.count == 16 else { throw .wrongLength(decoded.count) }
            bytes = decoded.reversed()
            return
        }
        let digits = Array(t.utf8)
        guard digits.allSatisfy({ Self.hexValue($0) != nil }), digits.count % 2 == 0 else { throw .notHexOrBase64 }
        guard digits.count == 32 else { throw .wrongLength(digits.count / 2) }
        bytes = stride(from: 0, to: 32, by: 2).map { Self.hexValue(digits[$0])! << 4 | Self.hexValue(digits[$0 + 1])! }
    }

    /// Never the key (logs, errors, the status topic).
    public var description: String { "IdentityResolvingKey(redacted)" }

    /// The 32-bit id the device's entry is published under (`<prefix>/apple/<id>`): the same at
    /// every gateway and in every run, so Home Assistant keeps one entity, and it says nothing
    /// about the key (an HKDF output, docs/security.md §10). Never 0.
    public func stableID() throws(CryptoError) -> UInt32 {
        let h = try hkdfSHA256(key: bytes, salt: [], info: Array("baton v1 apple id".utf8), count: 4)
        let id = UInt32(h[0]) | UInt32(h[1]) << 8 | UInt32(h[2]) << 16 | UInt32(h[3]) << 24
        return id == 0 ? 1 : id
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x41...0x46: c - 0x41 + 10
        case 0x61...0x66: c - 0x61 + 10
        default: nil
        }
    }

}

private extension String {
    func trimmingWhitespace() -> Substring {
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s = s.dropFirst() }
        while let l = s.last, l.isWhitespace { s = s.dropLast() }
        return s
    }
}

/// Resolves advertiser addresses against the IRKs a user configured (docs/security.md §10).
/// One AES context per key, made at start; a resolution allocates nothing. The last two
/// addresses of each device are remembered, so the AES work is done once per rotation.
public final class AddressResolver {
    private let resolvers: [DeviceIDResolver]
    /// Per device i: its last two resolved addresses at 2i and 2i + 1 (0: none yet).
    private var known: [UInt64]
    /// The latest addresses that resolved under no key, a ring: strangers' phones advertise
    /// ten times a second from one address, and each would otherwise cost every key's AES.
    private var strangers: [UInt64]
    private var nextStranger = 0
    public static let strangerMemory = 128
    /// AES blocks spent on addresses not seen before (stats `apple.resolutions`).
    public private(set) var resolutions = 0

    public var count: Int { resolvers.count }

    /// The index of the key `address` resolved under lately (one of its last two), without
    /// any AES: a scan of at most 2 × count values.
    public func remembered(_ address: UInt64) -> Int? {
        let a = address & 0xFFFF_FFFF_FFFF
        for i in known.indices where known[i] == a { return i >> 1 }
        return nil
    }

    /// Resolves under raw 16-byte keys, most significant byte first (a device's identity keys,
    /// docs/security.md §3.1, are IRKs in all but name).
    public convenience init(keys: [[UInt8]]) throws(CryptoError) {
        try self.init(irks: keys.map { IdentityResolvingKey(bytes: $0) })
    }

    public init(irks: [IdentityResolvingKey]) throws(CryptoError) {
        var r: [DeviceIDResolver] = []
        r.reserveCapacity(irks.count)
        for k in irks { r.append(try DeviceIDResolver(irk: k.bytes)) }
        resolvers = r
        // No 48-bit address is `.max`: an empty place never matches (0 would match address 0).
        known = Array(repeating: .max, count: 2 * irks.count)
        strangers = Array(repeating: .max, count: Self.strangerMemory)
    }

    /// The index of the IRK that `address` (48 bits, most significant byte first as printed)
    /// resolves under, or nil. Only a random address (HCI address type 1) shaped as a
    /// resolvable private address (top bits 0b01) is tried.
    public func resolve(address: UInt64, addressType: UInt8) -> Int? {
        guard addressType == 1, address & 0xC000_0000_0000 == 0x4000_0000_0000 else { return nil }
        let a = address & 0xFFFF_FFFF_FFFF
        if let i = remembered(a) { return i }
        guard !resolvers.isEmpty else { return nil }
        for s in strangers where s == a { return nil }
        for i in resolvers.indices {
            resolutions &+= 1
            if resolvers[i].resolves(a) {
                known[2 * i + 1] = known[2 * i]
                known[2 * i] = a
                return i
            }
        }
        strangers[nextStranger] = a
        nextStranger = (nextStranger + 1) % Self.strangerMemory
        return nil
    }
}
