// Test vectors are written in hex, as the specs print them; whitespace is for reading. The one
// hex helper of the tests: every test target that writes bytes (Wire, HCI, Keys, Core, Relay,
// Gateway, CLI…) and the broker helper here read and write hex through these four functions.

/// Bytes from hex digits, e.g. `hx("02 01 06")` or a multi-line vector; spaces and newlines are
/// for reading. Stops the test on an odd number of digits or a character that is not one.
public func hx(_ s: some StringProtocol) -> [UInt8] {
    guard let bytes = hexBytes(s) else { preconditionFailure("not hex bytes: \(s)") }
    return bytes
}

/// Bytes from hex digits (whitespace ignored, either case), or nil where `s` is not whole hex
/// bytes: for text a test did not write itself, such as mosquitto_sub's `%x` output.
public func hexBytes(_ s: some StringProtocol) -> [UInt8]? {
    var out: [UInt8] = []
    var high: UInt8? = nil
    for c in s.unicodeScalars where !c.properties.isWhitespace {
        guard let v = hexValue(c) else { return nil }
        if let h = high { out.append(h << 4 | v); high = nil } else { high = v }
    }
    return high == nil ? out : nil
}

/// Lower-case hex of `b`, no separators: "0c2002", as topics, JSON and the CBOR specs write it.
public func hexString(_ b: some Sequence<UInt8>) -> String {
    String(b.flatMap { [lowerDigits[Int($0 >> 4)], lowerDigits[Int($0 & 0xF)]] })
}

/// Upper-case hex of `b`, a space between bytes: "0C 20 02", as the Core spec and btmon print them.
public func spacedHex(_ b: some Sequence<UInt8>) -> String {
    b.map { String([upperDigits[Int($0 >> 4)], upperDigits[Int($0 & 0xF)]]) }.joined(separator: " ")
}

private let lowerDigits = Array("0123456789abcdef")
private let upperDigits = Array("0123456789ABCDEF")

private func hexValue(_ c: Unicode.Scalar) -> UInt8? {
    switch c {
    case "0"..."9": UInt8(c.value - 0x30)
    case "a"..."f": UInt8(c.value - 0x61 + 10)
    case "A"..."F": UInt8(c.value - 0x41 + 10)
    default: nil
    }
}

/// A small deterministic generator for churn tests (SplitMix64), so a failure replays.
public struct SplitMix: RandomNumberGenerator {
    public var state: UInt64
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
