// Rotating device ids, resolvable with the beacon key: docs/security.md §3, docs/protocol.md §2.4.
//
// The id is shaped like a resolvable private address (Core 5.4, Vol 6, Part B, §1.3.2.2):
// bits 0–23 hash, bits 24–47 prand, the two top bits of prand 0b01. The hash is the BLE random
// address hash function (Core 5.4, Vol 3, Part H, §2.2.2):
//
//   ah(k, r) = e(k, r') mod 2^24,   r' = 13 zero bytes ‖ r (3 bytes, most significant first)
//
// where e is AES-128 with the most significant byte of k and r' first (§2.2.1), i.e. the
// hash is the last three bytes of the AES output block. Phones (iOS, Android) and every BLE
// stack already compute it for RPAs; we only use the beacon key as the IRK.
import CCrypto

/// Makes and resolves rotating device ids under one key. Holds one AES-128-ECB context; a
/// resolution is one AES block and allocates nothing.
public final class DeviceIDResolver {
    private let aes: CipherContext

    /// The group's beacon key as the IRK.
    public convenience init(key: BeaconKey) throws(CryptoError) {
        try self.init(irk: key.bytes)
    }

    /// Any 16-byte IRK, most significant byte first as Core Vol 3 Part H §2.2.1 prints it.
    public init(irk: [UInt8]) throws(CryptoError) {
        precondition(irk.count == 16, "an IRK is 16 bytes")
        aes = try CipherContext(cipher: "AES-128-ECB", key: irk, encrypt: true) { ctx in
            EVP_CIPHER_CTX_set_padding(ctx, 0) == 1  // one block in, one block out
        }
    }

    /// `ah(k, prand)`: the 24-bit hash of a 24-bit prand (Core 5.4, Vol 3, Part H, §2.2.2).
    public func hash(prand: UInt32) -> UInt32 {
        let b = aes.scratch(0, 16)
        for i in 0..<13 { b[i] = 0 }
        b[13] = UInt8(truncatingIfNeeded: prand >> 16)
        b[14] = UInt8(truncatingIfNeeded: prand >> 8)
        b[15] = UInt8(truncatingIfNeeded: prand)
        var outl: Int32 = 0
        // In place is allowed (EVP_EncryptUpdate(3): in and out may be the same buffer).
        let ok = EVP_EncryptUpdate(aes.ctx, b, &outl, b, 16)
        precondition(ok == 1 && outl == 16, "AES-128-ECB over one block cannot fail")
        return UInt32(b[13]) << 16 | UInt32(b[14]) << 8 | UInt32(b[15])
    }

    /// The device id for `prand`: prand in bits 24–47, ah(k, prand) in bits 0–23.
    /// `prand` must be RPA-shaped (top bits 0b01); `newDeviceID()` draws one.
    public func deviceID(prand: UInt32) -> UInt64 {
        precondition(prand & 0xC0_0000 == 0x40_0000, "prand's top two bits are 0b01 (Core Vol 6 Part B §1.3.2.2)")
        return UInt64(prand) << 24 | UInt64(hash(prand: prand))
    }

    /// A fresh id: 22 random bits from libcrypto's CSPRNG, not all 0 and not all 1, under
    /// the top bits 0b01 (Core 5.4, Vol 6, Part B, §1.3.2.2).
    public func newDeviceID() throws(CryptoError) -> UInt64 {
        let r = aes.scratch(16, 3)
        while true {
            try randomBytes(UnsafeMutableRawBufferPointer(start: r, count: 3))
            let random = (UInt32(r[0]) << 16 | UInt32(r[1]) << 8 | UInt32(r[2])) & 0x3F_FFFF
            if random != 0 && random != 0x3F_FFFF { return deviceID(prand: 0x40_0000 | random) }
        }
    }

    /// True when `deviceID` was made with this key: an RPA-shaped prand whose ah() matches
    /// the hash (Core 5.4, Vol 3, Part C, §10.8.2.3). The comparison is constant time.
    public func resolves(_ deviceID: UInt64) -> Bool {
        let prand = UInt32(truncatingIfNeeded: deviceID >> 24) & 0xFF_FFFF
        guard prand & 0xC0_0000 == 0x40_0000 else { return false }
        let expected = hash(prand: prand)
        let received = UInt32(truncatingIfNeeded: deviceID) & 0xFF_FFFF
        return withUnsafeBytes(of: expected) { e in
            withUnsafeBytes(of: received) { r in constantTimeEqual(e.baseAddress!, r.baseAddress!, count: 4) }
        }
    }
}
