// Sealed payloads and stream data: docs/security.md §5.
//
// AES-128-GCM (NIST SP 800-38D) under the payload key, which only the group's devices hold.
// The envelope:
//
//   offset  size  field
//   0       1     version: 01
//   1       12    nonce (random per envelope, RAND_bytes)
//   13      n     ciphertext (as long as the plaintext)
//   13+n    16    GCM tag
//
// GCM's associated data is the version byte followed by the caller's *context*: what the
// envelope belongs to, which is not sent in it but known to both ends. For an activity payload
// the context is 01 ‖ device id (6, as on air) ‖ sequence (2, LE), so a payload sealed for one
// activity cannot be passed off as another's, or as an older save of the same activity.
//
// AES-GCM rather than ChaCha20-Poly1305: phones (CryptoKit AES.GCM, javax.crypto), mbedTLS and
// the ESP32's AES hardware all have it, and it is the same AES-128 the beacon already needs.
// Random 96-bit nonces keep the group under NIST SP 800-38D §8.3's bound (2^32 envelopes per key).
import CCrypto

/// Why an envelope was not opened or not sealed.
public enum SealError: Error, Equatable, CustomStringConvertible {
    /// Shorter than an envelope can be (29 bytes: version, nonce, tag): cut in transit.
    case tooShort(count: Int, need: Int)
    /// A version byte this gateway or device does not know (docs/security.md §5).
    case unsupportedVersion(UInt8)
    /// The tag does not match: the envelope was altered, sealed with another key, or for
    /// another context (another activity or sequence). Nothing of it is returned.
    case authenticationFailed
    /// The caller's buffer is smaller than the result (a caller bug or a capacity to raise).
    case noRoom(need: Int, capacity: Int)
    /// A plaintext above `SealedEnvelope.maxPlaintext`.
    case plaintextTooLong(count: Int, max: Int)
    /// libcrypto could not draw a nonce.
    case crypto(CryptoError)

    public var description: String {
        switch self {
        case .tooShort(let c, let n): "sealed envelope of \(c) bytes is cut short: at least \(n) bytes"
        case .unsupportedVersion(let v): "sealed envelope version \(v) is not supported (only 1)"
        case .authenticationFailed: "sealed envelope does not authenticate: altered, another group's key, or another activity"
        case .noRoom(let n, let c): "buffer of \(c) bytes is too small: \(n) needed"
        case .plaintextTooLong(let c, let m): "plaintext of \(c) bytes is above the \(m)-byte limit of a sealed envelope"
        case .crypto(let e): e.description
        }
    }
}

/// The context an activity payload is sealed for (docs/security.md §5.2).
public struct PayloadContext: Sendable {
    /// The kind byte of an activity payload's context; other kinds are the relay's.
    public static let kind: UInt8 = 0x01
    public static let length = 9
    public var deviceID: UInt64
    public var sequence: UInt16

    public init(deviceID: UInt64, sequence: UInt16) {
        self.deviceID = deviceID & 0xFFFF_FFFF_FFFF
        self.sequence = sequence
    }

    /// The 9 context bytes: 01 ‖ device id (6, LE) ‖ sequence (2, LE), on the stack.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws(SealError) -> R) throws(SealError) -> R {
        var b: InlineArray<9, UInt8> = .init(repeating: 0)
        b[0] = PayloadContext.kind
        for i in 0..<6 { b[1 + i] = UInt8(truncatingIfNeeded: deviceID >> (8 * UInt64(i))) }
        b[7] = UInt8(truncatingIfNeeded: sequence)
        b[8] = UInt8(truncatingIfNeeded: sequence >> 8)
        let span = b.span
        var result: Result<R, SealError>!
        span.withUnsafeBytes { raw in
            do throws(SealError) { result = .success(try body(raw)) } catch { result = .failure(error) }
        }
        return try result.get()
    }
}

/// Seals and opens envelopes with one payload key. Holds two preallocated AES-128-GCM
/// contexts (seal, open); both write into the caller's buffer and allocate nothing.
public final class SealedEnvelope {
    public static let version: UInt8 = 1
    public static let nonceLength = 12
    public static let tagLength = 16
    /// Version + nonce + tag: an envelope is its plaintext plus 29 bytes.
    public static let overhead = 1 + nonceLength + tagLength
    /// Far above any payload (3 KB recommended) or stream frame, far below GCM's limit.
    public static let maxPlaintext = 1 << 20

    private let sealer: CipherContext
    private let opener: CipherContext

    public init(key: PayloadKey) throws(CryptoError) {
        // 12-byte nonces are GCM's default length (SP 800-38D §5.2.1.1), no ctrl needed.
        sealer = try CipherContext(cipher: "AES-128-GCM", key: key.bytes, encrypt: true)
        opener = try CipherContext(cipher: "AES-128-GCM", key: key.bytes, encrypt: false)
    }

    /// The envelope length for a plaintext of `count` bytes.
    public static func sealedLength(plaintextCount count: Int) -> Int { count + overhead }

    /// Seals `plaintext` for `context` into `out`; returns the envelope length. `nonce` is
    /// for test vectors only: nil (the default) draws a fresh random one, as every real seal must.
    public func seal(_ plaintext: UnsafeRawBufferPointer, context: UnsafeRawBufferPointer,
                     into out: UnsafeMutableRawBufferPointer,
                     nonce: UnsafeRawBufferPointer? = nil) throws(SealError) -> Int {
        guard plaintext.count <= SealedEnvelope.maxPlaintext else {
            throw .plaintextTooLong(count: plaintext.count, max: SealedEnvelope.maxPlaintext)
        }
        let total = SealedEnvelope.sealedLength(plaintextCount: plaintext.count)
        guard total <= out.count else { throw .noRoom(need: total, capacity: out.count) }
        out[0] = SealedEnvelope.version
        let nonceOut = UnsafeMutableRawBufferPointer(rebasing: out[1..<13])
        if let nonce {
            precondition(nonce.count == SealedEnvelope.nonceLength, "a GCM nonce here is 12 bytes")
            nonceOut.copyMemory(from: nonce)
        } else {
            do throws(CryptoError) { try randomBytes(nonceOut) } catch { throw .crypto(error) }
        }
        let o = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let ctx = sealer.ctx
        var outl: Int32 = 0
        // Proof the Int32 conversions hold: plaintext ≤ maxPlaintext (2^20), context is
        // caller-sized but checked here.
        precondition(context.count <= Int(Int32.max))
        var ok = EVP_EncryptInit_ex(ctx, nil, nil, nil, o + 1) == 1
            && EVP_EncryptUpdate(ctx, nil, &outl, o, 1) == 1
            && (context.isEmpty || EVP_EncryptUpdate(ctx, nil, &outl, ptr(context), Int32(context.count)) == 1)
        if ok && !plaintext.isEmpty {
            ok = EVP_EncryptUpdate(ctx, o + 13, &outl, ptr(plaintext), Int32(plaintext.count)) == 1
                && Int(outl) == plaintext.count
        }
        ok = ok && EVP_EncryptFinal_ex(ctx, o + 13 + plaintext.count, &outl) == 1
            && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, Int32(SealedEnvelope.tagLength),
                                   o + 13 + plaintext.count) == 1
        precondition(ok, "AES-128-GCM with a set key and checked lengths cannot fail")
        return total
    }

    /// Opens an envelope sealed for `context`, writing the plaintext into `out`; returns its
    /// length. On any failure `out` holds no plaintext: GCM decrypts before it can check the
    /// tag, so what was written is wiped (OPENSSL_cleanse).
    public func open(_ envelope: UnsafeRawBufferPointer, context: UnsafeRawBufferPointer,
                     into out: UnsafeMutableRawBufferPointer) throws(SealError) -> Int {
        guard !envelope.isEmpty else { throw .tooShort(count: 0, need: SealedEnvelope.overhead) }
        guard envelope[0] == SealedEnvelope.version else { throw .unsupportedVersion(envelope[0]) }
        guard envelope.count >= SealedEnvelope.overhead else {
            throw .tooShort(count: envelope.count, need: SealedEnvelope.overhead)
        }
        let n = envelope.count - SealedEnvelope.overhead
        guard n <= SealedEnvelope.maxPlaintext else { throw .plaintextTooLong(count: n, max: SealedEnvelope.maxPlaintext) }
        guard n <= out.count else { throw .noRoom(need: n, capacity: out.count) }
        precondition(context.count <= Int(Int32.max))
        let e = ptr(envelope)
        let ctx = opener.ctx
        var outl: Int32 = 0
        var ok = EVP_DecryptInit_ex(ctx, nil, nil, nil, e + 1) == 1
            && EVP_DecryptUpdate(ctx, nil, &outl, e, 1) == 1
            && (context.isEmpty || EVP_DecryptUpdate(ctx, nil, &outl, ptr(context), Int32(context.count)) == 1)
        precondition(ok, "AES-128-GCM with a set key cannot fail before the tag check")
        let o = out.baseAddress?.assumingMemoryBound(to: UInt8.self)
        if n > 0 {
            ok = EVP_DecryptUpdate(ctx, o, &outl, e + 13, Int32(n)) == 1 && Int(outl) == n
            precondition(ok, "AES-128-GCM decryption of checked lengths cannot fail before the tag check")
        }
        // The tag is copied into our own buffer: EVP_CIPHER_CTX_ctrl takes a non-const pointer.
        let t = opener.scratch(0, 16), finalOut = opener.scratch(16, 16)
        UnsafeMutableRawPointer(t).copyMemory(from: e + 13 + n, byteCount: SealedEnvelope.tagLength)
        let verified = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, Int32(SealedEnvelope.tagLength), t) == 1
            && EVP_DecryptFinal_ex(ctx, finalOut, &outl) == 1
        guard verified else {
            ERR_clear_error()
            if n > 0 { OPENSSL_cleanse(out.baseAddress, n) }
            throw .authenticationFailed
        }
        return n
    }

    /// Seals an activity payload for the beacon (device id, sequence) it belongs to.
    public func sealPayload(_ plaintext: UnsafeRawBufferPointer, for context: PayloadContext,
                            into out: UnsafeMutableRawBufferPointer,
                            nonce: UnsafeRawBufferPointer? = nil) throws(SealError) -> Int {
        try context.withUnsafeBytes { (c) throws(SealError) in try seal(plaintext, context: c, into: out, nonce: nonce) }
    }

    /// Opens an activity payload sealed for (device id, sequence).
    public func openPayload(_ envelope: UnsafeRawBufferPointer, for context: PayloadContext,
                            into out: UnsafeMutableRawBufferPointer) throws(SealError) -> Int {
        try context.withUnsafeBytes { (c) throws(SealError) in try open(envelope, context: c, into: out) }
    }

    private func ptr(_ b: UnsafeRawBufferPointer) -> UnsafePointer<UInt8> {
        b.baseAddress!.assumingMemoryBound(to: UInt8.self)
    }
}

/// What a sealed stream frame is for (docs/security.md §5.2): 24 bytes of associated data, so
/// a frame opens only in its own stream, direction and place.
///
///   02 ‖ device id (6, LE) ‖ stream nonce (12) ‖ direction (1: 00 up, 01 down) ‖ frame (4, LE)
///
/// The stream nonce is the nonce of the endpoint's frame 0 (an empty "hello" envelope): random,
/// chosen by the endpoint, and known to the device once frame 0 arrives, before any other.
public struct StreamFrameContext: Sendable {
    public static let kind: UInt8 = 0x02
    public static let length = 24
    public enum Direction: UInt8, Sendable { case up = 0, down = 1 }

    public var deviceID: UInt64
    public var streamNonce: InlineArray<12, UInt8>
    public var direction: Direction
    public var frame: UInt32

    public init(deviceID: UInt64, streamNonce: InlineArray<12, UInt8>, direction: Direction, frame: UInt32) {
        self.deviceID = deviceID & 0xFFFF_FFFF_FFFF
        self.streamNonce = streamNonce
        self.direction = direction
        self.frame = frame
    }

    /// The stream nonce of an endpoint's frame 0: its envelope's nonce (§5.1, bytes 1–12).
    public static func streamNonce(ofFrameZero envelope: UnsafeRawBufferPointer) -> InlineArray<12, UInt8>? {
        guard envelope.count >= SealedEnvelope.overhead, envelope[0] == SealedEnvelope.version else { return nil }
        var n: InlineArray<12, UInt8> = .init(repeating: 0)
        for i in 0..<12 { n[i] = envelope[1 + i] }
        return n
    }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws(SealError) -> R) throws(SealError) -> R {
        var b: InlineArray<24, UInt8> = .init(repeating: 0)
        b[0] = StreamFrameContext.kind
        for i in 0..<6 { b[1 + i] = UInt8(truncatingIfNeeded: deviceID >> (8 * UInt64(i))) }
        for i in 0..<12 { b[7 + i] = streamNonce[i] }
        b[19] = direction.rawValue
        for i in 0..<4 { b[20 + i] = UInt8(truncatingIfNeeded: frame >> (8 * UInt32(i))) }
        let span = b.span
        var result: Result<R, SealError>!
        span.withUnsafeBytes { raw in
            do throws(SealError) { result = .success(try body(raw)) } catch { result = .failure(error) }
        }
        return try result.get()
    }
}

extension SealedEnvelope {
    /// Seals one stream frame's data. Frame 0 up is the endpoint's hello: pass `context` nil and
    /// an empty plaintext; its own nonce becomes the stream nonce, and its context carries it.
    public func sealFrame(_ plaintext: UnsafeRawBufferPointer, for context: StreamFrameContext,
                          into out: UnsafeMutableRawBufferPointer,
                          nonce: UnsafeRawBufferPointer? = nil) throws(SealError) -> Int {
        try context.withUnsafeBytes { (c) throws(SealError) -> Int in try seal(plaintext, context: c, into: out, nonce: nonce) }
    }

    /// Opens one stream frame's data; `authenticationFailed` unless it was sealed for exactly
    /// this stream, direction and frame number.
    public func openFrame(_ envelope: UnsafeRawBufferPointer, for context: StreamFrameContext,
                          into out: UnsafeMutableRawBufferPointer) throws(SealError) -> Int {
        try context.withUnsafeBytes { (c) throws(SealError) -> Int in try open(envelope, context: c, into: out) }
    }

    /// The endpoint's frame 0: an empty envelope whose random nonce is the stream nonce, sealed
    /// with a context that carries that nonce (§5.2). Returns the envelope's length (29).
    public func sealHello(deviceID: UInt64, into out: UnsafeMutableRawBufferPointer,
                          nonce: UnsafeRawBufferPointer? = nil) throws(SealError) -> Int {
        // Array.withUnsafeBytes rethrows untyped: a buffer of our own keeps the errors typed.
        let chosen = UnsafeMutableRawBufferPointer.allocate(byteCount: SealedEnvelope.nonceLength, alignment: 1)
        defer { chosen.deallocate() }
        if let nonce {
            precondition(nonce.count == SealedEnvelope.nonceLength, "a GCM nonce here is 12 bytes")
            chosen.copyMemory(from: nonce)
        } else {
            do throws(CryptoError) { try randomBytes(chosen) } catch { throw .crypto(error) }
        }
        var n: InlineArray<12, UInt8> = .init(repeating: 0)
        for i in 0..<12 { n[i] = chosen[i] }
        let context = StreamFrameContext(deviceID: deviceID, streamNonce: n, direction: .up, frame: 0)
        return try sealFrame(UnsafeRawBufferPointer(start: nil, count: 0), for: context, into: out,
                             nonce: UnsafeRawBufferPointer(chosen))
    }
}
