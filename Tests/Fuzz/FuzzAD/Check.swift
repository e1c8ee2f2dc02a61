// Fuzz target: the AD-structure iterator and the one-walk advertisement classifier.
// Invariants: the walk ends; the structures it yields tile a prefix of the input exactly;
// after an error it yields nothing; the classifier never disagrees with the walk.
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    var it = ADIterator(bytes)
    var covered = 0
    var walkFailed = false
    var steps = 0
    do {
        while let ad = try it.next() {
            invariant(ad.offset == covered, "structures must be contiguous")
            covered += 2 + ad.data.count
            invariant(covered <= bytes.count, "a structure ran past the input")
            steps += 1
            invariant(steps <= bytes.count, "more structures than bytes")
        }
    } catch {
        walkFailed = true
        invariant((try? it.next()) == nil, "the iterator must stop after an error")
    }
    if !walkFailed && covered < bytes.count {
        // Only zero padding may follow the significant part.
        invariant(bytes[covered...].allSatisfy { $0 == 0 }, "non-zero bytes left after the walk")
    }
    do {
        let content = try AdvertisementContent.decode(bytes)
        invariant(!walkFailed, "the classifier accepted what the walk rejected")
        invariant(content.structures == steps, "classifier and walk disagree on the count")
        var messages = content.continuityMessages
        while let m = messages.next() { _ = try? m.decode() }
    } catch {
        // A walk error must surface here too; a beacon or Continuity error may add to it.
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
