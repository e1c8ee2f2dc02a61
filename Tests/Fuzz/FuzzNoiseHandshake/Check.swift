// Fuzz target: the Noise responder (docs/esphome.md §4) and the transport after it. The input
// is the client's handshake message (what follows the 0x00 byte of its handshake frame) up to
// the first 0xFF 0xFF pair, then transport frames' bodies, each a length byte and that many
// bytes. The psk and our ephemeral key are the §4.3 vector's, so the vector's message in the
// corpus completes the handshake and mutations reach every check. Invariants:
//   * fewer than 48 or more than 304 bytes are `.malformed`; any other message that does not
//     complete the handshake is `.wrongKey` or `.malformed` (a low-order key), never `.crypto`;
//   * a completed handshake answers 48 bytes, the first 32 our ephemeral public key (fixed by
//     the vector's private key), and ends with the same hash every time for the same message;
//   * a transport body opens only if it is at least 16 bytes; whatever opens is total for
//     `NoiseFrame.decodeMessage`; a body that did not open leaves no plaintext behind.
import BatonProxy
import BatonWire
import FuzzSupport

let psk = Array<UInt8>(0...31)
let ephemeral = [UInt8](repeating: 0x22, count: 32)
let ourPublic: [UInt8] = [0x0f, 0xaa, 0x68, 0x4e, 0xd2, 0x88, 0x67, 0xb9, 0x7f, 0x4a, 0x6a, 0x2d, 0xee, 0x5d, 0xf8, 0xce,
                          0x97, 0x4e, 0x76, 0xb7, 0x01, 0x8e, 0x3f, 0x22, 0xa1, 0xc4, 0xcf, 0x26, 0x78, 0x57, 0x0f, 0x20]

func check(_ input: UnsafeRawBufferPointer) {
    var split = input.count
    var i = 0
    while i + 1 < input.count {
        if input[i] == 0xFF, input[i + 1] == 0xFF { split = i; break }
        i += 1
    }
    let message = UnsafeRawBufferPointer(rebasing: input[..<split])
    guard var hs = try? NoiseHandshake(psk: psk) else { return invariant(false, "libcrypto") }
    let transport: NoiseTransport
    do throws(NoiseError) {
        let (response, t) = try hs.respond(to: message, ephemeralPrivateKey: ephemeral)
        invariant(response.count == 48 && Array(response[..<32]) == ourPublic, "response \(hex(response))")
        guard var again = try? NoiseHandshake(psk: psk), (try? again.respond(to: message, ephemeralPrivateKey: ephemeral)) != nil,
              again.handshakeHash == hs.handshakeHash else { return invariant(false, "the same message completed differently") }
        transport = t
    } catch {
        let sized = message.count >= 48 && message.count <= 304
        switch error {
        case .malformed: break  // a size out of range, or a low-order key
        case .wrongKey: invariant(sized, "wrongKey for \(message.count) bytes")
        case .badTag, .crypto: invariant(false, "\(error)")
        }
        if !sized, error != .malformed("\(message.count) bytes, NNpsk0's first message has at least 48"),
           error != .malformed("\(message.count) bytes, more than the 304 a client sends") {
            invariant(false, "\(message.count) bytes gave \(error)")
        }
        return
    }
    var rest = split + 2
    while rest < input.count {
        let n = Int(input[rest])
        rest += 1
        let end = min(input.count, rest + n)
        var body = Array(input[rest..<end])
        let opened = body.withUnsafeMutableBytes { transport.open($0) }
        if opened {
            invariant(body.count >= 16, "opened \(body.count) bytes")
            let plain = Array(body[..<(body.count - 16)])
            _ = plain.withUnsafeBytes { try? NoiseFrame.decodeMessage($0) }
        } else if body.count > 16 {
            let original = Array(input[rest..<end])
            invariant(body.prefix(body.count - 16).allSatisfy { $0 == 0 } || body == original, "plaintext left after a failed open")
        }
        rest = end
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
