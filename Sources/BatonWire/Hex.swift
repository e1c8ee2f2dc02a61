// The one spelling of hex in what the gateway writes: device ids and hashes in topics and JSON
// (lowercase, docs/mqtt.md §2), opcodes, status codes and addresses in logs (uppercase, as the
// Bluetooth Core spec prints them). Byte writers take `digit`; everything that makes a String
// takes `text`. BatonYAML, which links only libyaml, keeps its own for U+XXXX.
public enum Hex {
    /// The ASCII digit of `nibble` (0…15; higher bits are ignored). Inlinable: the JSON and
    /// address writers of the hot path call it per digit.
    @inlinable @inline(__always)
    public static func digit(_ nibble: UInt8, uppercase: Bool = false) -> UInt8 {
        let v = nibble & 0x0F
        return v < 10 ? UInt8(ascii: "0") + v : (uppercase ? UInt8(ascii: "A") : UInt8(ascii: "a")) + v - 10
    }

    /// `value` in hex, most significant digit first, zero-padded to at least `digits` digits.
    public static func text<V: BinaryInteger>(_ value: V, digits: Int, uppercase: Bool = false) -> String {
        let s = String(value, radix: 16, uppercase: uppercase)
        return digits > s.utf8.count ? String(repeating: "0", count: digits - s.utf8.count) + s : s
    }
}
