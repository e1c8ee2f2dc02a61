// The responder of Noise_NNpsk0_25519_ChaChaPoly_SHA256 (noiseprotocol.org/noise.html, rev 34),
// as ESPHome's API server runs it (docs/esphome.md §4):
//
//   NNpsk0:
//     -> psk, e
//     <- e, ee
//
// with the prologue "NoiseAPIInit\0\0" and the 32-byte pre-shared key Home Assistant is given
// as base64. The handshake allocates (it runs once per connection); the transport does not.
import BatonWire
import CCrypto

/// Why a handshake or a transport message failed.
public enum NoiseError: Error, Equatable, CustomStringConvertible {
    /// The initiator's first message did not authenticate: it holds another key (or none).
    case wrongKey
    /// The initiator's message is not the shape NNpsk0 prescribes (the text says how).
    case malformed(String)
    /// A transport message did not authenticate: corrupted, replayed, or not from this peer.
    case badTag
    case crypto(ProxyCryptoError)

    public var description: String {
        switch self {
        case .wrongKey: "the client's handshake did not authenticate: it holds another encryption key"
        case .malformed(let text): "bad handshake message: \(text)"
        case .badTag: "an encrypted message did not authenticate"
        case .crypto(let e): e.description
        }
    }
}

public struct NoiseHandshake {
    public static let protocolName = "Noise_NNpsk0_25519_ChaChaPoly_SHA256"
    /// ESPHome's prologue (aioesphomeapi _frame_helper/noise.py: `set_prologue`).
    public static let prologue: [UInt8] = Array("NoiseAPIInit".utf8) + [0, 0]
    /// The initiator's message: e (32 bytes), then its payload encrypted (at least the tag).
    public static let initiatorMessageMin = 32 + 16
    /// Past this, an initiator's payload is not what ESPHome clients send (they send none).
    public static let initiatorMessageMax = 32 + 16 + 256

    var ck: [UInt8]
    var h: [UInt8]
    let psk: [UInt8]

    /// InitializeSymmetric(protocol_name) (§5.2: a name longer than 32 bytes is hashed),
    /// MixHash(prologue).
    public init(psk: [UInt8]) throws(NoiseError) {
        precondition(psk.count == 32, "a Noise pre-shared key is 32 bytes")
        self.psk = psk
        do throws(ProxyCryptoError) {
            h = try NoiseCrypto.sha256(Array(Self.protocolName.utf8), [])
            ck = h
            h = try NoiseCrypto.sha256(h, Self.prologue)
        } catch { throw .crypto(error) }
    }

    mutating func mixHash(_ data: [UInt8]) throws(ProxyCryptoError) { h = try NoiseCrypto.sha256(h, data) }

    /// MixKey (§5.2): ck, k = HKDF(ck, ikm, 2).
    mutating func mixKey(_ ikm: [UInt8]) throws(ProxyCryptoError) -> [UInt8] {
        let out = try NoiseCrypto.hkdf(chainingKey: ck, input: ikm, outputs: 2)
        ck = Array(out[0..<32])
        return Array(out[32..<64])
    }

    /// Reads the initiator's message (what follows the 0x00 byte of its handshake frame) and
    /// writes the response's 48 bytes (e, then the encrypted empty payload: its tag). Returns
    /// them with the transport: the initiator's key to read, ours to write (Split, §5.2).
    /// `ephemeralPrivateKey` is for the tests' fixed vectors; nil draws a fresh one.
    public mutating func respond(to message: UnsafeRawBufferPointer,
                                 ephemeralPrivateKey: [UInt8]? = nil) throws(NoiseError) -> (response: [UInt8], transport: NoiseTransport) {
        guard message.count >= Self.initiatorMessageMin else {
            throw .malformed("\(message.count) bytes, NNpsk0's first message has at least \(Self.initiatorMessageMin)")
        }
        guard message.count <= Self.initiatorMessageMax else {
            throw .malformed("\(message.count) bytes, more than the \(Self.initiatorMessageMax) a client sends")
        }
        let outcome: Outcome
        do throws(ProxyCryptoError) {
            outcome = try respondChecked(re: Array(message[0..<32]), sealed: Array(message[32...]), ephemeralPrivateKey: ephemeralPrivateKey)
        } catch {
            throw .crypto(error)
        }
        switch outcome {
        case .done(let response, let transport): return (response, transport)
        case .wrongKey: throw .wrongKey
        case .lowOrder: throw .malformed("the client's ephemeral key is a low-order point")
        }
    }

    /// The peer's two faults, beside libcrypto's (thrown).
    enum Outcome {
        case done([UInt8], NoiseTransport)
        case wrongKey
        case lowOrder
    }

    mutating func respondChecked(re: [UInt8], sealed: [UInt8], ephemeralPrivateKey: [UInt8]?) throws(ProxyCryptoError) -> Outcome {
        // -> psk: MixKeyAndHash(psk) (§9.2): ck, temp_h, temp_k = HKDF(ck, psk, 3).
        let three = try NoiseCrypto.hkdf(chainingKey: ck, input: psk, outputs: 3)
        ck = Array(three[0..<32])
        try mixHash(Array(three[32..<64]))
        // -> e: re; MixHash(re); with a psk, also MixKey(re) (§9.2).
        try mixHash(re)
        var k = try mixKey(re)
        // DecryptAndHash(payload): the tag proves the initiator holds the psk.
        var payload = sealed
        let reader = try ChaChaPoly(key: k, encrypt: false)
        let opened = payload.withUnsafeMutableBytes { p in h.withUnsafeBytes { ad in reader.open(p, ad: ad) } }
        guard opened else { return .wrongKey }
        try mixHash(sealed)
        // <- e: our ephemeral; MixHash(e.pub); MixKey(e.pub).
        let e = try NoiseCrypto.x25519Key(privateKey: ephemeralPrivateKey)
        defer { EVP_PKEY_free(e) }
        let ePub = try NoiseCrypto.publicKey(e)
        try mixHash(ePub)
        k = try mixKey(ePub)
        // <- ee: MixKey(DH(e, re)).
        guard let shared = try NoiseCrypto.x25519(e, peer: re) else { return .lowOrder }
        k = try mixKey(shared)
        // EncryptAndHash(empty payload): the tag alone, with the hash as associated data.
        var tag = [UInt8](repeating: 0, count: 16)
        let writer = try ChaChaPoly(key: k, encrypt: true)
        let sealedOK = tag.withUnsafeMutableBytes { t in h.withUnsafeBytes { ad in writer.seal(t, ad: ad) } }
        guard sealedOK else { throw ProxyCryptoError("EVP_CipherFinal_ex(ChaCha20-Poly1305)") }
        try mixHash(tag)
        // Split: k1 encrypts what the initiator sends, k2 what the responder sends.
        let keys = try NoiseCrypto.hkdf(chainingKey: ck, input: [], outputs: 2)
        let transport = try NoiseTransport(receiveKey: Array(keys[0..<32]), sendKey: Array(keys[32..<64]))
        return .done(ePub + tag, transport)
    }

    /// The handshake hash so far (tests compare it with another implementation's).
    public var handshakeHash: [UInt8] { h }
}

/// The two cipher states after the handshake. A class: each ChaChaPoly owns a libcrypto
/// context, and a client slot holds one transport at a time.
public final class NoiseTransport {
    let receive: ChaChaPoly
    let send: ChaChaPoly

    init(receiveKey: [UInt8], sendKey: [UInt8]) throws(ProxyCryptoError) {
        receive = try ChaChaPoly(key: receiveKey, encrypt: false)
        send = try ChaChaPoly(key: sendKey, encrypt: true)
    }

    /// Decrypts a transport frame's body in place (ciphertext, then tag); the plaintext is its
    /// first `count - 16` bytes.
    public func open(_ body: UnsafeMutableRawBufferPointer) -> Bool {
        receive.open(body, ad: UnsafeRawBufferPointer(start: nil, count: 0))
    }

    /// Encrypts in place: `body` holds the plaintext and 16 bytes of room for the tag.
    public func seal(_ body: UnsafeMutableRawBufferPointer) -> Bool {
        send.seal(body, ad: UnsafeRawBufferPointer(start: nil, count: 0))
    }
}
