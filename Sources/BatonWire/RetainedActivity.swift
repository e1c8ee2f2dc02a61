// What a gateway reads off another gateway's activity message (docs/mqtt.md §2) when it may
// take the device over: the activity's own change, sequence and time, and what the payload
// said (type, title, webpage URL, payload_seq). A move then republishes the activity as it
// was, with its new room, instead of calling it new (docs/mqtt.md §2 "Moves"), and costs the
// device no second fetch. The message is a flat JSON object of scalars, as the gateway's
// writer makes it; anything else is nil. Read once per message of another gateway (a change,
// never an advertisement), so the Strings it returns are the only allocations.

public struct RetainedActivity: Sendable, Equatable {
    public var gateway: String?
    public var seq: UInt16?
    public var typeHash: UInt32?
    /// `became-current` or `saved`, as written.
    public var change: String?
    /// RFC 3339, as written.
    public var changed: String?
    public var type: String?
    public var title: String?
    public var webpageURL: String?
    public var payloadSeq: UInt16?

    public init() {}

    /// The fields above from an activity message, or nil when the bytes are not a JSON object
    /// of scalars. Unknown keys are skipped; a string that is not what JSONWriter writes (an
    /// escape of a surrogate) leaves its field nil.
    public static func read(_ bytes: UnsafeRawBufferPointer) -> RetainedActivity? {
        var out = RetainedActivity()
        // The object walk is RetainedEntry's: one reader of flat entries (docs/mqtt.md §2).
        let whole = RetainedEntry.scan(bytes) { s, key, value in
            switch value {
            case .string(let range):
                let text = unescape(UnsafeRawBufferPointer(rebasing: bytes[range]))
                if s.equals(key, "gateway") { out.gateway = text }
                else if s.equals(key, "change") { out.change = text }
                else if s.equals(key, "changed") { out.changed = text }
                else if s.equals(key, "type") { out.type = text }
                else if s.equals(key, "title") { out.title = text }
                else if s.equals(key, "webpage_url") { out.webpageURL = text }
                else if s.equals(key, "type_hash"), let t = text, t.utf8.count == 8 { out.typeHash = UInt32(t, radix: 16) }
            case .number(let range, let fractional):
                // A sequence is 0…65535: at most five digits, no sign, no fraction.
                guard !fractional, bytes[range.lowerBound] != UInt8(ascii: "-"), range.count <= 5 else { return }
                var v = 0
                for i in range { v = v * 10 + Int(bytes[i] - UInt8(ascii: "0")) }
                guard v <= Int(UInt16.max) else { return }
                if s.equals(key, "seq") { out.seq = UInt16(v) }
                else if s.equals(key, "payload_seq") { out.payloadSeq = UInt16(v) }
            case .literal, .array:
                return
            }
        }
        return whole ? out : nil
    }

    /// A JSON string's content (already checked by the scanner) as text: the escapes of RFC
    /// 8259 §7 decoded. nil for a `\u` escape of a surrogate, which JSONWriter never writes
    /// (it writes every non-ASCII character as UTF-8).
    static func unescape(_ p: UnsafeRawBufferPointer) -> String? {
        guard p.contains(UInt8(ascii: "\\")) else { return String(decoding: p, as: UTF8.self) }
        var out: [UInt8] = []
        out.reserveCapacity(p.count)
        var i = 0
        while i < p.count {
            let b = p[i]
            guard b == UInt8(ascii: "\\") else { out.append(b); i += 1; continue }
            // Proof: the scanner checked every escape is complete.
            let e = p[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var v: UInt32 = 0
                for k in 0 ..< 4 {
                    let h = p[i + k]
                    let d: UInt8 = FlatJSONScanner.isDigit(h) ? h - UInt8(ascii: "0") : (h | 0x20) - UInt8(ascii: "a") + 10
                    v = v << 4 | UInt32(d)
                }
                i += 4
                guard let scalar = Unicode.Scalar(v) else { return nil }
                for u in UTF8.encode(scalar)! { out.append(u) }
            default: out.append(e)  // `"`, `\`, `/`
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
