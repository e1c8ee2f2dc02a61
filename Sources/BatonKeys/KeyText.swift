// The text form of a 128-bit key, for files, config values and QR codes: docs/security.md §1.
//
//   BATON-GROUP-V1:  + 26 base32 characters (RFC 4648 §6, no padding) of the 16 bytes
//                    + 2 base32 characters of a CRC-10/ATM over the 16 bytes
//
// Every character (A–Z, 2–7, '-', ':') is in a QR code's alphanumeric set (ISO/IEC 18004 §7.4.4),
// so the 43 characters fit a version 2 QR code. A CRC of degree 10 detects every error burst of
// at most 10 bits (Peterson & Brown, 1961): every single mistyped character (5 bits) and every
// swap of two neighbouring data characters.
import BatonLibc
import CLibc

/// A key's text form is wrong. Every case is the fault of whoever typed or pasted it.
public enum KeyTextError: Error, Equatable, CustomStringConvertible {
    /// The text does not start with the expected prefix.
    case missingPrefix(expected: String)
    /// The text is a different kind of key, e.g. a beacon key where the group secret belongs.
    case wrongKind(expected: String, found: String)
    /// Not 28 characters after the prefix.
    case wrongLength(expected: Int, found: Int)
    /// A character outside A–Z, 2–7; `position` counts from 1 after the prefix.
    case notBase32(character: Character, position: Int)
    /// The checksum does not match: a character is mistyped or two are swapped.
    case checksumMismatch
    /// The file could not be read (errno from the OS).
    case unreadableFile(path: String, errno: Int32)
    /// The file's first line is empty.
    case emptyFile(path: String)

    public var description: String {
        switch self {
        case .missingPrefix(let p): "a key must start with \(p)"
        case .wrongKind(let e, let f): "this is a \(f) (\(KeyText.prefix(of: f) ?? "")…), expected a \(e)"
        case .wrongLength(let e, let f): "a key has \(e) characters after its prefix, this one has \(f): check for a missing or extra character"
        case .notBase32(let c, let p): "character \(p) after the prefix, '\(c)', is not base32 (A–Z, 2–7); 0, 1, 8 and 9 never appear"
        case .checksumMismatch: "the key's checksum does not match: a character is mistyped or two are swapped"
        case .unreadableFile(let path, let e): "cannot read the key file \(path): \(String(cString: strerror(e)))"
        case .emptyFile(let path): "the key file \(path) is empty; its first line must be the key"
        }
    }
}

/// Encodes and parses the text form of a 16-byte key under a kind's prefix.
enum KeyText {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)
    /// 128 bits → 26 characters (the last carries 3 bits and 2 zero bits), then 2 of CRC.
    static let dataCharacters = 26
    static let characters = 28
    static let kinds: [(name: String, prefix: String)] = [
        ("group secret", "BATON-GROUP-V1:"),
        ("beacon key", "BATON-BEACON-V1:"),
    ]

    static func prefix(of kind: String) -> String? { kinds.first { $0.name == kind }?.prefix }

    /// CRC-10/ATM: polynomial 0x233, initial value 0, not reflected, no final XOR. Check value
    /// 0x199 over "123456789" (Greg Cook's CRC catalogue). A checksum, not a cryptographic
    /// primitive; libcrypto has none of this width.
    static func crc10(_ bytes: some Sequence<UInt8>) -> UInt16 {
        var crc: UInt16 = 0
        for b in bytes {
            crc ^= UInt16(b) << 2
            for _ in 0..<8 {
                crc = crc & 0x200 != 0 ? (crc << 1) ^ 0x233 : crc << 1
            }
            crc &= 0x3FF
        }
        return crc
    }

    static func encode(_ bytes: [UInt8], kind: String) -> String {
        precondition(bytes.count == 16)
        var out = Array(prefix(of: kind)!.utf8)
        // RFC 4648 §6: 5 bits at a time, most significant first.
        var acc: UInt32 = 0, bits = 0
        for b in bytes {
            acc = acc << 8 | UInt32(b); bits += 8
            while bits >= 5 { bits -= 5; out.append(alphabet[Int(acc >> UInt32(bits) & 0x1F)]) }
        }
        out.append(alphabet[Int(acc << UInt32(5 - bits) & 0x1F)])  // 3 bits left, padded with 0
        let crc = crc10(bytes)
        out.append(alphabet[Int(crc >> 5)])
        out.append(alphabet[Int(crc & 0x1F)])
        return String(decoding: out, as: UTF8.self)
    }

    /// Accepts any letter case and surrounding whitespace (a trailing newline from a file).
    static func decode(_ text: String, kind: String) throws(KeyTextError) -> [UInt8] {
        let expected = prefix(of: kind)!
        let trimmed = Array(text.uppercased().utf8.drop { isSpace($0) }.reversed().drop { isSpace($0) }.reversed())
        guard trimmed.starts(with: expected.utf8) else {
            if let other = kinds.first(where: { trimmed.starts(with: $0.prefix.utf8) }) {
                throw .wrongKind(expected: kind, found: other.name)
            }
            throw .missingPrefix(expected: expected)
        }
        let body = trimmed.dropFirst(expected.utf8.count)
        guard body.count == characters else { throw .wrongLength(expected: characters, found: body.count) }
        var values: [UInt8] = []
        for (i, c) in body.enumerated() {
            guard let v = alphabet.firstIndex(of: c) else {
                throw .notBase32(character: Character(Unicode.Scalar(c)), position: i + 1)
            }
            values.append(UInt8(v))
        }
        var bytes: [UInt8] = []
        var acc: UInt32 = 0, bits = 0
        for v in values.prefix(dataCharacters) {
            acc = acc << 5 | UInt32(v); bits += 5
            if bits >= 8 { bits -= 8; bytes.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits))) }
        }
        // The 2 bits left over must be zero (RFC 4648 §3.5, canonical encoding); anything
        // else is a mistyped last data character, reported as such.
        let crc = UInt16(values[26]) << 5 | UInt16(values[27])
        guard acc & 0x3 == 0, crc == crc10(bytes) else { throw .checksumMismatch }
        return bytes
    }

    /// The first line of a file, read with the C library (BatonKeys has no Foundation).
    static func firstLine(path: String) throws(KeyTextError) -> String {
        guard let f = fopen(path, "r") else { throw .unreadableFile(path: path, errno: errno) }
        defer { fclose(f) }
        var line: UnsafeMutablePointer<CChar>? = nil
        var capacity = 0
        defer { free(line) }
        let n = getline(&line, &capacity, f)
        if n < 0 {
            if ferror(f) != 0 { throw .unreadableFile(path: path, errno: errno) }
            throw .emptyFile(path: path)
        }
        let text = String(cString: line!)
        guard !text.utf8.allSatisfy(isSpace) else { throw .emptyFile(path: path) }
        return text
    }

    private static func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D }
}
