// The Noise_NNpsk0_25519_ChaChaPoly_SHA256 responder (docs/esphome.md §4) against vectors that
// the Python `noiseprotocol` 0.3.1 package (the library aioesphomeapi's client runs) wrote with
// fixed ephemeral keys: psk = 00 01 … 1f, the client's ephemeral private key 32 × 0x11, ours
// 32 × 0x22, prologue "NoiseAPIInit\0\0". Vector in docs/esphome.md §4.3.
import BatonTestSupport
import Testing
@testable import BatonProxy

let vectorPSK = Array<UInt8>(0...31)
let vectorResponderEphemeral = [UInt8](repeating: 0x22, count: 32)
/// The client's handshake message: its ephemeral public key, then the tag of its empty payload.
let vectorMessage1 = hx("""
    7b4e909bbe7ffe44c465a220037d608ee35897d31ef972f07f74892cb0f73f13
    d1bc1a38b6793685dc7e2ffdf8ea0933
    """)
/// Ours: our ephemeral public key, then the tag of our empty payload.
let vectorMessage2 = hx("""
    0faa684ed28867b97f4a6a2dee5df8ce974e76b7018e3f22a1c4cf2678570f20
    7336b95933b321b1ae86673f689f5c9f
    """)
let vectorHandshakeHash = hx("9fbfe40f5a75a9ec6e8f7e6982afebb114835c543b8729c12c266990978dc80e")
/// After the handshake: the client's PingRequest (type 7, length 0), and our PingResponse (8).
let vectorClientPing = hx("082a88d4457b72646ca1ef304be34f8ffac1f659")
let vectorServerPong = hx("d9423bf48bdea62bb10bbd87a7fb5ecc26721050")

@Suite struct NoiseTests {
    @Test func theResponseMatchesNoiseprotocolsByteForByte() throws {
        var hs = try NoiseHandshake(psk: vectorPSK)
        let (response, _) = try vectorMessage1.withUnsafeBytes { try hs.respond(to: $0, ephemeralPrivateKey: vectorResponderEphemeral) }
        #expect(hexString(response) == hexString(vectorMessage2))
        #expect(hs.handshakeHash == vectorHandshakeHash)
    }

    @Test func theTransportReadsTheClientsPingAndWritesThePong() throws {
        var hs = try NoiseHandshake(psk: vectorPSK)
        let (_, transport) = try vectorMessage1.withUnsafeBytes { try hs.respond(to: $0, ephemeralPrivateKey: vectorResponderEphemeral) }
        var ping = vectorClientPing
        #expect(ping.withUnsafeMutableBytes { transport.open($0) })
        #expect(ping.prefix(4) == [0x00, 0x07, 0x00, 0x00])
        var pong: [UInt8] = [0x00, 0x08, 0x00, 0x00] + [UInt8](repeating: 0, count: 16)
        #expect(pong.withUnsafeMutableBytes { transport.seal($0) })
        #expect(hexString(pong) == hexString(vectorServerPong))
    }

    @Test func aClientWithAnotherKeyIsTheWrongKey() throws {
        var other = vectorPSK
        other[0] ^= 1
        var hs = try NoiseHandshake(psk: other)
        #expect(throws: NoiseError.wrongKey) {
            try vectorMessage1.withUnsafeBytes { try hs.respond(to: $0, ephemeralPrivateKey: vectorResponderEphemeral) }
        }
    }

    @Test func aFlippedBitAnywhereInTheClientsMessageFails() throws {
        for i in vectorMessage1.indices {
            var m = vectorMessage1
            m[i] ^= 0x80
            var hs = try NoiseHandshake(psk: vectorPSK)
            #expect(throws: NoiseError.self) { try m.withUnsafeBytes { try hs.respond(to: $0) } }
        }
    }

    @Test func aShortOrOverlongMessageIsMalformed() throws {
        for count in [0, 1, 47, 32 + 16 + 257] {
            var hs = try NoiseHandshake(psk: vectorPSK)
            let m = [UInt8](repeating: 9, count: count)
            #expect(throws: NoiseError.self) { try m.withUnsafeBytes { try hs.respond(to: $0) } }
        }
    }

    @Test func aTamperedTransportMessageDoesNotOpen() throws {
        var hs = try NoiseHandshake(psk: vectorPSK)
        let (_, transport) = try vectorMessage1.withUnsafeBytes { try hs.respond(to: $0, ephemeralPrivateKey: vectorResponderEphemeral) }
        var ping = vectorClientPing
        ping[19] ^= 1
        #expect(!ping.withUnsafeMutableBytes { transport.open($0) })
    }
}
