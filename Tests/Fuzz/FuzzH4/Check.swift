// Fuzz target: the H4 framer (Core 5.4, Vol 4, Part A, §2; packet headers Vol 4, Part E,
// §5.4.1–§5.4.5), fed the same stream three ways.
//
// Input: byte 0 picks `maxDataPayload` (below 0x80: the default 1024; else (b & 0x7F) · 8, so
// 0…1016 and oversize ACL/ISO headers are common), byte 1 seeds the chunk sizes, and the rest
// is the byte stream.
// Invariants:
//   * bytes pushed == bytes delivered (indicators included) + stats.garbageBytes + pendingBytes;
//   * one push, pushes of fuzzer-chosen sizes (empty pushes included) and byte-by-byte pushes
//     (through the first 1 KB) deliver the same packets and end with the same stats and
//     pending bytes, and the accounting above holds after every push;
//   * every packet is its indicator, a whole header and exactly the payload length the header
//     announces (ISO: 14 bits), within the framer's limits;
//   * all of it equals a reference model written from the header layouts alone: hunt for an
//     indicator, drop it when its header announces an oversize payload and hunt again from
//     the next byte, otherwise deliver `1 + header + payload` bytes.
import BatonHCI
import BatonWire
import FuzzSupport

/// What one way of feeding the stream produced.
struct Delivered: Equatable {
    /// The delivered frames, back to back.
    var bytes: [UInt8] = []
    var lengths: [Int] = []
    var packets = 0
    var garbage = 0
    var oversize = 0
    var pending = 0
}

func check(_ input: UnsafeRawBufferPointer) {
    guard input.count >= 2 else { return }
    let config = input[0]
    let maxData = config < 0x80 ? H4Framer.defaultMaxDataPayload : Int(config & 0x7F) * 8
    let stream = UnsafeRawBufferPointer(rebasing: input[2...])

    let model = reference(stream, maxData: maxData)
    let whole = feed(stream, maxData: maxData) { _ in stream.count }
    var rng = SplitSizes(seed: input[1], count: stream.count)
    let split = feed(stream, maxData: maxData) { rest in rng.next(rest) }
    // Byte by byte through the first 1 KB (every boundary a real controller's reads could
    // make), then the rest at once: dripping all 4 KB would slow the run threefold.
    let drip = feed(stream, maxData: maxData) { rest in stream.count - rest < 1024 ? 1 : rest }

    invariant(whole.bytes.count + whole.garbage + whole.pending == stream.count,
              "bytes in \(stream.count) != delivered \(whole.bytes.count) + garbage \(whole.garbage) + pending \(whole.pending)")
    invariant(whole == model, "the framer and the reference model disagree:\n  framer \(whole)\n  model  \(model)")
    invariant(split == whole, "split pushes changed the result (seed \(input[1])):\n  \(split)\n  \(whole)")
    invariant(drip == whole, "byte-by-byte pushes changed the result:\n  \(drip)\n  \(whole)")
}

/// Pushes `stream` in chunks of `size(remaining)` bytes (clamped to what is left).
func feed(_ stream: UnsafeRawBufferPointer, maxData: Int, _ size: (Int) -> Int) -> Delivered {
    var framer = H4Framer(maxDataPayload: maxData)
    let capacity = framer.capacity
    var out = Delivered()
    var at = 0
    var pushes = 0
    var lastWasEmpty = false
    while at < stream.count || pushes == 0 {
        var n = min(max(size(stream.count - at), 0), stream.count - at)
        // Never two empty pushes in a row, so the loop ends within 2 · count + 1 pushes.
        if n == 0 && lastWasEmpty { n = min(1, stream.count - at) }
        lastWasEmpty = n == 0
        framer.push(UnsafeRawBufferPointer(rebasing: stream[at ..< at + n])) { packet in
            checkPacket(packet, maxData: maxData, capacity: capacity)
            out.bytes.append(contentsOf: packet.frame)
            out.lengths.append(packet.frame.count)
        }
        at += n
        pushes += 1
        expect(pushes <= 2 * stream.count + 1, "the chunking never reaches the end")
        let s = framer.stats
        expect(out.bytes.count + s.garbageBytes + framer.pendingBytes == at,
               "after \(at) bytes: delivered \(out.bytes.count) + garbage \(s.garbageBytes) + pending \(framer.pendingBytes)")
        expect(framer.isIdle == (framer.pendingBytes == 0), "isIdle disagrees with pendingBytes")
        expect(framer.pendingBytes <= framer.capacity, "more pending bytes than the buffer holds")
        if framer.pendingBytes > 0 {
            // A partial packet is always the stream's tail, starting at its indicator.
            expect(H4PacketType(rawValue: stream[at - framer.pendingBytes]) != nil,
                   "pending bytes do not start at an indicator")
        }
    }
    out.packets = framer.stats.packets
    out.garbage = framer.stats.garbageBytes
    out.oversize = framer.stats.oversizePackets
    out.pending = framer.pendingBytes
    invariant(out.packets == out.lengths.count, "stats.packets \(out.packets) != \(out.lengths.count) callbacks")
    return out
}

/// One delivered packet against its own header.
func checkPacket(_ p: H4Packet, maxData: Int, capacity: Int) {
    expect(p.frame.count == p.bytes.count + 1 && p.frame[0] == p.type.rawValue, "frame and bytes disagree")
    expect(p.bytes.baseAddress == p.frame.baseAddress.map { $0 + 1 }, "bytes do not follow the indicator")
    let header = headerSize(p.type)
    expect(p.bytes.count >= header, "\(p.type) packet shorter than its header")
    let payload = payloadLength(p.type, UnsafeRawBufferPointer(rebasing: p.bytes[..<header]))
    expect(p.bytes.count == header + payload, "\(p.type) header says \(payload), packet has \(p.bytes.count - header)")
    expect(payload <= ((p.type == .acl || p.type == .iso) ? maxData : 255), "oversize \(p.type) delivered")
    expect(p.frame.count <= capacity, "a frame larger than the buffer")
}

/// The reference: the same rule as H4Framer's header comment, over the whole stream at once.
func reference(_ s: UnsafeRawBufferPointer, maxData: Int) -> Delivered {
    var out = Delivered()
    var pos = 0
    while pos < s.count {
        guard let type = H4PacketType(rawValue: s[pos]) else {
            out.garbage += 1
            pos += 1
            continue
        }
        let header = headerSize(type)
        guard pos + 1 + header <= s.count else { out.pending = s.count - pos; break }
        let payload = payloadLength(type, UnsafeRawBufferPointer(rebasing: s[pos + 1 ..< pos + 1 + header]))
        if payload > ((type == .acl || type == .iso) ? maxData : 255) {
            out.oversize += 1
            out.garbage += 1
            pos += 1
            continue
        }
        let end = pos + 1 + header + payload
        guard end <= s.count else { out.pending = s.count - pos; break }
        out.bytes.append(contentsOf: s[pos ..< end])
        out.lengths.append(end - pos)
        out.packets += 1
        pos = end
    }
    return out
}

/// Header bytes after the indicator, Vol 4, Part E, §5.4 (written out again, not borrowed
/// from the framer, so a wrong table there shows up here).
func headerSize(_ t: H4PacketType) -> Int {
    switch t {
    case .command: 3
    case .acl: 4
    case .sco: 3
    case .event: 2
    case .iso: 4
    }
}

func payloadLength(_ t: H4PacketType, _ h: UnsafeRawBufferPointer) -> Int {
    switch t {
    case .command, .sco: Int(h[2])
    case .event: Int(h[1])
    case .acl: Int(h[2]) + 256 * Int(h[3])
    case .iso: (Int(h[2]) + 256 * Int(h[3])) % 0x4000  // §5.4.5: the top two bits are RFU
    }
}

/// Chunk sizes from a byte: a xorshift sequence mapping to 0 (an empty push), 1…16, or the
/// whole rest, so splits fall inside indicators, headers and payloads alike.
struct SplitSizes {
    var state: UInt32
    init(seed: UInt8, count: Int) { state = UInt32(seed) &* 0x9E37_79B9 ^ UInt32(truncatingIfNeeded: count) | 1 }
    mutating func next(_ rest: Int) -> Int {
        state ^= state << 13; state ^= state >> 17; state ^= state << 5
        switch state % 8 {
        case 0: return 0
        case 1: return rest
        default: return Int((state >> 8) % 16) + 1
        }
    }
}

/// `invariant` for the per-byte checks: inlined, so the call into FuzzSupport (and the
/// message) happen only when a check fails. Drip-feeding 4 KB otherwise spends most of its
/// time calling across the module boundary.
@inline(__always)
func expect(_ condition: Bool, _ message: @autoclosure () -> String, line: UInt = #line) {
    if !condition { invariant(false, message(), line: line) }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
