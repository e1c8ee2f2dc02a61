// The one place BatonKeys talks to OpenSSL's libcrypto (C is wrapped once: architecture.md §5.6).
// Every primitive (AES, CCM, GCM, HKDF, SHA-256, the random generator) is libcrypto's; this
// file only owns the contexts and turns failures into `CryptoError`.
import CCrypto
import CLibc

/// libcrypto refused an operation that cannot fail with valid arguments: the library is
/// missing an algorithm (a provider configuration without AES or HKDF, e.g. a restricted
/// FIPS setup) or the system has no entropy. The host's fault, not the peer's.
public struct CryptoError: Error, Equatable, CustomStringConvertible {
    /// The libcrypto call that failed, e.g. "EVP_CIPHER_fetch(AES-128-CCM)".
    public let operation: String
    /// OpenSSL's own reason (ERR_error_string_n), empty when it gave none.
    public let reason: String

    init(_ operation: String) {
        self.operation = operation
        var text = ""
        let code = ERR_get_error()
        if code != 0 {
            var buf = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buf, buf.count)
            text = String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        ERR_clear_error()
        reason = text
    }

    public var description: String {
        "libcrypto failed in \(operation)\(reason.isEmpty ? "" : ": \(reason)"); check the OpenSSL installation (libssl3, its providers)"
    }
}

/// One `EVP_CIPHER_CTX`, keyed once at init and re-armed with a new nonce per message, so the
/// per-message path allocates nothing (docs/security.md §7). Not shared across threads: the
/// gateway is single-threaded (docs/architecture.md §2).
final class CipherContext {
    let ctx: OpaquePointer
    /// 64 bytes of working memory (nonce, block, tag) allocated with the context, so the
    /// per-message path needs none; wiped and freed with it.
    let scratch: UnsafeMutableRawBufferPointer

    /// `configure` runs between choosing the cipher and setting the key: where CCM's nonce and
    /// tag lengths must be set (OpenSSL, EVP_EncryptInit(3) "CCM Mode").
    init(cipher name: String, key: [UInt8], encrypt: Bool,
         configure: (OpaquePointer) -> Bool = { _ in true }) throws(CryptoError) {
        guard let cipher = EVP_CIPHER_fetch(nil, name, nil) else { throw CryptoError("EVP_CIPHER_fetch(\(name))") }
        defer { EVP_CIPHER_free(cipher) }
        precondition(Int(EVP_CIPHER_get_key_length(cipher)) == key.count, "\(name) takes a \(EVP_CIPHER_get_key_length(cipher))-byte key")
        guard let ctx = EVP_CIPHER_CTX_new() else { throw CryptoError("EVP_CIPHER_CTX_new") }
        self.ctx = ctx
        scratch = .allocate(byteCount: 64, alignment: 16)
        scratch.initializeMemory(as: UInt8.self, repeating: 0)
        let enc: Int32 = encrypt ? 1 : 0
        guard EVP_CipherInit_ex(ctx, cipher, nil, nil, nil, enc) == 1 else { throw CryptoError("EVP_CipherInit_ex(\(name))") }
        guard configure(ctx) else { throw CryptoError("EVP_CIPHER_CTX_ctrl(\(name))") }
        guard EVP_CipherInit_ex(ctx, nil, nil, key, nil, enc) == 1 else { throw CryptoError("EVP_CipherInit_ex(\(name), key)") }
    }

    deinit {
        EVP_CIPHER_CTX_free(ctx)  // also cleanses the expanded key schedule
        OPENSSL_cleanse(scratch.baseAddress, scratch.count)
        scratch.deallocate()
    }

    /// `count` bytes of `scratch` from `offset`, as bytes.
    func scratch(_ offset: Int, _ count: Int) -> UnsafeMutablePointer<UInt8> {
        precondition(offset >= 0 && count >= 0 && offset + count <= scratch.count)
        return (scratch.baseAddress! + offset).assumingMemoryBound(to: UInt8.self)
    }
}

/// OSSL_PARAM keeps the pointer to its name, so the names must outlive the call that builds
/// it (a Swift String bridged to `const char *` lives only for that call). Made once, never
/// freed, never written: `nonisolated(unsafe)` is safe for a constant.
private enum ParamName {
    nonisolated(unsafe) static let digest = UnsafePointer(strdup(OSSL_KDF_PARAM_DIGEST)!)
    nonisolated(unsafe) static let key = UnsafePointer(strdup(OSSL_KDF_PARAM_KEY)!)
    nonisolated(unsafe) static let salt = UnsafePointer(strdup(OSSL_KDF_PARAM_SALT)!)
    nonisolated(unsafe) static let info = UnsafePointer(strdup(OSSL_KDF_PARAM_INFO)!)
}

/// HKDF-SHA256 (RFC 5869) through EVP_KDF "HKDF", extract-then-expand.
func hkdfSHA256(key: [UInt8], salt: [UInt8], info: [UInt8], count: Int) throws(CryptoError) -> [UInt8] {
    guard let kdf = EVP_KDF_fetch(nil, "HKDF", nil) else { throw CryptoError("EVP_KDF_fetch(HKDF)") }
    defer { EVP_KDF_free(kdf) }
    guard let kctx = EVP_KDF_CTX_new(kdf) else { throw CryptoError("EVP_KDF_CTX_new(HKDF)") }
    defer { EVP_KDF_CTX_free(kctx) }
    var out = [UInt8](repeating: 0, count: count)
    var digest = Array("SHA256".utf8CString)
    var key = key, salt = salt, info = info
    let ok = digest.withUnsafeMutableBufferPointer { d in
        key.withUnsafeMutableBytes { k in
            salt.withUnsafeMutableBytes { s in
                info.withUnsafeMutableBytes { i in
                    var params: [OSSL_PARAM] = [
                        OSSL_PARAM_construct_utf8_string(ParamName.digest, d.baseAddress, 0),
                        OSSL_PARAM_construct_octet_string(ParamName.key, k.baseAddress, k.count),
                        OSSL_PARAM_construct_octet_string(ParamName.salt, s.baseAddress, s.count),
                        OSSL_PARAM_construct_octet_string(ParamName.info, i.baseAddress, i.count),
                        OSSL_PARAM_construct_end(),
                    ]
                    return out.withUnsafeMutableBufferPointer { o in
                        EVP_KDF_derive(kctx, o.baseAddress, o.count, &params) == 1
                    }
                }
            }
        }
    }
    guard ok else { throw CryptoError("EVP_KDF_derive(HKDF-SHA256)") }
    return out
}

/// Fills `buffer` from libcrypto's CSPRNG (RAND_bytes(3), seeded by the OS).
func randomBytes(_ buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) {
    guard buffer.count > 0 else { return }
    guard RAND_bytes(buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(buffer.count)) == 1 else {
        throw CryptoError("RAND_bytes")
    }
}

/// Constant-time equality (CRYPTO_memcmp(3)): how long it takes does not depend on where the
/// first difference is, so a forger cannot learn a tag byte by byte from response times.
func constantTimeEqual(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, count: Int) -> Bool {
    CRYPTO_memcmp(a, b, count) == 0
}
