// Fuzz target: the activity beacon v1 decoder (docs/protocol.md §2), and the gateway's
// BeaconVerifier over what decodes (docs/security.md §4.4).
// Invariants: whatever decodes re-encodes to the same bytes, except the reserved flag bits,
// which v1 ignores on receipt (§2.2). The verifier never traps; it verifies only a beacon of
// its group whose tag is right, and renames only to an identity id of its group; it publishes
// unverified only another group's beacon.
import BatonKeys
import BatonWire
import FuzzSupport

/// One verifier for the whole run, so its remembered ids and sequences are fuzzed too.
nonisolated(unsafe) let verifier = try! BeaconVerifier(key: BeaconKey(bytes: Array(0x10..<0x20)), identities: 4,
                                                      policy: .publish)
nonisolated(unsafe) let tagger = try! BeaconTagger(key: BeaconKey(bytes: Array(0x10..<0x20)))

/// The 31-byte advertisement of a 24-byte beacon value under the default company id.
func advertisement(_ value: UnsafeRawBufferPointer) -> [UInt8] {
    [0x02, 0x01, 0x06, 0x1B, 0xFF, 0xFF, 0xFF] + Array(value)
}

func checkVerifier(_ value: UnsafeRawBufferPointer) {
    var ad = advertisement(value)
    // As received; with the keyed group's hash put in; and with its right tag too, so the
    // foreign, forged and verified paths are all fuzzed.
    for variant in 0..<3 {
        if variant >= 1 {
            let h = verifier.groupHash
            for k in 0..<4 { ad[7 + 8 + k] = UInt8(truncatingIfNeeded: h >> (8 * UInt32(k))) }
        }
        if variant == 2, ad.count == ActivityBeacon.advertisementLength {
            let t = ad.withUnsafeBytes { tagger.tag(signed: UnsafeRawBufferPointer(rebasing: $0[5..<27])) }
            for k in 0..<4 { ad[27 + k] = UInt8(truncatingIfNeeded: t >> (8 * UInt32(k))) }
        }
        ad.withUnsafeBytes { raw in
            let v = UnsafeRawBufferPointer(rebasing: raw[7...])
            guard var beacon = try? ActivityBeacon.decode(value: v) else { return }
            let air = beacon.deviceID
            switch verifier.check(&beacon, advertisingData: raw) {
            case .verified(let identity):
                invariant(beacon.groupHash == verifier.groupHash, "verified another group's beacon")
                invariant(tagger.verify(advertisingData: raw), "verified a beacon whose tag is wrong")
                if let n = identity {
                    invariant(beacon.deviceID == DeviceIdentity.id(groupHash: verifier.groupHash, number: n),
                              "renamed to something other than the identity's id")
                } else {
                    invariant(beacon.deviceID == air, "a group-wide id was renamed")
                }
            case .unverified:
                invariant(beacon.groupHash != verifier.groupHash, "published the keyed group's beacon unverified")
                invariant(beacon.deviceID == air, "an unverified beacon was renamed")
            case .dropped:
                break
            }
        }
    }
}

struct FixedTag: BeaconAuthenticator {
    let value: UInt32
    func tag(signed: UnsafeRawBufferPointer) -> UInt32 { value }
}

func check(_ bytes: UnsafeRawBufferPointer) {
    guard let beacon = try? ActivityBeacon.decode(value: bytes) else { return }
    invariant(bytes.count == ActivityBeacon.valueLength, "decoded a value of the wrong length")
    var out = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
    out.withUnsafeMutableBytes { raw in
        var w = ByteWriter(raw)
        do {
            try beacon.encodeAdvertisement(authenticator: FixedTag(value: beacon.tag), into: &w)
        } catch {
            invariant(false, "a decoded beacon must re-encode: \(error)")
        }
    }
    for i in 0..<ActivityBeacon.valueLength {
        let sent = i == 1 ? bytes[i] & 0x0F : bytes[i]
        invariant(out[7 + i] == sent, "byte \(i) changed on re-encode")
    }
    invariant(beacon.verify(authenticator: FixedTag(value: beacon.tag)), "a beacon must verify its own tag")
    checkVerifier(bytes)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
