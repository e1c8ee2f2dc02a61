// Silence is evidence (docs/table.md "RSSI", docs/rooms.md §3 "The evidence"): a room that
// stops hearing a device, or hears only a few of its reports, loses its level at a stated rate,
// one dB per advertising interval missed past a grace of four.
import BatonLibc
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Double) -> Instant { t0 + .milliseconds(Int((seconds * 1000).rounded())) }
private let phone: UInt64 = 0x5A12_3456_789A
private let beacon = ActivityBeacon(sequence: 1, activityTypeHash: 1, groupHash: 1, deviceID: phone, psm: 0x80)

private func hear(_ table: inout ActivityTable, _ rssi: Int8, at t: Instant) {
    table.hear(beacon, rssi: rssi, address: phone, addressType: 1, now: t) { _ in }
}

private func sent(_ schedule: inout SightingSchedule, _ table: borrowing ActivityTable, at t: Instant) -> Int8?? {
    var out: Int8?? = nil
    schedule.due(table: table, now: t) { out = .some($0.rssi) }
    return out
}

@Suite("Silence fades a level (docs/table.md \"RSSI\")")
struct SilenceFadeTests {
    @Test func theFadeIsADBAnIntervalPastFourIntervals() {
        // 100 ms: nothing for four intervals, then a dB per interval.
        #expect(SilenceFade.dB(silent: 400_000_000, interval: 100) == 0)
        #expect(SilenceFade.dB(silent: 499_000_000, interval: 100) == 0)
        #expect(SilenceFade.dB(silent: 500_000_000, interval: 100) == 1)
        #expect(SilenceFade.dB(silent: 1_400_000_000, interval: 100) == 10)
        // A sensor every 5 s: 1 dB after 25 s of silence.
        #expect(SilenceFade.dB(silent: 24_999_000_000, interval: 5000) == 0)
        #expect(SilenceFade.dB(silent: 25_000_000_000, interval: 5000) == 1)
        // An unknown interval (one report so far) fades nothing; faster than 100 ms counts as 100 ms.
        #expect(SilenceFade.dB(silent: 60_000_000_000, interval: 0) == 0)
        #expect(SilenceFade.dB(silent: 500_000_000, interval: 20) == 1)
    }

    @Test func theIntervalIsTheShortestGapCreepingUpWhenTheDeviceSlows() {
        var i = SilenceFade.track(0, gap: 300_000_000)
        #expect(i == 300)
        i = SilenceFade.track(i, gap: 100_000_000)
        #expect(i == 100, "a room that misses reports sees multiples of the interval, never less")
        i = SilenceFade.track(i, gap: 1_700_000_000)
        #expect(i == 125, "a 64th of the way to a longer gap")
    }

    @Test func aSilentDevicesSightingFadesAndIsSentOnceItHasMovedByTheStep() {
        // Heard at −60 every 100 ms for a second, then silent. Its sighting is due again once the
        // fade reaches the step (3 dB): 0.4 s of grace + 3 intervals after 1.0 s, and the
        // schedule says so. The `null` still comes after lost-after (10 s).
        var table = ActivityTable(config: .init(capacity: 4))
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 4)
        for tenth in 0 ... 10 { hear(&table, -60, at: at(Double(tenth) / 10)) }
        #expect(sent(&schedule, table, at: at(1.0)) == .some(-60))
        #expect(schedule.nextDeadline(table: table) == at(1.7))
        #expect(sent(&schedule, table, at: at(1.6)) == nil)
        #expect(sent(&schedule, table, at: at(1.7)) == .some(-63))
        #expect(sent(&schedule, table, at: at(2.2)) == .some(-68), "a step further each min-interval")
        #expect(sent(&schedule, table, at: at(11.0)) == .some(nil))
    }
}
