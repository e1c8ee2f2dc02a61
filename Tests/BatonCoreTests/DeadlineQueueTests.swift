// DeadlineQueue: each entry queued once, at its latest deadline, popped earliest first.
import BatonLibc
import Testing
import BatonCore

@Suite("Deadline queue (RoomOwnership's ticks)")
struct DeadlineQueueTests {
    private func t(_ ns: Int64) -> Instant { Instant(nanoseconds: ns) }

    @Test func setAgainMovesAnEntryInsteadOfAddingOne() {
        var q = DeadlineQueue(capacity: 4)
        q.set(2, t(30))
        q.set(0, t(20))
        q.set(2, t(10))
        #expect(q.count == 2)
        #expect(q.next == t(10))
        q.set(2, t(40))
        #expect(q.next == t(20), "a later deadline moves the entry back")
        q.lower(0, t(25))
        #expect(q.next == t(20), "lower keeps an earlier deadline")
        q.set(0, nil)
        #expect(q.count == 1 && q.next == t(40))
    }

    @Test func popsWhatIsDueEarliestFirstEqualDeadlinesInEntryOrder() {
        var q = DeadlineQueue(capacity: 8)
        for (e, ns) in [(5, 7), (1, 3), (7, 3), (0, 9), (3, 3)] { q.set(e, t(Int64(ns))) }
        var popped: [Int] = []
        while let e = q.popDue(t(7)) { popped.append(e) }
        #expect(popped == [1, 3, 7, 5])
        #expect(q.popDue(t(8)) == nil)
        #expect(q.popDue(t(9)) == 0)
        #expect(q.next == nil)
    }

    @Test func agreesWithAPlainListOverRandomOperations() {
        // A reference: the deadline of every queued entry in a dictionary.
        var rng = UInt64(0x9E37_79B9_7F4A_7C15)
        func next(_ n: UInt64) -> Int { rng = rng &* 6364136223846793005 &+ 1442695040888963407; return Int((rng >> 33) % n) }
        var q = DeadlineQueue(capacity: 64)
        var model: [Int: Int64] = [:]
        var now: Int64 = 0
        for _ in 0 ..< 20_000 {
            let e = next(64)
            switch next(4) {
            case 0: let d = now + Int64(next(100)); q.set(e, t(d)); model[e] = d
            case 1: q.set(e, nil); model[e] = nil
            case 2: let d = now + Int64(next(100)); q.lower(e, t(d)); model[e] = min(model[e] ?? .max, d)
            default:
                now += Int64(next(20))
                let expected = model.filter { $0.value <= now }.sorted { ($0.value, $0.key) < ($1.value, $1.key) }.map(\.key)
                var popped: [Int] = []
                while let p = q.popDue(t(now)) { popped.append(p) }
                #expect(popped == expected)
                for p in popped { model[p] = nil }
            }
            #expect(q.count == model.count)
            #expect(q.next?.nanoseconds == model.values.min())
        }
    }
}
