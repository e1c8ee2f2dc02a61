// Fuzz target: the link message codec (docs/protocol.md §5.1). The input is one SDU, byte for
// byte, so a crash file is a message you can read with `xxd`.
// Invariants:
//   * every error names a byte of the input, by §5.1's order: `truncated` only for an empty
//     input or a fixed part cut short (at the end, needing exactly what the fixed part lacks);
//     `unsupported` only at byte 0 for a type outside the table; `trailing` only after a
//     message without a body, from the end of its fixed part to the end of the input;
//     `malformed` at a byte before the end, or at the end only for a body that is empty
//     (link-empty, an empty room id); no other error kind;
//   * what decodes has a type from the table and the fields §5.1 gives it (0 where it has
//     none, windows and max data not 0, reasons from §5.1/§5.4); its body starts right after
//     the fixed part and runs to the end of the input; a message without a body fills exactly
//     `encodedCount` bytes;
//   * it re-encodes, through the encoder of its type, to the same bytes; in a buffer one byte
//     short the encoder throws `noRoom` and writes nothing;
//   * `payloadMax` only matters to payload and data: with 0 every other message decodes the
//     same; an accepted payload or data body is accepted with a limit of exactly its size and
//     refused as link-too-large at its last byte with one less.
import BatonWire
import FuzzSupport

let defaultPayloadMax = 4096

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    let result = decode(bytes, payloadMax: defaultPayloadMax)
    let message: LinkMessage
    switch result {
    case .failure(let e):
        checkError(e, bytes)
        checkLimitIndependence(bytes, result)
        return
    case .success(let m):
        message = m
    }
    let type = message.type
    let end = 1 + LinkMessage.fixedCount(type)
    invariant(bytes[0] == type.rawValue, "type \(type) decoded from byte \(bytes[0])")
    if LinkMessage.hasBody(type) {
        invariant(message.body == end ..< n, "\(type)'s body \(message.body) in \(n) bytes")
    } else {
        invariant(message.body == 0 ..< 0 && n == end, "\(type) of \(n) bytes with body \(message.body)")
    }
    invariant(LinkMessage.encodedCount(type, bodyCount: message.body.count) == n, "encodedCount of \(type)")
    checkFields(message)

    let body = UnsafeRawBufferPointer(rebasing: bytes[message.body])
    let again = encode(message, body: body, capacity: n)
    invariant(again.error == nil, "\(message) does not re-encode: \(String(describing: again.error))")
    invariant(again.bytes.elementsEqual(bytes), "\(hex(bytes)) re-encodes to \(hex(again.bytes))")
    let short = encode(message, body: body, capacity: n - 1)
    invariant(short.error == .noRoom(need: n, have: n - 1) && short.touched == 0,
              "one byte short: \(String(describing: short.error)), \(short.touched) byte(s) written")

    checkLimitIndependence(bytes, result)
    if type == .payload || type == .data {
        let size = message.body.count
        invariant(decode(bytes, payloadMax: size) == result, "a limit of exactly \(size) refuses it")
        invariant(decode(bytes, payloadMax: size - 1) == .failure(.malformed(at: n - 1, .linkTooLarge)),
                  "a limit of \(size - 1) does not refuse it at its last byte")
    }
}

func decode(_ bytes: UnsafeRawBufferPointer, payloadMax: Int) -> Result<LinkMessage, WireError> {
    do throws(WireError) { return .success(try LinkMessage.decode(bytes, payloadMax: payloadMax)) } catch { return .failure(error) }
}

/// Only payload and data look at the limit.
func checkLimitIndependence(_ bytes: UnsafeRawBufferPointer, _ result: Result<LinkMessage, WireError>) {
    guard let t = bytes.first, let type = LinkMessageType(rawValue: t), type != .payload, type != .data else { return }
    invariant(decode(bytes, payloadMax: 0) == result, "\(type) depends on payloadMax")
}

func checkFields(_ m: LinkMessage) {
    let sequenced: Set<LinkMessageType> = [.fetch, .payload, .fetchRefused, .continued]
    let numbered: Set<LinkMessageType> = sequenced.union([.data, .ack, .close])
    if sequenced.contains(m.type) { invariant(m.number <= 0xFFFF, "a sequence of \(m.number)") }
    if !numbered.contains(m.type) { invariant(m.number == 0, "\(m.type) with number \(m.number)") }
    switch m.type {
    case .open: invariant(m.window != 0 && m.maxData != 0, "open \(m.window)/\(m.maxData)")
    case .ack: invariant(m.window != 0 && m.maxData == 0, "ack \(m.window)/\(m.maxData)")
    default: invariant(m.window == 0 && m.maxData == 0, "\(m.type) with a window")
    }
    switch m.type {
    case .fetchRefused: invariant(FetchRefusal(rawValue: m.reason) != nil, "fetch-refused reason \(m.reason)")
    case .reset, .error: invariant(StreamReason(rawValue: m.reason) != nil, "stream reason \(m.reason)")
    default: invariant(m.reason == 0, "\(m.type) with reason \(m.reason)")
    }
    switch m.type {
    case .continued: invariant((1 ... LinkMessage.maxRoomBytes).contains(m.body.count), "room id of \(m.body.count)")
    case .error: invariant(m.body.count <= LinkMessage.maxDetailBytes, "detail of \(m.body.count)")
    case .payload, .data: invariant(!m.body.isEmpty, "an empty \(m.type)")
    default: break
    }
}

func checkError(_ e: WireError, _ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    guard n > 0 else {
        invariant(e == .truncated(at: 0, need: 1), "empty input: \(e)")
        return
    }
    guard let type = LinkMessageType(rawValue: bytes[0]) else {
        invariant(e == .unsupported(at: 0, value: UInt64(bytes[0])), "type \(bytes[0]): \(e)")
        return
    }
    let end = 1 + LinkMessage.fixedCount(type)
    switch e {
    case .truncated(let at, let need):
        invariant(at == n && n < end && need == end - n, "\(type) of \(n) bytes: \(e)")
    case .trailing(let at, let count):
        invariant(!LinkMessage.hasBody(type) && at == end && at + count == n, "\(type) of \(n) bytes: \(e)")
    case .malformed(let at, let reason):
        invariant(n >= end, "\(type) of \(n) bytes, short of its fixed part, threw \(e)")
        let emptyBody = n == end && (reason == .linkEmpty || (reason == .linkText && type == .continued))
        invariant(at >= 1 && (at < n || (at == n && emptyBody)), "\(e) in \(n) bytes")
        let allowed: [Malformed] = switch type {
        case .fetch, .close: []
        case .payload, .data: [.linkEmpty, .linkTooLarge]
        case .fetchRefused, .reset: [.linkReason]
        case .continued: [.linkText]
        case .open, .ack: [.linkWindow]
        case .error: [.linkReason, .linkText]
        }
        invariant(allowed.contains(reason), "\(type) refused with \(reason)")
        // A body's rules are checked on the body.
        if reason == .linkText || reason == .linkTooLarge || reason == .linkEmpty { invariant(at >= end, "\(e) inside the fixed part") }
    case .unsupported, .badLength, .noRoom:
        invariant(false, "\(type) of \(n) bytes threw \(e)")
    }
}

/// What an encoder wrote into a buffer of `capacity` bytes, each 0xEE beforehand.
struct Encoded {
    var bytes: [UInt8]
    var error: WireError?
    /// Bytes of the buffer that are no longer 0xEE: 0 after a throw.
    var touched: Int
}

/// Encodes `m` again through the encoder of its type, with `body` as its body.
func encode(_ m: LinkMessage, body: UnsafeRawBufferPointer, capacity: Int) -> Encoded {
    var buffer = [UInt8](repeating: 0xEE, count: max(capacity, 0))
    var error: WireError?
    let count = buffer.withUnsafeMutableBytes { raw -> Int in
        var w = ByteWriter(raw)
        do throws(WireError) {
            // checkFields proved that sequences fit 16 bits (a wrong one would not re-encode to the
            // same bytes anyway) and that reasons are in their enums.
            let sequence = UInt16(truncatingIfNeeded: m.number)
            switch m.type {
            case .fetch: try LinkMessage.encodeFetch(sequence: sequence, into: &w)
            case .payload: try LinkMessage.encodePayload(sequence: sequence, payload: body, into: &w)
            case .fetchRefused: try LinkMessage.encodeFetchRefused(sequence: sequence, FetchRefusal(rawValue: m.reason)!, into: &w)
            case .continued:
                try LinkMessage.encodeContinued(sequence: sequence, room: String(decoding: body, as: UTF8.self), into: &w)
            case .open: try LinkMessage.encodeOpen(window: m.window, maxData: m.maxData, into: &w)
            case .data: try LinkMessage.encodeData(frame: m.number, bytes: body, into: &w)
            case .ack: try LinkMessage.encodeAck(next: m.number, window: m.window, into: &w)
            case .close: try LinkMessage.encodeClose(end: m.number, into: &w)
            case .reset: try LinkMessage.encodeReset(StreamReason(rawValue: m.reason)!, into: &w)
            case .error:
                try LinkMessage.encodeError(StreamReason(rawValue: m.reason)!, detail: String(decoding: body, as: UTF8.self), into: &w)
            }
        } catch let e {
            error = e
            invariant(w.count == 0, "\(e) after writing \(w.count) byte(s)")
        }
        return w.count
    }
    return Encoded(bytes: Array(buffer[..<count]), error: error, touched: buffer.count { $0 != 0xEE })
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
