// Batched sightings in the rule: docs/rooms.md §8. A tick's due sightings go out as batches
// (SightingBatcher), and a batch is taken in as its records, one sighting each, under the same
// rule (RoomOwnership.batch).
import BatonLibc
import Testing
import BatonTestSupport
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Double) -> Instant { t0 + .milliseconds(Int((seconds * 1000).rounded())) }
private let run: Int64 = 1_795_430_000_000

private let phone: UInt64 = 0x5A12_3456_789A
private let laptop: UInt64 = 0x4B00_0000_0001
private let badge: UInt64 = 0x4B00_0000_0002

private func beacon(_ device: UInt64) -> ActivityBeacon {
    ActivityBeacon(sequence: 1, activityTypeHash: 1, groupHash: 1, deviceID: device, psm: 0x80)
}

/// A batch as the test reads it back: since, n and records.
private struct Sent: Equatable {
    var since: Int64
    var n: UInt64
    var records: [BatchedSighting]
}

private func read(_ bytes: UnsafeRawBufferPointer) -> Sent? {
    guard let b = try? SightingBatch.decode(bytes) else { return nil }
    return Sent(since: b.since, n: b.n, records: (0 ..< b.count).map { b[$0] })
}

/// One batch's bytes, written by the writer.
private func batch(since: Int64 = run, n: UInt64, _ records: [(UInt64, Int8?)]) -> [UInt8] {
    var buf = [UInt8](repeating: 0, count: SightingBatch.encodedCount(records: records.count))
    buf.withUnsafeMutableBytes { raw in
        var w = try! SightingBatchWriter(raw, since: since, n: n)
        for (d, r) in records { try! w.append(device: d, rssi: r) }
        _ = w.finish()
    }
    return buf
}

@Suite("Batched sightings (docs/rooms.md §8)")
struct SightingBatchCoreTests {
    // MARK: collecting a tick's sightings

    @Test func aTicksDueSightingsGoOutAsOneBatchWhoseCountersFollowOnFromTheLast() {
        var table = ActivityTable(config: .init(capacity: 8, expiry: .seconds(60)))
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 8)
        var batcher = SightingBatcher(since: run)
        for (d, rssi) in [(phone, Int8(-61)), (laptop, -70), (badge, -80)] {
            table.hear(beacon(d), rssi: rssi, address: d, addressType: 1, now: at(0)) { _ in }
        }
        var sent: [Sent] = []
        batcher.collect(&schedule, table: table, now: at(0)) { sent.append(read($0)!) }
        #expect(sent.count == 1)
        #expect(sent.first?.since == run)
        #expect(sent.first?.n == 1)
        #expect(Set(sent.first?.records.map(\.device) ?? []) == [phone, laptop, badge])
        #expect(batcher.counter == 3)

        // Nothing due at the same instant: nothing sent.
        batcher.collect(&schedule, table: table, now: at(0)) { sent.append(read($0)!) }
        #expect(sent.count == 1)

        // The heartbeat 2 s later: one batch again, counters 4…6.
        for d in [phone, laptop, badge] { table.hear(beacon(d), rssi: -61, address: d, addressType: 1, now: at(2)) { _ in } }
        batcher.collect(&schedule, table: table, now: at(2)) { sent.append(read($0)!) }
        #expect(sent.count == 2)
        #expect(sent.last?.n == 4)
        #expect(sent.last?.records.count == 3)
        #expect(batcher.counter == 6)
        #expect(batcher.batchesSent == 2 && batcher.recordsSent == 6)
    }

    @Test func newcomersAreHandedOnAndTheBuildingBatchIsNumberedAfterTheTicksBatch() {
        var table = ActivityTable(config: .init(capacity: 8, expiry: .seconds(60)))
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 8)
        let apple = AppleDeviceTable(config: .init())
        var batcher = SightingBatcher(since: run)
        for (d, rssi) in [(phone, Int8(-61)), (laptop, -70)] {
            table.hear(beacon(d), rssi: rssi, address: d, addressType: 1, now: at(0)) { _ in }
        }
        var sent: [Sent] = []
        var newcomers: [DueSighting] = []
        batcher.collect(&schedule, table: table, apple: apple, now: at(0), newcomer: { newcomers.append($0) }) {
            sent.append(read($0)!)
        }
        #expect(Set(newcomers.map(\.device)) == [phone, laptop])
        // The building batch follows on: records 3 and 4.
        batcher.collect(records: newcomers) { sent.append(read($0)!) }
        #expect(sent.map(\.n) == [1, 3])
        #expect(sent.last?.records.count == 2)

        // The heartbeat: no newcomers; a device heard for the first time is one.
        newcomers.removeAll()
        for d in [phone, laptop, badge] { table.hear(beacon(d), rssi: -61, address: d, addressType: 1, now: at(2)) { _ in } }
        batcher.collect(&schedule, table: table, apple: apple, now: at(2), newcomer: { newcomers.append($0) }) {
            sent.append(read($0)!)
        }
        #expect(newcomers == [DueSighting(device: badge, rssi: -61)])
        #expect(sent.last?.n == 5 && sent.last?.records.count == 3)
        // Nothing chosen: nothing sent.
        batcher.collect(records: []) { sent.append(read($0)!) }
        #expect(sent.count == 3)
    }

    @Test func aTickWithMoreThanMaxRecordsIsSplitAndNoRecordIsLost() {
        var batcher = SightingBatcher(since: run, maxRecords: 2)
        let due = (1 ... 5).map { DueSighting(device: UInt64($0), rssi: $0 == 3 ? nil : -50) }
        var sent: [Sent] = []
        batcher.collect({ each in due.forEach(each) }) { sent.append(read($0)!) }
        #expect(sent.map(\.n) == [1, 3, 5])
        #expect(sent.map(\.records.count) == [2, 2, 1])
        #expect(sent.flatMap(\.records) == due.map { BatchedSighting(device: $0.device, rssi: $0.rssi) })
    }

    @Test func theFirstBatchIsTheDocumentedVector() {
        // docs/protocol.md §6.3: a run that sent 41 sightings before.
        var batcher = SightingBatcher(since: 1_795_430_000_123, counter: 41)
        var bytes: [UInt8] = []
        batcher.collect({ each in
            each(DueSighting(device: 0x5a12_3456_789a, rssi: -61))
            each(DueSighting(device: 0xffff_0000_002a, rssi: nil))
        }) { bytes = Array($0) }
        #expect(bytes == hx("""
            01 fb a5 f7 07 a2 01 00 00 2a 00 00 00 00 00 00 00 02 00
            9a 78 56 34 12 5a c3
            2a 00 00 00 ff ff 7f
            """))
    }

    // MARK: taking a batch in

    /// The same walk sent as batches to one rule and as single sightings to another: the same
    /// changes, the same owner, the same counters.
    @Test func aBatchLeavesTheSameStateAsItsSightingsOneByOne() {
        var byBatch = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        var bySighting = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        var changesB: [OwnershipChange] = [], changesS: [OwnershipChange] = []
        for g in ["a", "b"] {
            byBatch.status(gateway: Substring(g), online: true, now: t0) { changesB.append($0) }
            bySighting.status(gateway: Substring(g), online: true, now: t0) { changesS.append($0) }
        }
        // Each gateway's ticks: (time, [(device, rssi)]). The phone walks from a to b; the
        // laptop stays in a.
        let ticks: [(Double, String, [(UInt64, Int8?)])] = [
            (0.0, "a", [(phone, -50), (laptop, -55)]),
            (0.1, "b", [(phone, -80), (laptop, -85)]),
            (2.0, "a", [(phone, -60), (laptop, -55)]),
            (2.1, "b", [(phone, -62), (laptop, -85)]),
            (3.0, "a", [(phone, -75)]),
            (3.1, "b", [(phone, -50)]),
            (5.0, "a", [(phone, -80), (laptop, -55)]),
            (5.1, "b", [(phone, -48), (laptop, nil)]),
            (6.2, "a", [(phone, -80), (laptop, -55)]),  // b has led by ≥ 6 dB since 3.0: dwell over
        ]
        var counter: [String: UInt64] = [:]
        for (t, g, records) in ticks {
            let n = counter[g, default: 0] + 1
            counter[g] = n + UInt64(records.count) - 1
            let bytes = batch(n: n, records)
            let outcome = bytes.withUnsafeBytes { raw in
                byBatch.batch(try! SightingBatch.decode(raw), gateway: Substring(g), now: at(t)) { changesB.append($0) }
            }
            #expect(outcome.accepted == records.count && outcome.dropped == 0)
            for (i, (d, rssi)) in records.enumerated() {
                let drop = bySighting.sighting(Sighting(rssi: rssi, since: run, n: n + UInt64(i)), gateway: Substring(g),
                                               device: d, now: at(t)) { changesS.append($0) }
                #expect(drop == nil)
            }
            byBatch.tick(now: at(t + 0.5)) { changesB.append($0) }
            bySighting.tick(now: at(t + 0.5)) { changesS.append($0) }
        }
        #expect(changesB == changesS)
        #expect(changesB.map(\.reason) == [.settled, .settled, .stronger])
        #expect(byBatch.owner(of: phone).map { byBatch.id(of: $0) } == "b")
        #expect(byBatch.owner(of: laptop).map { byBatch.id(of: $0) } == "a")
        #expect(byBatch.counters == bySighting.counters)
    }

    @Test func aBatchFromAnUnknownGatewayIsDroppedRecordByRecord() {
        var rule = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        rule.status(gateway: "a", online: true, now: t0) { _ in }
        let bytes = batch(n: 1, [(phone, -50), (laptop, -60)])
        let outcome = bytes.withUnsafeBytes { raw in
            rule.batch(try! SightingBatch.decode(raw), gateway: "ghost", now: at(0)) { _ in }
        }
        #expect(outcome.unknownGateway == 2 && outcome.accepted == 0)
        #expect(rule.counters.unknownGateway == 2)
        let followsPhone = rule.follows(phone)
        #expect(!followsPhone)
    }

    @Test func aBatchReplayedIsDroppedAndOneThatOverlapsTakesOnlyItsNewRecords() {
        var rule = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        for g in ["a", "b"] { rule.status(gateway: Substring(g), online: true, now: t0) { _ in } }
        let first = batch(n: 10, [(phone, -50), (laptop, -60)])
        func take(_ bytes: [UInt8], at t: Double) -> BatchOutcome {
            bytes.withUnsafeBytes { raw in rule.batch(try! SightingBatch.decode(raw), gateway: "b", now: at(t)) { _ in } }
        }
        #expect(take(first, at: 0).accepted == 2)
        var replayed = BatchOutcome()
        replayed.replayed = 2
        #expect(take(first, at: 0.1) == replayed)
        // Counters 11 and 12: 11 was taken already (the laptop's), so only the record carrying
        // 12 is new.
        let overlap = take(batch(n: 11, [(badge, -70), (phone, -52)]), at: 0.2)
        #expect(overlap.accepted == 1 && overlap.replayed == 1)
        let followsBadge = rule.follows(badge)
        #expect(!followsBadge)
        var drops: [String] = []
        overlap.forEachDrop { reason, count in drops.append("\(reason.name) \(count)") }
        #expect(drops == ["sighting-replayed 1"])
    }

    @Test func theBuildingWideChannelIsInOrderWithItselfNotWithTheNeighbourhoodOne() {
        // docs/rooms.md §8.3: b's tick batch (QoS 0, counters 10–11) and its building batch
        // (QoS 1, 12) may arrive the other way round, as the broker may queue QoS 1 and send
        // QoS 0 at once; then its next tick batch (13) arrives before the building one again.
        var rule = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        for g in ["a", "b"] { rule.status(gateway: Substring(g), online: true, now: t0) { _ in } }
        func take(_ bytes: [UInt8], buildingWide: Bool, at t: Double) -> BatchOutcome {
            bytes.withUnsafeBytes { raw in
                rule.batch(try! SightingBatch.decode(raw), gateway: "b", now: at(t), buildingWide: buildingWide) { _ in }
            }
        }
        let building = batch(n: 12, [(badge, -70)])
        #expect(take(building, buildingWide: true, at: 0).accepted == 1)
        #expect(take(batch(n: 10, [(phone, -50), (laptop, -60)]), buildingWide: false, at: 0.1).accepted == 2)
        #expect(take(batch(n: 13, [(phone, -51)]), buildingWide: false, at: 0.2).accepted == 1)
        // Each channel still refuses its own replays.
        #expect(take(building, buildingWide: true, at: 0.3).replayed == 1)
        #expect(take(batch(n: 13, [(phone, -51)]), buildingWide: false, at: 0.4).replayed == 1)
        #expect(rule.counters.replayed == 2)
    }

    /// docs/rooms.md §8.2: a building-wide record of a device this gateway does not follow,
    /// and `ignoreNew` says it neither hears nor owns, is accepted in the sender's order but
    /// not taken up; a device it follows already is taken in as always.
    @Test func aBuildingRecordOfADeviceNeitherHeardNorOwnedHereIsNotTakenUp() {
        var rule = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        for g in ["a", "b", "c"] { rule.status(gateway: Substring(g), online: true, now: t0) { _ in } }
        func take(_ bytes: [UInt8], from g: Substring, at t: Double) -> BatchOutcome {
            bytes.withUnsafeBytes { raw in
                rule.batch(try! SightingBatch.decode(raw), gateway: g, now: at(t), buildingWide: true,
                           ignoreNew: { $0 == badge }) { _ in }
            }
        }
        // The phone is followed (c's tick batch); the badge is not, and is heard nowhere here.
        _ = batch(n: 1, [(phone, -60)]).withUnsafeBytes { raw in
            rule.batch(try! SightingBatch.decode(raw), gateway: "c", now: at(0)) { _ in }
        }
        var outcome = take(batch(n: 5, [(badge, -50), (phone, -55)]), from: "b", at: 0.1)
        #expect(outcome.accepted == 2 && outcome.ignored == 1 && outcome.dropped == 0)
        #expect(rule.count == 1, "only the phone is followed")
        var candidates: [String] = []
        rule.sightings(of: phone, now: at(0.2)) { g, _ in candidates.append(rule.id(of: g)) }
        #expect(candidates.sorted() == ["b", "c"])
        // Ignored, yet in b's order: the same record again is a replay.
        outcome = take(batch(n: 5, [(badge, -50)]), from: "b", at: 0.3)
        #expect(outcome.replayed == 1 && outcome.ignored == 0)
        // The same record on the neighbourhood channel is taken up: only building-wide ones
        // are passed `ignoreNew` by the gateway, and the default takes everything.
        _ = batch(n: 6, [(badge, -50)]).withUnsafeBytes { raw in
            rule.batch(try! SightingBatch.decode(raw), gateway: "b", now: at(0.4)) { _ in }
        }
        #expect(rule.count == 2)
    }

    @Test func aBatchUnderOurOwnIdFromAnotherRunIsAnImpostor() {
        var rule = RoomOwnership(config: RoomsConfig(), selfID: "a", selfSince: run)
        rule.status(gateway: "a", online: true, now: t0) { _ in }
        let bytes = batch(since: run - 1, n: 1, [(phone, -50)])
        let outcome = bytes.withUnsafeBytes { raw in rule.batch(try! SightingBatch.decode(raw), gateway: "a", now: at(0)) { _ in } }
        #expect(outcome.impostor == 1)
    }
}
