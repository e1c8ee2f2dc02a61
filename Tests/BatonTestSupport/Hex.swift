// Test vectors are written in hex, as the specs print them; whitespace is for reading. Shared
// by every test target that writes bytes (Wire, Keys, Core, Relay…).

/// Bytes from hex digits, e.g. `hx("02 01 06")`.
public func hx(_ s: String) -> [UInt8] {
    let digits = s.filter { !$0.isWhitespace }
    var out: [UInt8] = []
    var i = digits.startIndex
    while i < digits.endIndex {
        let j = digits.index(i, offsetBy: 2)
        out.append(UInt8(digits[i..<j], radix: 16)!)
        i = j
    }
    return out
}

/// Lower-case hex of `b`, no separators.
public func hexString(_ b: [UInt8]) -> String {
    let d = Array("0123456789abcdef")
    return String(b.flatMap { [d[Int($0 >> 4)], d[Int($0 & 0xF)]] })
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
