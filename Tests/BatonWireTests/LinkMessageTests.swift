// Link messages: docs/protocol.md §5.1–§5.4. Each message is written as the SDU on the link,
// in hex: the type byte, the fixed part, the tail.
import BatonTestSupport
import Testing
import BatonWire

/// A message to encode, as a caller of the `encode…` functions names it.
private enum Message: Sendable, CustomStringConvertible {
    case fetch(UInt16)
    case payload(UInt16, [UInt8])
    case fetchRefused(UInt16, FetchRefusal)
    case continued(UInt16, String)
    case open(window: UInt16, maxData: UInt16)
    case data(UInt32, [UInt8])
    case ack(next: UInt32, window: UInt16)
    case close(UInt32)
    case reset(StreamReason)
    case error(StreamReason, String)

    var description: String {
        switch self {
        case .fetch: "fetch"
        case .payload: "payload"
        case .fetchRefused: "fetch-refused"
        case .continued: "continued"
        case .open: "open"
        case .data: "data"
        case .ack: "ack"
        case .close: "close"
        case .reset: "reset"
        case .error: "error"
        }
    }

    func encode(into w: inout ByteWriter) throws(WireError) {
        switch self {
        case .fetch(let seq): try LinkMessage.encodeFetch(sequence: seq, into: &w)
        case .payload(let seq, let bytes):
            try withBytes(bytes) { (raw) throws(WireError) in try LinkMessage.encodePayload(sequence: seq, payload: raw, into: &w) }
        case .fetchRefused(let seq, let reason): try LinkMessage.encodeFetchRefused(sequence: seq, reason, into: &w)
        case .continued(let seq, let room): try LinkMessage.encodeContinued(sequence: seq, room: room, into: &w)
        case .open(let window, let maxData): try LinkMessage.encodeOpen(window: window, maxData: maxData, into: &w)
        case .data(let frame, let bytes):
            try withBytes(bytes) { (raw) throws(WireError) in try LinkMessage.encodeData(frame: frame, bytes: raw, into: &w) }
        case .ack(let next, let window): try LinkMessage.encodeAck(next: next, window: window, into: &w)
        case .close(let end): try LinkMessage.encodeClose(end: end, into: &w)
        case .reset(let reason): try LinkMessage.encodeReset(reason, into: &w)
        case .error(let reason, let detail): try LinkMessage.encodeError(reason, detail: detail, into: &w)
        }
    }
}

/// `Array.withUnsafeBytes` rethrows untyped errors; this keeps a `WireError` typed.
private func withBytes(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(WireError) -> Void) throws(WireError) {
    let result: Result<Void, WireError> = bytes.withUnsafeBytes { raw in
        do throws(WireError) { try body(raw); return .success(()) } catch { return .failure(error) }
    }
    try result.get()
}

/// What an encoder did with a buffer of `capacity` bytes, each 0xEE beforehand.
private struct Encoded {
    var result: Result<[UInt8], WireError>
    /// Bytes of the buffer that are no longer 0xEE, and the writer's count: both 0 after a throw.
    var touched: Int
    var count: Int
}

private func encode(_ m: Message, capacity: Int = 70_000) -> Encoded {
    var buffer = [UInt8](repeating: 0xEE, count: capacity)
    let (result, count) = buffer.withUnsafeMutableBytes { raw -> (Result<[UInt8], WireError>, Int) in
        var w = ByteWriter(raw)
        do throws(WireError) {
            try m.encode(into: &w)
            return (.success(Array(w.written)), w.count)
        } catch {
            return (.failure(error), w.count)
        }
    }
    return Encoded(result: result, touched: buffer.count { $0 != 0xEE }, count: count)
}

private func decode(_ bytes: [UInt8], payloadMax: Int = 4096) -> Result<LinkMessage, WireError> {
    bytes.withUnsafeBytes { raw in
        do throws(WireError) { return .success(try LinkMessage.decode(raw, payloadMax: payloadMax)) } catch { return .failure(error) }
    }
}

/// The error `bytes` are refused with, or nil when they decode.
private func refusal(_ bytes: [UInt8], payloadMax: Int = 4096) -> WireError? {
    if case .failure(let e) = decode(bytes, payloadMax: payloadMax) { return e }
    return nil
}

private func refusal(_ hex: String, payloadMax: Int = 4096) -> WireError? { refusal(hx(hex), payloadMax: payloadMax) }

/// One vector per message type: what a caller asks for, the bytes §5.1 puts on the link, and
/// what the decoder returns for them.
private struct Vector: Sendable, CustomTestStringConvertible {
    var message: Message
    var hex: String
    var decoded: LinkMessage
    var testDescription: String { message.description }
}

private let vectors: [Vector] = [
    // §5.2: fetch(seq 0x0102) → payload(seq 0x0102, CBOR…) or fetch-refused; continued("office").
    Vector(message: .fetch(0x0102), hex: "01 0201",
           decoded: LinkMessage(type: .fetch, number: 0x0102)),
    Vector(message: .payload(0x0102, [0xA1, 0x00, 0x01]), hex: "02 0201 A10001",
           decoded: LinkMessage(type: .payload, number: 0x0102, body: 3 ..< 6)),
    Vector(message: .fetchRefused(0x0102, .notCurrent), hex: "03 0201 01",
           decoded: LinkMessage(type: .fetchRefused, number: 0x0102, reason: 1)),
    Vector(message: .continued(0x0102, "office"), hex: "04 0201 6F6666696365",
           decoded: LinkMessage(type: .continued, number: 0x0102, body: 3 ..< 9)),
    // §5.3: a window of 8 frames of at most 512 bytes; frame 0x01020304 "hi"; ack of 0…4.
    Vector(message: .open(window: 8, maxData: 512), hex: "10 0800 0002",
           decoded: LinkMessage(type: .open, window: 8, maxData: 512)),
    Vector(message: .data(0x0102_0304, Array("hi".utf8)), hex: "11 04030201 6869",
           decoded: LinkMessage(type: .data, number: 0x0102_0304, body: 5 ..< 7)),
    Vector(message: .ack(next: 5, window: 8), hex: "12 05000000 0800",
           decoded: LinkMessage(type: .ack, number: 5, window: 8)),
    Vector(message: .close(3), hex: "13 03000000",
           decoded: LinkMessage(type: .close, number: 3)),
    // §5.4: idle; protocol with a detail a user can read.
    Vector(message: .reset(.idle), hex: "14 04",
           decoded: LinkMessage(type: .reset, reason: 4)),
    Vector(message: .error(.protocolError, "ack 9"), hex: "15 02 61636B2039",
           decoded: LinkMessage(type: .error, reason: 2, body: 2 ..< 7)),
]

/// Every type §5.1 defines, with its fixed part's size after the type byte.
private let fixedSizes: [(LinkMessageType, Int)] = [
    (.fetch, 2), (.payload, 2), (.fetchRefused, 3), (.continued, 2), (.open, 4),
    (.data, 4), (.ack, 6), (.close, 4), (.reset, 1), (.error, 1),
]

@Suite("Link messages (docs/protocol.md §5.1–§5.4)")
struct LinkMessageTests {
    // MARK: the format

    @Test("§5.1: each message encodes to its bytes and decodes back", arguments: vectors)
    fileprivate func roundTrip(_ v: Vector) throws {
        let bytes = hx(v.hex)
        let encoded = encode(v.message)
        #expect(try encoded.result.get() == bytes)
        let decoded = try decode(bytes).get()
        #expect(decoded == v.decoded)
        #expect(LinkMessage.encodedCount(decoded.type, bodyCount: decoded.body.count) == bytes.count)
        #expect(encode(v.message, capacity: bytes.count).count == bytes.count, "an exact buffer is enough")
    }

    @Test func theBodyIsTheDecodedBytesInPlace() throws {
        let bytes = hx("04 0201 6F6666696365")
        let m = try decode(bytes).get()
        #expect(String(decoding: bytes[m.body], as: UTF8.self) == "office")
        let error = hx("15 06 676F6E65")
        #expect(String(decoding: error[try decode(error).get().body], as: UTF8.self) == "gone")
    }

    @Test func anErrorMayHaveNoDetail() throws {
        // §5.1: the detail is 0 … 100 bytes.
        #expect(try encode(.error(.cancelled, "")).result.get() == hx("15 01"))
        #expect(try decode(hx("15 01")).get() == LinkMessage(type: .error, reason: 1, body: 2 ..< 2))
    }

    @Test func fieldsAreLittleEndian() throws {
        #expect(try decode(hx("11 FFFFFFFF 00")).get().number == 0xFFFF_FFFF)
        #expect(try decode(hx("01 FFFF")).get().number == 0xFFFF)
        #expect(try decode(hx("10 FFFF FFFF")).get() == LinkMessage(type: .open, window: 0xFFFF, maxData: 0xFFFF))
        #expect(try encode(.ack(next: 0x0A0B_0C0D, window: 0x0102)).result.get() == hx("12 0D0C0B0A 0201"))
    }

    // MARK: type, fixed part, tail

    @Test func anEmptyMessageIsTruncated() {
        #expect(refusal([]) == .truncated(at: 0, need: 1))
    }

    @Test func everyReservedTypeIsUnsupported() {
        // §5.1: 05–0F and 16–FF are reserved, and 00 is not in the table.
        let reserved = [UInt8(0x00)] + Array(0x05 ... 0x0F) + Array(0x16 ... 0xFF)
        #expect(reserved.count == 256 - 10)
        for t in reserved {
            #expect(refusal([t]) == .unsupported(at: 0, value: UInt64(t)), "type \(t)")
            #expect(refusal([t, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06]) == .unsupported(at: 0, value: UInt64(t)), "type \(t)")
        }
    }

    @Test func everyCutOfAFixedPartIsTruncatedAtItsEnd() {
        for (type, size) in fixedSizes {
            // A message that is its type byte and a fixed part of 0x01s, cut after each byte.
            let whole = [type.rawValue] + [UInt8](repeating: 0x01, count: size)
            for cut in 1 ... size {
                #expect(refusal(Array(whole[..<cut])) == .truncated(at: cut, need: size + 1 - cut), "\(type), \(cut) bytes")
            }
        }
        // Two written out: an ack missing its window, an open missing its max data's high byte.
        #expect(refusal("12 05000000") == .truncated(at: 5, need: 2))
        #expect(refusal("10 0800 00") == .truncated(at: 4, need: 1))
    }

    @Test func aByteAfterAMessageWithoutABodyIsTrailing() {
        // §5.1: fetch, ack, close, reset, and likewise fetch-refused and open, are exactly their
        // fixed part; an SDU is one message, so a byte after it is never the next one.
        #expect(refusal("01 0201 00") == .trailing(at: 3, count: 1))
        #expect(refusal("03 0201 01 00") == .trailing(at: 4, count: 1))
        #expect(refusal("10 0800 0002 00") == .trailing(at: 5, count: 1))
        #expect(refusal("12 05000000 0800 00") == .trailing(at: 7, count: 1))
        #expect(refusal("13 03000000 00") == .trailing(at: 5, count: 1))
        #expect(refusal("14 04 00") == .trailing(at: 2, count: 1))
        #expect(refusal("14 04 0000") == .trailing(at: 2, count: 2))
    }

    @Test func theFixedPartIsCheckedBeforeTheTail() {
        // A bad reason or window is named even when bytes follow it.
        #expect(refusal("03 0201 09 00") == .malformed(at: 3, .linkReason))
        #expect(refusal("10 0000 0002 00") == .malformed(at: 1, .linkWindow))
        #expect(refusal("14 00 FF") == .malformed(at: 1, .linkReason))
    }

    // MARK: payload and data

    @Test func aPayloadOrDataMessageWithNothingInItIsEmpty() {
        #expect(refusal("02 0201") == .malformed(at: 3, .linkEmpty))
        #expect(refusal("11 00000000") == .malformed(at: 5, .linkEmpty))
    }

    @Test func aPayloadMayBeExactlyPayloadMax() throws {
        // relay.payload-max: 16 here, and the default 4096.
        for max in [16, 4096] {
            let at = [UInt8](repeating: 0x5A, count: max)
            #expect(try decode(hx("02 0201") + at, payloadMax: max).get().body == 3 ..< 3 + max)
            #expect(refusal(hx("02 0201") + at + [0x5A], payloadMax: max) == .malformed(at: 3 + max, .linkTooLarge))
        }
        #expect(refusal("02 0201 00", payloadMax: 0) == .malformed(at: 3, .linkTooLarge))
    }

    @Test func dataIsBoundByPayloadMaxAndBy65535() throws {
        #expect(try decode(hx("11 00000000") + [UInt8](repeating: 1, count: 16), payloadMax: 16).get().body == 5 ..< 21)
        #expect(refusal(hx("11 00000000") + [UInt8](repeating: 1, count: 17), payloadMax: 16) == .malformed(at: 21, .linkTooLarge))
        // Max data is a 2-byte field (§5.1 open), so no data frame is larger, whatever the limit.
        let most = [UInt8](repeating: 1, count: 65535)
        #expect(try decode(hx("11 00000000") + most, payloadMax: 100_000).get().body == 5 ..< 65540)
        #expect(refusal(hx("11 00000000") + most + [1], payloadMax: 100_000) == .malformed(at: 65540, .linkTooLarge))
    }

    // MARK: reasons (§5.1 fetch-refused, §5.4)

    @Test func fetchRefusedReasonsAreThe3InTheTable() throws {
        for reason in UInt8.min ... UInt8.max {
            let bytes = [0x03, 0x02, 0x01, reason]
            if (1 ... 3).contains(reason) {
                #expect(try decode(bytes).get().reason == reason)
            } else {
                #expect(refusal(bytes) == .malformed(at: 3, .linkReason), "reason \(reason)")
            }
        }
    }

    @Test func streamReasonsAreThe6InTheTable() throws {
        #expect(refusal("14 00") == .malformed(at: 1, .linkReason))
        #expect(refusal("14 07") == .malformed(at: 1, .linkReason))
        #expect(refusal("15 00 6869") == .malformed(at: 1, .linkReason))
        #expect(refusal("15 07") == .malformed(at: 1, .linkReason))
        for reason in UInt8.min ... UInt8.max {
            let known = StreamReason(rawValue: reason) != nil
            #expect(known == (1 ... 6).contains(reason))
            #expect((refusal([0x14, reason]) == nil) == known, "reset \(reason)")
            #expect((refusal([0x15, reason]) == nil) == known, "error \(reason)")
        }
    }

    @Test func streamReasonsHaveTheirNames() {
        let names = [StreamReason.cancelled, .protocolError, .unreachable, .idle, .busy, .gone].map { $0.name.description }
        #expect(names == ["cancelled", "protocol", "unreachable", "idle", "busy", "gone"])
    }

    // MARK: windows (§5.3)

    @Test func aWindowOrMaxDataOf0IsRefused() {
        #expect(refusal("10 0000 0002") == .malformed(at: 1, .linkWindow))
        #expect(refusal("10 0800 0000") == .malformed(at: 3, .linkWindow))
        #expect(refusal("12 05000000 0000") == .malformed(at: 5, .linkWindow))
        #expect(refusal("10 0100 0100") == nil, "1 frame of 1 byte is the least")
        #expect(refusal("12 00000000 0100") == nil, "an ack of nothing yet with a window of 1")
    }

    // MARK: room id and detail (§5.1 continued, error)

    @Test func aRoomIdIs1To64BytesOfUTF8() throws {
        #expect(refusal("04 0201") == .malformed(at: 3, .linkText))
        let room64 = [UInt8](repeating: UInt8(ascii: "r"), count: 64)
        #expect(try decode(hx("04 0201") + room64).get().body == 3 ..< 67)
        #expect(refusal(hx("04 0201") + room64 + [UInt8(ascii: "r")]) == .malformed(at: 67, .linkText))
        // "Küche" and "会议室" are rooms too.
        #expect(refusal(hx("04 0201") + Array("Küche".utf8)) == nil)
        #expect(refusal(hx("04 0201") + Array("会议室".utf8)) == nil)
    }

    @Test func aRoomIdOrDetailThatIsNotUTF8IsRefused() {
        // At the first byte of the first ill-formed sequence (Unicode 15, §3.9, Table 3-7).
        #expect(refusal("04 0201 6F FF 66") == .malformed(at: 4, .linkText), "FF is never UTF-8")
        #expect(refusal("04 0201 6F C0 80") == .malformed(at: 4, .linkText), "an overlong NUL")
        #expect(refusal("04 0201 ED A0 80") == .malformed(at: 3, .linkText), "a surrogate")
        #expect(refusal("04 0201 6F E2 82") == .malformed(at: 4, .linkText), "a sequence the message cuts short")
        #expect(refusal("15 02 61 80") == .malformed(at: 3, .linkText), "a stray continuation byte")
        #expect(refusal("15 02 F4 90 80 80") == .malformed(at: 2, .linkText), "above U+10FFFF")
    }

    @Test func aDetailIs0To100Bytes() throws {
        let detail100 = [UInt8](repeating: UInt8(ascii: "d"), count: 100)
        #expect(try decode(hx("15 03") + detail100).get().body == 2 ..< 102)
        #expect(refusal(hx("15 03") + detail100 + [UInt8(ascii: "d")]) == .malformed(at: 102, .linkText))
    }

    // MARK: encoders

    @Test("an encoder given one byte too few writes nothing", arguments: vectors)
    fileprivate func oneByteTooFewWritesNothing(_ v: Vector) {
        let count = hx(v.hex).count
        let e = encode(v.message, capacity: count - 1)
        #expect(e.result == .failure(.noRoom(need: count, have: count - 1)))
        #expect(e.touched == 0 && e.count == 0)
    }

    @Test func encodersRefuseWhatTheDecoderRefusesWithTheSameError() {
        let room64 = String(repeating: "r", count: 64), detail100 = String(repeating: "d", count: 100)
        let cases: [(Message, [UInt8])] = [
            (.payload(0x0102, []), hx("02 0201")),
            (.data(7, []), hx("11 07000000")),
            (.data(7, [UInt8](repeating: 1, count: 65536)), hx("11 07000000") + [UInt8](repeating: 1, count: 65536)),
            (.continued(0x0102, ""), hx("04 0201")),
            (.continued(0x0102, room64 + "r"), hx("04 0201") + Array((room64 + "r").utf8)),
            (.error(.gone, detail100 + "d"), hx("15 06") + Array((detail100 + "d").utf8)),
            (.open(window: 0, maxData: 512), hx("10 0000 0002")),
            (.open(window: 8, maxData: 0), hx("10 0800 0000")),
            (.ack(next: 5, window: 0), hx("12 05000000 0000")),
        ]
        for (message, bytes) in cases {
            let e = encode(message)
            guard case .failure(let error) = e.result else {
                Issue.record("\(message) was encoded")
                continue
            }
            #expect(refusal(bytes, payloadMax: 100_000) == error, "\(message)")
            #expect(e.touched == 0 && e.count == 0, "\(message) wrote something")
        }
        // The largest of each is fine.
        #expect(throws: Never.self) { try encode(.continued(1, room64)).result.get() }
        #expect(throws: Never.self) { try encode(.error(.gone, detail100)).result.get() }
        #expect(throws: Never.self) { try encode(.data(1, [UInt8](repeating: 1, count: 65535))).result.get() }
    }

    @Test func aRefusedMessageIsRefusedBeforeRoomIsChecked() {
        // A caller with an empty room id learns that, not that its buffer was short.
        #expect(encode(.continued(1, ""), capacity: 0).result == .failure(.malformed(at: 3, .linkText)))
    }

    @Test func anEncoderAppendsAfterWhatTheWriterHolds() throws {
        var buffer = [UInt8](repeating: 0xEE, count: 5)
        let written = buffer.withUnsafeMutableBytes { raw -> [UInt8] in
            var w = ByteWriter(raw)
            do throws(WireError) {
                try LinkMessage.encodeReset(.busy, into: &w)
                try LinkMessage.encodeFetch(sequence: 0x0102, into: &w)
                #expect(throws: WireError.noRoom(need: 7, have: 5)) { try LinkMessage.encodeReset(.busy, into: &w) }
            } catch {
                Issue.record("\(error)")
            }
            return Array(w.written)
        }
        #expect(written == hx("14 05 01 0201"))
    }

    // MARK: names

    @Test func reasonNamesAreTheStatsKeys() {
        let names = [Malformed.linkEmpty, .linkTooLarge, .linkReason, .linkText, .linkWindow].map(\.description)
        #expect(names == ["link-empty", "link-too-large", "link-reason", "link-text", "link-window"])
    }
}
