// The beacon's authentication tag: docs/security.md §4, docs/protocol.md §2.4.
//
// AES-128-CCM (RFC 3610, NIST SP 800-38C) under the beacon key, with a 4-byte MIC (M = 4) and a
// 13-byte nonce (L = 2), as BTHome v2 authenticates its encrypted adverts. BTHome's nonce is
//
//   MAC address (6) ‖ UUID 0xFCD2 (2, LE) ‖ device info byte (1) ‖ counter (4, LE)
//
// and ours is built field for field from the beacon itself (signed-byte offsets in brackets):
//
//   device id (6, as on air) [14..<20] ‖ company id (2, LE) [0..<2] ‖ flags (1, as on air) [3]
//     ‖ sequence as a 32-bit counter (4, LE: the 2 sequence bytes [4..<6], then 00 00)
//
// Unlike BTHome the beacon is not encrypted: gateways without the key still read the type and
// group hash (docs/protocol.md §2). So the plaintext is empty and the 22 signed bytes (company
// id through PSM) are CCM's associated data: the tag is CCM's MIC over B0 and the signed bytes,
// encrypted with counter block A0. A device sends one nonce per (device id, flags, sequence);
// re-sending an identical beacon re-sends the identical tag, which reveals nothing new.
import BatonWire
import CCrypto

/// Computes and verifies beacon tags under a beacon key. Holds one AES-128-CCM context, set up
/// once; tagging or verifying a beacon allocates nothing (docs/security.md §7).
public final class BeaconTagger: BeaconAuthenticator {
    public static let nonceLength = 13
    public static let tagLength = 4
    /// Its scratch: nonce at 0..<13, MIC at 16..<20, an output block at 32..<48 (CCM needs a
    /// non-null output pointer to finish an empty plaintext).
    private let ccm: CipherContext

    public init(key: BeaconKey) throws(CryptoError) {
        ccm = try CipherContext(cipher: "AES-128-CCM", key: key.bytes, encrypt: true) { ctx in
            // OpenSSL EVP_EncryptInit(3), "CCM Mode": nonce and tag lengths before the key.
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, Int32(BeaconTagger.nonceLength), nil) == 1
                && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, Int32(BeaconTagger.tagLength), nil) == 1
        }
    }

    /// The tag over the 22 signed bytes (company id + beacon value bytes 0..<20), read
    /// little-endian like every beacon field: the 4 MIC bytes in the order they go on air.
    public func tag(signed: UnsafeRawBufferPointer) -> UInt32 {
        precondition(signed.count == ActivityBeacon.signedLength, "the tag covers exactly 22 signed bytes")
        let m = computeMIC(signed)
        return UInt32(m[0]) | UInt32(m[1]) << 8 | UInt32(m[2]) << 16 | UInt32(m[3]) << 24
    }

    /// True when `tag` (the 4 bytes as on air) is the tag of `signed`; compared in constant time.
    public func verify(signed: UnsafeRawBufferPointer, tag: UnsafeRawBufferPointer) -> Bool {
        guard signed.count == ActivityBeacon.signedLength, tag.count == BeaconTagger.tagLength else { return false }
        let m = computeMIC(signed)
        return constantTimeEqual(m, tag.baseAddress!, count: BeaconTagger.tagLength)
    }

    /// Finds the beacon under `companyID` in advertising data and verifies its tag over the
    /// bytes as received (so the reserved flag bits, which a decoder ignores, are still
    /// covered). False when there is no well-formed v1 beacon or its tag does not verify.
    public func verify(advertisingData data: UnsafeRawBufferPointer,
                       companyID: UInt16 = ActivityBeacon.defaultCompanyID) -> Bool {
        var it = ADIterator(data)
        while true {
            guard let ad = try? it.next() else { return false }
            guard let m = ad.manufacturer, m.companyID == companyID else { continue }
            guard m.value.count == ActivityBeacon.valueLength, m.value[0] == ActivityBeacon.version else { return false }
            // The company id is the 2 bytes just before the value in the same AD (manufacturer).
            let signed = UnsafeRawBufferPointer(rebasing: ad.data[0..<ActivityBeacon.signedLength])
            let tag = UnsafeRawBufferPointer(rebasing: m.value[20..<24])
            return verify(signed: signed, tag: tag)
        }
    }

    /// The 4 MIC bytes, in the context's scratch until the next call.
    private func computeMIC(_ signed: UnsafeRawBufferPointer) -> UnsafeMutablePointer<UInt8> {
        let n = ccm.scratch(0, 13), m = ccm.scratch(16, 4), block = ccm.scratch(32, 16)
        for i in 0..<6 { n[i] = signed[14 + i] }   // device id
        n[6] = signed[0]; n[7] = signed[1]         // company id
        n[8] = signed[3]                           // flags
        n[9] = signed[4]; n[10] = signed[5]        // sequence, then the counter's high bytes
        n[11] = 0; n[12] = 0
        let ctx = ccm.ctx
        let signedP = signed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        var outl: Int32 = 0
        // CCM, OpenSSL EVP_EncryptInit(3): re-arm with the nonce (the key stays), give the
        // plaintext length (0), the associated data, the (empty) plaintext, then finish and
        // read the MIC.
        let ok = EVP_EncryptInit_ex(ctx, nil, nil, nil, n) == 1
            && EVP_EncryptUpdate(ctx, nil, &outl, nil, 0) == 1
            && EVP_EncryptUpdate(ctx, nil, &outl, signedP, Int32(signed.count)) == 1
            && EVP_EncryptUpdate(ctx, block, &outl, block, 0) == 1
            && EVP_EncryptFinal_ex(ctx, block, &outl) == 1
            && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, Int32(BeaconTagger.tagLength), m) == 1
        precondition(ok, "AES-128-CCM over 22 bytes with a set key cannot fail")
        return m
    }
}
