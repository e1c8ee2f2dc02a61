// Link messages (docs/protocol.md §5.1): one SDU of a device link (an L2CAP LE credit-based
// channel, Core 5.4, Vol 3, Part A, §3.4, or the simulator's SOCK_SEQPACKET socket, §5.5), so a
// message is always whole: the decoder is given exactly one, and a byte after a message that
// has no body is an error, not the start of the next one.
//
//   type  1 byte (§5.1's table)   fixed part (its size per type: `fixedCount`)   tail
//
// Decoding borrows: payload, data, room id and detail are a range of the caller's bytes, and
// nothing is allocated. Multi-byte fields are little-endian.

extension Malformed {
    /// A payload or data message with no bytes after its fixed part.
    public static let linkEmpty = Malformed("link-empty")
    /// A payload larger than the caller's limit (`relay.payload-max`), or a data message with
    /// more bytes than that limit or 65535, whichever is smaller.
    public static let linkTooLarge = Malformed("link-too-large")
    /// A reason code outside docs/protocol.md §5.1 (fetch-refused) or §5.4 (reset, error).
    public static let linkReason = Malformed("link-reason")
    /// A room id or error detail that is not UTF-8, empty where it may not be, or too long.
    public static let linkText = Malformed("link-text")
    /// An open or ack with a window of 0, or an open with a max data of 0.
    public static let linkWindow = Malformed("link-window")
}

/// The type byte (docs/protocol.md §5.1).
public enum LinkMessageType: UInt8, Sendable, Equatable {
    case fetch = 0x01, payload = 0x02, fetchRefused = 0x03, continued = 0x04
    case open = 0x10, data = 0x11, ack = 0x12, close = 0x13, reset = 0x14, error = 0x15
}

/// Why a device refused a fetch (§5.1 `fetch-refused`).
public enum FetchRefusal: UInt8, Sendable, Equatable {
    case notCurrent = 0x01, tooLarge = 0x02, refused = 0x03
}

/// Why a stream was reset or ended in error (§5.4).
public enum StreamReason: UInt8, Sendable, Equatable {
    case cancelled = 0x01, protocolError = 0x02, unreachable = 0x03, idle = 0x04, busy = 0x05, gone = 0x06
    /// The name used in logs, stats and MQTT answers: "cancelled", "protocol", …
    public var name: StaticString {
        switch self {
        case .cancelled: "cancelled"
        case .protocolError: "protocol"
        case .unreachable: "unreachable"
        case .idle: "idle"
        case .busy: "busy"
        case .gone: "gone"
        }
    }
}

/// One decoded link message. Variable parts (payload, data, room id, detail) are a range of
/// the decoded bytes, so decoding allocates nothing and the caller reads them in place.
public struct LinkMessage: Sendable, Equatable {
    public var type: LinkMessageType
    /// fetch, payload, fetch-refused, continued: the activity sequence. data: the frame
    /// number; ack: the next frame expected; close: one past the last data frame. 0 otherwise.
    public var number: UInt32
    /// open, ack: the window in frames. 0 otherwise.
    public var window: UInt16
    /// open: the largest data frame taken. 0 otherwise.
    public var maxData: UInt16
    /// fetch-refused: a `FetchRefusal` raw value; reset, error: a `StreamReason` raw value. 0 otherwise.
    public var reason: UInt8
    /// payload: the payload; data: the bytes; continued: the room id; error: the detail.
    /// Offsets into the bytes given to `decode`. Empty otherwise.
    public var body: Range<Int>

    public init(type: LinkMessageType, number: UInt32 = 0, window: UInt16 = 0, maxData: UInt16 = 0,
                reason: UInt8 = 0, body: Range<Int> = 0..<0) {
        self.type = type; self.number = number; self.window = window; self.maxData = maxData
        self.reason = reason; self.body = body
    }

    /// The longest room id in a continued message and the longest detail in an error
    /// message, in bytes of UTF-8 (docs/protocol.md §5.1).
    public static let maxRoomBytes = 64
    public static let maxDetailBytes = 100
    /// The most bytes one data message carries: max data is a 2-byte field (§5.1 `open`).
    public static let maxDataBytes = 65535
    /// A data message's bytes before its data: type (1) and frame number (4), §5.1.
    public static let dataHeaderBytes = 5

    /// Bytes after the type byte that every message of `type` has (§5.1's table), before its
    /// tail. One table, as Zephyr's `hci_core.c` keeps a `min_len` per event.
    public static func fixedCount(_ type: LinkMessageType) -> Int {
        switch type {
        case .fetch: 2
        case .payload: 2
        case .fetchRefused: 3
        case .continued: 2
        case .open: 4
        case .data: 4
        case .ack: 6
        case .close: 4
        case .reset: 1
        case .error: 1
        }
    }

    /// True for the messages whose tail is a body (payload, data, room id, detail); every
    /// other message is exactly its fixed part.
    public static func hasBody(_ type: LinkMessageType) -> Bool {
        switch type {
        case .payload, .continued, .data, .error: true
        case .fetch, .fetchRefused, .open, .ack, .close, .reset: false
        }
    }

    /// Checks type, fixed part, then tail (docs/protocol.md §5.1). `payloadMax` bounds a
    /// payload message's payload (and a data message's bytes: 65535 at most).
    ///
    /// Errors, in the order they are checked:
    /// - no bytes: `truncated(at: 0, need: 1)`;
    /// - a type outside §5.1's table: `unsupported` at byte 0;
    /// - a fixed part cut short: `truncated` at the end of the bytes, `need` what the fixed
    ///   part lacks;
    /// - a reason outside its table (fetch-refused, reset, error): `link-reason` at the reason;
    ///   a window or max data of 0 (open, ack): `link-window` at that field;
    /// - bytes after a message that has no body (fetch, fetch-refused, open, ack, close,
    ///   reset): `trailing` at the first of them;
    /// - a payload or data message with no body: `link-empty` at the end of the bytes, where
    ///   the body should start; a body over the limit: `link-too-large` at its first byte past
    ///   the limit;
    /// - a room id that is empty: `link-text` at the end of the bytes; a room id or detail too
    ///   long: `link-text` at its first byte past the limit; not UTF-8: `link-text` at the
    ///   first byte of the first ill-formed sequence.
    public static func decode(_ bytes: UnsafeRawBufferPointer, payloadMax: Int) throws(WireError) -> LinkMessage {
        precondition(payloadMax >= 0, "relay.payload-max is a byte count, never negative")
        var r = ByteReader(bytes)
        let typeByte = try r.readU8()
        guard let type = LinkMessageType(rawValue: typeByte) else { throw .unsupported(at: 0, value: UInt64(typeByte)) }
        let fixed = fixedCount(type)
        // The whole fixed part at once, so a short message is one error whatever field it cuts.
        guard fixed <= r.remaining else { throw .truncated(at: bytes.count, need: fixed &- r.remaining) }

        var m = LinkMessage(type: type)
        switch type {
        case .fetch, .payload, .continued:
            m.number = UInt32(try r.readU16LE())
        case .fetchRefused:
            m.number = UInt32(try r.readU16LE())
            let at = r.offset
            m.reason = try r.readU8()
            guard FetchRefusal(rawValue: m.reason) != nil else { throw .malformed(at: at, .linkReason) }
        case .open:
            // §5.3: a window of 0 frames or a max data of 0 bytes would stall the stream for good.
            let windowAt = r.offset
            m.window = try r.readU16LE()
            guard m.window != 0 else { throw .malformed(at: windowAt, .linkWindow) }
            let maxDataAt = r.offset
            m.maxData = try r.readU16LE()
            guard m.maxData != 0 else { throw .malformed(at: maxDataAt, .linkWindow) }
        case .data, .close:
            m.number = try r.readU32LE()
        case .ack:
            m.number = try r.readU32LE()
            let windowAt = r.offset
            m.window = try r.readU16LE()
            guard m.window != 0 else { throw .malformed(at: windowAt, .linkWindow) }
        case .reset, .error:
            let at = r.offset
            m.reason = try r.readU8()
            guard StreamReason(rawValue: m.reason) != nil else { throw .malformed(at: at, .linkReason) }
        }

        // The tail: all that follows the fixed part.
        let body = r.offset ..< bytes.count
        switch type {
        case .fetch, .fetchRefused, .open, .ack, .close, .reset:
            try r.requireEnd()
        case .payload:
            try checkBody(body, limit: payloadMax)
        case .data:
            try checkBody(body, limit: min(payloadMax, maxDataBytes))
        case .continued:
            guard !body.isEmpty else { throw .malformed(at: body.lowerBound, .linkText) }
            try checkText(bytes, body, limit: maxRoomBytes)
        case .error:
            try checkText(bytes, body, limit: maxDetailBytes)
        }
        if hasBody(type) { m.body = body }
        return m
    }

    /// A payload or data body: 1 … `limit` bytes.
    private static func checkBody(_ body: Range<Int>, limit: Int) throws(WireError) {
        guard !body.isEmpty else { throw .malformed(at: body.lowerBound, .linkEmpty) }
        // Proof: body.count > limit >= 0, so lowerBound + limit < upperBound <= Int.max.
        guard body.count <= limit else { throw .malformed(at: body.lowerBound &+ limit, .linkTooLarge) }
    }

    /// A room id or detail: at most `limit` bytes of UTF-8.
    private static func checkText(_ bytes: UnsafeRawBufferPointer, _ text: Range<Int>, limit: Int) throws(WireError) {
        // Proof: text.count > limit >= 0, so lowerBound + limit < upperBound.
        guard text.count <= limit else { throw .malformed(at: text.lowerBound &+ limit, .linkText) }
        if let bad = UTF8Check.firstInvalid(UnsafeRawBufferPointer(rebasing: bytes[text])) {
            // Proof: bad < text.count, so the sum lies inside `text`.
            throw .malformed(at: text.lowerBound &+ bad, .linkText)
        }
    }

    /// Bytes this message takes with a body of `bodyCount` bytes. A message without a body
    /// (`hasBody` false) takes a `bodyCount` of 0; anything else is the caller's bug.
    public static func encodedCount(_ type: LinkMessageType, bodyCount: Int) -> Int {
        precondition(bodyCount >= 0 && (bodyCount == 0 || hasBody(type)), "message type 0x\(Hex.text(type.rawValue, digits: 2, uppercase: true)) has no body of \(bodyCount) bytes")
        // Proof: fixedCount <= 6 and bodyCount is a count of bytes in memory, far below Int.max.
        return 1 &+ fixedCount(type) &+ bodyCount
    }

    /// Where a message's body starts: after the type byte and the fixed part.
    private static func bodyStart(_ type: LinkMessageType) -> Int { 1 &+ fixedCount(type) }

    // Encoders write one whole message into `w` or throw `noRoom` having written nothing.
    // They refuse what `decode` would refuse, with the error `decode` would throw on the
    // message they were asked to write (so offsets count from its type byte), and check that
    // before the room in `w`: a caller with a bad room id learns that, not that a buffer was short.

    public static func encodeFetch(sequence: UInt16, into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedCount(.fetch, bodyCount: 0))
        w.write(LinkMessageType.fetch.rawValue)
        w.writeU16LE(sequence)
    }

    /// The payload's size against `relay.payload-max` is the caller's business: the limit is
    /// the receiver's.
    public static func encodePayload(sequence: UInt16, payload: UnsafeRawBufferPointer, into w: inout ByteWriter) throws(WireError) {
        guard !payload.isEmpty else { throw .malformed(at: bodyStart(.payload), .linkEmpty) }
        try w.reserve(encodedCount(.payload, bodyCount: payload.count))
        w.write(LinkMessageType.payload.rawValue)
        w.writeU16LE(sequence)
        w.write(payload)
    }

    public static func encodeFetchRefused(sequence: UInt16, _ reason: FetchRefusal, into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedCount(.fetchRefused, bodyCount: 0))
        w.write(LinkMessageType.fetchRefused.rawValue)
        w.writeU16LE(sequence)
        w.write(reason.rawValue)
    }

    public static func encodeContinued(sequence: UInt16, room: some StringProtocol, into w: inout ByteWriter) throws(WireError) {
        let utf8 = room.utf8
        let count = utf8.count
        // A Swift string is always UTF-8, so length is all there is to check.
        guard count > 0 else { throw .malformed(at: bodyStart(.continued), .linkText) }
        guard count <= maxRoomBytes else { throw .malformed(at: bodyStart(.continued) &+ maxRoomBytes, .linkText) }
        try w.reserve(encodedCount(.continued, bodyCount: count))
        w.write(LinkMessageType.continued.rawValue)
        w.writeU16LE(sequence)
        for b in utf8 { w.write(b) }
    }

    public static func encodeOpen(window: UInt16, maxData: UInt16, into w: inout ByteWriter) throws(WireError) {
        // Bytes 1 and 3: the window and the max data (§5.1).
        guard window != 0 else { throw .malformed(at: 1, .linkWindow) }
        guard maxData != 0 else { throw .malformed(at: 3, .linkWindow) }
        try w.reserve(encodedCount(.open, bodyCount: 0))
        w.write(LinkMessageType.open.rawValue)
        w.writeU16LE(window)
        w.writeU16LE(maxData)
    }

    /// `bytes` larger than the peer's max data is the caller's business (§5.3): only the
    /// 65535 that any max data allows is checked here.
    public static func encodeData(frame: UInt32, bytes: UnsafeRawBufferPointer, into w: inout ByteWriter) throws(WireError) {
        guard !bytes.isEmpty else { throw .malformed(at: bodyStart(.data), .linkEmpty) }
        guard bytes.count <= maxDataBytes else { throw .malformed(at: bodyStart(.data) &+ maxDataBytes, .linkTooLarge) }
        try w.reserve(encodedCount(.data, bodyCount: bytes.count))
        w.write(LinkMessageType.data.rawValue)
        w.writeU32LE(frame)
        w.write(bytes)
    }

    public static func encodeAck(next: UInt32, window: UInt16, into w: inout ByteWriter) throws(WireError) {
        // Byte 5: the window, after the frame number (§5.1).
        guard window != 0 else { throw .malformed(at: 5, .linkWindow) }
        try w.reserve(encodedCount(.ack, bodyCount: 0))
        w.write(LinkMessageType.ack.rawValue)
        w.writeU32LE(next)
        w.writeU16LE(window)
    }

    public static func encodeClose(end: UInt32, into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedCount(.close, bodyCount: 0))
        w.write(LinkMessageType.close.rawValue)
        w.writeU32LE(end)
    }

    public static func encodeReset(_ reason: StreamReason, into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedCount(.reset, bodyCount: 0))
        w.write(LinkMessageType.reset.rawValue)
        w.write(reason.rawValue)
    }

    public static func encodeError(_ reason: StreamReason, detail: some StringProtocol, into w: inout ByteWriter) throws(WireError) {
        let utf8 = detail.utf8
        let count = utf8.count
        guard count <= maxDetailBytes else { throw .malformed(at: bodyStart(.error) &+ maxDetailBytes, .linkText) }
        try w.reserve(encodedCount(.error, bodyCount: count))
        w.write(LinkMessageType.error.rawValue)
        w.write(reason.rawValue)
        for b in utf8 { w.write(b) }
    }
}
