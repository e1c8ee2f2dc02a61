// When a gateway sends its own sightings: docs/rooms.md §2 "When a sighting is sent". The
// defaults: heartbeat 2 s, step 3 dB no more often than every 0.5 s, lost after 10 s.
import BatonLibc
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Double) -> Instant { t0 + .milliseconds(Int((seconds * 1000).rounded())) }

private let phone: UInt64 = 0x5A12_3456_789A
private let laptop: UInt64 = 0x4B00_0000_0001

private func beacon(_ device: UInt64 = phone) -> ActivityBeacon {
    ActivityBeacon(sequence: 1, activityTypeHash: 1, groupHash: 1, deviceID: device, psm: 0x80)
}

/// One gateway's table and schedule.
private struct Gateway: ~Copyable {
    var table: ActivityTable
    var schedule: SightingSchedule

    init(capacity: Int = 8, expiry: Duration = .seconds(60)) {
        table = ActivityTable(config: .init(capacity: capacity, expiry: expiry))
        schedule = SightingSchedule(config: RoomsConfig(), capacity: capacity)
    }

    mutating func hear(_ device: UInt64 = phone, rssi: Int8, at t: Instant) {
        table.hear(beacon(device), rssi: rssi, address: device, addressType: 1, now: t) { _ in }
    }

    /// The sightings due at `t`, as "device rssi" pairs.
    mutating func due(at t: Instant) -> [DueSighting] {
        var out: [DueSighting] = []
        schedule.due(table: table, now: t) { out.append($0) }
        return out
    }
}

/// The sightings due at `t`, each with whether it is a newcomer's, when the best other room
/// hears the device at `best` and reach is 20 dB (docs/rooms.md §8.4).
private func withReach(_ g: inout Gateway, best: Int, _ t: Instant) -> [(DueSighting, Bool)] {
    var out: [(DueSighting, Bool)] = []
    g.schedule.dueMarkingNewcomers(table: g.table, apple: AppleDeviceTable(config: .init()), now: t,
                                   outOfReach: { _, rssi in rssi < best - 20 }) { out.append(($0, $1)) }
    return out
}

@Suite("Sighting schedule (docs/rooms.md §2)")
struct SightingScheduleTests {
    @Test func aDeviceHeardForTheFirstTimeIsDueAtOnce() {
        var g = Gateway()
        g.hear(rssi: -61, at: at(0))
        #expect(g.due(at: at(0)) == [DueSighting(device: phone, rssi: -61)])
        #expect(g.due(at: at(0)) == [], "sent: not due again at the same instant")
    }

    @Test func aSteadyDeviceGetsAHeartbeatEverySightingInterval() {
        var g = Gateway()
        var sent: [Double] = []
        for tenth in 0 ... 70 {
            let s = Double(tenth) / 10
            g.hear(rssi: -61, at: at(s))
            if !g.due(at: at(s)).isEmpty { sent.append(s) }
        }
        #expect(sent == [0, 2, 4, 6])
    }

    @Test func aMoveOfStepDBIsSentSoonerButNotBeforeMinInterval() throws {
        var g = Gateway()
        g.hear(rssi: -60, at: at(0))
        _ = g.due(at: at(0))
        // The table smooths: a −40 report moves the average by a quarter, to −55 (5 dB).
        g.hear(rssi: -40, at: at(0.2))
        #expect(g.due(at: at(0.2)) == [], "moved, but only 0.2 s after the last sighting")
        #expect(g.schedule.nextDeadline(table: g.table) == at(0.5))
        #expect(g.due(at: at(0.5)) == [DueSighting(device: phone, rssi: -55)])
        // A move below the step waits for the heartbeat.
        g.hear(rssi: -47, at: at(1.0))  // −55 + (−47 + 55) / 4 = −53: 2 dB
        #expect(g.due(at: at(1.0)) == [])
        #expect(g.schedule.nextDeadline(table: g.table) == at(2.5))
        // Heard 0.2 s apart at first, then once 0.8 s on: the interval estimate creeps to
        // 0.209 s. Silent 1.5 s since, seven intervals, three past the grace: 3 dB faded.
        #expect(g.due(at: at(2.5)) == [DueSighting(device: phone, rssi: -56)])
    }

    @Test func aDeviceNotHeardForLostAfterGetsOneNullThenSilence() {
        var g = Gateway()
        g.hear(rssi: -61, at: at(0))
        _ = g.due(at: at(0))
        #expect(g.due(at: at(8)).map(\.rssi) == [-61], "a heartbeat while still within lostAfter")
        #expect(g.schedule.nextDeadline(table: g.table) == at(10))
        #expect(g.due(at: at(9.9)) == [])
        #expect(g.due(at: at(10)) == [DueSighting(device: phone, rssi: nil)])
        #expect(g.due(at: at(10.5)) == [])
        var kept = g.schedule.lastSent(phone)
        #expect(kept == DueSighting(device: phone, rssi: nil), "remembered as not heard for a heartbeat")
        for s in [12.0, 20, 30] { #expect(g.due(at: at(s)) == [], "silent at \(s) s") }
        // Freed 2 s after its `rssi: null` (a `sighting-interval`): the walk passes it by.
        kept = g.schedule.lastSent(phone)
        #expect(kept == nil && g.schedule.count == 0)
        #expect(g.schedule.nextDeadline(table: g.table) == nil)
        // Heard again: due at once, like a first hearing.
        g.hear(rssi: -70, at: at(31))
        #expect(g.schedule.nextDeadline(table: g.table).map { $0 <= at(31) } == true)
        #expect(g.due(at: at(31)) == [DueSighting(device: phone, rssi: -65)],
                "smoothed, a report 31 s after the last weighing a half (docs/table.md \"RSSI\"): −61 + (−70 + 61) / 2")
    }

    @Test func aDeviceThatLeftTheTableGetsOneNull() {
        var g = Gateway(expiry: .seconds(5))
        g.hear(rssi: -61, at: at(0))
        g.hear(laptop, rssi: -80, at: at(0))
        _ = g.due(at: at(0))
        g.hear(laptop, rssi: -80, at: at(4))
        g.table.expire(now: at(5)) { _ in }  // the phone expires; the laptop stays
        #expect(g.schedule.nextDeadline(table: g.table).map { $0 <= at(5) } == true)
        #expect(g.due(at: at(5)) == [DueSighting(device: laptop, rssi: -80), DueSighting(device: phone, rssi: nil)],
                "the laptop's heartbeat, then the phone's null")
        #expect(g.due(at: at(5)) == [])
        #expect(g.schedule.count == 1)
    }

    @Test func aDeviceThatLeftAfterItsNullGetsNothingMore() {
        var g = Gateway(expiry: .seconds(30))
        g.hear(rssi: -61, at: at(0))
        _ = g.due(at: at(0))
        #expect(g.due(at: at(10)) == [DueSighting(device: phone, rssi: nil)])
        g.table.expire(now: at(30)) { _ in }
        #expect(g.due(at: at(30)) == [])
        #expect(g.schedule.count == 0)
    }

    @Test func resetMakesEverythingDueAgain() {
        var g = Gateway()
        g.hear(rssi: -61, at: at(0))
        g.hear(laptop, rssi: -80, at: at(0))
        _ = g.due(at: at(0))
        #expect(g.due(at: at(1)) == [])
        g.schedule.reset()
        #expect(Set(g.due(at: at(1)).map(\.device)) == [phone, laptop])
    }

    @Test func aDeviceWithoutRSSIIsSightedAtTheFloor() {
        // Core 5.4, Vol 4, Part E, §7.7.65.2: 127 is "RSSI not available". BlueZ's btvirt
        // reports nothing else (docs/vm.md): such a device is heard, at the weakest RSSI a
        // sighting carries, so a lone gateway owns it and any room that measures one wins.
        var g = Gateway()
        g.hear(rssi: 127, at: at(0))
        #expect(g.due(at: at(0)) == [DueSighting(device: phone, rssi: -127)])
        g.hear(rssi: -61, at: at(1))
        #expect(g.due(at: at(1)) == [DueSighting(device: phone, rssi: -61)])
    }

    @Test func rssiIsClampedToWhatASightingCarries() {
        var g = Gateway()
        g.hear(rssi: -128, at: at(0))
        #expect(g.due(at: at(0)) == [DueSighting(device: phone, rssi: -127)])
    }

    @Test func capacityPlusOneDevices() {
        // A full table of 2 gives up its weakest for a third device 6 dB louder (docs/table.md
        // "A full table"); the schedule says the one given up is no longer heard and sights the
        // newcomer. A newcomer not that loud is not in the table, so it is not sighted.
        var g = Gateway(capacity: 2)
        g.hear(1, rssi: -70, at: at(0))
        g.hear(2, rssi: -61, at: at(0.1))
        #expect(g.due(at: at(0.1)).count == 2)
        g.hear(3, rssi: -66, at: at(0.15))
        #expect(g.due(at: at(0.15)).isEmpty)
        g.hear(3, rssi: -62, at: at(0.2))
        #expect(g.due(at: at(0.2)) == [DueSighting(device: 1, rssi: nil), DueSighting(device: 3, rssi: -62)])
        #expect(g.schedule.count == 2)
    }

    @Test func nextDeadlineIsTheEarliestOfHeartbeatStepAndLoss() {
        var g = Gateway()
        #expect(g.schedule.nextDeadline(table: g.table) == nil)
        g.hear(rssi: -61, at: at(0))
        #expect(g.schedule.nextDeadline(table: g.table) == at(0), "first hearing: due since it was heard")
        _ = g.due(at: at(0))
        #expect(g.schedule.nextDeadline(table: g.table) == at(2), "the heartbeat")
        // Not heard any more: the heartbeat at 2 s still comes first, then the loss at 10 s.
        _ = g.due(at: at(2))
        _ = g.due(at: at(4))
        _ = g.due(at: at(6))
        _ = g.due(at: at(8))
        #expect(g.schedule.nextDeadline(table: g.table) == at(10))
    }

    // MARK: newcomers (docs/rooms.md §8.3)

    /// The sightings due at `t` with whether each is a newcomer's.
    private func dueMarked(_ g: inout Gateway, at t: Instant) -> [(DueSighting, Bool)] {
        var out: [(DueSighting, Bool)] = []
        g.schedule.dueMarkingNewcomers(table: g.table, apple: AppleDeviceTable(config: .init()), now: t) { out.append(($0, $1)) }
        return out
    }

    @Test func aDevicesFirstSightingAndItsFirstAfterRssiNullAreANewcomers() {
        var g = Gateway()
        g.hear(rssi: -61, at: at(0))
        var due = dueMarked(&g, at: at(0))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: -61)])
        #expect(due.map(\.1) == [true], "heard for the first time")
        let hears = g.schedule.hears(phone), sent = g.schedule.lastSent(phone)
        #expect(hears)
        #expect(sent == DueSighting(device: phone, rssi: -61))

        g.hear(rssi: -61, at: at(2))
        due = dueMarked(&g, at: at(2))
        #expect(due.map(\.1) == [false], "the heartbeat is not news")

        // Not heard after 2 s: `rssi: null` at 12 s, not a newcomer's.
        due = dueMarked(&g, at: at(12))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: nil)])
        #expect(due.map(\.1) == [false])
        let hearsNow = g.schedule.hears(phone), sentNow = g.schedule.lastSent(phone)
        #expect(!hearsNow)
        #expect(sentNow == DueSighting(device: phone, rssi: nil))

        // Heard again: a newcomer again.
        g.hear(rssi: -70, at: at(13))
        due = dueMarked(&g, at: at(13))
        #expect(due.map(\.0.device) == [phone] && due.first?.0.rssi != nil, "heard (smoothed RSSI)")
        #expect(due.map(\.1) == [true])
        let laptopSent = g.schedule.lastSent(laptop)
        #expect(laptopSent == nil, "never heard: not followed")
    }

    @Test func aDeviceFlappingInAndOutIsANewcomerAtMostOncePerSightingInterval() {
        // Lost after 300 ms, so it can come and go faster than the 2 s heartbeat.
        var g = Gateway()
        g.schedule = SightingSchedule(config: RoomsConfig(lostAfter: .milliseconds(300)), capacity: 8)
        g.hear(rssi: -61, at: at(0))
        #expect(dueMarked(&g, at: at(0)).map(\.1) == [true])
        #expect(dueMarked(&g, at: at(0.5)).map(\.0) == [DueSighting(device: phone, rssi: nil)])
        g.hear(rssi: -61, at: at(1))
        #expect(dueMarked(&g, at: at(1)).map(\.1) == [false], "within 2 s of the last newcomer sighting")
        #expect(dueMarked(&g, at: at(1.5)).map(\.0) == [DueSighting(device: phone, rssi: nil)])
        g.hear(rssi: -61, at: at(2.5))
        #expect(dueMarked(&g, at: at(2.5)).map(\.1) == [true], "2 s on: news again")
    }

    @Test func aDeviceOutOfReachIsWithdrawnOnceAndSentAgainWhenBackWithinReach() {
        // docs/rooms.md §8.4, with the default reach (20 dB) and step (3 dB). This gateway hears
        // the phone at −80 throughout; the best other room's sighting is `best`, first −70.
        var g = Gateway()
        var best = -70
        g.hear(rssi: -80, at: at(0))
        var due = withReach(&g, best: best, at(0))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: -80)], "within reach: sent")
        // The best room now hears it at −55: at the heartbeat this one is 25 dB below, and says
        // `rssi: null` once, not as a newcomer.
        best = -55
        g.hear(rssi: -80, at: at(2))
        due = withReach(&g, best: best, at(2))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: nil)])
        #expect(due.map(\.1) == [false])
        let hears = g.schedule.hears(phone)
        #expect(!hears, "withdrawn: this gateway no longer says it hears the phone")
        // Heartbeats go by: nothing.
        for s in [4.0, 6, 8] {
            g.hear(rssi: -80, at: at(s))
            #expect(withReach(&g, best: best, at(s)).isEmpty)
        }
        // The best room fades to −62: −80 is within 20 dB, but not a step more (−83 < −82).
        best = -62
        g.hear(rssi: -80, at: at(9))
        #expect(withReach(&g, best: best, at(9)).isEmpty, "no flapping at the edge of reach")
        // To −63: back, 8 s after it was withdrawn: the rooms hearing the phone still count this
        // one a neighbour (they keep one for 60 s), so it is no newcomer.
        best = -63
        g.hear(rssi: -80, at: at(10))
        due = withReach(&g, best: best, at(10))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: -80)])
        #expect(due.map(\.1) == [false])
        // Withdrawn again at 12 s, back at 50 s: they may have forgotten it, so it is news.
        best = -55
        g.hear(rssi: -80, at: at(12))
        #expect(withReach(&g, best: best, at(12)).map(\.0) == [DueSighting(device: phone, rssi: nil)])
        // Heard all along at −80 (a room silent for 38 s would have faded, `SilenceFade`).
        for s in stride(from: 14.0, through: 48, by: 2) {
            g.hear(rssi: -80, at: at(s))
            #expect(withReach(&g, best: best, at(s)).isEmpty)
        }
        best = -63
        g.hear(rssi: -80, at: at(50))
        due = withReach(&g, best: best, at(50))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: -80)])
        #expect(due.map(\.1) == [true])
        // Not heard any more while withdrawn: nothing more is owed.
        best = -55
        g.hear(rssi: -80, at: at(52))
        #expect(withReach(&g, best: best, at(52)).map(\.0) == [DueSighting(device: phone, rssi: nil)])
        #expect(withReach(&g, best: best, at(70)).isEmpty, "lost while withdrawn: no second `rssi: null`")
    }

    /// A withdrawn device heard louder than at the last look (by 2 dB or more) is looked at
    /// again after `sighting-min-interval`; heard no louder, only after `sighting-interval`.
    @Test func aWithdrawnDeviceHeardLouderIsLookedAtSooner() {
        var g = Gateway()
        g.hear(rssi: -80, at: at(0))
        #expect(withReach(&g, best: -55, at(0)).isEmpty, "first heard 25 dB below: not announced")
        // It walks in: heard at −50, half a second later it is looked at and back within reach.
        g.hear(rssi: -50, at: at(0.5))
        let back = withReach(&g, best: -55, at(0.5))
        #expect(back.count == 1 && back.first?.0.rssi.map { $0 >= -72 } == true, "\(back)")
        // Another phone heard no louder: not looked at for 2 s, though the best room has gone
        // quiet meanwhile (its sighting of the phone is −90 now).
        var h = Gateway()
        h.hear(rssi: -80, at: at(0))
        #expect(withReach(&h, best: -55, at(0)).isEmpty)
        h.hear(rssi: -80, at: at(1))
        #expect(withReach(&h, best: -90, at(1)).isEmpty, "1 s on and no louder: not looked at")
        h.hear(rssi: -80, at: at(2))
        #expect(withReach(&h, best: -90, at(2)).map(\.0) == [DueSighting(device: phone, rssi: -80)])
    }

    @Test func aDeviceFirstHeardOutOfReachIsNotAnnouncedUntilItComesWithinReach() {
        // docs/rooms.md §8.4: a phone at the edge of this room's hearing, 35 dB below the room
        // that owns it, costs the building nothing; walking closer, it is a newcomer.
        var g = Gateway()
        var best = -55
        g.hear(rssi: -90, at: at(0))
        #expect(withReach(&g, best: best, at(0)).isEmpty)
        let hears = g.schedule.hears(phone)
        #expect(!hears)
        for s in [2.0, 4, 6] {
            g.hear(rssi: -90, at: at(s))
            #expect(withReach(&g, best: best, at(s)).isEmpty)
        }
        // The best room fades to −73; heard no louder here, that is looked at with the next
        // heartbeat's look (2 s after the last), not at every 0.5 s.
        best = -73
        g.hear(rssi: -90, at: at(7))
        #expect(withReach(&g, best: best, at(7)).isEmpty, "1 s after the last look, and no louder")
        g.hear(rssi: -90, at: at(8))
        let due = withReach(&g, best: best, at(8))
        #expect(due.map(\.0) == [DueSighting(device: phone, rssi: -90)])
        #expect(due.map(\.1) == [true], "the rooms that hear it have not heard of this one yet")
        // Lost, then heard again out of reach: nothing at all.
        #expect(withReach(&g, best: best, at(18)).map(\.0) == [DueSighting(device: phone, rssi: nil)])
        best = -55
        g.hear(rssi: -90, at: at(20))
        #expect(withReach(&g, best: best, at(20)).isEmpty)
    }
}
