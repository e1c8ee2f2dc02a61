// Apple devices from their Continuity frames: docs/table.md "Apple devices", over the layouts
// of docs/protocol.md §4. Every frame is a whole advertisement as heard on air, in hex.
import BatonLibc
import BatonTestSupport
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Int) -> Instant { t0 + .seconds(seconds) }
private func at(ms: Int) -> Instant { t0 + .milliseconds(ms) }

// Flags AD `02 01 1A` as iPhones send it, then the Apple manufacturer AD: length, `FF`, `4C 00`.

/// An iPhone with a current activity: Handoff (§4.2: no clipboard, sequence 0x1234, tag 0xAB,
/// 10 encrypted bytes) and Nearby Info (§4.3).
private let phoneReading = """
    02 01 1A
    1A FF 4C 00
    0C 0E 00 34 12 AB 00 11 22 33 44 55 66 77 88 99
    10 05 1B 1C 7A 8D 2E
    """
/// The same iPhone after the user moved on: a new Handoff sequence 0x1235, tag and ciphertext.
private let phoneWatching = """
    02 01 1A
    1A FF 4C 00
    0C 0E 00 35 12 5C 0F 1E 2D 3C 4B 5A 69 78 87 96
    10 05 1B 1C 7A 8D 2E
    """
/// A Mac with universal clipboard data: Handoff only (clipboard 0x08, sequence 0x0042, tag 0x17).
let macHandoff = """
    02 01 1A
    13 FF 4C 00
    0C 0E 08 42 00 17 A0 A1 A2 A3 A4 A5 A6 A7 A8 A9
    """
/// An iPad with no current activity: Nearby Info only.
let padNearbyInfo = """
    02 01 1A
    0A FF 4C 00
    10 05 1B 1C 7A 8D 2E
    """
/// A device asking for a Wi-Fi password: Nearby Action (§4.4) only.
private let wifiNearbyAction = """
    02 01 1A
    0A FF 4C 00
    0F 05 90 00 B5 DA 60
    """
/// AirTag-style Find My (0x12) only: not a kind the table tracks.
private let findMyOnly = """
    02 01 06
    07 FF 4C 00
    12 02 00 01
    """

private let addressA: UInt64 = 0x4A_11_22_33_44_55
private let addressB: UInt64 = 0x5B_66_77_88_99_AA
private let addressC: UInt64 = 0x6C_12_34_56_78_9A

/// Decodes the advertisement as the gateway does (AdvertisementContent, protocol.md §1) and
/// hands its Continuity messages to the table. Returns the changes, in order.
@discardableResult
private func hear(_ table: inout AppleDeviceTable, _ advert: String, from address: UInt64, rssi: Int8 = -60,
                  at t: Instant) throws -> [AppleChange] {
    try hear(&table, hx(advert), from: address, rssi: rssi, at: t)
}

@discardableResult
private func hear(_ table: inout AppleDeviceTable, _ advert: [UInt8], from address: UInt64, rssi: Int8 = -60,
                  at t: Instant) throws -> [AppleChange] {
    var changes: [AppleChange] = []
    try advert.withUnsafeBytes { raw in
        let content = try AdvertisementContent.decode(raw)
        #expect(content.kind == .continuity)
        table.hear(content.continuityMessages, rssi: rssi, address: address, addressType: 1, now: t) { changes.append($0) }
    }
    return changes
}

func devices(_ table: borrowing AppleDeviceTable) -> [AppleDevice] {
    var all: [AppleDevice] = []
    table.forEach { all.append($0) }
    return all
}

func expire(_ table: inout AppleDeviceTable, at t: Instant) -> [AppleChange] {
    var changes: [AppleChange] = []
    table.expire(now: t) { changes.append($0) }
    return changes
}

@Suite struct AppleDeviceTableTests {
    @Test func aHandoffDeviceAppears() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, idKey: 0x0123_4567_89AB_CDEF))
        let changes = try hear(&table, phoneReading, from: addressA, rssi: -55, at: at(0))
        let d = try #require(changes.first?.device)
        #expect(changes.map(\.kind) == [.appeared])
        #expect(d.id != 0)
        #expect(d.kinds == [.handoff, .nearbyInfo])
        #expect(d.handoffSequence == 0x1234 && d.handoffChanged == at(0))
        #expect(d.address == addressA && d.addressType == 1 && d.addresses == 1)
        #expect(d.rssi == -55 && d.firstSeen == at(0) && d.lastSeen == at(0))
        #expect(table.count == 1 && table.counters.appeared == 1 && table.counters.framesHeard == 1)
    }

    @Test func identicalFramesChangeNothing() throws {
        var table = AppleDeviceTable(config: .init())
        try hear(&table, phoneReading, from: addressA, at: at(0))
        var changes = 0
        for i in 1...1_000 { changes += try hear(&table, phoneReading, from: addressA, at: at(ms: i * 100)).count }
        #expect(changes == 0)
        #expect(devices(table).first?.lastSeen == at(ms: 100_000))
        #expect(table.counters.framesHeard == 1_001)
    }

    @Test func theSameHandoffFromTwoAddressesIsOneDevice() throws {
        var table = AppleDeviceTable(config: .init())
        #expect(try hear(&table, phoneReading, from: addressA, at: at(0)).map(\.kind) == [.appeared])
        #expect(try hear(&table, phoneReading, from: addressB, at: at(1)).isEmpty)
        // Both addresses keep advertising for a while: back and forth, still one device.
        for s in 2...20 {
            #expect(try hear(&table, phoneReading, from: s.isMultiple(of: 2) ? addressA : addressB, at: at(s)).isEmpty)
        }
        let all = devices(table)
        #expect(all.count == 1)
        #expect(all.first?.addresses == 2, "two distinct addresses, however often they alternate")
        #expect(all.first?.address == addressA, "the latest address heard")
        #expect(table.counters.mergedAddresses == 1 && table.counters.appeared == 1)
    }

    @Test func rotationKeepsTheIdAndLeavesNoTrail() throws {
        // Apple rotates the random address about every 15 minutes; the Handoff frame stays the
        // same until the activity changes.
        var table = AppleDeviceTable(config: .init(expiry: .seconds(60)))
        let id = try #require(try hear(&table, phoneReading, from: addressA, at: at(0)).first?.device.id)
        try hear(&table, phoneReading, from: addressA, at: at(899))
        #expect(try hear(&table, phoneReading, from: addressB, at: at(900)).isEmpty)
        #expect(try hear(&table, phoneReading, from: addressC, at: at(1_800)).isEmpty)
        let all = devices(table)
        #expect(all.count == 1 && all.first?.id == id && all.first?.address == addressC && all.first?.addresses == 3)
        #expect(expire(&table, at: at(1_859)).isEmpty, "no stale entry for A or B expires later")
        // The oldest address is forgotten: a Nearby Info frame from A finds nothing to update.
        try hear(&table, padNearbyInfo, from: addressA, at: at(1_859))
        #expect(table.nextExpiry == at(1_860))
    }

    @Test func aNewHandoffSequenceIsHandoffChanged() throws {
        var table = AppleDeviceTable(config: .init())
        try hear(&table, phoneReading, from: addressA, at: at(0))
        let changes = try hear(&table, phoneWatching, from: addressA, at: at(30))
        #expect(changes.map(\.kind) == [.handoffChanged])
        #expect(changes.first?.device.handoffSequence == 0x1235 && changes.first?.device.handoffChanged == at(30))
        #expect(try hear(&table, phoneWatching, from: addressA, at: at(31)).isEmpty)
        #expect(table.counters.handoffChanged == 1)
    }

    @Test func rotationAfterANewActivityFollowsTheNewFrame() throws {
        var table = AppleDeviceTable(config: .init())
        try hear(&table, phoneReading, from: addressA, at: at(0))
        try hear(&table, phoneWatching, from: addressA, at: at(10))
        #expect(try hear(&table, phoneWatching, from: addressB, at: at(20)).isEmpty, "matched by the new frame")
        #expect(table.count == 1 && table.counters.mergedAddresses == 1)
    }

    @Test func trackingHandoffIgnoresADeviceWithoutHandoff() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff))
        #expect(try hear(&table, padNearbyInfo, from: addressB, at: at(0)).isEmpty)
        #expect(try hear(&table, wifiNearbyAction, from: addressC, at: at(0)).isEmpty)
        #expect(table.count == 0 && table.counters.framesHeard == 2)
    }

    @Test func otherFramesKeepAKnownHandoffDeviceAlive() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, expiry: .seconds(60)))
        try hear(&table, macHandoff, from: addressA, at: at(0))
        #expect(try hear(&table, padNearbyInfo, from: addressA, at: at(50)).map(\.kind) == [.kindsChanged])
        #expect(devices(table).first?.kinds == [.handoff, .nearbyInfo])
        #expect(table.nextExpiry == at(110))
    }

    @Test func trackingAllTakesNearbyInfoAndNearbyAction() throws {
        var table = AppleDeviceTable(config: .init(tracking: .all))
        #expect(try hear(&table, padNearbyInfo, from: addressA, at: at(0)).map(\.kind) == [.appeared])
        #expect(try hear(&table, wifiNearbyAction, from: addressB, at: at(0)).map(\.kind) == [.appeared])
        #expect(try hear(&table, findMyOnly, from: addressC, at: at(0)).isEmpty, "Find My is not tracked")
        let pad = try #require(devices(table).first { $0.address == addressA })
        #expect(pad.kinds == [.nearbyInfo] && pad.handoffSequence == nil && pad.handoffChanged == nil)
    }

    @Test func aFirstHandoffFromANearbyDeviceIsKindsChanged() throws {
        var table = AppleDeviceTable(config: .init(tracking: .all))
        try hear(&table, padNearbyInfo, from: addressA, at: at(0))
        let changes = try hear(&table, phoneReading, from: addressA, at: at(5))
        #expect(changes.map(\.kind) == [.kindsChanged])
        #expect(changes.first?.device.handoffSequence == 0x1234 && changes.first?.device.handoffChanged == at(5))
        #expect(table.counters.handoffChanged == 0)
    }

    @Test func trackingOffOnlyCounts() throws {
        var table = AppleDeviceTable(config: .init(tracking: .off))
        #expect(try hear(&table, phoneReading, from: addressA, at: at(0)).isEmpty)
        #expect(table.count == 0 && table.nextExpiry == nil && table.counters.framesHeard == 1)
    }

    @Test func silenceExpiresADeviceAtTheBoundary() throws {
        var table = AppleDeviceTable(config: .init(expiry: .seconds(60)))
        try hear(&table, phoneReading, from: addressA, at: at(0))
        try hear(&table, macHandoff, from: addressB, at: at(10))
        #expect(table.nextExpiry == at(60))
        #expect(expire(&table, at: at(60) - .nanoseconds(1)).isEmpty)
        let gone = expire(&table, at: at(60))
        #expect(gone.map(\.kind) == [.expired] && gone.first?.device.address == addressA)
        #expect(table.nextExpiry == at(70))
        #expect(expire(&table, at: at(70)).first?.device.address == addressB)
        #expect(table.count == 0 && table.counters.expired == 2)
        // Gone means gone: the same frame again is a new appearance.
        #expect(try hear(&table, phoneReading, from: addressB, at: at(71)).map(\.kind) == [.appeared])
    }

    @Test func capacityPlusOneEvictsTheLeastRecentlyHeard() throws {
        var table = AppleDeviceTable(config: .init(tracking: .all, capacity: 2))
        try hear(&table, phoneReading, from: addressA, at: at(0))
        try hear(&table, macHandoff, from: addressB, at: at(1))
        try hear(&table, phoneReading, from: addressA, at: at(2))
        let changes = try hear(&table, padNearbyInfo, from: addressC, at: at(3))
        #expect(changes.map(\.kind) == [.evicted, .appeared])
        #expect(changes.map(\.device.address) == [addressB, addressC])
        #expect(Set(devices(table).map(\.address)) == [addressA, addressC])
        #expect(table.count == 2 && table.capacity == 2 && table.counters.evicted == 1)
    }

    @Test func idsAreKeyedPseudonymsOfTheFirstAddress() throws {
        func firstID(_ key: UInt64, _ advert: String, _ address: UInt64) throws -> UInt32? {
            var table = AppleDeviceTable(config: .init(idKey: key))
            return try hear(&table, advert, from: address, at: at(0)).first?.device.id
        }
        let id = try #require(try firstID(7, phoneReading, addressA))
        #expect(try firstID(7, macHandoff, addressA) == id, "the same address and key: the same id")
        #expect(try firstID(8, phoneReading, addressA) != id, "another key: another id")
        #expect(try firstID(7, phoneReading, addressB) != id)
        #expect(UInt64(id) != addressA & 0xFFFF_FFFF && id != UInt32(truncatingIfNeeded: addressA >> 16))
    }

    @Test func rssiIsSmoothedAnd127IsNoSample() throws {
        var table = AppleDeviceTable(config: .init())
        // A phone heard every 100 ms: each report weighs a quarter (docs/table.md "RSSI").
        try hear(&table, phoneReading, from: addressA, rssi: 127, at: at(ms: 0))
        #expect(devices(table).first?.rssi == 127)
        try hear(&table, phoneReading, from: addressA, rssi: -60, at: at(ms: 100))
        try hear(&table, phoneReading, from: addressA, rssi: 127, at: at(ms: 200))
        try hear(&table, phoneReading, from: addressA, rssi: -100, at: at(ms: 300))
        #expect(devices(table).first?.rssi == -70)
    }

    @Test func churnWithRotationLeavesNothingBehind() throws {
        // 40 devices with 16 places; each rotates its address and changes its activity at
        // random. Deterministic, so a failure replays.
        var rng = SplitMix(state: 11)
        var table = AppleDeviceTable(config: .init(tracking: .handoff, capacity: 16, expiry: .seconds(5)))
        var address = (0..<40).map { _ in UInt64.random(in: 1...0xFFFF_FFFF_FFFF, using: &rng) }
        var sequence = (0..<40).map { UInt16($0) }
        var used = Set(address)
        for step in 0..<5_000 {
            let n = Int.random(in: 0..<40, using: &rng)
            if Int.random(in: 0..<20, using: &rng) == 0 { address[n] = UInt64.random(in: 1...0xFFFF_FFFF_FFFF, using: &rng) }
            if Int.random(in: 0..<20, using: &rng) == 0 { sequence[n] &+= 1 }
            used.insert(address[n])
            // §4.2: sequence (LE), tag 0xAB, ciphertext starting with the device number.
            let frame = hx("02 01 1A  13 FF 4C 00  0C 0E 00") + [UInt8(sequence[n] & 0xFF), UInt8(sequence[n] >> 8), 0xAB, UInt8(n)]
                + hx("11 22 33 44 55 66 77 88 99")
            try hear(&table, frame, from: address[n], at: at(ms: step * 10))
            if step % 50 == 0 { _ = expire(&table, at: at(ms: step * 10)) }
            let all = devices(table)
            #expect(all.count == table.count && table.count <= 16)
            #expect(Set(all.map(\.id)).count == all.count, "ids are unique")
        }
        _ = expire(&table, at: at(1_000))
        #expect(table.count == 0 && table.nextExpiry == nil)
        // Every address the table ever held is forgotten: Nearby Info from each finds nothing.
        for a in used { try hear(&table, padNearbyInfo, from: a, at: at(1_001)) }
        #expect(table.count == 0 && table.nextExpiry == nil)
    }
}
