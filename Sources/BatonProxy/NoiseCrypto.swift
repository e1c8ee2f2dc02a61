// The one place BatonProxy talks to libcrypto (architecture.md §5.6), in the manner of
// Sources/BatonKeys/Libcrypto.swift: every primitive of the Noise protocol's
// 25519_ChaChaPoly_SHA256 suite is libcrypto's (X25519, ChaCha20-Poly1305, SHA-256, and HKDF,
// which is exactly Noise's HKDF: noiseprotocol.org/noise.html §4.3, RFC 5869 with the chaining
// key as salt and an empty info); this file owns the contexts and turns failures into errors.
import CCrypto
import CLibc

/// libcrypto refused an operation that cannot fail with valid arguments (a provider without
/// X25519 or ChaCha20-Poly1305, no entropy): the host's fault, not the peer's.
public struct ProxyCryptoError: Error, Equatable, CustomStringConvertible {
    public let operation: String
    init(_ operation: String) {
        self.operation = operation
        ERR_clear_error()
    }
    public var description: String { "libcrypto failed in \(operation); check the OpenSSL installation (libssl3, its providers)" }
}

/// One ChaCha20-Poly1305 direction of a Noise cipher state (§5.1): keyed once, then re-armed
/// with each message's nonce (4 zero bytes, then the 64-bit counter little-endian: §12.3), so
/// the per-message path allocates nothing.
final class ChaChaPoly {
    let ctx: OpaquePointer
    let encrypt: Bool
    /// The 12-byte nonce, allocated with the context.
    let iv: UnsafeMutablePointer<UInt8>
    /// The next message's counter (Noise's n).
    var counter: UInt64 = 0

    init(key: [UInt8], encrypt: Bool) throws(ProxyCryptoError) {
        precondition(key.count == 32, "ChaCha20-Poly1305 takes a 32-byte key")
        guard let cipher = EVP_CIPHER_fetch(nil, "ChaCha20-Poly1305", nil) else { throw ProxyCryptoError("EVP_CIPHER_fetch(ChaCha20-Poly1305)") }
        defer { EVP_CIPHER_free(cipher) }
        guard let ctx = EVP_CIPHER_CTX_new() else { throw ProxyCryptoError("EVP_CIPHER_CTX_new") }
        self.ctx = ctx
        self.encrypt = encrypt
        iv = .allocate(capacity: 12)
        iv.initialize(repeating: 0, count: 12)
        guard key.withUnsafeBufferPointer({ EVP_CipherInit_ex(ctx, cipher, nil, $0.baseAddress, nil, encrypt ? 1 : 0) }) == 1 else {
            throw ProxyCryptoError("EVP_CipherInit_ex(ChaCha20-Poly1305, key)")
        }
    }

    deinit {
        EVP_CIPHER_CTX_free(ctx)  // also cleanses the key
        iv.deallocate()
    }

    private func arm() -> Bool {
        var n = counter
        for i in 4..<12 {
            iv[i] = UInt8(truncatingIfNeeded: n)
            n >>= 8
        }
        return EVP_CipherInit_ex(ctx, nil, nil, nil, iv, encrypt ? 1 : 0) == 1
    }

    /// ENCRYPT(k, n++, ad, plaintext): encrypts `buffer`'s first `count - 16` bytes in place and
    /// writes the tag into its last 16. False only if libcrypto fails.
    func seal(_ buffer: UnsafeMutableRawBufferPointer, ad: UnsafeRawBufferPointer) -> Bool {
        precondition(encrypt && buffer.count >= 16)
        guard arm() else { return false }
        let plain = buffer.count &- 16
        let p = buffer.baseAddress!.assumingMemoryBound(to: UInt8.self)
        var outl: Int32 = 0
        if ad.count > 0 {
            guard EVP_CipherUpdate(ctx, nil, &outl, ad.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(ad.count)) == 1 else { return false }
        }
        if plain > 0 { guard EVP_CipherUpdate(ctx, p, &outl, p, Int32(plain)) == 1 else { return false } }
        var fin: Int32 = 0
        guard EVP_CipherFinal_ex(ctx, p + plain, &fin) == 1 else { return false }
        guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, p + plain) == 1 else { return false }
        counter &+= 1
        return true
    }

    /// DECRYPT(k, n++, ad, ciphertext): `buffer` is ciphertext then tag; decrypts in place into
    /// its first `count - 16` bytes. False when the tag does not authenticate (the counter
    /// stays: a Noise session that failed once is closed).
    func open(_ buffer: UnsafeMutableRawBufferPointer, ad: UnsafeRawBufferPointer) -> Bool {
        precondition(!encrypt)
        guard buffer.count >= 16, arm() else { return false }
        let plain = buffer.count &- 16
        let p = buffer.baseAddress!.assumingMemoryBound(to: UInt8.self)
        var outl: Int32 = 0
        if ad.count > 0 {
            guard EVP_CipherUpdate(ctx, nil, &outl, ad.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(ad.count)) == 1 else { return false }
        }
        if plain > 0 { guard EVP_CipherUpdate(ctx, p, &outl, p, Int32(plain)) == 1 else { return false } }
        guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, p + plain) == 1 else { return false }
        var fin: Int32 = 0
        guard EVP_CipherFinal_ex(ctx, p + plain, &fin) == 1 else {
            // What was decrypted did not authenticate: leave none of it.
            OPENSSL_cleanse(p, plain)
            return false
        }
        counter &+= 1
        return true
    }
}

enum NoiseCrypto {
    /// SHA-256 of `a` then `b` (Noise's HASH over a concatenation, MixHash §5.2).
    static func sha256(_ a: [UInt8], _ b: [UInt8]) throws(ProxyCryptoError) -> [UInt8] {
        guard let md = EVP_MD_CTX_new() else { throw ProxyCryptoError("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(md) }
        var out = [UInt8](repeating: 0, count: 32)
        var len: UInt32 = 0
        let ok = a.withUnsafeBytes { ab in
            b.withUnsafeBytes { bb in
                out.withUnsafeMutableBufferPointer { o in
                    EVP_DigestInit_ex(md, EVP_sha256(), nil) == 1
                        && (ab.count == 0 || EVP_DigestUpdate(md, ab.baseAddress, ab.count) == 1)
                        && (bb.count == 0 || EVP_DigestUpdate(md, bb.baseAddress, bb.count) == 1)
                        && EVP_DigestFinal_ex(md, o.baseAddress, &len) == 1
                }
            }
        }
        guard ok, len == 32 else { throw ProxyCryptoError("EVP_Digest(SHA256)") }
        return out
    }

    /// Noise's HKDF(chaining_key, input_key_material, n) (§4.3): RFC 5869 HKDF-SHA256 with the
    /// chaining key as salt, the input as key, empty info, 32·n bytes.
    static func hkdf(chainingKey: [UInt8], input: [UInt8], outputs: Int) throws(ProxyCryptoError) -> [UInt8] {
        guard let kdf = EVP_KDF_fetch(nil, "HKDF", nil) else { throw ProxyCryptoError("EVP_KDF_fetch(HKDF)") }
        defer { EVP_KDF_free(kdf) }
        guard let kctx = EVP_KDF_CTX_new(kdf) else { throw ProxyCryptoError("EVP_KDF_CTX_new(HKDF)") }
        defer { EVP_KDF_CTX_free(kctx) }
        var out = [UInt8](repeating: 0, count: 32 * outputs)
        var digest = Array("SHA256".utf8CString)
        var salt = chainingKey
        // An empty key still needs a pointer: HKDF takes a zero-length IKM (Noise's Split).
        var key = input
        if key.isEmpty { key = [0] }
        let keyCount = input.count
        let ok = digest.withUnsafeMutableBufferPointer { d in
            key.withUnsafeMutableBytes { k in
                salt.withUnsafeMutableBytes { s in
                    var params: [OSSL_PARAM] = [
                        OSSL_PARAM_construct_utf8_string(ParamName.digest, d.baseAddress, 0),
                        OSSL_PARAM_construct_octet_string(ParamName.key, k.baseAddress, keyCount),
                        OSSL_PARAM_construct_octet_string(ParamName.salt, s.baseAddress, s.count),
                        OSSL_PARAM_construct_end(),
                    ]
                    return out.withUnsafeMutableBufferPointer { o in EVP_KDF_derive(kctx, o.baseAddress, o.count, &params) == 1 }
                }
            }
        }
        guard ok else { throw ProxyCryptoError("EVP_KDF_derive(HKDF-SHA256)") }
        return out
    }

    /// An X25519 key pair: a fresh one from libcrypto's generator, or from a given private key
    /// (the tests' fixed vectors). The caller frees it with EVP_PKEY_free.
    static func x25519Key(privateKey: [UInt8]?) throws(ProxyCryptoError) -> OpaquePointer {
        if let privateKey {
            precondition(privateKey.count == 32)
            guard let k = privateKey.withUnsafeBufferPointer({ EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, $0.baseAddress, 32) }) else {
                throw ProxyCryptoError("EVP_PKEY_new_raw_private_key(X25519)")
            }
            return k
        }
        guard let pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nil) else { throw ProxyCryptoError("EVP_PKEY_CTX_new_id(X25519)") }
        defer { EVP_PKEY_CTX_free(pctx) }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_keygen_init(pctx) == 1, EVP_PKEY_keygen(pctx, &key) == 1, let key else {
            throw ProxyCryptoError("EVP_PKEY_keygen(X25519)")
        }
        return key
    }

    static func publicKey(_ key: OpaquePointer) throws(ProxyCryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var len = 32
        guard out.withUnsafeMutableBufferPointer({ EVP_PKEY_get_raw_public_key(key, $0.baseAddress, &len) }) == 1, len == 32 else {
            throw ProxyCryptoError("EVP_PKEY_get_raw_public_key(X25519)")
        }
        return out
    }

    /// DH(key, peer) (§4.1). Nil when the peer's key is a low-order point, whose shared secret
    /// is all zeros and which libcrypto refuses (RFC 7748 §6.1): the peer's fault.
    static func x25519(_ key: OpaquePointer, peer: [UInt8]) throws(ProxyCryptoError) -> [UInt8]? {
        precondition(peer.count == 32)
        guard let peerKey = peer.withUnsafeBufferPointer({ EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nil, $0.baseAddress, 32) }) else {
            ERR_clear_error()
            return nil
        }
        defer { EVP_PKEY_free(peerKey) }
        guard let dctx = EVP_PKEY_CTX_new(key, nil) else { throw ProxyCryptoError("EVP_PKEY_CTX_new(X25519)") }
        defer { EVP_PKEY_CTX_free(dctx) }
        guard EVP_PKEY_derive_init(dctx) == 1 else { throw ProxyCryptoError("EVP_PKEY_derive_init(X25519)") }
        guard EVP_PKEY_derive_set_peer(dctx, peerKey) == 1 else {
            ERR_clear_error()
            return nil
        }
        var out = [UInt8](repeating: 0, count: 32)
        var len = 32
        guard out.withUnsafeMutableBufferPointer({ EVP_PKEY_derive(dctx, $0.baseAddress, &len) }) == 1, len == 32 else {
            ERR_clear_error()
            return nil
        }
        return out
    }

    /// Fills `buffer` from libcrypto's generator.
    static func random(_ count: Int) throws(ProxyCryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        guard out.withUnsafeMutableBufferPointer({ RAND_bytes($0.baseAddress, Int32(count)) }) == 1 else {
            throw ProxyCryptoError("RAND_bytes")
        }
        return out
    }
}

/// OSSL_PARAM keeps the pointer to its name, so the names must outlive the call that builds
/// it: made once, never freed, never written.
private enum ParamName {
    nonisolated(unsafe) static let digest = UnsafePointer(strdup(OSSL_KDF_PARAM_DIGEST)!)
    nonisolated(unsafe) static let key = UnsafePointer(strdup(OSSL_KDF_PARAM_KEY)!)
    nonisolated(unsafe) static let salt = UnsafePointer(strdup(OSSL_KDF_PARAM_SALT)!)
}
