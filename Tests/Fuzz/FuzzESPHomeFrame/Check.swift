// Fuzz target: the ESPHome frame decoders (docs/esphome.md §2) over a receive buffer. Byte 0
// picks the framing (even: plaintext, odd: Noise) and, in its upper bits, the buffer's room
// (`maxBody`); the rest is a byte stream as a client sends it. Invariants:
//   * decoding the stream frame after frame ends in `.needMore` or an error; every frame lies
//     inside the input, frames tile a prefix of it, and a plaintext frame's body ends at its
//     length; no body is longer than `maxBody`;
//   * every prefix of the stream decodes to the same frames as the whole, then `.needMore` or
//     the same error: the decoder never decides anything from bytes it has not been given,
//     and a frame never depends on the bytes after it (drip-fed, as a socket delivers);
//   * an error names a byte inside the input.
import BatonProxy
import BatonWire
import FuzzSupport

enum Outcome: Equatable {
    case frames([FrameResult], end: FrameResult?)
    case error([FrameResult], WireError)
}

func run(_ bytes: UnsafeRawBufferPointer, noise: Bool, maxBody: Int) -> Outcome {
    var frames: [FrameResult] = []
    var start = 0
    while true {
        let rest = UnsafeRawBufferPointer(rebasing: bytes[start...])
        do throws(WireError) {
            let r = noise ? try NoiseFrame.decode(rest, maxBody: maxBody) : try PlaintextFrame.decode(rest, maxBody: maxBody)
            guard case .frame(_, let payload, let length) = r else { return .frames(frames, end: r) }
            invariant(length > 0 && length <= rest.count, "frame of \(length) in \(rest.count)")
            invariant(payload.upperBound == length && payload.count <= maxBody, "payload \(payload) of \(length)")
            frames.append(r)
            start += length
            if start == bytes.count { return .frames(frames, end: nil) }
        } catch {
            return .error(frames, error)
        }
    }
}

func errorOffset(_ e: WireError) -> Int? {
    switch e {
    case .truncated(let at, _), .badLength(let at, _), .trailing(let at, _), .unsupported(let at, _), .malformed(let at, _): at
    case .noRoom: nil
    }
}

func check(_ input: UnsafeRawBufferPointer) {
    guard let first = input.first else { return }
    let noise = first & 1 == 1
    let maxBody = Int(first >> 1) * 4
    let stream = UnsafeRawBufferPointer(rebasing: input[1...])
    let whole = run(stream, noise: noise, maxBody: maxBody)
    if case .error(let frames, let e) = whole {
        let consumed = frames.reduce(0) { if case .frame(_, _, let l) = $1 { return $0 + l }; return $0 }
        guard let at = errorOffset(e) else { return invariant(false, "noRoom from a decoder") }
        invariant(consumed + at < stream.count, "error \(e) after \(consumed) bytes of \(stream.count)")
    }
    // Every prefix agrees with the whole, up to where it stops.
    for cut in 0..<min(stream.count, 512) {
        let part = run(UnsafeRawBufferPointer(rebasing: stream[..<cut]), noise: noise, maxBody: maxBody)
        switch (part, whole) {
        case (.frames(let a, _), .frames(let b, _)), (.frames(let a, _), .error(let b, _)):
            invariant(a.count <= b.count && Array(b.prefix(a.count)) == a, "prefix \(cut): \(a) vs \(b)")
        case (.error(let a, let ea), .error(let b, let eb)):
            invariant(a == b && ea == eb, "prefix \(cut) fails as \(ea) after \(a.count), the whole as \(eb) after \(b.count)")
        case (.error(_, let e), .frames):
            invariant(false, "prefix \(cut) fails as \(e), the whole does not")
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
