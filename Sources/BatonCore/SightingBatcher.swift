// Collects one tick's due sightings into batches (docs/rooms.md §8, docs/protocol.md §6): the
// schedule decides what is due, exactly as for one message per device (§2 "When a sighting is
// sent"); the batcher writes each due sighting as a record of the current batch, hands a batch
// on when it is full, and the last one when the walk ends. So a tick sends
// ⌈due / maxRecords⌉ messages instead of `due`.
//
// The buffer is allocated once at init; `collect` allocates nothing. The counter is the
// run's sighting counter (`n`), the same one the JSON sightings used: record i of a batch
// carries n + i, and the next batch starts after the last record sent.
import BatonLibc
public import BatonWire

public struct SightingBatcher: ~Copyable {
    /// Unix ms at which this gateway's run started: every batch's `since`.
    public let since: Int64
    /// Records per batch at most (1…`SightingBatch.maxRecords`).
    public let maxRecords: Int
    /// The counter of the last sighting handed on; the next batch's `n` is one more.
    public private(set) var counter: UInt64
    /// Batches and records handed to `send` so far.
    public private(set) var batchesSent = 0
    public private(set) var recordsSent = 0

    private let buffer: UnsafeMutableRawBufferPointer

    /// `maxRecords` outside 1…4096 is the caller's bug (the config loader checks it first).
    public init(since: Int64, maxRecords: Int = SightingBatch.maxRecords, counter: UInt64 = 0) {
        precondition(maxRecords >= 1 && maxRecords <= SightingBatch.maxRecords,
                     "batch records \(maxRecords) outside 1...\(SightingBatch.maxRecords)")
        precondition(since >= 0, "a run's since is a unix time in ms, never negative")
        self.since = since
        self.maxRecords = maxRecords
        self.counter = counter
        buffer = .allocate(byteCount: SightingBatch.encodedCount(records: maxRecords), alignment: 8)
    }

    deinit { buffer.deallocate() }

    /// Walks `schedule.due` over the activity table and the named Apple devices (the gateway's
    /// call) and hands each batch's bytes to `send`, valid only during the call. Nothing due:
    /// nothing sent.
    public mutating func collect(_ schedule: inout SightingSchedule, table: borrowing ActivityTable,
                                 apple: borrowing AppleDeviceTable, now: Instant,
                                 outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
                                 send: (UnsafeRawBufferPointer) -> Void) {
        var open = Open()
        schedule.due(table: table, apple: apple, now: now, outOfReach: outOfReach) { due in add(due, &open, send) }
        flush(&open, send)
    }

    /// `collect`, handing each newcomer's sighting (`SightingSchedule.dueMarkingNewcomers`,
    /// docs/rooms.md §8.3) to `newcomer` too, after it is in the batch: the gateway keeps them
    /// for its building-wide batch (`collect(records:send:)`), sent after this tick's batch.
    public mutating func collect(_ schedule: inout SightingSchedule, table: borrowing ActivityTable,
                                 apple: borrowing AppleDeviceTable, now: Instant,
                                 outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
                                 newcomer: (DueSighting) -> Void,
                                 send: (UnsafeRawBufferPointer) -> Void) {
        var open = Open()
        schedule.dueMarkingNewcomers(table: table, apple: apple, now: now, outOfReach: outOfReach) { due, isNew in
            add(due, &open, send)
            if isNew { newcomer(due) }
        }
        flush(&open, send)
    }

    /// Sightings already chosen (the building-wide batch: newcomers and answers, docs/rooms.md
    /// §8.3) as batches, numbered after everything sent so far. Allocates nothing.
    public mutating func collect(records: [DueSighting], send: (UnsafeRawBufferPointer) -> Void) {
        var open = Open()
        for due in records { add(due, &open, send) }
        flush(&open, send)
    }

    /// What is due, one sighting at a time, with the same counter (`rooms.batches: false`: one
    /// JSON message per device, docs/rooms.md §2); counted as batches of one.
    public mutating func collectEach(_ schedule: inout SightingSchedule, table: borrowing ActivityTable,
                                     apple: borrowing AppleDeviceTable, now: Instant,
                                     outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
                                     send: (UInt64, Sighting) -> Void) {
        let since = self.since
        var counter = self.counter
        var sent = 0
        schedule.due(table: table, apple: apple, now: now, outOfReach: outOfReach) { due in
            counter &+= 1  // 64 bits at a million a second: half a million years
            sent &+= 1
            send(due.device, Sighting(rssi: due.rssi, since: since, n: counter))
        }
        self.counter = counter
        batchesSent &+= sent
        recordsSent &+= sent
    }

    /// `collect` over the activity table alone.
    public mutating func collect(_ schedule: inout SightingSchedule, table: borrowing ActivityTable, now: Instant,
                                 send: (UnsafeRawBufferPointer) -> Void) {
        var open = Open()
        schedule.due(table: table, now: now) { due in add(due, &open, send) }
        flush(&open, send)
    }

    /// Batches the sightings `each` hands out, as they come: for tests and callers with their
    /// own walk. It may allocate its closures' contexts; the gateway's loop uses the form above.
    public mutating func collect(_ each: ((DueSighting) -> Void) -> Void, send: (UnsafeRawBufferPointer) -> Void) {
        var open = Open()
        withoutActuallyEscaping(send) { send in
            each { due in add(due, &open, send) }
            flush(&open, send)
        }
    }

    // MARK: - internals

    /// The batch being filled, if any.
    private struct Open {
        var writer: SightingBatchWriter?
    }

    private mutating func add(_ due: DueSighting, _ open: inout Open, _ send: (UnsafeRawBufferPointer) -> Void) {
        if open.writer == nil {
            // Proof: the buffer holds `maxRecords` records and `since` ≥ 0 (init).
            open.writer = try! SightingBatchWriter(buffer, since: since, n: counter &+ 1)
        }
        // Proof: a writer that became full was flushed below, so this one has room, unless the
        // counter would wrap (2⁶⁴ sightings: half a million years at a million a second).
        try! open.writer!.append(device: due.device, rssi: due.rssi)
        if open.writer!.count == maxRecords || open.writer!.isFull { flush(&open, send) }
    }

    private mutating func flush(_ open: inout Open, _ send: (UnsafeRawBufferPointer) -> Void) {
        guard var w = open.writer else { return }
        open.writer = nil
        send(w.finish())
        counter &+= UInt64(w.count)
        batchesSent &+= 1
        recordsSent &+= w.count
    }
}
