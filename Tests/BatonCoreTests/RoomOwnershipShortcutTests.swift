// The rule skips the sightings that cannot change its decision (RoomOwnership.cannotMatter):
// the heartbeats of rooms that neither own a device nor challenge its owner. These tests run
// the same random building through the rule twice, once evaluating every sighting as before,
// and ask for the same changes, at the same instants, in the same order.
import BatonLibc
import Testing
import BatonTestSupport
import BatonWire
@testable import BatonCore

@Suite struct RoomOwnershipShortcutTests {
    /// Six rooms, 24 devices, 60 s in steps of 10–60 ms: each step ticks both rules, then
    /// sends one room's sighting of one device (now and then `rssi: null`), and now and then
    /// takes a room offline or brings it back. Each device has a home room and heard levels
    /// that drift under noise, so owners settle, are challenged, move and are taken over.
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func skippingSightingsThatCannotMatterChangesNothing(_ seed: UInt64) {
        let rooms = ["a", "b", "c", "d", "e", "f"]
        let config = RoomsConfig()
        var fast = RoomOwnership(config: config, selfID: "a", selfSince: 1_795_430_000_000)
        var full = RoomOwnership(config: config, selfID: "a", selfSince: 1_795_430_000_000)
        full.evaluatesEverySighting = true
        var fastChanges: [String] = [], fullChanges: [String] = []
        func note(_ list: inout [String], _ c: OwnershipChange, _ t: Int) {
            list.append("\(t) \(String(c.device, radix: 16)) \(c.from?.index ?? -1)→\(c.to?.index ?? -1) \(c.reason)")
        }
        let t0 = Instant.now
        for r in rooms {
            fast.status(gateway: Substring(r), online: true, now: t0) { _ in }
            full.status(gateway: Substring(r), online: true, now: t0) { _ in }
        }
        var rng = SplitMix(state: seed)
        func below(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
        var level = (0 ..< 24 * rooms.count).map { i in -50 - 12 * ((i % rooms.count + i / rooms.count) % rooms.count) }
        var counter = Array(repeating: UInt64(0), count: rooms.count)
        var online = Array(repeating: true, count: rooms.count)
        var ms = 0
        var skipped = 0, sightings = 0
        while ms < 60_000 {
            ms += 10 + below(51)
            let now = t0 + .milliseconds(ms)
            fast.tick(now: now) { note(&fastChanges, $0, ms) }
            full.tick(now: now) { note(&fullChanges, $0, ms) }
            if below(400) == 0 {
                let r = 1 + below(rooms.count - 1)  // never this gateway, "a"
                online[r].toggle()
                fast.status(gateway: Substring(rooms[r]), online: online[r], now: now) { note(&fastChanges, $0, ms) }
                full.status(gateway: Substring(rooms[r]), online: online[r], now: now) { note(&fullChanges, $0, ms) }
                continue
            }
            let r = below(rooms.count), d = below(24)
            guard online[r] else { continue }
            // The device's level in this room drifts by up to ±4 dB a sighting, and each
            // sighting adds up to ±7 dB of noise: challengers lead, dip and lead again.
            let i = d * rooms.count + r
            level[i] = max(-100, min(-40, level[i] + below(9) - 4))
            let rssi: Int8? = below(30) == 0 ? nil : Int8(level[i] + below(15) - 7)
            counter[r] += 1
            sightings += 1
            let s = Sighting(rssi: rssi, since: 1_795_430_000_000, n: counter[r])
            let device = 0x5B00_0000_0000 + UInt64(d)
            let accepted = fast.counters.sightingsAccepted
            let evaluatedBefore = fastChanges.count
            _ = fast.sighting(s, gateway: Substring(rooms[r]), device: device, now: now) { note(&fastChanges, $0, ms) }
            _ = full.sighting(s, gateway: Substring(rooms[r]), device: device, now: now) { note(&fullChanges, $0, ms) }
            if fast.counters.sightingsAccepted > accepted, fastChanges.count == evaluatedBefore,
               fast.wouldSkip(device: device, from: rooms[r], rssi: rssi, now: now) { skipped += 1 }
            #expect(fastChanges == fullChanges, "seed \(seed), at \(ms) ms")
            if fastChanges != fullChanges { return }
        }
        #expect(fastChanges.count > 50, "the walk moved devices: \(fastChanges.count) changes")
        #expect(Set(fastChanges.map { $0.split(separator: " ")[3] }).isSuperset(of: ["settled", "stronger", "takeover"]))
        #expect(skipped * 3 > sightings, "a third or more were skipped: \(skipped) of \(sightings)")
        for d in 0 ..< 24 {
            #expect(fast.owner(of: 0x5B00_0000_0000 + UInt64(d)) == full.owner(of: 0x5B00_0000_0000 + UInt64(d)))
        }
    }
}

extension RoomOwnership {
    /// Whether `cannotMatter` holds for this room's sighting of `device`, as taken in at `now`.
    fileprivate func wouldSkip(device: UInt64, from gateway: String, rssi: Int8?, now: Instant) -> Bool {
        guard let d = index.find(device).map({ Int($0) }), let g = find(Substring(gateway)) else { return false }
        return cannotMatter(d, from: g, rssi: rssi, now: now)
    }
}
