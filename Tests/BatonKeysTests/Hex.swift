// Test vectors are written in hex, as the specs print them; whitespace is for reading.

/// Bytes from hex digits, e.g. `hx("02 01 06")`.
func hx(_ s: String) -> [UInt8] {
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
func hexString(_ b: [UInt8]) -> String {
    let d = Array("0123456789abcdef")
    return String(b.flatMap { [d[Int($0 >> 4)], d[Int($0 & 0xF)]] })
}
