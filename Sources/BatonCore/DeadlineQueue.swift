// When each of a fixed set of entries is next due: an indexed binary min-heap, one place per
// entry, so setting an entry's deadline again moves it rather than adding a second one.
// RoomOwnership keeps each device's next deadline here, so a tick runs the rule for the devices
// that are due, not for every device (docs/rooms.md §3 "Evaluating a device"). Storage is
// fixed at init; nothing allocates after it.
import BatonLibc

public struct DeadlineQueue {
    /// Entries in heap order.
    private var heap: [Int32]
    /// Each entry's place in `heap`; -1 when it is not queued.
    private var place: [Int32]
    /// Each entry's deadline, in nanoseconds; valid while it is queued.
    private var due: [Int64]

    /// Room for entries 0 ..< capacity.
    public init(capacity: Int) {
        heap = []
        heap.reserveCapacity(capacity)
        place = Array(repeating: -1, count: capacity)
        due = Array(repeating: 0, count: capacity)
    }

    public var count: Int { heap.count }

    /// The earliest deadline queued.
    public var next: Instant? { heap.first.map { Instant(nanoseconds: due[Int($0)]) } }

    /// Entry `e` is next due at `t`, or at nothing (nil: removed). Replaces what it had.
    public mutating func set(_ e: Int, _ t: Instant?) {
        guard let t else { return remove(e) }
        let p = Int(place[e])
        due[e] = t.nanoseconds
        if p < 0 {
            place[e] = Int32(heap.count)
            heap.append(Int32(e))
            up(heap.count - 1)
        } else {
            up(p)
            down(Int(place[e]))
        }
    }

    /// Entry `e` is due at `t` at the latest: an earlier deadline it has stays.
    public mutating func lower(_ e: Int, _ t: Instant) {
        if place[e] >= 0 && due[e] <= t.nanoseconds { return }
        set(e, t)
    }

    public mutating func remove(_ e: Int) {
        let p = Int(place[e])
        guard p >= 0 else { return }
        place[e] = -1
        let last = heap.removeLast()
        guard p < heap.count else { return }
        heap[p] = last
        place[Int(last)] = Int32(p)
        up(p)
        down(Int(place[Int(last)]))
    }

    /// The earliest entry due at or before `now`, taken off the queue; nil when none is.
    public mutating func popDue(_ now: Instant) -> Int? {
        guard let first = heap.first, due[Int(first)] <= now.nanoseconds else { return nil }
        remove(Int(first))
        return Int(first)
    }

    /// Deadline order; equal deadlines in entry order, so a tick reports the same changes in
    /// the same order on every gateway.
    private func before(_ a: Int32, _ b: Int32) -> Bool {
        let da = due[Int(a)], db = due[Int(b)]
        return da < db || (da == db && a < b)
    }

    private mutating func swapAt(_ i: Int, _ j: Int) {
        heap.swapAt(i, j)
        place[Int(heap[i])] = Int32(i)
        place[Int(heap[j])] = Int32(j)
    }

    private mutating func up(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            guard before(heap[i], heap[parent]) else { return }
            swapAt(i, parent)
            i = parent
        }
    }

    private mutating func down(_ start: Int) {
        var i = start
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < heap.count && before(heap[l], heap[m]) { m = l }
            if r < heap.count && before(heap[r], heap[m]) { m = r }
            guard m != i else { return }
            swapAt(i, m)
            i = m
        }
    }
}
