// Fuzz target: the activity beacon v1 decoder (docs/protocol.md §2).
// Invariant: whatever decodes re-encodes to the same bytes, except the reserved flag bits,
// which v1 ignores on receipt (§2.2).
import BatonWire
import FuzzSupport

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
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
