// Fuzz target: Apple Continuity TLVs (docs/protocol.md §4).
// Invariants: a validated chain tiles the input exactly; every message decodes or throws.
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    guard var it = try? ContinuityIterator(validating: bytes) else { return }
    var covered = 0
    while let m = it.next() {
        invariant(m.offset == covered, "messages must be contiguous")
        covered += 2 + m.value.count
        if case .handoff(let h) = try? m.decode() {
            invariant(h.encrypted.count == m.value.count - 4, "Handoff keeps every encrypted byte")
        }
    }
    invariant(covered == bytes.count, "validated TLVs must cover the input exactly")
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
