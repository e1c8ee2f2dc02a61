// The activity table: docs/table.md, over beacons as docs/protocol.md §2 defines them.
// Time is injected: every instant is `t0` plus the seconds a test names.
import BatonLibc
import BatonTestSupport
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Int) -> Instant { t0 + .seconds(seconds) }
private func at(ms: Int) -> Instant { t0 + .milliseconds(ms) }

private let reader = "com.example.reader.article"
private let video = "com.example.player.video"
private let phone: UInt64 = 0x5A12_3456_789A

/// A beacon as a device sends it (§2.1): streams supported, group 0xA1B2C3D4, PSM 0x80.
private func beacon(_ device: UInt64 = phone, seq: UInt16, type: String = reader,
                    flags: BeaconFlags = [.supportsStreams]) -> ActivityBeacon {
    ActivityBeacon(flags: flags, sequence: seq, activityTypeHash: activityTypeHash(type.utf8),
                   groupHash: 0xA1B2_C3D4, deviceID: device, psm: 0x0080)
}

/// Hears one beacon and returns the changes it made, in order.
@discardableResult
private func hear(_ table: inout ActivityTable, _ b: ActivityBeacon, rssi: Int8 = -60,
                  address: UInt64 = 0x7B_0000_0001, at t: Instant) -> [ActivityChangeKind] {
    var kinds: [ActivityChangeKind] = []
    table.hear(b, rssi: rssi, address: address, addressType: 1, now: t) { kinds.append($0.kind) }
    return kinds
}

private func expire(_ table: inout ActivityTable, at t: Instant) -> [ActivityChange] {
    var changes: [ActivityChange] = []
    table.expire(now: t) { changes.append($0) }
    return changes
}

private func deviceIDs(_ table: borrowing ActivityTable) -> Set<UInt64> {
    var ids = Set<UInt64>()
    table.forEach { ids.insert($0.deviceID) }
    return ids
}

@Suite struct ActivityTableTests {
    @Test func theSpecVectorBecomesCurrent() throws {
        // protocol.md §2.5, vector 1, as heard on air.
        let advert = hx("""
            02 01 06
            1B FF FF FF
            01 03 02 01 B7 4B 9B BE D4 C3 B2 A1 9A 78 56 34 12 5A 80 00 00 00 00 00
            """)
        let b = try #require(try advert.withUnsafeBytes { try ActivityBeacon.find(inAdvertisingData: $0) })
        var table = ActivityTable(config: .init())
        var changes: [ActivityChange] = []
        table.hear(b, rssi: -58, address: 0xC0FF_EE00_0001, addressType: 1, now: at(0)) { changes.append($0) }

        let change = try #require(changes.first)
        #expect(changes.count == 1 && change.kind == .becameCurrent)
        #expect(change.activity.deviceID == 0x5A12_3456_789A)
        #expect(change.activity.beacon.sequence == 258)
        #expect(change.activity.state == .current)
        #expect(change.activity.rssi == -58 && change.activity.lastRSSI == -58)
        #expect(change.activity.address == 0xC0FF_EE00_0001 && change.activity.addressType == 1)
        #expect(change.activity.firstSeen == at(0) && change.activity.lastSeen == at(0) && change.activity.lastChange == at(0))
        #expect(change.activity.reports == 1)
        #expect(table.activity(deviceID: 0x5A12_3456_789A) == change.activity)
        #expect(table.count == 1 && table.counters.becameCurrent == 1 && table.counters.beaconsHeard == 1)
    }

    @Test func identicalRepeatsChangeNothing() {
        // The common case: a device repeats its beacon every advertising interval.
        var table = ActivityTable(config: .init())
        #expect(hear(&table, beacon(seq: 7), at: at(0)) == [.becameCurrent])
        var changes = 0
        for i in 1...1_000 {
            table.hear(beacon(seq: 7), rssi: -60, address: 0x7B_0000_0001, addressType: 1, now: at(ms: i * 100)) { _ in changes += 1 }
        }
        #expect(changes == 0)
        let a = table.activity(deviceID: phone)
        #expect(a?.reports == 1_001)
        #expect(a?.lastSeen == at(ms: 100_000), "a repeat keeps the device alive")
        #expect(a?.lastChange == at(0), "but is not a change")
        #expect(table.counters.beaconsHeard == 1_001 && table.counters.saved == 0 && table.counters.becameCurrent == 1)
    }

    @Test func aNewerSequenceIsSaved() {
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 7), at: at(0))
        #expect(hear(&table, beacon(seq: 8), at: at(1)) == [.saved])
        #expect(table.activity(deviceID: phone)?.beacon.sequence == 8)
        #expect(table.activity(deviceID: phone)?.lastChange == at(1))
        #expect(table.counters.saved == 1)
    }

    @Test func aNewActivityTypeBecomesCurrent() {
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 7, type: reader), at: at(0))
        #expect(hear(&table, beacon(seq: 8, type: video), at: at(1)) == [.becameCurrent])
        #expect(table.activity(deviceID: phone)?.beacon.activityTypeHash == activityTypeHash(video.utf8))
        #expect(table.counters.becameCurrent == 2 && table.counters.saved == 0)
    }

    @Test func invalidateIsOneChangeThenSilence() {
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 7), at: at(0))
        #expect(hear(&table, beacon(seq: 8, flags: [.invalidated]), at: at(1)) == [.invalidated])
        #expect(table.activity(deviceID: phone)?.state == .invalidated)
        for s in 2...50 {
            #expect(hear(&table, beacon(seq: 8, flags: [.invalidated]), at: at(s)).isEmpty)
        }
        #expect(hear(&table, beacon(seq: 9, flags: [.invalidated]), at: at(51)).isEmpty, "still ended")
        #expect(table.counters.invalidated == 1)
        #expect(table.activity(deviceID: phone)?.lastSeen == at(51), "an ended activity's device is still heard")
        // A newer beacon without the flag: the device has a current activity again.
        #expect(hear(&table, beacon(seq: 10), at: at(52)) == [.becameCurrent])
        #expect(table.activity(deviceID: phone)?.state == .current)
    }

    @Test func invalidationIsFinalForItsSequence() {
        // A copy of the beacon sent just before the invalidation, heard late.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 7), at: at(0))
        #expect(hear(&table, beacon(seq: 7, flags: [.invalidated]), at: at(1)) == [.invalidated])
        #expect(hear(&table, beacon(seq: 7), at: at(2)).isEmpty)
        #expect(table.activity(deviceID: phone)?.state == .invalidated)
    }

    @Test func aDevicesFirstBeaconAlreadyInvalidatedIsKeptSilently() {
        var table = ActivityTable(config: .init())
        #expect(hear(&table, beacon(seq: 7, flags: [.invalidated]), at: at(0)).isEmpty, "nothing to clear")
        #expect(table.count == 1 && table.activity(deviceID: phone)?.state == .invalidated)
        #expect(hear(&table, beacon(seq: 6), at: at(1)).isEmpty, "an older replay cannot make it current")
        #expect(hear(&table, beacon(seq: 8), at: at(2)) == [.becameCurrent])
    }

    @Test func theSequenceWrapsFromFFFFTo0000() {
        // RFC 1982 §3.2: 0x0000 follows 0xFFFF.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 0xFFFF), at: at(0))
        #expect(hear(&table, beacon(seq: 0x0000), at: at(1)) == [.saved])
        #expect(hear(&table, beacon(seq: 0xFFFF), at: at(2)).isEmpty)
        #expect(table.activity(deviceID: phone)?.beacon.sequence == 0x0000)
        #expect(table.counters.staleSequence == 1)
    }

    @Test func anOlderSequenceIsIgnoredAndCounted() {
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        hear(&table, beacon(seq: 10), rssi: -50, address: 0xA1, at: at(0))
        let before = table.activity(deviceID: phone)
        #expect(hear(&table, beacon(seq: 9, type: video), rssi: -90, address: 0xA2, at: at(30)).isEmpty)
        #expect(table.activity(deviceID: phone) == before, "a replayed old beacon changes nothing, not even lastSeen")
        #expect(table.counters.staleSequence == 1 && table.counters.beaconsHeard == 2)
        #expect(table.nextExpiry == at(60), "and does not keep the entry alive")
    }

    @Test func halfTheSequenceSpaceAwayIsOlder() {
        // RFC 1982 leaves s + 2¹⁵ undefined; a beacon must be unambiguously newer to count.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 0x0010), at: at(0))
        #expect(hear(&table, beacon(seq: 0x8010), at: at(1)).isEmpty)
        #expect(hear(&table, beacon(seq: 0x800F), at: at(2)) == [.saved], "one less is newer")
        #expect(table.counters.staleSequence == 1)
    }

    @Test func visibleFlagsChangingInPlaceAreSaved() {
        // §2.2 bits 0–1 reach the activity topic, so a flip without a new sequence still does.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 7, flags: [.supportsStreams]), at: at(0))
        #expect(hear(&table, beacon(seq: 7, flags: [.supportsStreams, .hasWebURL]), at: at(1)) == [.saved])
        #expect(hear(&table, beacon(seq: 7, flags: [.supportsStreams, .hasWebURL]), at: at(2)).isEmpty)
        #expect(table.activity(deviceID: phone)?.beacon.flags.contains(.hasWebURL) == true)
    }

    @Test func aRelayedCopyIsIgnoredAndCounted() {
        // docs/table.md: a relayed copy says the device is in another room; it changes nothing
        // here, not even when the device was last heard, and a newer one makes no entry either.
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        hear(&table, beacon(seq: 7), at: at(0))
        var relayed = beacon(seq: 8, flags: [.supportsStreams, .relayed])
        relayed.psm = 0x0091
        #expect(hear(&table, relayed, at: at(30)).isEmpty)
        #expect(table.activity(deviceID: phone)?.beacon.sequence == 7 && table.activity(deviceID: phone)?.lastSeen == at(0))
        var stranger = beacon(seq: 1, flags: [.relayed])
        stranger.deviceID = 0x5A00_0000_00FF
        #expect(hear(&table, stranger, at: at(31)).isEmpty && table.count == 1)
        #expect(table.counters.relayed == 2)
    }

    @Test func anEntryExpiresExactlyAtLastSeenPlusExpiry() {
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        hear(&table, beacon(seq: 7), at: at(0))
        #expect(table.nextExpiry == at(60))
        #expect(expire(&table, at: at(60) - .nanoseconds(1)).isEmpty)
        #expect(table.count == 1)
        let gone = expire(&table, at: at(60))
        #expect(gone.map(\.kind) == [.expired])
        #expect(gone.first?.activity.deviceID == phone && gone.first?.activity.beacon.sequence == 7)
        #expect(table.count == 0 && table.activity(deviceID: phone) == nil && table.nextExpiry == nil)
        #expect(table.counters.expired == 1)
        #expect(hear(&table, beacon(seq: 7), at: at(61)) == [.becameCurrent], "back after expiry: current again")
    }

    @Test func anInvalidatedEntryExpiresToo() {
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        hear(&table, beacon(seq: 7), at: at(0))
        hear(&table, beacon(seq: 8, flags: [.invalidated]), at: at(5))
        let gone = expire(&table, at: at(65))
        #expect(gone.map(\.kind) == [.expired] && gone.first?.activity.state == .invalidated)
    }

    @Test func nextExpiryFollowsTheLeastRecentlyHeard() {
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        #expect(table.nextExpiry == nil)
        hear(&table, beacon(0xA, seq: 1), at: at(0))
        hear(&table, beacon(0xB, seq: 1), at: at(10))
        hear(&table, beacon(0xC, seq: 1, flags: [.invalidated]), at: at(15))
        #expect(table.nextExpiry == at(60))
        hear(&table, beacon(0xA, seq: 1), at: at(20))
        #expect(table.nextExpiry == at(70), "A was heard again: B is now the oldest")
        hear(&table, beacon(0xB, seq: 1), at: at(25))
        #expect(table.nextExpiry == at(75), "C, invalidated, is the oldest")
        let gone = expire(&table, at: at(80))
        #expect(gone.map(\.activity.deviceID) == [0xC, 0xA], "oldest first")
        #expect(table.nextExpiry == at(85))
    }

    // MARK: A full table (docs/table.md "A full table")

    @Test func capacityPlusOneTakesANewcomerOnlyWhenClearlyLouderThanTheWeakest() {
        var table = ActivityTable(config: .init(capacity: 3))
        hear(&table, beacon(0xA, seq: 1), rssi: -60, at: at(0))
        hear(&table, beacon(0xB, seq: 1), rssi: -70, at: at(1))
        hear(&table, beacon(0xC, seq: 1), rssi: -80, at: at(2))
        #expect(table.count == 3 && table.capacity == 3 && table.weakestGivable == -80)

        // −75 is 5 dB above the weakest (−80): not the 6 of `admitMargin`. Nothing changes, and
        // the beacon is counted.
        #expect(hear(&table, beacon(0xD, seq: 1), rssi: -75, at: at(3)).isEmpty)
        #expect(deviceIDs(table) == [0xA, 0xB, 0xC])
        #expect(table.counters.refusedWeaker == 1 && table.counters.evicted == 0)

        // −74 is 6 dB above it: the weakest goes, the newcomer comes.
        var changes: [ActivityChange] = []
        table.hear(beacon(0xD, seq: 1), rssi: -74, address: 0xD, addressType: 1, now: at(4)) { changes.append($0) }
        #expect(changes.map(\.kind) == [.evicted, .becameCurrent])
        #expect(changes.map(\.activity.deviceID) == [0xC, 0xD])
        #expect(deviceIDs(table) == [0xA, 0xB, 0xD])
        #expect(table.counters.evicted == 1 && table.weakestGivable == -74)
    }

    @Test func theWeakestIsTheWeakestBySmoothedRSSINotTheLeastRecentlyHeard() {
        var table = ActivityTable(config: .init(capacity: 2))
        hear(&table, beacon(0xA, seq: 1), rssi: -60, at: at(0))
        hear(&table, beacon(0xB, seq: 1), rssi: -90, at: at(1))
        // A walks away: its average follows it down, past B's.
        for s in 2...20 { hear(&table, beacon(0xA, seq: 1), rssi: -95, at: at(s)) }
        #expect(table.activity(deviceID: 0xA)?.rssi == -95 && table.weakestGivable == -95)
        var changes: [ActivityChange] = []
        table.hear(beacon(0xC, seq: 1), rssi: -89, address: 0xC, addressType: 1, now: at(21)) { changes.append($0) }
        #expect(changes.map(\.activity.deviceID) == [0xA, 0xC], "A, heard last, is now the weakest")
    }

    @Test func anOwnedEntryIsNeverGivenUp() {
        var table = ActivityTable(config: .init(capacity: 2))
        hear(&table, beacon(0xA, seq: 1), rssi: -90, at: at(0))
        hear(&table, beacon(0xB, seq: 1), rssi: -60, at: at(1))
        table.setOwned(0xA, true)
        #expect(table.ownedCount == 1 && table.weakestGivable == -60)
        // A is the weakest, but this room owns it: B goes for a newcomer 6 dB louder than B.
        var changes: [ActivityChange] = []
        table.hear(beacon(0xC, seq: 1), rssi: -54, address: 0xC, addressType: 1, now: at(2)) { changes.append($0) }
        #expect(changes.map(\.activity.deviceID) == [0xB, 0xC])
        table.setOwned(0xC, true)
        // Every entry owned: however loud the newcomer, nothing is given up.
        #expect(hear(&table, beacon(0xD, seq: 1), rssi: -30, at: at(3)).isEmpty)
        #expect(table.counters.refusedOwned == 1 && deviceIDs(table) == [0xA, 0xC])
        // A is given back: it is the weakest again.
        table.setOwned(0xA, false)
        #expect(table.weakestGivable == -90 && table.ownedCount == 1)
        #expect(hear(&table, beacon(0xD, seq: 1), rssi: -30, at: at(4)) == [.evicted, .becameCurrent])
        #expect(deviceIDs(table) == [0xC, 0xD])
    }

    @Test func anEntryTheRuleOwnsIsKeptEvenIfTheTableWasNotToldYet() {
        // The room's rule is asked only about the entry about to be given up (a device that
        // came back to a room still owning it is not marked until then).
        var table = ActivityTable(config: .init(capacity: 2))
        hear(&table, beacon(0xA, seq: 1), rssi: -90, at: at(0))
        hear(&table, beacon(0xB, seq: 1), rssi: -80, at: at(1))
        var asked: [UInt64] = []
        var changes: [ActivityChange] = []
        table.hear(beacon(0xC, seq: 1), rssi: -50, address: 0xC, addressType: 1, now: at(2),
                   owned: { asked.append($0); return $0 == 0xA }) { changes.append($0) }
        #expect(asked == [0xA, 0xB])
        #expect(changes.map(\.activity.deviceID) == [0xB, 0xC])
        #expect(table.ownedCount == 1, "A is kept from then on")
    }

    @Test func anInvalidatedEntryIsEvictedFirst() {
        var table = ActivityTable(config: .init(capacity: 3))
        hear(&table, beacon(0xA, seq: 1), rssi: -80, at: at(0))
        hear(&table, beacon(0xB, seq: 1), at: at(1))
        hear(&table, beacon(0xC, seq: 1), at: at(2))
        hear(&table, beacon(0xC, seq: 2, flags: [.invalidated]), at: at(3))
        // C is the most recently heard and louder than A, but has no retained topic to lose; it
        // goes for any newcomer, loud or not.
        var changes: [ActivityChange] = []
        table.hear(beacon(0xD, seq: 1), rssi: -95, address: 0xD, addressType: 1, now: at(4)) { changes.append($0) }
        #expect(changes.map(\.kind) == [.evicted, .becameCurrent])
        #expect(changes.first?.activity.deviceID == 0xC && changes.first?.activity.state == .invalidated)
        #expect(deviceIDs(table) == [0xA, 0xB, 0xD])
    }

    @Test func anAlreadyInvalidatedNewcomerNeverPushesOutACurrentActivity() {
        var table = ActivityTable(config: .init(capacity: 2))
        hear(&table, beacon(0xA, seq: 1), at: at(0))
        hear(&table, beacon(0xB, seq: 1), at: at(1))
        #expect(hear(&table, beacon(0xC, seq: 1, flags: [.invalidated]), rssi: -20, at: at(2)).isEmpty)
        #expect(deviceIDs(table) == [0xA, 0xB] && table.counters.evicted == 0)
        #expect(table.counters.refusedEnded == 1)
    }

    @Test func twentyDevicesOverATableOfEightHoldAStableSet() {
        // Issue 30: a room that hears more devices than it holds. Twenty still devices, 2 dB
        // apart (−50 … −88), each report ±3 dB of noise; the room owns two of the weakest. After
        // the first round the table holds what it owns and then the strongest, and a thousand
        // more rounds change nothing: no eviction, no change a subscriber would see.
        var rng = SplitMix(state: 30)
        var table = ActivityTable(config: .init(capacity: 8))
        let devices = (0..<20).map { UInt64(0x5B00_0000_0000 + $0) }
        let level = { (i: Int) -> Int in -50 - 2 * i }
        let owned: Set<UInt64> = [devices[17], devices[19]]
        var order = Array(devices.indices)
        func round(_ t: Int) -> [ActivityChangeKind] {
            order.shuffle(using: &rng)
            var kinds: [ActivityChangeKind] = []
            for i in order {
                let rssi = Int8(level(i) + Int.random(in: -3...3, using: &rng))
                table.hear(beacon(devices[i], seq: 1), rssi: rssi, address: devices[i], addressType: 1,
                           now: at(ms: t * 1000 + i), owned: { owned.contains($0) }) { kinds.append($0.kind) }
            }
            return kinds
        }
        // The room's rule settles on its two while the table fills.
        for i in [17, 19] { hear(&table, beacon(devices[i], seq: 1), rssi: Int8(level(i)), at: at(0)); table.setOwned(devices[i], true) }
        for t in 1...5 { _ = round(t) }
        let held = deviceIDs(table)
        #expect(held.count == 8 && owned.isSubset(of: held))
        // Stable: nobody outside is `admitMargin` louder than the weakest held that may go.
        let weakest = Int(table.weakestGivable ?? 0)
        for (i, d) in devices.enumerated() where !held.contains(d) {
            #expect(level(i) + 3 < weakest + ActivityTable.admitMargin, "\(d) at \(level(i)) dBm outside, weakest \(weakest)")
        }
        let evicted = table.counters.evicted
        var seen: [ActivityChangeKind] = []
        for t in 6...1005 { seen += round(t) }
        #expect(seen.isEmpty, "changes without a walk: \(seen.count)")
        #expect(table.counters.evicted == evicted && deviceIDs(table) == held)
        #expect(table.counters.refusedWeaker >= 1000 * 12, "every beacon of the twelve left out is counted")
    }

    @Test func rssi127IsNotASample() {
        // Core 5.4, Vol 4, Part E, §7.7.65.2: 127 = RSSI not available.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 1), rssi: 127, at: at(0))
        #expect(table.activity(deviceID: phone)?.rssi == 127, "no sample yet")
        hear(&table, beacon(seq: 1), rssi: -60, at: at(1))
        #expect(table.activity(deviceID: phone)?.rssi == -60, "the first sample initialises")
        hear(&table, beacon(seq: 1), rssi: 127, at: at(2))
        #expect(table.activity(deviceID: phone)?.rssi == -60)
        #expect(table.activity(deviceID: phone)?.lastRSSI == 127, "the raw value is kept as reported")
    }

    @Test func oneOutlierMovesTheAverageByAQuarter() {
        // A device heard every 100 ms (a sparse one weighs a half: below).
        var table = ActivityTable(config: .init())
        for tenth in 0..<10 { hear(&table, beacon(seq: 1), rssi: -60, at: at(ms: tenth * 100)) }
        hear(&table, beacon(seq: 1), rssi: -100, at: at(ms: 1000))
        #expect(table.activity(deviceID: phone)?.rssi == -70)
        #expect(table.activity(deviceID: phone)?.lastRSSI == -100)
    }

    @Test func smoothingConvergesOnASteadySignal() throws {
        // A person walks from the far end of the room (-40 → -80 dBm): the average follows
        // without overshoot and settles on the new level exactly.
        var table = ActivityTable(config: .init())
        hear(&table, beacon(seq: 1), rssi: -40, at: at(0))
        var readings: [Int8] = []
        for tenth in 1...30 {
            hear(&table, beacon(seq: 1), rssi: -80, at: at(ms: tenth * 100))
            readings.append(try #require(table.activity(deviceID: phone)?.rssi))
        }
        #expect(readings.first == -50)
        #expect(zip(readings, readings.dropFirst()).allSatisfy { $0 >= $1 && $1 >= -80 }, "\(readings)")
        #expect(readings[7] >= -77, "8 reports: 90 % of the way")
        #expect(readings.last == -80)
    }

    @Test func aDeviceHeardOnceASecondWeighsEachReportAHalf() throws {
        // docs/table.md "RSSI": from an interval of 0.7 s a report weighs 1/2, so a sensor that
        // walks is followed in 4 reports, where a quarter would take 8 (40 s at one in 5 s).
        var table = ActivityTable(config: .init())
        for s in 0..<3 { hear(&table, beacon(seq: 1), rssi: -40, at: at(s)) }
        var readings: [Int8] = []
        for s in 3..<9 {
            hear(&table, beacon(seq: 1), rssi: -80, at: at(s))
            readings.append(try #require(table.activity(deviceID: phone)?.rssi))
        }
        #expect(readings.first == -60, "half the way at once")
        #expect(readings[3] >= -77 && readings[3] < -75, "4 reports: 90 % of the way")
        #expect(zip(readings, readings.dropFirst()).allSatisfy { $0 >= $1 && $1 >= -80 }, "\(readings)")
        #expect(table.activity(deviceID: phone)?.interval == 1000)
    }

    @Test func aPhoneHeardTenTimesASecondKeepsTheQuarter() throws {
        var table = ActivityTable(config: .init())
        for tenth in 0..<3 { hear(&table, beacon(seq: 1), rssi: -40, at: at(ms: tenth * 100)) }
        hear(&table, beacon(seq: 1), rssi: -80, at: at(ms: 300))
        #expect(table.activity(deviceID: phone)?.rssi == -50)
    }

    @Test func forEachVisitsEveryEntryOnce() {
        var table = ActivityTable(config: .init(capacity: 10))
        for id in UInt64(1)...6 { hear(&table, beacon(id, seq: 1, flags: id.isMultiple(of: 2) ? [.invalidated] : []), at: at(Int(id))) }
        var seen: [UInt64] = []
        table.forEach { seen.append($0.deviceID) }
        #expect(seen.sorted() == [1, 2, 3, 4, 5, 6])
    }

    @Test func churnKeepsTheIndexAndTheListsInStep() {
        // Devices come, save, end, go quiet and get evicted at random; after every step the table
        // must find exactly the devices it lists. Deterministic, so a failure replays.
        var rng = SplitMix(state: 4)
        var table = ActivityTable(config: .init(capacity: 64, expiry: .seconds(5)))
        let population = (0..<300).map { _ in UInt64.random(in: 1...0xFFFF_FFFF_FFFF, using: &rng) }
        var sequence = [UInt16](repeating: 0, count: population.count)
        var evictedOrExpired = 0
        for step in 0..<20_000 {
            let n = Int.random(in: 0..<population.count, using: &rng)
            sequence[n] &+= UInt16.random(in: 0...1, using: &rng)
            let flags: BeaconFlags = Int.random(in: 0..<10, using: &rng) == 0 ? [.invalidated] : []
            let rssi = Int8.random(in: -100 ... -40, using: &rng)
            table.hear(beacon(population[n], seq: sequence[n], flags: flags), rssi: rssi, address: 1, addressType: 1,
                       now: at(ms: step * 10)) { if $0.kind == .evicted { evictedOrExpired += 1 } }
            if step % 97 == 0 { evictedOrExpired += expire(&table, at: at(ms: step * 10)).count }

            let listed = deviceIDs(table)
            #expect(listed.count == table.count && table.count <= 64)
            // The strength buckets agree with the entries: the weakest current one is found.
            var weakest: Int8?
            table.forEach { if $0.state == .current { weakest = min(weakest ?? $0.rssi, $0.rssi) } }
            #expect(table.weakestGivable == weakest)
            if step % 499 == 0 {
                for id in population {
                    #expect((table.activity(deviceID: id) != nil) == listed.contains(id))
                }
            }
        }
        #expect(evictedOrExpired > 0, "the test reached a full table")
        #expect(table.counters.evicted + table.counters.expired == evictedOrExpired)
        let remaining = table.count
        #expect(expire(&table, at: at(10_000)).count == remaining)
        #expect(table.count == 0 && table.nextExpiry == nil)
    }

    @Test func timeRunningBackwardsDoesNotReorderTheTable() {
        var table = ActivityTable(config: .init(expiry: .seconds(60)))
        hear(&table, beacon(0xA, seq: 1), at: at(10))
        hear(&table, beacon(0xB, seq: 1), at: at(5))
        #expect(table.activity(deviceID: 0xB)?.lastSeen == at(10), "clamped to the latest instant seen")
        #expect(table.nextExpiry == at(70))
    }

    @Test("A capacity of 0 is the config loader's bug: a precondition")
    func zeroCapacityTraps() async {
        await #expect(processExitsWith: .failure) {
            _ = ActivityTable(config: .init(capacity: 0))
        }
    }
}
