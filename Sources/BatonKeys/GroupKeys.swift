// The key hierarchy of a group: docs/security.md §2.
//
//   group secret (16 bytes, devices only)
//     ├─ HKDF-SHA256, info "baton v1 beacon key"  → beacon key (16): gateways and devices
//     │     └─ HKDF-SHA256, info "baton v1 group hash" → group hash (4, LE): public, on air
//     └─ HKDF-SHA256, info "baton v1 payload key" → payload key (16): devices only
//
// A gateway is provisioned with the beacon key alone: everything it does (resolve rotating
// device ids, verify beacon tags, match the group hash) follows from it, and the payload key
// cannot be derived from it (RFC 5869 §3.3: HKDF outputs under distinct info are independent).
import CCrypto

/// The group's 128-bit secret (Handoff's Team ID role), provisioned out of band. Held by the
/// group's devices only; never printed.
public struct GroupSecret: Sendable, CustomStringConvertible {
    public static let byteCount = 16
    let bytes: [UInt8]

    /// `bytes` must be 16 bytes (a precondition: the caller owns that length, not a peer).
    public init(bytes: [UInt8]) {
        precondition(bytes.count == GroupSecret.byteCount, "a group secret is 16 bytes")
        self.bytes = bytes
    }

    /// A new secret from libcrypto's CSPRNG.
    public static func generate() throws(CryptoError) -> GroupSecret {
        var bytes = [UInt8](repeating: 0, count: byteCount)
        var failure: CryptoError?
        bytes.withUnsafeMutableBytes { raw in
            do throws(CryptoError) { try randomBytes(raw) } catch { failure = error }
        }
        if let failure { throw failure }
        return GroupSecret(bytes: bytes)
    }

    /// Parses `BATON-GROUP-V1:` + 28 base32 characters (docs/security.md §1).
    public init(text: String) throws(KeyTextError) {
        bytes = try KeyText.decode(text, kind: "group secret")
    }

    /// Reads the first line of a file holding the text form.
    public static func load(path: String) throws(KeyTextError) -> GroupSecret {
        try GroupSecret(text: KeyText.firstLine(path: path))
    }

    /// The text form, to write to a file or a QR code. The only way the secret leaves memory.
    public var text: String { KeyText.encode(bytes, kind: "group secret") }

    /// Never the secret itself: a secret must not reach a log (issue 7, part 5).
    public var description: String { "GroupSecret(redacted)" }

    /// The raw bytes, for a test or an implementer's check against docs/security.md.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        bytes.withUnsafeBytes(body)
    }
}

/// The key a gateway holds: resolves rotating device ids (the BLE IRK role) and verifies
/// beacon tags. It cannot open sealed payloads.
public struct BeaconKey: Sendable, Equatable, CustomStringConvertible {
    public static let byteCount = 16
    let bytes: [UInt8]

    public init(bytes: [UInt8]) {
        precondition(bytes.count == BeaconKey.byteCount, "a beacon key is 16 bytes")
        self.bytes = bytes
    }

    /// Parses `BATON-BEACON-V1:` + 28 base32 characters (docs/security.md §1).
    public init(text: String) throws(KeyTextError) {
        bytes = try KeyText.decode(text, kind: "beacon key")
    }

    public static func load(path: String) throws(KeyTextError) -> BeaconKey {
        try BeaconKey(text: KeyText.firstLine(path: path))
    }

    /// The text form a gateway's configuration holds.
    public var text: String { KeyText.encode(bytes, kind: "beacon key") }

    public var description: String { "BeaconKey(redacted)" }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        bytes.withUnsafeBytes(body)
    }

    /// The beacon's group field (docs/protocol.md §2.3, docs/security.md §2.2): the first four
    /// bytes of HKDF-SHA256(beacon key, info "baton v1 group hash"), little-endian. Public on
    /// air; as an HKDF output it says nothing about the key.
    public func groupHash() throws(CryptoError) -> UInt32 {
        let h = try hkdfSHA256(key: bytes, salt: [], info: Array("baton v1 group hash".utf8), count: 4)
        return UInt32(h[0]) | UInt32(h[1]) << 8 | UInt32(h[2]) << 16 | UInt32(h[3]) << 24
    }
}

/// The key only a group's devices hold: seals activity payloads and streams (AES-128-GCM).
public struct PayloadKey: Sendable, CustomStringConvertible {
    public static let byteCount = 16
    let bytes: [UInt8]

    public init(bytes: [UInt8]) {
        precondition(bytes.count == PayloadKey.byteCount, "a payload key is 16 bytes")
        self.bytes = bytes
    }

    public var description: String { "PayloadKey(redacted)" }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        bytes.withUnsafeBytes(body)
    }
}

/// Everything derived from a group secret (docs/security.md §2).
public struct GroupKeys: Sendable {
    public let beaconKey: BeaconKey
    public let payloadKey: PayloadKey
    /// The beacon's group field, derived from the beacon key.
    public let groupHash: UInt32

    /// HKDF-SHA256 (RFC 5869) with an empty salt (§2.2: HashLen zero bytes) — the secret is
    /// already uniformly random — and one `info` label per key, so the keys are independent.
    public static func derive(secret: GroupSecret) throws(CryptoError) -> GroupKeys {
        let beacon = BeaconKey(bytes: try hkdfSHA256(key: secret.bytes, salt: [],
                                                     info: Array("baton v1 beacon key".utf8), count: 16))
        let payload = PayloadKey(bytes: try hkdfSHA256(key: secret.bytes, salt: [],
                                                       info: Array("baton v1 payload key".utf8), count: 16))
        return GroupKeys(beaconKey: beacon, payloadKey: payload, groupHash: try beacon.groupHash())
    }
}
