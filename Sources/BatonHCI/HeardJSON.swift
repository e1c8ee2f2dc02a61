// One heard advertisement as one JSON object (`baton replay`'s lines; the format is in
// README.md and docs/captures.md). Written by the fixed-buffer JSONWriter: no allocation.
public import BatonWire

/// "AA:BB:CC:DD:EE:FF", most significant byte first, on the stack.
struct AddressText {
    var bytes: InlineArray<17, UInt8> = .init(repeating: UInt8(ascii: ":"))

    init(_ address: UInt64) {
        for i in 0..<6 {
            let b = UInt8(truncatingIfNeeded: address >> UInt64(8 * (5 - i)))
            bytes[3 * i] = Hex.digit(b >> 4, uppercase: true)
            bytes[3 * i + 1] = Hex.digit(b, uppercase: true)
        }
    }

    func write(into w: inout JSONWriter) throws(WireError) {
        var copy = bytes
        var span = copy.mutableSpan
        let failure: WireError? = span.withUnsafeMutableBytes { raw -> WireError? in
            do throws(WireError) { try w.string(utf8: UnsafeRawBufferPointer(raw)); return nil } catch { return error }
        }
        if let failure { throw failure }
    }
}

/// Lower-case hex of a 32-bit value, 8 digits, as a JSON string.
func writeHex32(_ v: UInt32, into w: inout JSONWriter) throws(WireError) {
    var digits: InlineArray<8, UInt8> = .init(repeating: 0)
    for i in 0..<8 {
        digits[i] = Hex.digit(UInt8(truncatingIfNeeded: v >> UInt32(4 * (7 - i))))
    }
    var span = digits.mutableSpan
    let failure: WireError? = span.withUnsafeMutableBytes { raw -> WireError? in
        do throws(WireError) { try w.string(utf8: UnsafeRawBufferPointer(raw)); return nil } catch { return error }
    }
    if let failure { throw failure }
}

extension AdvertisingReport {
    /// Address_Type names (Core 5.4, Vol 4, Part E, §7.7.65.2 / §7.7.65.13).
    public var addressTypeName: StaticString {
        switch addressType {
        case 0x00: "public"
        case 0x01: "random"
        case 0x02: "public-identity"
        case 0x03: "random-identity"
        case 0xFF: "anonymous"
        default: "unknown"
        }
    }
}

extension HeardAdvertisement {
    /// Writes the advertisement as one JSON object.
    public func renderJSON(into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("t"); try w.timestamp(unixMicroseconds: timestamp)
        try w.key("kind")
        switch content.kind {
        case .beacon: try w.string("beacon")
        case .continuity: try w.string("continuity")
        case .other: try w.string("other")
        }
        try w.key("address"); try AddressText(report.address).write(into: &w)
        try w.key("address_type"); try w.string(report.addressTypeName)
        try w.key("rssi")
        if report.rssi == AdvertisingReport.rssiNotAvailable { try w.null() } else { try w.int(Int64(report.rssi)) }
        try w.key("extended"); try w.bool(report.isExtended)
        switch content.kind {
        case .beacon:
            // Proof: kind is .beacon only when beacon is set.
            guard let b = content.beacon else { preconditionFailure("kind beacon without a beacon") }
            try w.key("device"); try AddressText(b.deviceID).write(into: &w)
            try w.key("seq"); try w.uint(UInt64(b.sequence))
            try w.key("activity_type_hash"); try writeHex32(b.activityTypeHash, into: &w)
            try w.key("group"); try writeHex32(b.groupHash, into: &w)
            try w.key("psm"); try w.uint(UInt64(b.psm))
            try w.key("flags")
            try w.beginArray()
            if b.flags.contains(.supportsStreams) { try w.string("streams") }
            if b.flags.contains(.hasWebURL) { try w.string("web-url") }
            if b.flags.contains(.invalidated) { try w.string("invalidated") }
            if b.flags.contains(.relayed) { try w.string("relayed") }
            try w.endArray()
            try w.key("tag"); try writeHex32(b.tag, into: &w)
        case .continuity:
            try w.key("messages")
            try w.beginArray()
            var messages = content.continuityMessages
            while let m = messages.next() { try renderContinuity(m, into: &w) }
            try w.endArray()
        case .other:
            try w.key("name")
            if let name = content.localName { try w.string(utf8: name) } else { try w.null() }
            try w.key("company")
            if let id = content.companyID { try w.uint(UInt64(id)) } else { try w.null() }
            try w.key("tx_power")
            if let p = content.txPower { try w.int(Int64(p)) } else { try w.null() }
        }
        try w.endObject()
    }

    private func renderContinuity(_ m: ContinuityMessage, into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("type"); try w.string(ContinuityType.name(m.type))
        // Messages were decoded once already by AdvertisementDecoder; one that failed there
        // never reaches here, so a failure now is printed as its raw type only.
        switch try? m.decode() {
        case .handoff(let h):
            try w.key("seq"); try w.uint(UInt64(h.sequence))
            try w.key("clipboard"); try w.bool(h.hasClipboardData)
        case .nearbyInfo(let n):
            try w.key("status"); try w.uint(UInt64(n.statusFlags))
            try w.key("action"); try w.uint(UInt64(n.actionCode))
        case .nearbyAction(let a):
            try w.key("action_type"); try w.uint(UInt64(a.actionType))
        case .iBeacon(let b):
            try w.key("major"); try w.uint(UInt64(b.major))
            try w.key("minor"); try w.uint(UInt64(b.minor))
            try w.key("power"); try w.int(Int64(b.measuredPower))
        case .other, nil:
            try w.key("type_id"); try w.uint(UInt64(m.type))
        }
        try w.endObject()
    }
}
