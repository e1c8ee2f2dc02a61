// Fuzz target: opening a sealed envelope (docs/security.md §5), the bytes a fetch carries for a
// keyed group and `baton fetch --key` opens. The key is the payload key of the §8.2 vector and
// the context that of §8.5, so the §8.5 envelope in the corpus opens and mutations of it reach
// every check. Invariants:
//   * the error says what the input is: empty or shorter than 29 bytes → `tooShort`, a first
//     byte other than 1 → `unsupportedVersion` (checked before the length), anything else that
//     does not open → `authenticationFailed`; never `noRoom` (the buffer holds any plaintext);
//   * a failed open leaves no plaintext in the output buffer;
//   * what opens has exactly count − 29 bytes, and sealing that plaintext again with the
//     input's nonce gives the input back byte for byte;
//   * flipping one bit of an envelope that opened (first, middle, last byte) makes it fail.
import BatonKeys
import FuzzSupport

nonisolated(unsafe) let sealer: SealedEnvelope = {
    let secret = GroupSecret(bytes: Array(0 ... 15))
    // Proof: deriving from a fixed 16-byte secret only fails if libcrypto is broken.
    guard let keys = try? GroupKeys.derive(secret: secret), let s = try? SealedEnvelope(key: keys.payloadKey) else {
        fatalError("libcrypto could not derive the §8.2 keys")
    }
    return s
}()
let context = PayloadContext(deviceID: 0x5A12_3456_789A, sequence: 258)

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    var out = [UInt8](repeating: 0xEE, count: max(n, 1))
    let opened: Result<Int, SealError> = out.withUnsafeMutableBytes { o in
        do throws(SealError) { return .success(try sealer.openPayload(bytes, for: context, into: o)) } catch {
            return .failure(error)
        }
    }
    switch opened {
    case .failure(let error):
        if n == 0 || bytes[0] == SealedEnvelope.version && n < SealedEnvelope.overhead {
            invariant(error == .tooShort(count: n, need: SealedEnvelope.overhead), "\(n) bytes gave \(error)")
        } else if bytes[0] != SealedEnvelope.version {
            invariant(error == .unsupportedVersion(bytes[0]), "version \(bytes[0]) gave \(error)")
        } else {
            invariant(error == .authenticationFailed, "\(n) bytes of version 1 gave \(error)")
        }
        // OPENSSL_cleanse wipes to zero what GCM decrypted before the tag failed.
        invariant(out.allSatisfy { $0 == 0xEE || $0 == 0 }, "plaintext left behind after \(error)")
    case .success(let count):
        invariant(count == n - SealedEnvelope.overhead, "\(count) bytes of plaintext from \(n)")
        let plaintext = Array(out[..<count])
        let nonce = Array(UnsafeRawBufferPointer(rebasing: bytes[1 ..< 1 + SealedEnvelope.nonceLength]))
        var again = [UInt8](repeating: 0, count: n)
        let written = plaintext.withUnsafeBytes { p in
            nonce.withUnsafeBytes { nn in
                again.withUnsafeMutableBytes { a in try? sealer.sealPayload(p, for: context, into: a, nonce: nn) }
            }
        }
        invariant(written == n && again.elementsEqual(bytes), "sealing the plaintext again differs: \(hex(again))")
        for i in Set([0, n / 2, n - 1]) {
            var flipped = Array(bytes)
            flipped[i] ^= 0x01
            let reopened = flipped.withUnsafeBytes { f in
                out.withUnsafeMutableBytes { o in try? sealer.openPayload(f, for: context, into: o) }
            }
            invariant(reopened == nil, "a bit flipped at byte \(i) still opened")
        }
    }
}

/// libFuzzer's entry point (see main.swift).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
