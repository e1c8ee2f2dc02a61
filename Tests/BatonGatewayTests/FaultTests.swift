// Issue 16: faults injected into a building of three rooms, twenty devices and one gateway per
// room, on a real mosquitto (persistence off, no logins). The simulator's event lines are the
// ground truth: after each fault the retained activities must be exactly the truth (every
// device once, in its room, at its latest sequence) within 2 s of the broker's or the
// gateway's return, and stay so. Each test prints its measured times as `FAULT …` lines.
//
// Real time (speed 1) with the default room parameters (docs/rooms.md §3), because the faults
// are measured against real timeouts: the broker's keepalive (1.5 × 5 s) and a 3 s outage.
import BatonTestSupport
import Foundation
import Testing

@Suite(.serialized) struct FaultTests {
    /// Issue 16 case 1: mosquitto killed (-9) and started again on its port 3 s later, twice;
    /// then stopped as `systemctl restart mosquitto` does (SIGTERM), which also delivers every
    /// gateway's will `offline` to whoever is still connected, so the gateways see each other
    /// leave and take each other's devices on the way down. Without persistence the broker
    /// returns empty; every gateway reconnects and must republish exactly what it owns, and
    /// nothing it does not.
    @Test func brokerKilledTwiceThenStoppedLeavesTheTruthEachTime() throws {
        let rig = try FaultRig("broker-restart", duration: 90)
        try #require(try rig.settled(), "the building never held the truth before the fault")
        for round in 1...3 {
            if round < 3 { rig.broker.kill() } else { rig.broker.stop() }
            sleep(3)
            try rig.broker.restart()
            let returned = Date()
            let statuses = try StatusWatcher(port: rig.broker.port, in: rig.dir, name: "status-\(round)")
            let watcher = try ActivityWatcher(port: rig.broker.port, in: rig.dir, name: "watch-\(round)")
            try rig.expectConverges("broker-restart \(round)", since: returned, watcher: watcher)
            // Issue 16 case 2: how long each gateway took to be back (its `online` arrived).
            rig.report("broker-restart \(round): online again after the broker's return: \(statuses.report(since: returned))")
        }
        rig.report(String(format: "test took %.1f s", Date().timeIntervalSince(rig.started)))
    }

    /// Issue 16 case 1, frozen: the kitchen's gateway stopped (SIGSTOP) for 20 s with its
    /// socket open, as a hung Pi or a cut cable gives, then continued. While it is frozen its
    /// devices move to the next rooms (the broker drops it after 1.5 × keepalive, its will
    /// says `offline`); after the thaw the truth must be back within 2 s.
    @Test func aGatewayFrozenFor20sThenThawedLeavesTheTruth() throws {
        let rig = try FaultRig("freeze", duration: 90)
        try #require(try rig.settled(), "the building never held the truth before the fault")
        let kitchen = rig.gateways["kitchen"]!
        let frozen = Date()
        kitchen.signal(SIGSTOP)
        let (movedAt, willAt) = try rig.watchHandOver(of: "kitchen", since: frozen, bound: 19.5)
        // The hand-over the issue saw working: devices moved in 3.5–4.8 s, the will at 8.5 s.
        #expect(movedAt != nil, "the frozen kitchen's devices were never handed over")
        #expect(willAt != nil, "the frozen kitchen's will never came")
        let rest = 20 - Date().timeIntervalSince(frozen)
        if rest > 0 { usleep(UInt32(rest * 1_000_000)) }
        let statuses = try StatusWatcher(port: rig.broker.port, in: rig.dir, name: "status-thaw")
        let watcher = try ActivityWatcher(port: rig.broker.port, in: rig.dir, name: "watch-thaw")
        kitchen.signal(SIGCONT)
        let thawed = Date()
        try rig.expectConverges("thaw", since: thawed, watcher: watcher)
        rig.report("thaw: online again after the thaw: \(statuses.report(since: thawed, gateways: ["kitchen"]))")
        #expect(kitchen.isRunning, "the kitchen's gateway died after the thaw:\n\(kitchen.log)")
        rig.report(String(format: "test took %.1f s", Date().timeIntervalSince(rig.started)))
    }

    /// Issue 16: the kitchen's gateway SIGKILLed (the broker sends its will at once, the
    /// socket being closed), then started again with the same config once the will is out.
    ///
    /// Here and after a thaw the rooms that stood in for the kitchen would keep its devices
    /// until it had led by `margin` for `dwell` (3 s) under docs/rooms.md §3 alone; §7's
    /// `returned` hands them back as soon as its first sightings arrive. The time is measured
    /// from the process's start, not from its `online`: its own settle (1 s) is in it.
    @Test func aGatewayKilledThenRestartedLeavesTheTruth() throws {
        let rig = try FaultRig("kill", duration: 90)
        try #require(try rig.settled(), "the building never held the truth before the fault")
        let killed = Date()
        rig.gateways["kitchen"]!.kill()
        let (movedAt, willAt) = try rig.watchHandOver(of: "kitchen", since: killed, bound: 10)
        #expect(movedAt != nil, "the killed kitchen's devices were never handed over")
        try #require(willAt != nil, "the killed kitchen's will never came")
        let statuses = try StatusWatcher(port: rig.broker.port, in: rig.dir, name: "status-restart")
        let watcher = try ActivityWatcher(port: rig.broker.port, in: rig.dir, name: "watch-restart")
        try rig.startGateway("kitchen")
        let restarted = Date()
        try rig.expectConverges("gateway-restart", since: restarted, watcher: watcher)
        rig.report("gateway-restart: online after the start: \(statuses.report(since: restarted, gateways: ["kitchen"]))")
        rig.report(String(format: "test took %.1f s", Date().timeIntervalSince(rig.started)))
    }

    /// Issue 16 case 3: 5,000 retained activities of `ghost`, a gateway whose retained status
    /// is `offline`, are more than a gateway's table and Apple table together (256 + 64). A
    /// fresh gateway with a 2 s table expiry must clear them all, not only the first 320.
    @Test func fiveThousandOrphansOfAnOfflineGatewayAreAllCleared() throws {
        let count = 5_000, bound = 40.0
        let began = Date()
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("fault-orphans")
        try broker.publish(topic: "baton/gateways/ghost/status", payload: Array("offline".utf8), retain: true)
        let orphans = ghostActivities(count)
        let publishing = Date()
        try broker.publishRetained(orphans)
        let held = try broker.retained("baton/activities/+").count
        print(String(format: "FAULT orphans: %d retained in %.2f s", held, Date().timeIntervalSince(publishing)))
        try #require(held == count)

        // Default capacities; a capture of three devices, so the gateway has a radio and
        // activities of its own (which expire too, 2 s after the capture ends).
        let capture = try GeneratedCapture(in: dir, devices: 3, reports: 50, seed: 16)
        let gateway = try GatewayProcess(
            yaml: gatewayYAML(port: broker.port, id: "hall", room: "Hall", radio: "capture:\(capture.path)",
                              expiry: "2s"), in: dir)
        defer { gateway.kill() }
        let started = Date()
        var left = count, firstCleared: Double?
        while Date().timeIntervalSince(started) < bound {
            let read = Date().timeIntervalSince(started)
            left = try broker.retained("baton/activities/+").keys.filter { $0.hasPrefix("baton/activities/5c") }.count
            if firstCleared == nil, left < count {
                firstCleared = read
                print(String(format: "FAULT orphans: %d cleared %.2f s after the gateway started", count - left, read))
            }
            if left == 0 { break }
            usleep(500_000)
        }
        let took = Date().timeIntervalSince(started)
        let stats = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? [])
        let rooms = stats?["rooms"] as? [String: Any], brokerStats = stats?["broker"] as? [String: Any]
        let counters = "rooms.cleared_for_others \(rooms?["cleared_for_others"] ?? "?"), "
            + "broker.orphans_cleared \(brokerStats?["orphans_cleared"] ?? "?")"
        if left == 0 {
            print(String(format: "FAULT orphans: all %d cleared %.2f s after the gateway started; %@", count, took, counters))
        } else {
            print(String(format: "FAULT orphans: %d of %d still retained %.0f s after the gateway started; %@",
                         left, count, took, counters))
        }
        #expect(left == 0, "\(left) of \(count) orphans of the offline gateway still retained after \(bound) s; \(counters)")
        #expect(gateway.isRunning, "\(gateway.log)")
        // Counted, each once, and said in the log (docs/mqtt.md §5): the stats come every second.
        let counted = try eventually(within: 5) { () -> (Int, Int)? in
            let stats = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? [])
            guard let cleared = (stats?["rooms"] as? [String: Any])?["cleared_for_others"] as? Int,
                  let rescans = (stats?["broker"] as? [String: Any])?["orphan_rescans"] as? Int,
                  cleared >= count else { return nil }
            return (cleared, rescans)
        }
        #expect((counted?.0 ?? 0) >= count, "cleared_for_others never reached \(count)")
        // Known, intermittent, seen on a loaded machine (old code too): a gateway that reads the
        // retained flood slower than the 2 s grace drains the orphan list as fast as it fills, so
        // the batches may not be needed; and stale copies the broker had queued before a clear
        // arrive after it and are cleared, and counted, a second time.
        withKnownIssue("a slow reader of the retained flood: no batches, or clears counted twice", isIntermittent: true) {
            #expect(counted?.0 == count, "cleared_for_others \(counted.map { "\($0.0)" } ?? "never reached \(count)")")
            #expect((counted?.1 ?? 0) >= 1, "the broker was asked again for the entries that did not fit")
            #expect(gateway.log.contains("more retained entries to check than the orphan list holds"), "\(gateway.log)")
        }
        print(String(format: "FAULT orphans: test took %.1f s", Date().timeIntervalSince(began)))
    }
}

/// `count` retained activities of `ghost`, as a gateway publishes them (docs/mqtt.md §2), on
/// devices 5c0000000000….
func ghostActivities(_ count: Int) -> [(topic: String, payload: [UInt8])] {
    (0..<count).map { i in
        let device = String(format: "5c%010x", i)
        let body = #"{"device":"\#(device)","state":"current","change":"became-current","seq":1,"#
            + #""type_hash":"be9b4bb7","group":"a1b2c3d4","supports_streams":false,"has_web_url":false,"#
            + #""relayed":false,"psm":128,"verified":false,"room":"Ghost","gateway":"ghost","rssi":-61,"#
            + #""first_seen":"2026-11-23T09:14:03.512204Z","changed":"2026-11-23T09:14:03.512204Z"}"#
        return ("baton/activities/\(device)", Array(body.utf8))
    }
}

extension FaultTests {
    /// docs/mqtt.md §5: the first online gateway clears offline gateways' leftovers. When it
    /// goes offline before it has (its expiry is long), the next one becomes first and asks the
    /// broker for everything again, and clears them.
    @Test func whenTheFirstOnlineGatewayLeavesTheNextClearsTheOrphans() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("fault-orphans-first")
        try broker.publish(topic: "baton/gateways/ghost/status", payload: Array("offline".utf8), retain: true)
        try broker.publishRetained(ghostActivities(400))
        // "attic" sorts before "hall": it is the first online, and waits a minute before clearing.
        var gateways: [GatewayProcess] = []
        defer { for g in gateways { g.kill() } }
        for (id, room, expiry, seed) in [("attic", "Attic", "60s", UInt64(41)), ("hall", "Hall", "2s", UInt64(42))] {
            let gdir = try folder(id, in: dir)
            let capture = try GeneratedCapture(in: gdir, devices: 3, reports: 50, seed: seed)
            gateways.append(try GatewayProcess(
                yaml: gatewayYAML(port: broker.port, id: id, room: room, radio: "capture:\(capture.path)", expiry: expiry),
                in: gdir))
        }
        func ghosts() throws -> Int {
            try broker.retained("baton/activities/+").keys.filter { $0.hasPrefix("baton/activities/5c") }.count
        }
        let bothOnline = try broker.retained("baton/gateways/+/status", within: 10) {
            text($0["baton/gateways/attic/status"]) == "online" && text($0["baton/gateways/hall/status"]) == "online"
        }
        try #require(bothOnline != nil, "\(gateways[0].log)\n\(gateways[1].log)")
        sleep(4)  // past the hall's 2 s grace: not the hall's to clear while the attic is first
        #expect(try ghosts() == 400, "the hall cleared others' leftovers while it was not the first online")
        gateways[0].kill()
        let cleared = try eventually(within: 10) { try ghosts() == 0 ? true : nil }
        let left = try ghosts()
        #expect(cleared != nil, "\(left) of 400 left after the first online gateway died:\n\(gateways[1].log)")
    }
}

/// Issue 36's faults, on the line of four rooms with devices on its borders: a suite of their
/// own, serialized within but beside FaultTests, which has the same real-time waits; one
/// chain of both was the longest wait of the whole test run.
@Suite(.serialized) struct BorderFaultTests {
    /// Issue 36: a device on each border of four rooms in a line (FaultBuilding.borders), the
    /// broker killed (-9) and back 3 to 5 s later, eight times in one run. After every return each device,
    /// the border ones included, must be published by exactly one gateway within 2 s. Before
    /// the fix about one round in four left a border device with no publisher (the owner's view
    /// handed it over while still away from the broker, a room already back kept the owner)
    /// or published only when a stand-in's rejoin window closed, over 2 s after the return.
    /// The outages of 5 s outlast every heartbeat held (`sighting-fresh`), those of 3 s are
    /// the issue's probe.
    @Test func everyBorderDeviceHasOnePublisherAfterEachOfEightBrokerRestarts() throws {
        let outages = [3.0, 5.0, 3.5, 5.0, 4.0, 3.0, 5.0, 4.5]
        let rig = try FaultRig("borders", duration: 120, layout: .borders)
        let everyone = rig.layout.rooms.map(\.id)
        try #require(try rig.settled(), "the building never held the truth before the fault")
        for (i, outage) in outages.enumerated() {
            let round = i + 1
            rig.broker.kill()
            usleep(UInt32(outage * 1_000_000))
            try rig.broker.restart()
            let returned = Date()
            let statuses = try StatusWatcher(port: rig.broker.port, in: rig.dir, name: "status-\(round)")
            let watcher = try ActivityWatcher(port: rig.broker.port, in: rig.dir, name: "watch-\(round)")
            try rig.expectConverges(String(format: "broker-restart %d (%.1f s away)", round, outage), since: returned,
                                    watcher: watcher)
            rig.report("broker-restart \(round): online again after the broker's return: \(statuses.report(since: returned, gateways: everyone))")
        }
        rig.report(String(format: "test took %.1f s", Date().timeIntervalSince(rig.started)))
    }

    /// Issue 36, thawed: the kitchen's gateway stands on two borders (the hall|kitchen and the
    /// kitchen|office devices). It is frozen (SIGSTOP) for 12 s, past the broker's keepalive
    /// (1.5 × 5 s), so its will goes out (from mosquitto, or from the gateway when it finds it stood still) and the hall and the office stand in for its devices,
    /// then thawed; three times in one run. After every thaw each device, the border ones
    /// included, must be published by exactly one gateway within 2 s. Before the fix the thawed
    /// gateway took in its backlog before it noticed the broker had dropped it, and at the
    /// reconnect republished the border devices the hall or the office had taken over: two
    /// rooms published one device for seconds, two thaws in three.
    @Test func aGatewayOnTwoBordersFrozenAndThawedThreeTimesLeavesOnePublisherEachTime() throws {
        let rig = try FaultRig("border-thaw", duration: 90, layout: .borders)
        let everyone = rig.layout.rooms.map(\.id)
        try #require(try rig.settled(), "the building never held the truth before the fault")
        let kitchen = rig.gateways["kitchen"]!
        for round in 1...3 {
            let frozen = Date()
            kitchen.signal(SIGSTOP)
            let (movedAt, willAt) = try rig.watchHandOver(of: "kitchen", since: frozen, bound: 11.5)
            #expect(movedAt != nil, "round \(round): the frozen kitchen's devices were never handed over")
            // mosquitto checks keepalives now and then: its will came 6.9 to 10.2 s in, or not
            // before the thaw, when the gateway sends it itself (`brokerGaveUp`).
            _ = willAt
            let rest = 12 - Date().timeIntervalSince(frozen)
            if rest > 0 { usleep(UInt32(rest * 1_000_000)) }
            let statuses = try StatusWatcher(port: rig.broker.port, in: rig.dir, name: "status-thaw-\(round)")
            let watcher = try ActivityWatcher(port: rig.broker.port, in: rig.dir, name: "watch-thaw-\(round)")
            kitchen.signal(SIGCONT)
            let thawed = Date()
            try rig.expectConverges("thaw \(round)", since: thawed, watcher: watcher)
            rig.report("thaw \(round): online again after the thaw: \(statuses.report(since: thawed, gateways: everyone))")
            #expect(kitchen.isRunning, "the kitchen's gateway died after thaw \(round):\n\(kitchen.log)")
        }
        rig.report(String(format: "test took %.1f s", Date().timeIntervalSince(rig.started)))
    }
}

// MARK: - The building, its truth, and the checks

extension FaultRig where Broker == MosquittoBroker {
    /// The building on one mosquitto of its own (persistence off, no logins).
    convenience init(_ label: String, duration: Int, layout: FaultBuilding = .issue16) throws {
        try self.init(label, duration: duration, layout: layout, broker: MosquittoBroker())
    }
}

/// A building of rooms in a line, a gateway each, and devices that stand still for the whole
/// scenario: in a room, or on the border of two (`between`), where both hear it alike.
struct FaultBuilding {
    var rooms: [(id: String, name: String)]
    /// Each device and where it stands: one room, or the two whose border it is on.
    var devices: [(id: String, rooms: [String])]
    /// Walks, by device index: at second `at` the device walks to `room` (and stands there).
    var walks: [Int: [(at: Int, room: String)]] = [:]
    /// Scenario keys added to a device's line, by device index (`streams: true`, say).
    var details: [Int: String] = [:]

    /// Issue 16's building: hall, kitchen, office in a line; device i stands in room i mod 3
    /// for the whole scenario (7, 7 and 6 devices). Its own room hears it at -55 dBm, the next
    /// room at -70 and the far one at -85, each with 1 dB of noise: 15 dB apart, well beyond
    /// the 6 dB margin, so the room that must own each device is never in doubt.
    static let issue16 = FaultBuilding(rooms: threeRooms.map { ($0.0, $0.1) }, devices: (0..<20).map { i in
        (String(format: "5a00000001%02x", i), [threeRooms[i % 3].0])
    })

    /// Issue 36's building: four rooms in a line, a device on each of the three borders
    /// (devices 0, 1, 2: heard at -62.5 dBm by both rooms, 15 dB less by the next ones), and 17
    /// in the rooms (device i in room i mod 4). A border device's owner is either of its two
    /// rooms: the one the rule settled on keeps it, since neither is `margin` louder.
    static let borders = FaultBuilding(
        rooms: [("hall", "Hall"), ("kitchen", "Kitchen"), ("office", "Office"), ("study", "Study")],
        devices: (0..<20).map { i in
            let line = ["hall", "kitchen", "office", "study"]
            return (String(format: "5a00000002%02x", i), i < 3 ? [line[i], line[i + 1]] : [line[i % 4]])
        })

    var borderDevices: [String] { devices.filter { $0.rooms.count > 1 }.map(\.id) }

    /// Devices 0, 1, 5, 6, 10, 11, 15, 16 (some in each room) save every 3 or 4 s, so
    /// sequences move during every fault.
    static func saves(_ i: Int, duration: Int) -> [Int] {
        guard i % 5 < 2 else { return [] }
        return Array(stride(from: 2 + i % 3, to: duration, by: 3 + i % 2))
    }

    func scenario(duration: Int) -> String {
        var yaml = """
            seed: 16
            speed: 1
            duration: \(duration)
            rate: 10
            radio: {in-room: -55, per-room: -15, heard-down-to: -95, noise: 1, loss: 0.02}
            rooms:

            """
        for room in rooms { yaml += "  - {id: \(room.id), name: \(room.name)}\n" }
        yaml += "devices:\n"
        for (i, d) in devices.enumerated() {
            let place = d.rooms.count == 1 ? d.rooms[0] : "{between: [\(d.rooms.joined(separator: ", "))]}"
            yaml += "  - {id: \(d.id), at: \(place)" + (details[i].map { ", \($0)" } ?? "")
            let saves = Self.saves(i, duration: duration).map { ($0, "{at: \($0), save: true}") }
            let moves = (walks[i] ?? []).map { ($0.at, "{at: \($0.at), walk: \($0.room)}") }
            let steps = (saves + moves).sorted { $0.0 < $1.0 }.map(\.1)
            yaml += steps.isEmpty ? "}\n" : ", script: [\(steps.joined(separator: ", "))]}\n"
        }
        return yaml
    }
}

/// Where a device is according to the simulator, and so who must publish it.
struct Truth: CustomStringConvertible {
    /// Its room's gateway and the room's name; for a device on a border, either room's.
    var places: [(gateway: String, room: String)]
    var sequence: Int
    /// When the simulator made the latest sequence (unix seconds); 0 for the first.
    var since: Double
    func allows(gateway: String, room: String) -> Bool { places.contains { $0 == (gateway, room) } }
    var description: String {
        places.map { "\($0.room) by \($0.gateway)" }.joined(separator: " or ") + ", seq \(sequence)"
    }
}

/// A saved sequence reaches the retained store a report or two later (10 reports a second,
/// 2 % lost): for this long after a save the previous sequence is not yet a fault.
let publishGrace = 1.0

/// What a fault rig's broker is to its checks: where a fresh subscriber reads the retained
/// messages and watchers connect, and what each gateway's `broker.url` says. One mosquitto, or
/// a NATS cluster's nodes (NATSClusterTests.swift).
protocol FaultBroker: AnyObject {
    var port: Int { get }
    func retained(_ pattern: String) throws -> [String: [UInt8]]
    /// `broker.url` (and any other broker lines) for the `index`th gateway of the building.
    func gatewayBroker(_ index: Int) -> (url: String, extra: String)
}

extension MosquittoBroker: FaultBroker {
    func gatewayBroker(_ index: Int) -> (url: String, extra: String) { ("mqtt://127.0.0.1:\(port)", "") }
}

/// One run of the building: the broker, the simulator, a gateway per room.
final class FaultRig<Broker: FaultBroker> {
    let broker: Broker
    let dir: URL
    let building: SimulatedBuilding
    let layout: FaultBuilding
    var gateways: [String: GatewayProcess] = [:]
    /// When the three gateways were started.
    private(set) var started = Date()
    let label: String

    init(_ label: String, duration: Int, layout: FaultBuilding, broker: Broker) throws {
        self.label = label
        self.layout = layout
        self.broker = broker
        dir = try scratchDirectory("fault-\(label)")
        building = try SimulatedBuilding(scenario: layout.scenario(duration: duration), in: dir)
        started = Date()
        for room in layout.rooms { try startGateway(room.id) }
    }

    func yaml(_ id: String) -> String {
        let index = layout.rooms.firstIndex { $0.id == id }!
        let (url, extra) = broker.gatewayBroker(index)
        return roomGatewayYAML(port: broker.port, id: id, room: layout.rooms[index].name, socket: building.socket(id),
                               speed: 1, keepalive: "5s", url: url, brokerExtra: extra)
    }

    /// A new `baton gateway` for the room with its usual config (a restart after a crash).
    func startGateway(_ id: String) throws {
        gateways[id] = try GatewayProcess(yaml: yaml(id), in: try folder(id, in: dir))
    }

    /// The simulator's truth now: each device's room (its place, then every `walk` to a room),
    /// that room's gateway and name, and the sequence of its latest step.
    func truth() -> [String: Truth] {
        let lines = building.lines
        let names = lines.first { $0["event"] as? String == "ready" }?["names"] as? [String: String] ?? [:]
        var truth: [String: Truth] = [:]
        for (id, rooms) in layout.devices {
            truth[id] = Truth(places: rooms.map { ($0, names[$0] ?? $0) }, sequence: 1, since: 0)
        }
        for line in lines {
            guard let device = line["device"] as? String, var t = truth[device] else { continue }
            if line["event"] as? String == "walk" {
                let rooms = (line["room"] as? String).map { [$0] } ?? line["between"] as? [String] ?? []
                t.places = rooms.map { ($0, names[$0] ?? $0) }
            }
            if let sequence = line["sequence"] as? Int, sequence != t.sequence {
                t.sequence = sequence
                t.since = Double(line["unix_us"] as? Int ?? 0) / 1e6
            }
            truth[device] = t
        }
        return truth
    }

    /// nil when `baton/activities/+` holds exactly the truth: every device once, by its room's
    /// gateway with its room's name, at its latest sequence (the one before during
    /// `publishGrace` after a save), and nothing else. Otherwise one line per difference.
    func retainedMatchesTruth() throws -> String? {
        let retained = try broker.retained("baton/activities/+")
        // Read after the broker, so the truth is never older than what was retained.
        let truth = self.truth()
        let now = Date().timeIntervalSince1970
        var diff: [String] = []
        for (device, t) in truth.sorted(by: { $0.key < $1.key }) {
            guard let bytes = retained["baton/activities/\(device)"] else {
                diff.append("\(device): nothing retained; is \(t)")
                continue
            }
            guard let m = json(bytes) else {
                diff.append("\(device): not JSON: \(String(decoding: bytes, as: UTF8.self))")
                continue
            }
            let gateway = m["gateway"] as? String ?? "?", room = m["room"] as? String ?? "?"
            let seq = m["seq"] as? Int ?? -1
            let seqOK = seq == t.sequence || (seq == t.sequence - 1 && now - t.since < publishGrace)
            if !t.allows(gateway: gateway, room: room) || !seqOK {
                diff.append("\(device): retained \(room) by \(gateway), seq \(seq); is \(t)")
            }
        }
        for topic in retained.keys.sorted() where truth[String(topic.split(separator: "/").last ?? "")] == nil {
            diff.append("\(topic): retained, but no such device")
        }
        return diff.isEmpty ? nil : diff.joined(separator: "\n")
    }

    /// Seconds from `since` until the retained activities first equal the truth, polled for
    /// up to `bound` seconds; nil (with the last difference) if they never do. The time is
    /// taken when the matching read began, so it does not count the read itself.
    func convergence(since: Date, bound: Double) throws -> (seconds: Double?, diff: String) {
        var last = ""
        while Date().timeIntervalSince(since) < bound {
            let began = Date()
            // A read that fails (a cluster node refusing new clients while its streams elect
            // a leader, say) is a moment in which a fresh subscriber is not sent the truth.
            do {
                guard let diff = try retainedMatchesTruth() else { return (began.timeIntervalSince(since), "") }
                last = diff
            } catch {
                last = "a fresh subscriber could not read the retained state: \(error)"
            }
            usleep(100_000)
        }
        return (nil, last)
    }

    /// Problems seen in `seconds` after convergence: a retained state that differs from the
    /// truth at any of the reads (every 0.5 s), or any message `watcher` saw after its line
    /// `from` that names another room, clears a device, or goes back in sequence; for a device
    /// on a border, also one from the other of its rooms than the message before it (two
    /// gateways both publishing it).
    func stays(for seconds: Double, watcher: ActivityWatcher, from: Int) throws -> [String] {
        var problems: [String] = []
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            if let diff = try retainedMatchesTruth() {
                problems.append(String(format: "at +%.1f s the retained state differs:\n", seconds - end.timeIntervalSinceNow)
                                + diff)
                break
            }
            usleep(500_000)
        }
        let truth = self.truth()
        var highest: [String: Int] = [:]
        var writer: [String: String] = [:]
        for (i, (device, m)) in watcher.ordered.enumerated() {
            let seq = m?["seq"] as? Int ?? -1
            let previous = writer[device]
            defer {
                highest[device] = max(highest[device] ?? 0, seq)
                if let g = m?["gateway"] as? String { writer[device] = g }
            }
            guard i >= from, let t = truth[device] else { continue }
            guard let m else { problems.append("\(device) was cleared"); continue }
            let gateway = m["gateway"] as? String ?? "?", room = m["room"] as? String ?? "?"
            if !t.allows(gateway: gateway, room: room) {
                problems.append("\(device): late message \(room) by \(gateway), seq \(seq); the truth now: \(t)")
            } else if t.places.count > 1, let previous, previous != gateway {
                problems.append("\(device): late message by \(gateway) after one by \(previous): both publish it")
            } else if seq < highest[device] ?? 0 {
                problems.append("\(device): late message goes back to seq \(seq) from \(highest[device]!)")
            }
        }
        return problems
    }

    /// Waits for the building to hold the truth before any fault: the gateways settle every
    /// device within a few seconds of the scenario's start.
    func settled() throws -> Bool {
        let (seconds, diff) = try convergence(since: started, bound: 20)
        report("start: retained == truth \(seconds.map { String(format: "%.2f s", $0) } ?? "never") after the gateways started")
        if seconds == nil { print(diff) }
        return seconds != nil
    }

    /// After a fault: how long until retained == truth (expected within 2 s, polled up to
    /// `bound`), then whether it stays so for `hold` seconds. Records an issue per failure.
    ///
    /// `within`: the seconds the issue allows (2 s; a NATS node's death is held to what
    /// nats-server can give, NATSClusterTests).
    func expectConverges(_ what: String, since returned: Date, watcher: ActivityWatcher, bound: Double = 10,
                         hold: Double = 5, within: Double = 2, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let (seconds, diff) = try convergence(since: returned, bound: bound)
        let publishers = watcher.publishers
        let multiple = publishers.filter { $0.value.count > 1 }.count
        let published = "\(multiple) of \(layout.devices.count) devices seen from two or more gateways since (retained included)"
        guard let seconds else {
            report("\(what): NOT converged within \(Int(bound)) s; \(published)\n\(diff)")
            Issue.record("\(label) \(what): not converged within \(bound) s (the issue asks for \(within) s); \(published):\n\(diff)",
                         sourceLocation: sourceLocation)
            return
        }
        report(String(format: "%@: retained == truth first %.2f s after the return; %@", what, seconds, published))
        // Converged means equal from then on: a wrong message that lands after the first
        // equal reading (one libmosquitto resent from before the outage, say) and is corrected
        // moves the convergence to the next equal reading. At most three such transients.
        var converged = seconds
        var problems = try stays(for: hold, watcher: watcher, from: watcher.ordered.count)
        var transients = 0
        while !problems.isEmpty, transients < 3 {
            transients += 1
            report("\(what): a transient after \(String(format: "%.2f s", converged)):\n  \(problems.joined(separator: "\n  "))")
            guard let again = try convergence(since: returned, bound: bound).seconds else { break }
            converged = again
            problems = try stays(for: hold, watcher: watcher, from: watcher.ordered.count)
        }
        report(String(format: "%@: converged %.2f s after the return (%d transient%@), %@ for %d s", what, converged,
                      transients, transients == 1 ? "" : "s", problems.isEmpty ? "stayed equal" : "did NOT stay equal",
                      Int(hold)))
        #expect(converged <= within, "\(label) \(what): equal for good only \(converged) s after the return, the issue asks for \(within) s",
                sourceLocation: sourceLocation)
        #expect(problems.isEmpty, "\(label) \(what): after converging:\n\(problems.joined(separator: "\n"))",
                sourceLocation: sourceLocation)
    }

    func report(_ text: String) { print("FAULT \(label) \(text)") }

    /// The gateways' ids, in room order.
    var gatewayIDs: [String] { layout.rooms.map(\.id) }

    /// Devices whose retained activity names `gateway`, and `gateway`'s retained status.
    func snapshot(of gateway: String) throws -> (owned: Set<String>, status: String?) {
        let r = try broker.retained("baton/#")
        var owned: Set<String> = []
        for (topic, bytes) in r where topic.hasPrefix("baton/activities/") {
            if json(bytes)?["gateway"] as? String == gateway { owned.insert(String(topic.dropFirst(17))) }
        }
        return (owned, text(r["baton/gateways/\(gateway)/status"]))
    }

    /// Polls until `gateway`'s devices have all moved to other rooms and its status is
    /// `offline`, up to `bound` seconds from `since`; prints when each happened.
    func watchHandOver(of gateway: String, since: Date, bound: Double) throws -> (movedAt: Double?, willAt: Double?) {
        var movedAt: Double?, willAt: Double?
        var left: Set<String> = []
        while Date().timeIntervalSince(since) < bound, movedAt == nil || willAt == nil {
            let began = Date().timeIntervalSince(since)
            // A read that fails is a moment nothing is known: poll on.
            guard let (owned, status) = try? snapshot(of: gateway) else { usleep(200_000); continue }
            left = owned
            if movedAt == nil, owned.isEmpty { movedAt = began }
            if willAt == nil, status == "offline" { willAt = began }
            usleep(200_000)
        }
        func seconds(_ s: Double?) -> String { s.map { String(format: "%.2f s", $0) } ?? "never" }
        // Which devices stayed, and what the rooms hear of them, is where a failure starts.
        let stayed = movedAt == nil ? " (still its at the last read: \(left.sorted().joined(separator: ", ")))" : ""
        report("\(gateway): its devices moved after \(seconds(movedAt))\(stayed), its status offline after \(seconds(willAt))")
        return (movedAt, willAt)
    }

    deinit {
        for g in gateways.values { g.kill() }
    }
}

/// `mosquitto_sub` on the gateways' statuses, each message with the time it arrived
/// (`%U`, unix seconds with nanoseconds) and its retain flag (`%r`): when each gateway was
/// back. The retained statuses the broker sends at subscribe are not a gateway coming back.
final class StatusWatcher {
    let process: ChildProcess
    let output: URL

    init(port: Int, in dir: URL, name: String) throws {
        output = dir.appendingPathComponent("\(name).txt")
        process = try ChildProcess("/usr/bin/mosquitto_sub",
                                   ["-h", "127.0.0.1", "-p", "\(port)", "-t", "baton/gateways/+/status", "-F", "%U %r %t %p"],
                                   stdout: output.path)
    }

    /// Seconds from `since` until each gateway's first `online`.
    func online(since: Date) -> [String: Double] {
        let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        var result: [String: Double] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 4, parts[1] == "0", parts[3] == "online", let at = Double(parts[0]) else { continue }
            let gateway = String(parts[2].split(separator: "/")[2])
            if result[gateway] == nil { result[gateway] = at - since.timeIntervalSince1970 }
        }
        return result
    }

    func report(since: Date, gateways: [String] = threeRooms.map(\.0)) -> String {
        let online = self.online(since: since)
        return gateways.map { id in "\(id) \(online[id].map { String(format: "%.2f s", $0) } ?? "not yet")" }
            .joined(separator: ", ")
    }

    deinit {
        process.signal(SIGKILL)
        _ = process.wait(timeout: .seconds(5))
    }
}

extension ActivityWatcher {
    /// Every message in arrival order: the device and its JSON, nil for a clear.
    var ordered: [(device: String, message: [String: Any]?)] {
        let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            let parts = line.split(separator: " ", maxSplits: 1)
            guard let device = parts.first?.split(separator: "/").last else { return nil }
            return (String(device), parts.count > 1 ? json(Array(parts[1].utf8)) : nil)
        }
    }

    /// The gateways that published each device since the watcher started.
    var publishers: [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for (device, m) in ordered {
            if let g = m?["gateway"] as? String { result[device, default: []].insert(g) }
        }
        return result
    }
}
