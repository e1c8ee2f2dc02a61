// Scenarios (docs/simulator.md "Scenarios"): the file format and its errors, and the RSSI
// model, in process. `baton sim --scenario` itself, the built binary with gateways on its
// rooms' sockets, is BatonCLITests' (SimCommandTests.swift).
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

let scenarioFixtures = repository.appendingPathComponent("Tests/Fixtures/scenarios")

/// The task's sketch, as docs/simulator.md shows it.
let exampleScenario = """
    seed: 1
    speed: 1
    duration: 60
    rate: 10
    radio:
      in-room: -55
      per-room: -15
      heard-down-to: -95
      noise: 3
      loss: 0.05
    rooms:
      - {id: hall, name: Hall}
      - {id: kitchen, name: Kitchen, noise: 6}
      - {id: office, name: Office, x: 2, y: 0}
    devices:
      - id: 5a0000000001
        name: alice-phone
        type: com.example.reader.article
        streams: true
        at: hall
        script:
          - {at: 10, walk: kitchen}
          - {at: 20, walk: {between: [kitchen, office]}}
          - {at: 25, save: true}
          - {at: 30, become-current: com.example.video.watch}
          - {at: 40, invalidate: true}
          - {at: 45, silent: true}
          - {at: 50, resume: true}
      - id: 5A:00:00:00:00:02
        at: {x: 0.5, y: 1}
    crowd:
      count: 1000
      first-id: 5b0000000000
      wander: 30
    """

/// The error `yaml` is refused with, or nil if it is accepted.
func parseError(_ yaml: String) -> ScenarioError? {
    do throws(ScenarioError) {
        _ = try Scenario.parse(yaml: yaml, file: "s.yaml")
        return nil
    } catch {
        return error
    }
}

@Suite struct ScenarioParsingTests {
    @Test func theExampleParsesToItsModel() throws {
        let s = try Scenario.parse(yaml: exampleScenario, file: "example.yaml")
        let expected = Scenario(
            seed: 1, speed: 1, duration: 60, rate: 10, radio: Scenario.Radio(),
            rooms: [Scenario.Room(id: "hall", name: "Hall", x: 0),
                    Scenario.Room(id: "kitchen", name: "Kitchen", x: 1, noise: 6),
                    Scenario.Room(id: "office", name: "Office", x: 2, y: 0)],
            devices: [
                Scenario.Device(id: 0x5A00_0000_0001, name: "alice-phone", type: "com.example.reader.article",
                                streams: true, place: .room("hall"), script: [
                                    Scenario.Step(at: 10, .walk(.room("kitchen"))),
                                    Scenario.Step(at: 20, .walk(.between("kitchen", "office"))),
                                    Scenario.Step(at: 25, .save),
                                    Scenario.Step(at: 30, .becomeCurrent("com.example.video.watch")),
                                    Scenario.Step(at: 40, .invalidate),
                                    Scenario.Step(at: 45, .silent),
                                    Scenario.Step(at: 50, .resume),
                                ]),
                Scenario.Device(id: 0x5A00_0000_0002, name: "5a0000000002", type: Scenario.defaultType,
                                place: .point(x: 0.5, y: 1)),
            ],
            crowd: Scenario.Crowd(count: 1000, firstID: 0x5B00_0000_0000, wander: 30))
        #expect(s == expected)
    }

    /// docs/simulator.md's example and the fixtures are scenarios the simulator accepts.
    @Test func theDocumentedExampleAndTheFixturesParse() throws {
        let doc = try String(contentsOf: repository.appendingPathComponent("docs/simulator.md"), encoding: .utf8)
        let section = try #require(doc.range(of: "## Scenarios")).upperBound
        let start = try #require(doc.range(of: "```yaml\n", range: section..<doc.endIndex)).upperBound
        let end = try #require(doc.range(of: "```", range: start..<doc.endIndex)).lowerBound
        let documented = try Scenario.parse(yaml: String(doc[start..<end]), file: "docs/simulator.md")
        #expect(documented.rooms.map(\.id) == ["hall", "kitchen", "office"])
        let walk = try Scenario.load(file: scenarioFixtures.appendingPathComponent("walk.yaml").path)
        #expect(walk.rooms.map(\.id) == ["hall", "kitchen", "office"])
        #expect(walk.duration == 60)
        #expect(walk.devices.map(\.place) == [.room("hall"), .between("hall", "kitchen")])
        #expect(walk.devices[0].script == [Scenario.Step(at: 20, .walk(.room("kitchen"))),
                                           Scenario.Step(at: 40, .walk(.room("office")))])
        let links = try Scenario.load(file: scenarioFixtures.appendingPathComponent("links.yaml").path)
        #expect(links.devices.map(\.link) == [true, false, true])
        #expect(links.devices.first?.payloadBytes == 600)
        let demo = try Scenario.load(file: scenarioFixtures.appendingPathComponent("demo.yaml").path)
        #expect(demo.rooms.count == 3)
        #expect(demo.devices.count >= 3)
    }

    static let minimal = """
        duration: 60
        rooms: [{id: hall}, {id: kitchen}]
        devices:
          - id: 5a0000000001
            at: hall
        """

    /// Each mistake: the YAML, the line and key it is reported at, and words of the message.
    static let mistakes: [(yaml: String, line: Int?, key: String, says: String)] = [
        ("durtion: 60\n" + minimal, 1, "durtion", "unknown key (did you mean \"duration\"?)"),
        (minimal + "\n    nmae: alice", 6, "devices[0].nmae", "did you mean \"name\"?"),
        (minimal + "\n    in-room: -50", 6, "devices[0].in-room", "\"in-room\" is a key of radio"),
        (minimal + "\n    script:\n      - {at: 10, walk: kichen}", 7, "devices[0].script[0].walk",
         "no room \"kichen\" (did you mean \"kitchen\"?)"),
        (minimal + "\n    script:\n      - {at: 10, walk: {between: [hall, hall]}}", 7,
         "devices[0].script[0].walk.between", "two different rooms"),
        (minimal + "\n    script:\n      - {at: 10, save: true, silent: true}", 7, "devices[0].script[0]",
         "one action per step"),
        (minimal + "\n    script:\n      - {at: 61, save: true}", 7, "devices[0].script[0].at",
         "61 is after the end (duration 60)"),
        (minimal + "\n    script:\n      - {walk: hall}", 7, "devices[0].script[0].at", "missing"),
        (minimal + "\n    script:\n      - {at: 5, save: false}", 7, "devices[0].script[0].save",
         "write \"save: true\""),
        (minimal.replacingOccurrences(of: "5a0000000001", with: "5a00zz"), 4, "devices[0].id",
         "12 hex digits"),
        (minimal.replacingOccurrences(of: "at: hall", with: "at: attic"), 5, "devices[0].at", "no room \"attic\""),
        ("rate: -1\n" + minimal, 1, "rate", "must be more than 0"),
        ("rate: 10s\n" + minimal, 1, "rate", "write the number alone"),
        (minimal.replacingOccurrences(of: "duration: 60\n", with: "seed: 3\n"), 1, "duration", "missing"),
        ("radio:\n  loss: 1.5\n" + minimal, 2, "radio.loss", "between 0 and 1"),
        (minimal.replacingOccurrences(of: "{id: kitchen}", with: "{id: Kitchen Room}"), 2, "rooms[1].id",
         "a-z, 0-9, _ and -"),
        (minimal.replacingOccurrences(of: "{id: kitchen}", with: "{id: hall}"), 2, "rooms[1].id", "listed twice"),
        (minimal + "\n  - {id: 5a0000000001, at: kitchen}", 6, "devices[1].id", "listed twice (first on line 4)"),
        (minimal + "\ncrowd: {count: 10, first-id: 59fffffffffa}", 6, "crowd.first-id", "include device 5a0000000001"),
        ("company-id: 0x004C\n" + minimal, 1, "company-id", "Apple's company id"),
        ("duration: 60\n\trooms: []\n", 2, "", "tabs"),
        // Device links (docs/simulator.md "Device links").
        (minimal + "\n    payload-bytes: 10", 6, "devices[0].payload-bytes", "must be between 64 and 65535"),
        (minimal + "\n    payload-bytes: 65536", 6, "devices[0].payload-bytes", "must be between 64 and 65535"),
        (minimal + "\n    payload-bytes: 68", 6, "devices[0].payload-bytes", "must be at least 69 for this device"),
        (minimal + "\n    link: maybe", 6, "devices[0].link", "expected true or false"),
        (minimal + "\n    group-secret: BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QM", 6, "devices[0].group-secret",
         "checksum does not match"),
        (minimal + "\n    title: \"\"", 6, "devices[0].title", "1 to 100 bytes"),
        (minimal + "\n    type: reader", 6, "devices[0].type", "reverse DNS"),
        ("radio:\n  link-latency: -1\n" + minimal, 2, "radio.link-latency", "between 0 and 60"),
        (minimal + "\ncrowd: {count: 10, first-id: 5b0000000000, payload-bytes: 70000}", 6, "crowd.payload-bytes",
         "must be between 64 and 65535"),
        (minimal + "\ncrowd: {count: 10, first-id: 5b0000000000, link: 2}", 6, "crowd.link", "expected true or false"),
        (minimal + "\ncrowd: {count: 10, first-id: 5b0000000000, walk: nextdoor}", 6, "crowd.walk",
         "expected one of anywhere or next-door, got \"nextdoor\""),
        // Nesting, tags and a plus sign (issue 16).
        ("duration: 60\nrooms: " + String(repeating: "[", count: 5000) + "\n", 2, "",
         "YAML nesting deeper than 64 levels (lists and sections inside each other)"),
        (minimal.replacingOccurrences(of: "duration: 60", with: "duration: !!int 60"), 1, "", "YAML tag !!int is not allowed"),
        (minimal.replacingOccurrences(of: "at: hall", with: "at: !room hall"), 5, "", "YAML tag !room is not allowed"),
        ("rate: +5\n" + minimal, 1, "rate", "got \"+5\": write it without the +"),
        ("seed: +3\n" + minimal, 1, "seed", "got \"+3\": write it without the +"),
        ("radio:\n  in-room: +5\n" + minimal, 2, "radio.in-room", "got \"+5\": write it without the +"),
        ("company-id: 0x+FF\n" + minimal, 1, "company-id", "expected a number like 0xFFFF, got \"0x+FF\""),
    ]

    @Test(arguments: mistakes.indices)
    func aMistakeIsReportedWithFileLineAndKey(_ i: Int) throws {
        let m = Self.mistakes[i]
        let error = try #require(parseError(m.yaml), "accepted: \(m.yaml)")
        #expect(error.line == m.line, "\(error)")
        #expect(error.key == m.key, "\(error)")
        #expect(error.message.contains(m.says), "\(error)")
        var prefix = "s.yaml"
        if let line = m.line { prefix += ":\(line)" }
        if !m.key.isEmpty { prefix += ": \(m.key)" }
        #expect(error.description.hasPrefix(prefix + ": "), "\(error)")
    }

    /// 64 levels pass the check and reach the schema; 65 do not. A device's title is 3 down
    /// (the top, `devices`, the device), so 61 lists in it make 64.
    @Test func nestingUpToTheCapIsReadOn() throws {
        func title(lists n: Int) -> String {
            Self.minimal + "\n    title: " + String(repeating: "[", count: n) + String(repeating: "]", count: n)
        }
        let inside = try #require(parseError(title(lists: 61)))
        #expect(inside.description == "s.yaml:6: devices[0].title: expected the activity's title, got a list", "\(inside)")
        let past = try #require(parseError(title(lists: 62)))
        #expect(past.description == "s.yaml:6: YAML nesting deeper than 64 levels (lists and sections inside each other): is it the right file?")
    }

    @Test func everyMistakeInTheFileIsReportedInFileOrder() throws {
        let yaml = "rate: 0\n" + Self.minimal + "\n    nmae: x\n    streams: maybe"
        let error = try #require(parseError(yaml))
        #expect(error.all.map(\.line) == [1, 7, 8])
        #expect(error.all.map(\.key) == ["rate", "devices[0].nmae", "devices[0].streams"])
        #expect(error.description.split(separator: "\n").count == 3)
    }

    @Test func theDeviceLinkKeysParse() throws {
        let s = try Scenario.parse(yaml: """
            duration: 60
            radio: {link-latency: 0.25}
            rooms: [{id: hall}]
            devices:
              - {id: 5a0000000001, at: hall, title: Chapter 3, payload-bytes: 69, link: false}
              - {id: 5a0000000002, at: hall}
            crowd: {count: 3, first-id: 5b0000000000, title: Shared, payload-bytes: 3072, link: false}
            """, file: "s.yaml")
        #expect(s.radio.linkLatency == 0.25)
        #expect(s.devices.map(\.title) == ["Chapter 3", nil])
        #expect(s.devices.map(\.payloadBytes) == [69, nil])
        #expect(s.devices.map(\.link) == [false, true])
        #expect(s.crowd == Scenario.Crowd(count: 3, firstID: 0x5B00_0000_0000, title: "Shared", payloadBytes: 3072, link: false))
        // Padded to exactly payload-bytes, whatever the sequence.
        let player = ScenarioPlayer(s)
        #expect(player.payload(device: 0, sequence: .max).count == 69)
        // No link: the beacon names PSM 0 (docs/protocol.md §2.1).
        #expect(player.beacon(0).psm == 0 && player.beacon(1).psm == 0x81 && player.beacon(2).psm == 0)
    }

    @Test func roomsUpToTheCapacityAndOnePast() throws {
        func yaml(rooms n: Int) -> String {
            "duration: 1\nrooms:\n" + (0..<n).map { "  - {id: r\($0)}\n" }.joined()
                + "devices: [{id: 5a0000000001, at: r0}]\n"
        }
        #expect(try Scenario.parse(yaml: yaml(rooms: Scenario.maxRooms), file: "s.yaml").rooms.count == Scenario.maxRooms)
        #expect(throws: ScenarioError.self) { try Scenario.parse(yaml: yaml(rooms: Scenario.maxRooms + 1), file: "s.yaml") }
    }

    @Test func devicesUpToTheCapacityAndOnePast() throws {
        func yaml(crowd n: Int) -> String { Self.minimal + "\ncrowd: {count: \(n), first-id: 5b0000000000}\n" }
        let full = try Scenario.parse(yaml: yaml(crowd: Scenario.maxDevices - 1), file: "s.yaml")
        #expect(full.devices.count + (full.crowd?.count ?? 0) == Scenario.maxDevices)
        let error = try #require(parseError(yaml(crowd: Scenario.maxDevices)), "one past the capacity was accepted")
        #expect(error.key == "crowd.count")
    }
}

// MARK: - The RSSI model, in process

/// Everything a player produced up to the end: per room, the reports heard.
struct Heard {
    var reports: [[(time: Int64, device: UInt64, sequence: UInt16, rssi: Int8)]]
    var events: [ScenarioEvent] = []
}

func play(_ scenario: Scenario) -> (ScenarioPlayer, Heard) {
    let player = ScenarioPlayer(scenario)
    var heard = Heard(reports: Array(repeating: [], count: scenario.rooms.count))
    player.advance(to: player.end, hear: { room, report in
        guard case .baton(let b) = report.kind else { return }
        // The advertisement is the beacon, as a gateway decodes it.
        let decoded = report.data.withUnsafeBytes { try? ActivityBeacon.find(inAdvertisingData: $0) }
        #expect(decoded == b)
        heard.reports[room].append((report.timestamp, b.deviceID, b.sequence, report.rssi))
    }, event: { heard.events.append($0) })
    return (player, heard)
}

let threeRooms = [Scenario.Room(id: "hall", name: "Hall", x: 0), Scenario.Room(id: "kitchen", name: "Kitchen", x: 1),
                  Scenario.Room(id: "office", name: "Office", x: 2)]

@Suite struct RadioModelTests {
    @Test func aRoomHearsItsOwnDeviceLouderThanItsNeighbours() {
        let s = Scenario(duration: 200, rate: 10, radio: Scenario.Radio(heardDownTo: -127, noise: 3, loss: 0), rooms: threeRooms,
                         devices: [Scenario.Device(id: 0x5A00_0000_0001, name: "a", type: "t", place: .room("hall"))])
        let (player, heard) = play(s)
        let levels = heard.reports.map { mean($0.map(\.rssi)) }
        #expect(abs(levels[0] - -55) < 0.5, "\(levels)")
        #expect(abs(levels[1] - -70) < 0.5, "\(levels)")
        #expect(abs(levels[2] - -85) < 0.5, "\(levels)")
        // rate 10 for 200 s, and every room heard every report (no loss, nothing too weak).
        #expect(abs(player.reportsSent - 2000) <= 5)
        #expect(heard.reports.allSatisfy { $0.count == player.reportsSent })
        // The noise is there: not every report at the mean.
        #expect(Set(heard.reports[0].map(\.rssi)).count > 5)
    }

    @Test func eachRoomMissesItsLossFraction() {
        var rooms = threeRooms
        rooms[2].loss = 0.5
        let s = Scenario(duration: 500, rate: 10, radio: Scenario.Radio(noise: 0, loss: 0.2), rooms: rooms,
                         devices: [Scenario.Device(id: 1, name: "a", type: "t", place: .room("kitchen"))])
        let (player, heard) = play(s)
        let sent = Double(player.reportsSent)
        #expect(abs(Double(player.counts[0].lost) / sent - 0.2) < 0.02, "\(player.counts)")
        #expect(abs(Double(player.counts[1].lost) / sent - 0.2) < 0.02, "\(player.counts)")
        #expect(abs(Double(player.counts[2].lost) / sent - 0.5) < 0.03, "\(player.counts)")
        for r in 0..<3 { #expect(heard.reports[r].count + player.counts[r].lost == player.reportsSent) }
    }

    @Test func reportsBelowHeardDownToAreNotHeard() {
        let s = Scenario(duration: 200, rate: 10, radio: Scenario.Radio(heardDownTo: -80, noise: 3, loss: 0),
                         rooms: threeRooms, devices: [Scenario.Device(id: 1, name: "a", type: "t", place: .room("hall"))])
        let (player, heard) = play(s)
        // The office is 2 rooms away: -85 on average, so only the loudest few reach -80.
        #expect(heard.reports[2].allSatisfy { $0.rssi >= -80 })
        #expect(player.counts[2].unheard > player.reportsSent * 8 / 10)
        #expect(player.counts[2].unheard + heard.reports[2].count == player.reportsSent)
        #expect(player.counts[0].unheard == 0)
    }

    @Test func levelsAreClampedToWhatAnHCIReportCarries() {
        let s = Scenario(duration: 50, rate: 10, radio: Scenario.Radio(inRoom: 15, perRoom: -100, heardDownTo: -127,
                                                                       noise: 10, loss: 0),
                         rooms: threeRooms, devices: [Scenario.Device(id: 1, name: "a", type: "t", place: .room("hall"))])
        let (_, heard) = play(s)
        #expect(heard.reports[0].contains { $0.rssi == 20 })
        #expect(heard.reports[0].allSatisfy { $0.rssi <= 20 })
        #expect(heard.reports[2].allSatisfy { $0.rssi == -127 })
    }

    @Test func theSameSeedGivesTheSameReports() throws {
        var s = try Scenario.parse(yaml: exampleScenario, file: "example.yaml")
        s.crowd?.count = 50
        s.crowd?.wander = 5
        func fingerprint(_ s: Scenario) -> [String] {
            let (_, heard) = play(s)
            return heard.reports.map { $0.map { "\($0.time) \($0.device) \($0.sequence) \($0.rssi)" }.joined(separator: ",") }
                + heard.events.map { "\($0.time) \($0.deviceID) \($0.action)" }
        }
        let first = fingerprint(s)
        #expect(first == fingerprint(s))
        s.seed = 2
        #expect(first != fingerprint(s))
    }

    @Test func aWalkMovesTheRoomThatHearsTheDeviceLoudest() {
        let s = Scenario(duration: 60, rate: 10, rooms: threeRooms, devices: [
            Scenario.Device(id: 1, name: "alice", type: "t", place: .room("hall"), script: [
                Scenario.Step(at: 20, .walk(.room("kitchen"))), Scenario.Step(at: 20, .save),
                Scenario.Step(at: 40, .walk(.room("office"))), Scenario.Step(at: 40, .save),
            ]),
        ])
        let (_, heard) = play(s)
        func loudest(sequence: UInt16) -> Int {
            let levels = heard.reports.map { mean($0.filter { $0.sequence == sequence }.map(\.rssi)) }
            return levels.indices.max { levels[$0] < levels[$1] }!
        }
        #expect(loudest(sequence: 1) == 0)
        #expect(loudest(sequence: 2) == 1)
        #expect(loudest(sequence: 3) == 2)
        #expect(heard.events.map(\.time) == [20_000_000, 20_000_000, 40_000_000, 40_000_000])
        #expect(heard.events.map(\.sequence) == [1, 2, 2, 3])
    }

    @Test func stepsChangeTheBeaconAsTheyDo() {
        let s = Scenario(duration: 60, rate: 10, radio: Scenario.Radio(loss: 0), rooms: threeRooms, devices: [
            Scenario.Device(id: 1, name: "alice", type: "com.example.reader.article", streams: true, place: .room("hall"),
                            script: [Scenario.Step(at: 10, .becomeCurrent("com.example.video.watch")),
                                     Scenario.Step(at: 20, .invalidate),
                                     Scenario.Step(at: 30, .silent), Scenario.Step(at: 40, .resume)]),
        ])
        let player = ScenarioPlayer(s)
        var beacons: [(Int64, ActivityBeacon)] = []
        player.advance(to: player.end, hear: { room, report in
            if room == 0, case .baton(let b) = report.kind { beacons.append((report.timestamp, b)) }
        }, event: { _ in })
        let before = beacons.filter { $0.0 < 10_000_000 }.map(\.1)
        let video = beacons.filter { $0.0 > 10_000_000 && $0.0 < 20_000_000 }.map(\.1)
        let ended = beacons.filter { $0.0 > 20_000_000 }.map(\.1)
        #expect(before.allSatisfy { $0.activityTypeHash == activityTypeHash("com.example.reader.article".utf8) && $0.sequence == 1 })
        #expect(video.allSatisfy { $0.activityTypeHash == activityTypeHash("com.example.video.watch".utf8) && $0.sequence == 2 })
        #expect(ended.allSatisfy { $0.flags.contains(.invalidated) && $0.flags.contains(.supportsStreams) && $0.sequence == 3 })
        // Silent from 30 to 40 s: nothing in between, and it speaks again after.
        #expect(!beacons.contains { $0.0 > 30_000_000 && $0.0 < 40_000_000 })
        #expect(beacons.contains { $0.0 > 40_000_000 })
        #expect(beacons.allSatisfy { $0.1.groupHash == 0xA1B2_C3D4 && $0.1.deviceID == 1 && $0.1.psm == 0x80 })
    }

    @Test func aCrowdWandersBetweenRooms() {
        let s = Scenario(duration: 100, rate: 1, rooms: threeRooms, devices: [],
                         crowd: Scenario.Crowd(count: 100, firstID: 0x5B00_0000_0000, wander: 10))
        let (player, heard) = play(s)
        #expect(player.deviceCount == 100)
        // About every 10 s each: 100 × 100 / 10 walks, give or take.
        #expect(heard.events.count > 800 && heard.events.count < 1200, "\(heard.events.count)")
        var room: [Int: String] = [:]
        for e in heard.events {
            guard case .walk(.room(let r)) = e.action else { Issue.record("\(e.action)"); continue }
            #expect(room[e.device] != r, "a wander goes to another room")
            room[e.device] = r
        }
        #expect(Set(heard.events.map(\.deviceID)).isSubset(of: Set((0..<100).map { 0x5B00_0000_0000 + UInt64($0) })))
    }

    /// `walk: next-door` in a 3 × 2 grid: every walk goes to a room sharing a wall with the one
    /// before (one room unit away, never the diagonal), and every such room is walked to.
    @Test func aCrowdWalkingNextDoorOnlyCrossesWalls() throws {
        let grid = (0..<6).map { Scenario.Room(id: "r\($0)", name: "r\($0)", x: Double($0 % 3), y: Double($0 / 3)) }
        var crowd = Scenario.Crowd(count: 100, firstID: 0x5B00_0000_0000, wander: 10)
        crowd.walk = .nextDoor
        let (_, heard) = play(Scenario(duration: 100, rate: 1, rooms: grid, devices: [], crowd: crowd))
        #expect(heard.events.count > 800, "\(heard.events.count)")
        var room: [Int: Int] = [:]
        var steps: Set<[Int]> = []
        for e in heard.events {
            guard case .walk(.room(let id)) = e.action, let r = Int(id.dropFirst()) else { Issue.record("\(e.action)"); continue }
            if let from = room[e.device] {
                let dx = abs(from % 3 - r % 3), dy = abs(from / 3 - r / 3)
                #expect(dx + dy == 1, "r\(from) to r\(r) is not next door")
                steps.insert([from, r])
            }
            room[e.device] = r
        }
        // 7 walls in a 3 × 2 grid, each crossed both ways.
        #expect(steps.count == 14, "\(steps.sorted { $0.lexicographicallyPrecedes($1) })")
    }
}
