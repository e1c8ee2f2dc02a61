// Sightings over more than the activity table (docs/rooms.md §2, docs/security.md §10): the
// gateway hands the schedule two `SightingSource`s, the activity table and the Apple devices
// the user named by their IRK, so one room owns each; `due(now:each:)` takes any walk. The defaults: heartbeat 2 s,
// step 3 dB no more often than every 0.5 s, lost after 10 s.
import BatonLibc
import BatonTestSupport
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Double) -> Instant { t0 + .milliseconds(Int((seconds * 1000).rounded())) }

/// A Baton device's rotating id (docs/protocol.md §2.4).
private let reader: UInt64 = 0x5A12_3456_789A
private let laptop: UInt64 = 0x4B00_0000_0001
/// A named iPhone, published as `apple/f76dfa55`; rooms know it as ffff f76dfa55.
private let phone = AppleIdentity(index: 0, id: 0xF76D_FA55)
private let phoneInRooms = AppleDevice.roomsID(0xF76D_FA55)

private func beacon(_ device: UInt64) -> ActivityBeacon {
    ActivityBeacon(sequence: 1, activityTypeHash: 1, groupHash: 1, deviceID: device, psm: 0x80)
}

private func hear(_ table: inout ActivityTable, _ device: UInt64, rssi: Int8, at t: Instant) {
    table.hear(beacon(device), rssi: rssi, address: device, addressType: 1, now: t) { _ in }
}

/// The named phone heard from one of its resolvable private addresses, in an advertisement
/// with no Continuity frames.
private func hearPhone(_ apple: inout AppleDeviceTable, rssi: Int8, at t: Instant, address: UInt64 = 0x7081_940D_FBAA) {
    apple.hear(.empty, rssi: rssi, address: address, addressType: 1, identity: phone, now: t) { _ in }
}

/// `due` over both sources, as the gateway's loop calls it (RoomState.sendSightings).
private func due(_ schedule: inout SightingSchedule, _ table: borrowing ActivityTable, _ apple: borrowing AppleDeviceTable,
                 at t: Instant) -> [DueSighting] {
    var out: [DueSighting] = []
    schedule.due(table, apple, now: t) { out.append($0) }
    return out
}

/// `due` over a plain list.
private func due(_ schedule: inout SightingSchedule, _ devices: [SightedDevice], at t: Instant) -> [DueSighting] {
    var out: [DueSighting] = []
    schedule.due(now: t, each: { visit in devices.forEach(visit) }) { out.append($0) }
    return out
}

@Suite("Sightings of activities and named devices (docs/rooms.md §2)")
struct SightedDeviceTests {
    @Test func bothSourcesAreSighted() {
        var table = ActivityTable(config: .init(capacity: 8))
        var apple = AppleDeviceTable(config: .init(tracking: .handoff))
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 8 + 1)
        hear(&table, reader, rssi: -61, at: at(0))
        hearPhone(&apple, rssi: -70, at: at(0.1))
        // An unnamed Apple device is not sighted: rooms follow only what has a stable name.
        apple.hear(.empty, rssi: -50, address: 0x5F00_1122_3344, addressType: 1, now: at(0.1)) { _ in }
        #expect(schedule.nextDeadline(table, apple) == at(0), "never walked: due from when first heard")
        #expect(due(&schedule, table, apple, at: at(0.1))
                == [DueSighting(device: reader, rssi: -61), DueSighting(device: phoneInRooms, rssi: -70)])
        #expect(due(&schedule, table, apple, at: at(0.1)) == [], "sent: not due again at once")
        #expect(schedule.nextDeadline(table, apple) == at(2.1), "the heartbeat")
        // Both keep being heard; the phone from its next address, a step of 3 dB louder.
        hear(&table, reader, rssi: -61, at: at(1.5))
        // Heard 1.4 s apart, the report weighs a half (docs/table.md "RSSI"): −70 + (−58 + 70) / 2 = −64.
        hearPhone(&apple, rssi: -58, at: at(1.5), address: 0x4A11_2233_4455)
        #expect(schedule.nextDeadline(table, apple) == at(0.6), "the phone moved by the step: due after minInterval")
        #expect(due(&schedule, table, apple, at: at(1.5)) == [DueSighting(device: phoneInRooms, rssi: -64)])
        #expect(due(&schedule, table, apple, at: at(2.1)) == [DueSighting(device: reader, rssi: -61)])
        // The phone falls silent; the reader goes on.
        for s in stride(from: 2.0, through: 12, by: 1) { hear(&table, reader, rssi: -61, at: at(s)) }
        var phoneSent: [(Double, Int8?)] = [], readerSent: [Double] = []
        for tenth in 22...125 {
            for d in due(&schedule, table, apple, at: at(Double(tenth) / 10)) {
                if d.device == phoneInRooms { phoneSent.append((Double(tenth) / 10, d.rssi)) } else { readerSent.append(Double(tenth) / 10) }
            }
        }
        #expect(phoneSent.map(\.0) == [3.5, 5.5, 7.5, 9.5, 11.5], "heartbeats while within lostAfter, then lost")
        // Heard 1.4 s apart, then silent: past four intervals (7.1 s) it fades a dB an interval.
        #expect(phoneSent.map(\.1) == [-64, -64, -64, -65, nil], "one null, 10 s after last heard at 1.5 s")
        #expect(readerSent == [4.1, 6.1, 8.1, 10.1, 12.1])
        #expect(schedule.count == 2)
    }

    @Test func aDeviceThatVanishesFromEachGetsOneNull() {
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 4)
        var devices = [SightedDevice(deviceID: reader, rssi: -61, lastSeen: at(0)),
                       SightedDevice(deviceID: phoneInRooms, rssi: -70, lastSeen: at(0))]
        #expect(due(&schedule, devices, at: at(0)).count == 2)
        devices.removeAll { $0.deviceID == phoneInRooms }  // evicted, expired, or IRK removed
        #expect(schedule.nextDeadline(each: { visit in devices.forEach(visit) }).map { $0 <= at(0.1) } == true)
        #expect(due(&schedule, devices, at: at(0.1)) == [DueSighting(device: phoneInRooms, rssi: nil)])
        #expect(due(&schedule, devices, at: at(0.2)) == [])
        #expect(schedule.count == 1)
        // Back: like a first hearing.
        devices.append(SightedDevice(deviceID: phoneInRooms, rssi: -72, lastSeen: at(0.3)))
        #expect(due(&schedule, devices, at: at(0.3)) == [DueSighting(device: phoneInRooms, rssi: -72)])
    }

    @Test func aDeviceWithoutRSSIIsSightedAtTheFloor() {
        // Core 5.4, Vol 4, Part E, §7.7.65.2: 127 is "RSSI not available". Such a device is
        // heard, at −127, so some room owns it, and any room that measures one beats it.
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 4)
        let silent = [SightedDevice(deviceID: phoneInRooms, rssi: 127, lastSeen: at(0))]
        #expect(due(&schedule, silent, at: at(0)) == [DueSighting(device: phoneInRooms, rssi: -127)])
        // A named device whose reports carry no RSSI, through the Apple table.
        var table = ActivityTable(config: .init(capacity: 4))
        var apple = AppleDeviceTable(config: .init())
        var gateway = SightingSchedule(config: RoomsConfig(), capacity: 5)
        hearPhone(&apple, rssi: 127, at: at(0))
        hear(&table, reader, rssi: 127, at: at(0))
        #expect(due(&gateway, table, apple, at: at(0))
                == [DueSighting(device: reader, rssi: -127), DueSighting(device: phoneInRooms, rssi: -127)])
        // Its first measured RSSI is a move far beyond the step.
        hearPhone(&apple, rssi: -60, at: at(0.2))
        #expect(due(&gateway, table, apple, at: at(0.5)) == [DueSighting(device: phoneInRooms, rssi: -60)])
    }

    @Test func capacityPlusOneDevicesWaitForARoom() {
        // A schedule smaller than what `each` hands it sights the first `capacity` devices; the
        // rest wait until one leaves (the gateway sizes it as table capacity + IRKs).
        var schedule = SightingSchedule(config: RoomsConfig(), capacity: 2)
        var devices = [SightedDevice(deviceID: reader, rssi: -61, lastSeen: at(0)),
                       SightedDevice(deviceID: laptop, rssi: -80, lastSeen: at(0)),
                       SightedDevice(deviceID: phoneInRooms, rssi: -70, lastSeen: at(0))]
        #expect(due(&schedule, devices, at: at(0)).map(\.device) == [reader, laptop])
        #expect(schedule.count == 2)
        devices.removeFirst()
        #expect(due(&schedule, devices, at: at(0.1))
                == [DueSighting(device: reader, rssi: nil), DueSighting(device: phoneInRooms, rssi: -70)],
                "the departed device's null first, then the waiting one takes its place")
        #expect(schedule.count == 2)
    }

    @Test func theTableWrapperGivesTheSameSightings() {
        // SightingScheduleTests.aDeviceThatLeftTheTableGetsOneNull, through both APIs.
        var table = ActivityTable(config: .init(capacity: 8, expiry: .seconds(5)))
        var byTable = SightingSchedule(config: RoomsConfig(), capacity: 8)
        var byEach = SightingSchedule(config: RoomsConfig(), capacity: 8)
        func both(_ t: Instant) -> [DueSighting] {
            var a: [DueSighting] = [], b: [DueSighting] = []
            byTable.due(table: table, now: t) { a.append($0) }
            byEach.due(now: t, each: { visit in table.forEach { visit(SightedDevice($0)) } }) { b.append($0) }
            #expect(a == b)
            #expect(byTable.nextDeadline(table: table) == byEach.nextDeadline(each: { visit in table.forEach { visit(SightedDevice($0)) } }))
            return a
        }
        hear(&table, reader, rssi: -61, at: at(0))
        hear(&table, laptop, rssi: -80, at: at(0))
        #expect(both(at(0)).count == 2)
        hear(&table, laptop, rssi: -80, at: at(4))
        table.expire(now: at(5)) { _ in }
        #expect(both(at(5)) == [DueSighting(device: laptop, rssi: -80), DueSighting(device: reader, rssi: nil)])
        #expect(both(at(5)) == [])
    }

    @Test func everyFormGivesTheSameSightingsUnderChurn() {
        // Eight Baton devices through a table of four (a full table's refusals and evictions, expiry, silence, moves,
        // no-RSSI reports) and two named phones beside an unnamed Mac. Each step runs
        //   - the table alone through `due(table:)` and through `due(now:each:)`;
        //   - both sources through `due(_:_:now:)` and through `due(now:each:)` over both.
        // Deterministic, so a failure replays.
        var rng = SplitMix(state: 27)
        var table = ActivityTable(config: .init(capacity: 4, expiry: .seconds(15)))
        var apple = AppleDeviceTable(config: .init(tracking: .handoff, capacity: 4, expiry: .seconds(15)))
        let named = [phone, AppleIdentity(index: 1, id: 0x5E13_B289)]
        var byTable = SightingSchedule(config: RoomsConfig(), capacity: 4)
        var byTableEach = SightingSchedule(config: RoomsConfig(), capacity: 4)
        var byBoth = SightingSchedule(config: RoomsConfig(), capacity: 4 + 2)
        var byBothEach = SightingSchedule(config: RoomsConfig(), capacity: 4 + 2)
        var tableOnly: [DueSighting] = [], both: [DueSighting] = []
        var disagreements = 0
        // Device 1's first reports carry no RSSI, into a table with room: a full table takes a
        // newcomer only 6 dB above its weakest (docs/table.md), which −127 never is.
        for tenth in 0..<3 { hear(&table, 1, rssi: 127, at: at(Double(tenth) / 100)) }
        for tenth in 0..<1_200 {
            let now = at(Double(tenth) / 10)
            let rssi: Int8 = Int.random(in: 0..<10, using: &rng) == 0 ? 127 : Int8.random(in: -95 ... -35, using: &rng)
            switch Int.random(in: 0..<6, using: &rng) {
            case 0, 1:
                // Device 8 falls silent after 30 s, so it is lost, then expires.
                let device = UInt64(Int.random(in: 1...8, using: &rng))
                if device != 8 || tenth < 300 { hear(&table, device, rssi: rssi, at: now) }
            case 2:
                // The watch falls silent after 60 s.
                let n = Int.random(in: 0...1, using: &rng)
                if n == 0 || tenth < 600 {
                    let address = 0x4000_0000_0000 | UInt64(Int.random(in: 1...3, using: &rng))
                    apple.hear(.empty, rssi: rssi, address: address, addressType: 1, identity: named[n], now: now) { _ in }
                }
            case 3:
                apple.hear(.empty, rssi: rssi, address: 0x5F00_1122_3344, addressType: 1, now: now) { _ in }
            default:
                break
            }
            if tenth % 10 == 0 {
                table.expire(now: now) { _ in }
                apple.expire(now: now) { _ in }
            }
            var a: [DueSighting] = [], b: [DueSighting] = [], c: [DueSighting] = [], d: [DueSighting] = []
            byTable.due(table: table, now: now) { a.append($0) }
            byTableEach.due(now: now, each: { visit in table.forEach { visit(SightedDevice($0)) } }) { b.append($0) }
            byBoth.due(table, apple, now: now) { c.append($0) }
            byBothEach.due(now: now, each: { visit in
                table.forEachSighted(visit)
                apple.forEachSighted(visit)
            }) { d.append($0) }
            if a != b || byTable.nextDeadline(table: table)
                != byTableEach.nextDeadline(each: { visit in table.forEach { visit(SightedDevice($0)) } }) {
                disagreements += 1
            }
            if c != d || byBoth.nextDeadline(table, apple) != byBothEach.nextDeadline(each: { visit in
                table.forEachSighted(visit)
                apple.forEachSighted(visit)
            }) {
                disagreements += 1
            }
            // The named phones are the only difference between the two pairs.
            // (Within one pass the order of two devices' sightings may differ: each schedule
            // lists departures in its own slot order.)
            if a.sorted(by: { $0.device < $1.device }) != c.filter({ $0.device >> 32 != 0xFFFF }).sorted(by: { $0.device < $1.device }) {
                disagreements += 1
            }
            tableOnly += a
            both += c
        }
        #expect(disagreements == 0)
        // The walk exercised what it claims to.
        #expect(tableOnly.contains { $0.rssi == nil } && tableOnly.contains { $0.rssi == -127 } && tableOnly.count > 100)
        #expect(tableOnly.contains { $0.device == 8 && $0.rssi == nil })
        #expect(both.contains { $0.device == phoneInRooms && $0.rssi != nil })
        #expect(both.contains { $0.device == AppleDevice.roomsID(0x5E13_B289) && $0.rssi == nil }, "the watch was lost")
        #expect(!both.contains { $0.device >> 32 == 0xFFFF && $0.device != phoneInRooms
                                 && $0.device != AppleDevice.roomsID(0x5E13_B289) }, "the unnamed Mac is never sighted")
    }
}
