// Fuzz target: the protobuf decoder of Home Assistant's messages (docs/esphome.md §3). Bytes
// 0–1 are the message type (big-endian, as in a Noise frame), the rest its body. Invariants:
//   * the field walk either reaches the body's exact end, its fields tiling it in order (each
//     length-delimited value inside the body), or throws at a byte inside the body (a read cut
//     short: at its end at the latest);
//   * `ClientMessage.decode` throws exactly when the walk throws, with the same error: every
//     body is walked whole, whatever the type;
//   * a type the server does not know decodes to `.other(type)`; a hello's client_info lies in
//     the body;
//   * appending an unknown field (number 1000, varint) changes nothing, and so does a known
//     field written with another wire type (skipped as unknown);
//   * the messages of active connections (`GATTMessage.decode`, 68, 70, 73, 75–78, 80) throw
//     exactly when the walk throws, decode every other type to nil, keep a write's data inside
//     the body, and ignore an appended unknown field (docs/esphome.md §11).
import BatonProxy
import BatonWire
import FuzzSupport

let known: Set<UInt32> = [1, 5, 6, 7, 8, 9, 11, 20, 66, 87, 127]

func walk(_ body: UnsafeRawBufferPointer) -> WireError? {
    var fields = ProtoFieldReader(body)
    var end = 0
    do throws(WireError) {
        while let f = try fields.next() {
            invariant(f.at == end, "field at \(f.at), previous ended at \(end)")
            if f.wireType == Protobuf.lengthDelimited, f.bytes.count > 0 {
                let start = f.bytes.baseAddress! - body.baseAddress!
                invariant(start > f.at && start + f.bytes.count <= body.count, "value outside the body")
            }
            end = fields.reader.offset
        }
        invariant(end == body.count, "walk ended at \(end) of \(body.count)")
        return nil
    } catch {
        switch error {
        case .truncated(let at, let need):
            // A read cut short: at the body's end at the latest, needing more than is left.
            invariant(at >= end && at <= body.count && need > 0, "\(error) outside the body of \(body.count)")
        case .badLength(let at, _), .malformed(let at, _):
            invariant(at >= end && at < body.count, "\(error) outside the body of \(body.count)")
        default:
            invariant(false, "walk threw \(error)")
        }
        return error
    }
}

func decode(_ type: UInt32, _ body: UnsafeRawBufferPointer) -> Result<ClientMessage, WireError> {
    do throws(WireError) { return .success(try ClientMessage.decode(type: type, body: body)) } catch { return .failure(error) }
}

let gattTypes: Set<UInt32> = [68, 70, 73, 75, 76, 77, 78, 80]

func decodeGATT(_ type: UInt32, _ body: UnsafeRawBufferPointer) -> Result<GATTMessage?, WireError> {
    do throws(WireError) { return .success(try GATTMessage.decode(type: type, body: body)) } catch { return .failure(error) }
}

func checkGATT(_ type: UInt32, _ body: UnsafeRawBufferPointer, walked: WireError?) {
    let result = decodeGATT(type, body)
    switch result {
    case .failure(let e):
        invariant(gattTypes.contains(type) && walked == e, "GATT decode of \(type) threw \(e), the walk \(String(describing: walked))")
    case .success(nil):
        invariant(!gattTypes.contains(type), "type \(type) is a GATT message and decoded to nothing")
    case .success(let m?):
        invariant(gattTypes.contains(type) && walked == nil, "type \(type) decoded to \(m)")
        if case .ask(_, _, let data) = m { invariant(data.lowerBound >= 0 && data.upperBound <= body.count, "data \(data) outside the body") }
        let longer = Array(body) + [0xC0, 0x3E, 0x2A]
        let again = longer.withUnsafeBytes { decodeGATT(type, $0) }
        invariant(again == result, "with an unknown field: \(again)")
    }
}

func check(_ input: UnsafeRawBufferPointer) {
    guard input.count >= 2 else { return }
    let type = UInt32(input[0]) << 8 | UInt32(input[1])
    let body = UnsafeRawBufferPointer(rebasing: input[2...])
    let walked = walk(body)
    checkGATT(type, body, walked: walked)
    let result = decode(type, body)
    switch result {
    case .failure(let e):
        invariant(walked == e, "decode threw \(e), the walk \(String(describing: walked))")
    case .success(let m):
        invariant(walked == nil, "decoded \(m) where the walk threw")
        if !known.contains(type) { invariant(m == .other(type: type), "type \(type) gave \(m)") }
        if case .hello(let info, _, _) = m { invariant(info.upperBound <= body.count, "client_info \(info)") }
        // An unknown field after the body changes nothing.
        let longer = Array(body) + [0xC0, 0x3E, 0x2A]  // field 1000, varint 42
        let again = longer.withUnsafeBytes { decode(type, $0) }
        invariant(again == result, "with an unknown field: \(again)")
        // The same body with a known field 1 sent as fixed32 first is skipped as unknown.
        let other = [0x0D, 1, 2, 3, 4] + Array(body)
        if case .success(let m2) = other.withUnsafeBytes({ decode(type, $0) }) {
            if case .hello = m2 {} else { invariant(m2 == m, "a fixed32 field 1 changed \(m) into \(m2)") }
        } else {
            invariant(false, "a fixed32 field 1 broke a body that decodes")
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
