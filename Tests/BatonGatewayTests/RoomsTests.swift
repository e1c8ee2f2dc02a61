// A building on one machine (docs/rooms.md): `baton sim --scenario` plays the rooms' controllers,
// one `baton gateway` per room runs on its socket, a real mosquitto (or two, bridged) carries
// sightings and statuses, and `mosquitto_sub` watches the retained activities as Home
// Assistant would. Scenarios run 4× faster than real time, with every room parameter divided
// by 4, so a simulated minute takes 15 s.
import BatonTestSupport
import Foundation
import Testing

/// `baton sim --scenario` as a child process; its JSON event lines are read from a file.
final class SimulatedBuilding {
    let process: ChildProcess
    let events: URL
    let sockets: URL

    init(scenario: String, in dir: URL) throws {
        let file = dir.appendingPathComponent("scenario.yaml")
        try scenario.write(to: file, atomically: true, encoding: .utf8)
        events = dir.appendingPathComponent("sim-events.jsonl")
        sockets = dir.appendingPathComponent("rooms")
        process = try ChildProcess(batonBinary.path, ["sim", "--scenario", file.path, "--sockets", sockets.path],
                                   stdout: events.path, stderr: dir.appendingPathComponent("sim.log").path)
        let ready = eventually(within: 10) { lines.first { $0["event"] as? String == "ready" } }
        guard ready != nil else { throw BrokerError("the simulator did not get ready") }
    }

    var lines: [[String: Any]] {
        let text = (try? String(contentsOf: events, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { json(Array($0.utf8)) }
    }

    func socket(_ room: String) -> String { sockets.appendingPathComponent("\(room).sock").path }

    /// A `baton gateway` on the broker at `port` for each of `rooms`, on its room's socket
    /// (`roomGatewayYAML` with `speed`, `keepalive` and `tableCapacity`), each in a folder of its
    /// own under `dir`; by room id.
    func gateways(_ rooms: [(String, String)], port: Int, in dir: URL, speed: Int = 4, keepalive: String = "5s",
                  tableCapacity: Int? = nil) throws -> [String: GatewayProcess] {
        var gateways: [String: GatewayProcess] = [:]
        for (id, room) in rooms {
            let yaml = roomGatewayYAML(port: port, id: id, room: room, socket: socket(id), speed: speed, keepalive: keepalive,
                                       tableCapacity: tableCapacity)
            gateways[id] = try GatewayProcess(yaml: yaml, in: try folder(id, in: dir))
        }
        return gateways
    }

    /// Waits for the scenario's end line (the simulator exits after it).
    func waitForEnd(within seconds: Double) -> Bool {
        eventually(within: seconds) { lines.contains { $0["event"] as? String == "end" } ? true : nil } != nil
    }

    deinit {
        process.signal(SIGKILL)
        _ = process.wait(timeout: .seconds(5))
    }
}

/// `mosquitto_sub -v` on the activities: every retained message and change, in arrival order.
final class ActivityWatcher {
    let process: ChildProcess
    let output: URL

    init(port: Int, in dir: URL, name: String = "watch") throws {
        output = dir.appendingPathComponent("\(name).txt")
        process = try ChildProcess("/usr/bin/mosquitto_sub",
                                   ["-h", "127.0.0.1", "-p", "\(port)", "-v", "-t", "baton/activities/+"],
                                   stdout: output.path)
    }

    /// Each device's messages in order: nil for a clear, the JSON otherwise.
    var messages: [String: [[String: Any]?]] {
        let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        var result: [String: [[String: Any]?]] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ", maxSplits: 1)
            guard let topic = parts.first, let device = topic.split(separator: "/").last else { continue }
            result[String(device), default: []].append(parts.count > 1 ? json(Array(parts[1].utf8)) : nil)
        }
        return result
    }

    /// The gateways that published a device's activity, one entry per change of gateway:
    /// what a user sees as the device moving between rooms.
    func owners(of device: String) -> [String] {
        var owners: [String] = []
        for case let m? in messages[device] ?? [] {
            if let g = m["gateway"] as? String, owners.last != g { owners.append(g) }
        }
        return owners
    }

    func last(_ device: String) -> [String: Any]?? { messages[device]?.last }

    deinit {
        process.signal(SIGKILL)
        _ = process.wait(timeout: .seconds(5))
    }
}

/// One room's gateway at 4× speed: every room duration divided by 4 (docs/rooms.md §3).
///
/// `url` replaces the one broker on `port` (a cluster's nodes as a YAML list, say), and
/// `brokerExtra` lines go into the broker section (`protocol: 3.1.1`).
func roomGatewayYAML(port: Int, id: String, room: String, socket: String, speed: Int = 4,
                     keepalive: String = "5s", tableCapacity: Int? = nil, url: String? = nil,
                     brokerExtra: String = "") -> String {
    func ms(_ base: Int) -> String { "\(base / speed)ms" }
    let capacity = tableCapacity.map { "\n  capacity: \($0)" } ?? ""
    let extra = brokerExtra.isEmpty ? "" : "\n  " + brokerExtra
    return """
    gateway:
      id: \(id)
      room: \(room)
    broker:
      url: \(url ?? "mqtt://127.0.0.1:\(port)")\(extra)
      keepalive: \(keepalive)
      reconnect-min: 100ms
      reconnect-max: 1s
    radio:
      source: sim:\(socket)
      silence: 30s
    table:
      expiry: \(ms(60_000))\(capacity)
    rooms:
      sighting-interval: \(ms(2000))
      sighting-min-interval: \(ms(500))
      sighting-fresh: \(ms(5000))
      lost-after: \(ms(10_000))
      settle: \(ms(1000))
      dwell: \(ms(3000))
    status:
      interval: 1s
    """
}

let threeRooms = [("hall", "Hall"), ("kitchen", "Kitchen"), ("office", "Office")]

/// alice walks hall → kitchen → office at t = 20 s and 40 s; a tablet stands on the
/// hall/kitchen border, heard equally by both with 3 dB of noise per report.
func walkScenario(speed: Int = 4, duration: Int = 60) -> String {
    """
    seed: 7
    speed: \(speed)
    duration: \(duration)
    rate: 10
    radio: {in-room: -55, per-room: -15, heard-down-to: -95, noise: 3, loss: 0.05}
    rooms:
      - {id: hall, name: Hall}
      - {id: kitchen, name: Kitchen}
      - {id: office, name: Office}
    devices:
      - id: 5a0000000001
        name: alice-phone
        at: hall
        script:
          - {at: 20, walk: kitchen}
          - {at: 40, walk: office}
      - id: 5a0000000002
        name: border-tablet
        at: {between: [hall, kitchen]}
    """
}

/// Floor 1's broker, and floor 2's bridged to it with mosquitto's own bridge, as in
/// board/mosquitto-floor.conf (which bridges with MQTT v3.1.1, mosquitto's default).
func bridgedFloors() throws -> (floor1: MosquittoBroker, floor2: MosquittoBroker) {
    let floor1 = try MosquittoBroker()
    let floor2 = try MosquittoBroker(extraConfig: [
        "connection floor1",
        "address 127.0.0.1:\(floor1.port)",
        "topic baton/# both 1",
        "topic homeassistant/# both 1",
        "restart_timeout 1 1",
    ])
    #expect(floor2.waitForLog("Received CONNACK on connection"), "the bridge did not connect: \(floor2.log)")
    return (floor1, floor2)
}

@Suite(.serialized) struct RoomsTests {
    let alice = "5a0000000001", border = "5a0000000002"

    /// One room, the hall, with alice's phone in it (the simulator's default radio unless
    /// `radio` is given), its gateway, and a watcher on the activities, once the hall has
    /// published her.
    func aliceInTheHall(_ name: String, seed: Int, radio: String? = nil) throws
        -> (MosquittoBroker, ActivityWatcher, SimulatedBuilding, GatewayProcess) {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory(name)
        let watcher = try ActivityWatcher(port: broker.port, in: dir)
        let building = try SimulatedBuilding(scenario: """
            seed: \(seed)
            speed: 1
            duration: 120
            \(radio.map { "radio: \($0)" } ?? "")
            rooms: [{id: hall, name: Hall}]
            devices: [{id: \(alice), at: hall}]
            """, in: dir)
        let hall = try GatewayProcess(
            yaml: roomGatewayYAML(port: broker.port, id: "hall", room: "Hall", socket: building.socket("hall"), speed: 1),
            in: dir)
        let owned = eventually(within: 15) { watcher.owners(of: alice) == ["hall"] ? true : nil }
        guard owned != nil else {
            hall.kill()
            throw BrokerError("the hall never published alice: \(hall.log)")
        }
        return (broker, watcher, building, hall)
    }

    /// A second gateway, "lab", says it is online (its retained status).
    func labComesOnline(_ broker: MosquittoBroker) throws {
        try broker.publish(topic: "baton/gateways/lab/status", payload: Array("online".utf8), retain: true)
        usleep(200_000)
    }

    /// Lab sights alice at `rssi` (its sighting `n`), then publishes the hall's message `ours`
    /// as its own: the claim of a gateway whose view parted from the hall's.
    func labClaimsAlice(_ broker: MosquittoBroker, from ours: [UInt8], rssi: Int, n: Int) throws {
        try broker.publish(topic: "baton/sightings/lab/\(alice)", payload: Array(#"{"rssi":\#(rssi),"since":100,"n":\#(n)}"#.utf8))
        usleep(100_000)
        var o = try #require(json(ours))
        o["gateway"] = "lab"
        o["room"] = "Lab"
        try broker.publish(topic: "baton/activities/\(alice)", payload: Array(try JSONSerialization.data(withJSONObject: o)),
                           retain: true)
    }

    /// Runs the walk with gateways on `brokers[i % brokers.count]` and checks what a user
    /// would: the activity's room follows alice with exactly two moves, the border tablet
    /// moves at most once, and the retained state at the end names the office.
    func walk(brokers: [MosquittoBroker], watchOn watched: MosquittoBroker, name: String) throws {
        let dir = try scratchDirectory(name)
        let watcher = try ActivityWatcher(port: watched.port, in: dir)
        let building = try SimulatedBuilding(scenario: walkScenario(), in: dir)
        var gateways: [GatewayProcess] = []
        for (i, (id, room)) in threeRooms.enumerated() {
            gateways.append(try GatewayProcess(
                yaml: roomGatewayYAML(port: brokers[i % brokers.count].port, id: id, room: room,
                                      socket: building.socket(id)), in: try folder(id, in: dir)))
        }
        // 60 simulated seconds at 4×, after the gateways connect.
        #expect(building.waitForEnd(within: 40), "the scenario did not end")
        let owners = watcher.owners(of: alice)
        #expect(owners == ["hall", "kitchen", "office"], "alice's activity was published by \(owners)")
        let borderOwners = watcher.owners(of: border)
        #expect(!borderOwners.isEmpty && borderOwners.count <= 2,
                "the border tablet moved \(borderOwners.count - 1) times in a simulated minute: \(borderOwners)")
        #expect(["hall", "kitchen"].contains(borderOwners.last ?? ""))
        let state = try watched.retained("baton/activities/+")
        let final = json(state["baton/activities/\(alice)"] ?? [])
        #expect(final?["room"] as? String == "Office" && final?["gateway"] as? String == "office",
                "retained at the end: \(final.map { "\($0)" } ?? "nothing")")
        for g in gateways { #expect(g.stop() == 0, "a gateway did not stop cleanly: \(g.log)") }
    }

    @Test func theRoomFollowsAWalkWithoutFlapping() throws {
        let broker = try MosquittoBroker()
        try walk(brokers: [broker], watchOn: broker, name: "walk")
    }

    @Test func theSameWalkAcrossTwoBridgedBrokers() throws {
        // Hall and office on floor 1, kitchen on floor 2.
        let (floor1, floor2) = try bridgedFloors()
        // The watcher is on floor 1; the kitchen's messages reach it only through the bridge.
        try walk(brokers: [floor1, floor2], watchOn: floor1, name: "bridged")
    }

    @Test func killingTheOwnerMovesTheDeviceToTheNextBestRoom() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("takeover")
        let watcher = try ActivityWatcher(port: broker.port, in: dir)
        // alice stays in the hall: the kitchen hears her 15 dB weaker, the office 30 dB.
        let building = try SimulatedBuilding(scenario: walkScenario(speed: 1, duration: 120), in: dir)
        let gateways = try building.gateways(threeRooms, port: broker.port, in: dir, speed: 1, keepalive: "5s")
        let owned = eventually(within: 15) { watcher.owners(of: alice) == ["hall"] ? true : nil }
        try #require(owned != nil, "the hall never published alice: \(watcher.owners(of: alice))")

        gateways["hall"]!.kill()
        // The broker sends the hall's will as soon as its socket closes; in any case within
        // 1.5 × keepalive (MQTT 5.0 §3.1.2.10), the bound the issue sets.
        let moved = eventually(within: 7.5) { watcher.owners(of: alice) == ["hall", "kitchen"] ? true : nil }
        #expect(moved != nil, "alice's owners after the kill: \(watcher.owners(of: alice))")
        let state = try broker.retained("#")
        let final = json(state["baton/activities/\(alice)"] ?? [])
        #expect(final?["gateway"] as? String == "kitchen" && final?["room"] as? String == "Kitchen")
        #expect(text(state["baton/gateways/hall/status"]) == "offline")
        // Home Assistant's entities read the room from the activity; their configs, sent once
        // by the hall, name no gateway, so the move sent none (docs/mqtt.md §4 "Once"). The
        // tracker says the kitchen.
        let config = json(state["homeassistant/sensor/baton_\(alice)/room/config"] ?? [])
        #expect(config != nil && config?["availability"] == nil, "\(config ?? [:])")
        #expect((config?["device"] as? [String: Any])?["via_device"] == nil)
        #expect(text(state["baton/trackers/\(alice)"]) == "Kitchen")
        _ = building
    }

    /// docs/rooms.md §7 rule 3: two gateways that both believe they own a device (views that
    /// parted in a fault) settle it by rank, and do not publish over each other for good. A
    /// second gateway "lab" hears alice 3 dB better than the hall (under the margin: the rule
    /// alone would never move her) and publishes her activity as its own.
    @Test func twoClaimsToADeviceAreSettledByRankNotFought() throws {
        let (broker, watcher, building, hall) = try aliceInTheHall("claims", seed: 5,
            radio: "{in-room: -55, per-room: -15, heard-down-to: -95, noise: 0, loss: 0}")
        let ours = try #require(try broker.retained("baton/activities/\(alice)")["baton/activities/\(alice)"])
        try labComesOnline(broker)
        // Weaker than the hall: the hall keeps her and says so.
        try labClaimsAlice(broker, from: ours, rssi: -70, n: 1)
        let back = eventually(within: 3) { watcher.owners(of: alice) == ["hall", "lab", "hall"] ? true : nil }
        #expect(back != nil, "owners: \(watcher.owners(of: alice))\n\(hall.log)")
        // 3 dB stronger: the hall gives way and stays silent.
        try labClaimsAlice(broker, from: ours, rssi: -52, n: 2)
        let yielded = eventually(within: 3) { hall.log.contains("moved to lab (yielded)") ? true : nil }
        #expect(yielded != nil, "\(hall.log)")
        sleep(1)
        #expect(watcher.owners(of: alice) == ["hall", "lab", "hall", "lab"], "owners: \(watcher.owners(of: alice))")
        let corrections = hall.log.components(separatedBy: "publishing it again").count - 1
        #expect(corrections == 1, "the hall published over lab's claim \(corrections) times")
        #expect(hall.stop() == 0)
        _ = building
    }

    /// docs/rooms.md §7 rule 3, on a broker of several nodes (docs/broker.md "NATS"): each
    /// node keeps the retained message it received last, so when the hall and lab publish
    /// alice at once, the hall's node can deliver lab's claim and then the hall's own message,
    /// and lab's node the reverse. Each gateway sees its own message land last; the hall must
    /// still settle the claim by rank, or the two nodes keep different rooms for good
    /// (NATSClusterTests after a node rejoins). Here the hall's own message is sent again
    /// right after lab's claim; no lab gateway runs, so once the hall yields nobody publishes.
    @Test func aClaimFollowedByTheOwnersOwnMessageIsStillSettledByRank() throws {
        let (broker, watcher, building, hall) = try aliceInTheHall("claim-then-echo", seed: 6,
            radio: "{in-room: -55, per-room: -15, heard-down-to: -95, noise: 0, loss: 0}")
        let topic = "baton/activities/\(alice)"
        let ours = try #require(try broker.retained(topic)[topic])
        try labComesOnline(broker)
        // lab hears her 3 dB better (under the margin, so only rank settles it) and claims her.
        try labClaimsAlice(broker, from: ours, rssi: -52, n: 1)
        try broker.publish(topic: topic, payload: ours, retain: true)
        let yielded = eventually(within: 3) { hall.log.contains("moved to lab (yielded)") ? true : nil }
        #expect(yielded != nil, "the hall kept alice although lab ranks higher: \(hall.log)")
        sleep(1)
        #expect(watcher.owners(of: alice) == ["hall", "lab", "hall"], "owners: \(watcher.owners(of: alice))")
        #expect(hall.stop() == 0)
        _ = building
    }

    @Test func garbageSightingsAreCountedAndChangeNothing() throws {
        let (broker, watcher, building, hall) = try aliceInTheHall("garbage", seed: 3)

        // A second gateway "lab" comes online and sights alice weakly: accepted, changes nothing.
        try labComesOnline(broker)
        func sighting(_ from: String, _ body: String) throws {
            try broker.publish(topic: "baton/sightings/\(from)/\(alice)", payload: Array(body.utf8))
        }
        try sighting("lab", #"{"rssi":-90,"since":100,"n":5}"#)
        // Each of these would move alice to a louder room if it were believed.
        try sighting("ghost", #"{"rssi":-20,"since":100,"n":1}"#)           // no such gateway online
        try sighting("lab", #"{"rssi":-20,"since":100,"n":4}"#)             // older than n = 5: a replay
        try sighting("lab", #"{"rssi":-300,"since":100,"n":9}"#)            // no radio hears -300 dBm
        try sighting("hall", #"{"rssi":-20,"since":100,"n":10}"#)           // not the hall's run
        try sighting("lab", #"{"rssi":-20,"since":"#)                        // cut short
        try sighting("lab", "[1,2,3]")                                      // not a sighting at all
        try broker.publish(topic: "baton/sightings/lab/not-a-device", payload: Array("{}".utf8))

        // Longer than dwell (3 s) + settle: a believed -20 dBm sighting would have won by now.
        let drops = eventually(within: 10) { () -> [String: Int]? in
            let retained = (try? broker.retained("baton/gateways/hall/stats")) ?? [:]
            let stats = json(retained["baton/gateways/hall/stats"] ?? [])
            let d = ((stats?["rooms"] as? [String: Any])?["drops"] as? [String: Int]) ?? [:]
            return d.count >= 7 ? d : nil
        }
        try #require(drops != nil, "the hall's stats never counted the garbage")
        #expect(drops?["sighting-unknown-gateway"] == 1)
        #expect(drops?["sighting-replayed"] == 1)
        #expect(drops?["sighting-rssi"] == 1)
        #expect(drops?["sighting-impostor"] == 1)
        #expect(drops?["truncated"] == 1)
        #expect(drops?["sighting-syntax"] == 1)
        #expect(drops?["sighting-topic"] == 1)
        sleep(4)
        #expect(watcher.owners(of: alice) == ["hall"], "alice moved: \(watcher.owners(of: alice))")
        #expect(hall.isRunning)
        #expect(hall.stop() == 0)
        _ = building  // the simulated room plays until here
    }
}
