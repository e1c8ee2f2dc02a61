// Continuing in another room (docs/relay.md): three rooms' gateways on the simulator, a real
// mosquitto (or two, bridged), and fetches asked the way a user's app would — `baton fetch`,
// or `mosquitto_pub`/`mosquitto_sub` with MQTT v5 properties or the v3.1.1 body.
import BatonLibc
import BatonKeys
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

/// alice's phone in the hall offers a 3,000-byte payload and streams (the simulator echoes
/// them); bob's laptop in the office offers no link (`link: false`). The scenario runs long
/// enough for every test's fetches and streams.
let relayScenario = """
    seed: 11
    speed: 1
    duration: 120
    rate: 10
    radio: {in-room: -55, per-room: -15, heard-down-to: -95, noise: 1, loss: 0, link-latency: 0.1}
    rooms:
      - {id: hall, name: Hall}
      - {id: kitchen, name: Kitchen}
      - {id: office, name: Office}
    devices:
      - id: 5a0000000001
        name: alice-phone
        type: com.example.reader.article
        title: A long read
        payload-bytes: 3000
        web-url: true
        streams: true
        at: hall
      - id: 5a0000000003
        name: carol-tablet
        type: com.example.video.watch
        at: kitchen
      - id: 5a0000000002
        name: bob-laptop
        type: com.example.mail.compose
        link: false
        at: office
      - id: 5a0000000004
        name: dave-phone
        type: com.example.notes.edit
        title: Dave's secret plan
        group-secret: \(daveSecret)
        identity: 4
        rotate: 2
        streams: true
        at: kitchen
    """

/// Dave's group (docs/security.md §8.1's vector): his payloads leave his phone sealed, and his
/// phone, device 4 of the group, rotates its id every 2 s (§3.1).
let daveSecret = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"
/// The gateways hold the group's beacon key, so they publish Dave under his identity id.
let daveKeys = try! GroupKeys.derive(secret: try! GroupSecret(text: daveSecret))
let dave = ActivityBeacon.deviceIDText(DeviceIdentity.id(groupHash: daveKeys.groupHash, number: 4))

/// `baton fetch` as a child process: exit status, stdout bytes, stderr text.
func batonFetch(_ arguments: [String], in dir: URL) throws -> (status: Int32?, out: [UInt8], err: String) {
    let tag = UUID().uuidString.prefix(8)
    let out = dir.appendingPathComponent("fetch-\(tag).out"), err = dir.appendingPathComponent("fetch-\(tag).err")
    let code = try ChildProcess.run(batonBinary.path, ["fetch"] + arguments, stdout: out.path, stderr: err.path,
                                    timeout: .seconds(20))
    let status: Int32? = code < 0 ? nil : code
    let bytes = (try? Data(contentsOf: out)).map { [UInt8]($0) } ?? []
    return (status, bytes, (try? String(contentsOf: err, encoding: .utf8)) ?? "")
}

/// The simulator and one gateway per room, each on `brokers[i % count]`, with the owners
/// settled: alice in the hall, carol in the kitchen, bob in the office.
final class RelayBuilding {
    let dir: URL
    let building: SimulatedBuilding
    var gateways: [GatewayProcess] = []
    let player: ScenarioPlayer
    /// The tests' `mosquitto_sub`s (`subscribe`), killed with the building.
    private var subscribers: [ChildProcess] = []

    /// `extra` is YAML appended to every gateway's config (a `relay:` section, say).
    init(name: String, brokers: [MosquittoBroker], extra: String = "") throws {
        dir = try scratchDirectory(name)
        building = try SimulatedBuilding(scenario: relayScenario, in: dir)
        player = ScenarioPlayer(try Scenario.parse(yaml: relayScenario, file: "relay.yaml"))
        for (i, (id, room)) in threeRooms.enumerated() {
            gateways.append(try GatewayProcess(
                yaml: roomGatewayYAML(port: brokers[i % brokers.count].port, id: id, room: room,
                                      socket: building.socket(id))
                    + "\nsecurity:\n  beacon-key: \(daveKeys.beaconKey.text)\n" + extra, in: try folder(id, in: dir)))
        }
        let watched = brokers[0]
        let settled = eventually(within: 20) { () -> Bool? in
            let retained = (try? watched.retained("baton/activities/+")) ?? [:]
            let rooms = ["5a0000000001": "hall", "5a0000000003": "kitchen", "5a0000000002": "office"]
            return rooms.allSatisfy { device, gateway in
                json(retained["baton/activities/\(device)"] ?? [])?["gateway"] as? String == gateway
            } ? true : nil
        }
        guard settled != nil else {
            throw BrokerError("the rooms did not settle: \(gateways.map(\.log).joined(separator: "\n---\n"))")
        }
    }

    /// What alice's phone answers a fetch with now.
    var alicePayload: [UInt8] { player.payload(device: 0, sequence: player.sequence(device: 0)) }

    func stopAll() {
        for g in gateways { #expect(g.stop() == 0, "a gateway did not stop cleanly: \(g.log)") }
    }

    /// `mosquitto_sub` on `broker` with `arguments` (its topic and how it prints) into the file
    /// `name` in the building's folder, which `read` and `bytes` read, until the building goes.
    func subscribe(_ name: String, on broker: MosquittoBroker, _ arguments: [String]) throws {
        subscribers.append(try ChildProcess("/usr/bin/mosquitto_sub", ["-h", "127.0.0.1", "-p", "\(broker.port)"] + arguments,
                                            stdout: dir.appendingPathComponent(name).path))
    }

    deinit {
        for sub in subscribers {
            sub.signal(SIGKILL)
            _ = sub.wait(timeout: .seconds(5))
        }
    }
}

/// Fetches asked by hand, as a user's script would: each request published with
/// `mosquitto_pub` (MQTT 3.1.1, QoS 1, the body's `response_topic`), the answers collected by
/// one `mosquitto_sub` on `test/answers/#`. Request n answers on `test/answers/n` with
/// correlation "0n".
final class HandFetches {
    let port: Int
    let file: URL
    let sub: ChildProcess

    init(broker: MosquittoBroker, in dir: URL) throws {
        port = broker.port
        file = dir.appendingPathComponent("answers.txt")
        sub = try ChildProcess("/usr/bin/mosquitto_sub",
                               ["-h", "127.0.0.1", "-p", "\(port)", "-V", "mqttv311", "-v", "-t", "test/answers/#"],
                               stdout: file.path)
        usleep(300_000)
    }

    deinit {
        sub.signal(SIGKILL)
        _ = sub.wait(timeout: .seconds(5))
    }

    static func route(_ n: Int, _ extra: String = "") -> String {
        #"{"response_topic":"test/answers/\#(n)","correlation":"0\#(n)"\#(extra)}"#
    }

    func request(_ device: String, _ body: String) throws {
        let p = try ChildProcess("/usr/bin/mosquitto_pub",
                                 ["-h", "127.0.0.1", "-p", "\(port)", "-V", "mqttv311", "-q", "1",
                                  "-t", "baton/fetch/\(device)", "-m", body])
        #expect(p.wait(timeout: .seconds(10)) == 0)
    }

    /// The answers so far, by request number, in arrival order.
    func collected() -> [String: [[String: Any]]] {
        let text = (try? String(contentsOf: file, encoding: .utf8)) ?? ""
        var result: [String: [[String: Any]]] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, let n = parts[0].split(separator: "/").last, let o = json(Array(parts[1].utf8)) else { continue }
            result[String(n), default: []].append(o)
        }
        return result
    }
}

@Suite(.serialized) struct RelayTests {
    let alice = "5a0000000001", bob = "5a0000000002", carol = "5a0000000003"

    @Test func aFetchFromAnotherRoomReturnsThePayloadBytes() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "fetch", brokers: [broker])
        let url = "mqtt://127.0.0.1:\(broker.port)"

        // CBOR: the device's bytes, exactly.
        let cbor = try batonFetch([alice, "--cbor", "--broker", url], in: b.dir)
        #expect(cbor.status == 0, "baton fetch failed: \(cbor.err)")
        #expect(cbor.out.count == 3000)
        #expect(cbor.out == b.alicePayload, "the payload differs from what alice's phone sent")

        // JSON: the same payload rendered (docs/payload.md §4).
        let rendered = try batonFetch([alice, "--broker", url], in: b.dir)
        #expect(rendered.status == 0, "baton fetch failed: \(rendered.err)")
        let payload = json(rendered.out)
        #expect(payload?["activityType"] as? String == "com.example.reader.article")
        #expect(payload?["title"] as? String == "A long read")
        #expect((payload?["userInfo"] as? [String: Any])?["position"] as? Int == Int(b.player.sequence(device: 0)))

        // The second fetch came from the hall's cache: one link opened for the two. The hall also
        // reads alice's payload for her title (docs/relay.md §4.1) through the same cache, so
        // that read and the two fetches share the one link, and one or two of the fetches are hits.
        let stats = try #require(eventually(within: 5) { () -> [String: Any]? in
            let s = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            let relay = s?["relay"] as? [String: Any]
            return (relay?["answers"] as? [String: Any])?["ok"] as? Int == 2 ? relay : nil
        }, "the hall's stats never counted two ok answers")
        #expect((1...2).contains(stats["cache_hits"] as? Int ?? 0), "\(stats)")
        #expect(stats["link_opens"] as? Int == 1, "\(stats)")

        // A device without a link, and one nobody hears: error answers, exit status 1.
        let noLink = try batonFetch([bob, "--broker", url], in: b.dir)
        #expect(noLink.status == 1 && noLink.err.contains("unreachable") && noLink.err.contains("gateway office"),
                "bob's laptop has no link: \(noLink.status.map(String.init) ?? "killed") \(noLink.err)")
        let nobody = try batonFetch(["5affffffffff", "--broker", url], in: b.dir)
        #expect(nobody.status == 1 && nobody.err.contains("unknown-device"), "unknown device: \(nobody.err)")
        b.stopAll()
    }

    @Test func aFetchAcrossBridgedBrokersUsesTheBodyFallback() throws {
        // Floor 2's mosquitto bridges to floor 1's with MQTT v3.1.1 (mosquitto's default), so
        // the request's v5 properties are lost on the way and the body carries the route.
        let (floor1, floor2) = try bridgedFloors()
        // hall and office on floor 1, kitchen on floor 2; the requester stands on floor 2.
        let b = try RelayBuilding(name: "fetch-bridged", brokers: [floor1, floor2])
        let cbor = try batonFetch([alice, "--cbor", "--broker", "mqtt://127.0.0.1:\(floor2.port)"], in: b.dir)
        #expect(cbor.status == 0, "baton fetch across the bridge failed: \(cbor.err)")
        #expect(cbor.out == b.alicePayload)
        b.stopAll()
    }

    /// docs/security.md §5: a keyed group's payload crosses the building sealed. Gateways and
    /// the broker carry ciphertext; only `baton fetch --key` with the group secret opens it.
    @Test func aSealedPayloadCrossesTheBuildingAsCiphertext() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "fetch-sealed", brokers: [broker])
        try b.subscribe("everything.bin", on: broker, ["-v", "-t", "#"])
        usleep(300_000)
        let url = "mqtt://127.0.0.1:\(broker.port)"
        let plain = b.player.payload(device: 3, sequence: b.player.sequence(device: 3))
        try "\(daveSecret)\n".write(to: b.dir.appendingPathComponent("dave.key"), atomically: true, encoding: .utf8)
        let other = GroupSecret(bytes: Array(repeating: 0x42, count: GroupSecret.byteCount)).text
        try "\(other)\n".write(to: b.dir.appendingPathComponent("other.key"), atomically: true, encoding: .utf8)

        // Without the key: the envelope (version, nonce, ciphertext, tag), not the payload.
        let sealed = try batonFetch([dave, "--cbor", "--broker", url], in: b.dir)
        #expect(sealed.status == 0, "\(sealed.err)")
        #expect(sealed.out.count == plain.count + 29 && sealed.out != plain && sealed.out.first == 0x01)
        let asJSON = try batonFetch([dave, "--broker", url], in: b.dir)
        #expect(asJSON.status == 1 && asJSON.err.contains("bad-request") && asJSON.err.contains("sealed"), "\(asJSON.err)")

        // With the group secret: exactly what the phone saved.
        let opened = try batonFetch([dave, "--cbor", "--key", b.dir.appendingPathComponent("dave.key").path, "--broker", url], in: b.dir)
        #expect(opened.status == 0, "\(opened.err)")
        #expect(opened.out == plain, "the opened payload differs from the phone's")
        let rendered = try batonFetch([dave, "--key", b.dir.appendingPathComponent("dave.key").path, "--broker", url], in: b.dir)
        #expect(json(rendered.out)?["title"] as? String == "Dave's secret plan", "\(rendered.err)")
        let wrong = try batonFetch([dave, "--key", b.dir.appendingPathComponent("other.key").path, "--broker", url], in: b.dir)
        #expect(wrong.status == 1 && wrong.err.contains("did not open"), "\(wrong.err)")

        // Nothing on the broker ever held the plaintext.
        usleep(500_000)
        let seen = b.bytes("everything.bin")
        #expect(seen.count > 0)
        #expect(!contains(seen, Array("secret plan".utf8)), "the title crossed the broker in the clear")
        #expect(!contains(seen, Array(plain.prefix(48))), "the payload's bytes crossed the broker in the clear")
        b.stopAll()
    }

    /// Handoff's userActivityWasContinued: a fetch that says where it continues the activity
    /// tells the device over its link and publishes the event; a fetch that only looks does not.
    @Test func aFetchThatContinuesTellsTheDeviceAndPublishesTheEvent() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "fetch-continue", brokers: [broker])
        try b.subscribe("continued.txt", on: broker, ["-v", "-t", "baton/continued/+"])
        let watchOut = b.dir.appendingPathComponent("watch.txt")
        let watch = try ChildProcess(batonBinary.path, ["watch", "--lines", "--broker", "mqtt://127.0.0.1:\(broker.port)"],
                                     stdout: watchOut.path)
        defer { watch.signal(SIGKILL); _ = watch.wait(timeout: .seconds(5)) }
        usleep(500_000)
        let url = "mqtt://127.0.0.1:\(broker.port)"
        // First over the link (the continued message follows the payload on it), then a fetch
        // that only looks (from the cache): one continuation in all.
        let take = try batonFetch([alice, "--broker", url, "--continue", "Living room TV"], in: b.dir)
        #expect(take.status == 0, "\(take.err)")
        let look = try batonFetch([alice, "--broker", url], in: b.dir)
        #expect(look.status == 0, "\(look.err)")

        // The device heard `continued(seq, "Living room TV")` on its link (the simulator's line).
        let told = eventually(within: 10) { () -> [[String: Any]]? in
            let lines = b.building.lines.filter { $0["event"] as? String == "continued" }
            return lines.isEmpty ? nil : lines
        }
        #expect(told?.count == 1, "the device was told \(told?.count ?? 0) times: \(told ?? [])")
        #expect(told?.first?["device"] as? String == alice)
        #expect(told?.first?["room"] as? String == "Living room TV")
        #expect(told?.first?["sequence"] as? Int == Int(b.player.sequence(device: 0)))

        // And automations saw the event, once.
        let seen = eventually(within: 5) { () -> [String]? in
            let lines = b.read("continued.txt").split(separator: "\n").map(String.init)
            return lines.isEmpty ? nil : lines
        }
        #expect(seen?.count == 1, "events: \(seen ?? [])")
        let event = seen?.first.flatMap { json(Array($0.split(separator: " ", maxSplits: 1).last!.utf8)) }
        #expect(seen?.first?.hasPrefix("baton/continued/\(alice) ") == true)
        #expect(event?["at"] as? String == "Living room TV" && event?["gateway"] as? String == "hall"
                && event?["room"] as? String == "Hall" && event?["seq"] as? Int == Int(b.player.sequence(device: 0)),
                "event: \(event.map { "\($0)" } ?? "none")")
        // `baton watch --lines` says it in words (docs/mqtt.md §8).
        let said = eventually(within: 5) { () -> String? in
            let text = (try? String(contentsOf: watchOut, encoding: .utf8)) ?? ""
            return text.contains("\(alice) continued at Living room TV (from Hall") ? text : nil
        }
        #expect(said != nil, "baton watch: \((try? String(contentsOf: watchOut, encoding: .utf8)) ?? "")")
        b.stopAll()
    }

    /// Requests published by hand, answers collected by hand: each request gets exactly one
    /// answer from the three gateways, and garbage is answered or counted.
    @Test func everyRequestGetsExactlyOneAnswer() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "fetch-garbage", brokers: [broker])
        let hand = try HandFetches(broker: broker, in: b.dir)
        func request(_ device: String, _ body: String) throws { try hand.request(device, body) }
        func route(_ n: Int, _ extra: String = "") -> String { HandFetches.route(n, extra) }
        try request(alice, route(1))                                  // ok
        try request(alice, route(2, #","format":"xml""#))               // bad-request: format
        try request(alice, route(3, #","colour":"red""#))               // bad-request: unknown key
        try request("5A0000000001", route(4))                         // bad-request: the topic
        try request("5affffffffff", route(5))                         // unknown-device
        try request(bob, route(6))                                    // unreachable: no link
        try request(alice, #"{"format":"json"}"#)                     // nowhere to answer: counted
        try request(alice, "not json")                                // nowhere to answer: counted
        try request(carol, route(7, #","format":"json""#))            // ok, rendered

        let expected = ["1": "ok", "2": "bad-request", "3": "bad-request", "4": "bad-request",
                        "5": "unknown-device", "6": "unreachable", "7": "ok"]
        func collected() -> [String: [[String: Any]]] { hand.collected() }
        _ = eventually(within: 10) { collected().count == expected.count ? true : nil }
        // Any second answer would come within the fetch timeout: wait it out once.
        usleep(1_500_000)
        let got = collected()
        for (n, status) in expected.sorted(by: { $0.key < $1.key }) {
            let list = got[n] ?? []
            #expect(list.count == 1, "request \(n) got \(list.count) answers: \(list)")
            #expect(list.first?["status"] as? String == status, "request \(n): \(list.first.map { "\($0)" } ?? "no answer")")
            #expect(list.first?["correlation"] as? String == "0\(n)", "request \(n) lost its correlation")
        }
        let carolPayload = b.player.payload(device: 1, sequence: b.player.sequence(device: 1))
        #expect(((got["7"]?.first?["payload"] as? [String: Any])?["activityType"] as? String) == "com.example.video.watch")
        #expect(!carolPayload.isEmpty)
        let ok = got["1"]?.first
        #expect(ok?["cbor"] as? String == Data(b.alicePayload).base64EncodedString())
        #expect(ok?["gateway"] as? String == "hall")

        // The hall counted the two it could not answer (every gateway does).
        let drops = eventually(within: 5) { () -> [String: Any]? in
            let s = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            let d = (s?["relay"] as? [String: Any])?["drops"] as? [String: Any]
            return d?["fetch-no-response-topic"] as? Int == 1 && d?["fetch-syntax"] as? Int == 1 ? d : nil
        }
        #expect(drops != nil, "the unanswerable requests were not counted")

        // And the gateways keep serving.
        let again = try batonFetch([alice, "--cbor", "--broker", "mqtt://127.0.0.1:\(broker.port)"], in: b.dir)
        #expect(again.status == 0 && again.out == b.alicePayload)
        b.stopAll()
    }

    /// MQTT v5 request/response with `mosquitto_pub -D`: a second request of the same
    /// requester before the first is answered makes the first `cancelled`.
    @Test func aNewerRequestFromTheSameRequesterCancelsTheFirst() throws {
        let broker = try MosquittoBroker()
        // Without the owner's own fetch for carol's title (docs/relay.md §4.1), which would leave
        // her payload in the cache and answer the first request from it before the second came.
        let b = try RelayBuilding(name: "fetch-cancel", brokers: [broker], extra: "relay:\n  fetch-titles: false\n")
        try b.subscribe("answers.txt", on: broker, ["-V", "mqttv5", "-F", "%t %P %p", "-t", "test/v5/#"])
        usleep(300_000)
        // Two requests in one connection, back to back (`-l`: one message per stdin line), for
        // JSON answers so the collected file is text.
        let lines = b.dir.appendingPathComponent("requests.txt")
        try "{\"format\":\"json\"}\n{\"format\":\"json\"}\n".write(to: lines, atomically: true, encoding: .utf8)
        let pub = try ChildProcess("/bin/sh", ["-c",
            "/usr/bin/mosquitto_pub -h 127.0.0.1 -p \(broker.port) -V mqttv5 -q 1 -t baton/fetch/\(carol) -l " +
            "-D publish response-topic test/v5/me -D publish correlation-data ab < \(lines.path)"])
        #expect(pub.wait(timeout: .seconds(10)) == 0)
        let got = eventually(within: 10) { () -> [String]? in
            let l = b.read("answers.txt").split(separator: "\n").map(String.init)
            return l.count >= 2 ? l : nil
        }
        usleep(1_000_000)
        let all = b.read("answers.txt").split(separator: "\n").map(String.init)
        #expect(got != nil && all.count == 2, "two requests, answers: \(all)")
        #expect(all.first?.contains("status:cancelled") == true, "first answer: \(all.first ?? "none")")
        #expect(all.last?.contains("status:ok") == true, "second answer: \(all.last ?? "none")")
        b.stopAll()
    }
}

/// `sh -c SCRIPT` in `dir`, bounded; its exit status (nil when it had to be killed).
func shell(_ script: String, in dir: URL, timeout: Duration = .seconds(120)) throws -> Int32? {
    let code = try ChildProcess.run("/bin/sh", ["-c", "cd '\(dir.path)' && \(script)"], timeout: timeout)
    return code < 0 ? nil : code
}

/// As board/mosquitto-building.conf: without TCP_NODELAY on the broker's side, Nagle's
/// algorithm holds each small frame for the subscriber's delayed ack, 40 ms a round trip
/// (docs/broker.md "Streams").
let streamBroker = ["set_tcp_nodelay true"]

extension RelayBuilding {
    /// What the file `name` in the building's folder says; "" while there is none.
    func read(_ name: String) -> String { (try? String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8)) ?? "" }

    /// The bytes of the file `name` in the building's folder; none while there is none.
    func bytes(_ name: String) -> [UInt8] { (try? Data(contentsOf: dir.appendingPathComponent(name))).map { [UInt8]($0) } ?? [] }

    /// `baton stream` to `device` fed by a writer that never ends (1 KiB every 10 ms): what comes
    /// back in out.bin, what it says in err.txt, and its exit status in status.txt once it ends.
    func endlessStream(to device: String, on broker: MosquittoBroker) throws -> ChildProcess {
        try "import sys,time\nwhile True:\n    sys.stdout.buffer.write(b'x'*1024); sys.stdout.flush()\n    time.sleep(0.01)\n"
            .write(to: dir.appendingPathComponent("endless.py"), atomically: true, encoding: .utf8)
        return try ChildProcess("/bin/sh", ["-c", "cd '\(dir.path)' && python3 endless.py | ('\(batonBinary.path)' stream \(device) --broker mqtt://127.0.0.1:\(broker.port) > out.bin 2> err.txt; echo $? > status.txt)"])
    }

    /// Bytes came back into out.bin within 10 s: the stream flows.
    func streamFlows() -> Bool {
        eventually(within: 10) { () -> Bool? in
            let size = (try? FileManager.default.attributesOfItem(atPath: dir.appendingPathComponent("out.bin").path)[.size] as? Int) ?? 0
            return size > 0 ? true : nil
        } != nil
    }

    /// `baton stream`'s exit status as status.txt says it, within `seconds`. The shell creates
    /// the file before it writes the status into it: this waits for the whole line.
    func streamStatus(within seconds: Double) -> String? {
        eventually(within: seconds) { () -> String? in
            (try? String(contentsOf: dir.appendingPathComponent("status.txt"), encoding: .utf8)).flatMap { $0.hasSuffix("\n") ? $0 : nil }
        }
    }
}

/// Continuation streams (docs/relay.md §7): `baton stream` to alice's phone, which echoes.
@Suite(.serialized) struct StreamTests {
    let alice = "5a0000000001", bob = "5a0000000002"

    /// Random bytes in a file, and their SHA-256 as `sha256sum` prints it.
    func randomFile(_ dir: URL, _ name: String, megabytes: Int) throws -> String {
        #expect(try shell("head -c \(megabytes << 20) /dev/urandom > \(name)", in: dir) == 0)
        return try sha256(dir.appendingPathComponent(name))
    }

    func sha256(_ file: URL) throws -> String {
        let out = file.deletingLastPathComponent().appendingPathComponent(file.lastPathComponent + ".sha")
        _ = try ChildProcess.run("/usr/bin/sha256sum", [file.path], stdout: out.path)
        return String((try String(contentsOf: out, encoding: .utf8)).prefix(64))
    }

    @Test func tenMegabytesEachWayThroughASlowReaderArriveWhole() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-10mb", brokers: [broker])
        let sent = try randomFile(b.dir, "in.bin", megabytes: 10)
        // The reader takes 16 KiB every 5 ms: slower than the stream could go, so the pipe
        // fills, baton stream stops acking, and the device and the writer wait (§5.3).
        try "import sys,time\nwhile True:\n    b=sys.stdin.buffer.read(16384)\n    if not b: break\n    sys.stdout.buffer.write(b)\n    time.sleep(0.005)\n"
            .write(to: b.dir.appendingPathComponent("slow.py"), atomically: true, encoding: .utf8)
        let status = try shell("'\(batonBinary.path)' stream \(alice) --broker mqtt://127.0.0.1:\(broker.port) < in.bin 2> err.txt | python3 slow.py > out.bin",
                               in: b.dir)
        let err = b.read("err.txt")
        #expect(status == 0, "baton stream failed: \(err)")
        let received = try sha256(b.dir.appendingPathComponent("out.bin"))
        let size = (try FileManager.default.attributesOfItem(atPath: b.dir.appendingPathComponent("out.bin").path)[.size] as? Int) ?? 0
        #expect(size == 10 << 20, "\(size) bytes came back of \(10 << 20)")
        #expect(received == sent, "the bytes that came back differ from the bytes sent")
        var last: [String: Any]?
        let stats = eventually(within: 5) { () -> [String: Any]? in
            let s = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            last = (s?["relay"] as? [String: Any])?["streams"] as? [String: Any]
            return last?["finished"] as? Int == 1 ? last : nil
        }
        #expect(stats != nil, "the hall never counted the stream as finished: \(last.map { "\($0)" } ?? "no stats")")
        #expect(stats?["open"] as? Int == 0)
        b.stopAll()
    }

    /// Issue 7 part 3: a stream to a keyed group's device is sealed end to end
    /// (docs/security.md §5.2): the bytes arrive whole, and nothing on the broker is plaintext.
    @Test func aSealedStreamCrossesTheBuildingAsCiphertext() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-sealed", brokers: [broker])
        let owned = eventually(within: 15) { () -> Bool? in
            json((try? broker.retained("baton/activities/\(dave)"))?["baton/activities/\(dave)"] ?? [])?["verified"] as? Bool
        }
        try #require(owned == true, "dave's activity was never published, verified")
        try "\(daveSecret)\n".write(to: b.dir.appendingPathComponent("dave.key"), atomically: true, encoding: .utf8)
        let other = GroupSecret(bytes: Array(repeating: 0x42, count: GroupSecret.byteCount)).text
        try "\(other)\n".write(to: b.dir.appendingPathComponent("other.key"), atomically: true, encoding: .utf8)
        try b.subscribe("everything.bin", on: broker, ["-v", "-t", "#"])
        usleep(300_000)
        let url = "mqtt://127.0.0.1:\(broker.port)"

        let sent = try randomFile(b.dir, "in.bin", megabytes: 1)
        let status = try shell("'\(batonBinary.path)' stream \(dave) --key dave.key --broker \(url) < in.bin > out.bin 2> err.txt", in: b.dir)
        let err = b.read("err.txt")
        #expect(status == 0, "the sealed stream failed: \(err)")
        #expect(try sha256(b.dir.appendingPathComponent("out.bin")) == sent, "the bytes that came back differ")

        // An endpoint without the key, or with another group's: refused with error protocol.
        try Data("hello".utf8).write(to: b.dir.appendingPathComponent("small.bin"))
        for (k, (key, says)) in [("", "hello"), ("--key other.key", "did not open")].enumerated() {
            let st = try shell("'\(batonBinary.path)' stream \(dave) \(key) --broker \(url) < small.bin > /dev/null 2> refused\(k).txt", in: b.dir)
            let said = b.read("refused\(k).txt")
            #expect(st == 1 && said.contains(says), "\(key.isEmpty ? "no key" : key): exit \(st), \(said)")
        }

        // Nothing on the broker ever held the plaintext.
        usleep(500_000)
        let seen = b.bytes("everything.bin")
        let plain = b.bytes("in.bin")
        #expect(seen.count > plain.count, "the subscriber saw less than the stream carried")
        for at in [0, 300_000, plain.count - 64] {
            #expect(!contains(seen, Array(plain[at ..< at + 40])), "plaintext at \(at) crossed the broker")
        }
        b.stopAll()
    }

    @Test func aBrokerRestartMidStreamLosesAndDuplicatesNothing() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-restart", brokers: [broker])
        let sent = try randomFile(b.dir, "in.bin", megabytes: 2)
        // The writer feeds 64 KiB every 50 ms (about 1.6 s in all); the broker is restarted,
        // with nothing kept, half a second in.
        try "import sys,time\nf=open('in.bin','rb')\nwhile True:\n    b=f.read(65536)\n    if not b: break\n    sys.stdout.buffer.write(b); sys.stdout.flush()\n    time.sleep(0.05)\n"
            .write(to: b.dir.appendingPathComponent("writer.py"), atomically: true, encoding: .utf8)
        let run = try ChildProcess("/bin/sh", ["-c", "cd '\(b.dir.path)' && python3 writer.py | '\(batonBinary.path)' stream \(alice) --broker mqtt://127.0.0.1:\(broker.port) > out.bin 2> err.txt"])
        #expect(b.streamFlows(), "nothing came back before the restart")
        try broker.restart()
        let status = run.wait(timeout: .seconds(60))
        if status == nil { run.signal(SIGKILL) }
        let err = b.read("err.txt")
        #expect(status == 0, "baton stream did not finish cleanly across the restart: \(err)")
        #expect(try sha256(b.dir.appendingPathComponent("out.bin")) == sent,
                "the bytes that came back across the restart differ from the bytes sent")
        b.stopAll()
    }

    @Test func killingTheOwnerMidStreamGivesTheEndpointAnErrorFrame() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-kill", brokers: [broker])
        // A writer that never ends: 1 KiB every 10 ms.
        let run = try b.endlessStream(to: alice, on: broker)
        defer { run.signal(SIGKILL); _ = run.wait(timeout: .seconds(5)) }
        #expect(b.streamFlows(), "the stream never flowed")
        b.gateways[0].kill()  // the hall, alice's room
        let status = b.streamStatus(within: 15)
        let err = b.read("err.txt")
        #expect(status?.trimmingCharacters(in: .whitespacesAndNewlines) == "1", "baton stream went on after its gateway died: \(err)")
        #expect(err.contains("gone") && err.contains("hall"), "the endpoint was not told: \(err)")
        for g in b.gateways.dropFirst() { #expect(g.stop() == 0) }
    }

    /// docs/relay.md §7.4: `baton stream` watches its carrier's status itself, so the end is
    /// heard when no gateway is left online to send error gone.
    @Test func theEndpointHearsItsCarrierGoWithNoGatewayLeftToSayIt() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-alone", brokers: [broker])
        for g in b.gateways.dropFirst() { #expect(g.stop() == 0) }  // the kitchen and the office
        let run = try b.endlessStream(to: alice, on: broker)
        defer { run.signal(SIGKILL); _ = run.wait(timeout: .seconds(5)) }
        try #require(b.streamFlows(), "the stream never flowed")
        b.gateways[0].kill()  // the hall: the last gateway
        let status = b.streamStatus(within: 10)
        let err = b.read("err.txt")
        #expect(status?.trimmingCharacters(in: .whitespacesAndNewlines) == "1", "baton stream went on after its gateway died: \(err)")
        #expect(err.contains("gone: gateway hall went offline (its status says so"), "the endpoint did not hear it: \(err)")
    }

    /// Issue 16: junk on `<prefix>/streams/<id>/gateway` cannot hide a stream's end
    /// (docs/relay.md §7.3 "The stream directory", §7.4). 200 junk messages, more than the
    /// directory of the old rule held (relay.streams × 8 = 128), reach every gateway before a
    /// real stream opens: not retained, retained but not a gateway id, naming a gateway nobody
    /// knows, and retained claims naming the online hall and office beyond what a gateway can
    /// carry (relay.streams = 16 each). Then the hall, carrying the real stream, is killed: the
    /// kitchen, first online now, still knows the stream and says `gone`, and `baton stream`
    /// exits with it.
    @Test func junkOnTheStreamDirectoryCannotHideAStreamsEnd() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-junk", brokers: [broker])
        try b.subscribe("downs.txt", on: broker, ["-v", "-F", "%t %x", "-t", "baton/streams/+/down"])

        // One line per junk message: retain flag, stream id, payload in hex.
        var junk: [(retain: Bool, id: String, payload: [UInt8])] = []
        var random = SystemRandomNumberGenerator()
        func id() -> String { String(format: "%016llx", UInt64.random(in: .min ... .max, using: &random)) }
        for i in 0 ..< 100 { junk.append((false, id(), Array(["hall", "kitchen", "office"][i % 3].utf8))) }
        for i in 0 ..< 40 {
            let bad: [[UInt8]] = [Array("Hall".utf8), Array("hall/x".utf8), [0xFF, 0x00, 0x68], Array(repeating: 0x61, count: 65),
                                  Array("hall ".utf8)]
            junk.append((true, id(), bad[i % bad.count]))
        }
        for i in 0 ..< 20 { junk.append((true, id(), Array("ghost-\(i)".utf8))) }
        for _ in 0 ..< 20 { junk.append((true, id(), Array("hall".utf8))) }
        for _ in 0 ..< 20 { junk.append((true, id(), Array("office".utf8))) }
        let lines = junk.map { "\($0.retain ? 1 : 0) \($0.id) \(hexString($0.payload))" }
        try (lines.joined(separator: "\n") + "\n").write(to: b.dir.appendingPathComponent("junk.txt"), atomically: true, encoding: .utf8)
        // MQTT 3.1.1 by hand (§3.1 CONNECT, §3.3 PUBLISH at QoS 0, §3.12 PINGREQ): the ping's
        // answer says the broker has read every publish before it.
        try """
            import socket,sys
            def rl(n):
                out=b''
                while True:
                    d=n%128; n//=128
                    out+=bytes([d|128 if n else d])
                    if not n: return out
            def pkt(t,body): return bytes([t])+rl(len(body))+body
            def st(b): return len(b).to_bytes(2,'big')+b
            s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))
            s.sendall(pkt(0x10,st(b'MQTT')+bytes([4,2])+(60).to_bytes(2,'big')+st(b'junk')))
            assert s.recv(4)[:2]==b'\\x20\\x02'
            for line in open('junk.txt'):
                r,i,h=(line.split()+[''])[:3]
                s.sendall(pkt(0x30|int(r),st(('baton/streams/%s/gateway'%i).encode())+bytes.fromhex(h)))
            s.sendall(b'\\xc0\\x00')
            assert s.recv(2)==b'\\xd0\\x00'
            s.sendall(b'\\xe0\\x00')
            """.write(to: b.dir.appendingPathComponent("junk.py"), atomically: true, encoding: .utf8)
        #expect(try shell("python3 junk.py \(broker.port)", in: b.dir) == 0, "the junk was not published")
        // The junk reaches the gateways before the real stream's claim does.
        usleep(500_000)

        let run = try b.endlessStream(to: alice, on: broker)
        defer { run.signal(SIGKILL); _ = run.wait(timeout: .seconds(5)) }
        try #require(b.streamFlows(), "the stream never flowed: \(b.read("err.txt"))")
        // The real stream: the one the hall claims that is not junk.
        let junkIDs = Set(junk.map(\.id))
        let stream = try #require(eventually(within: 5) { () -> String? in
            let retained = (try? broker.retained("baton/streams/+/gateway")) ?? [:]
            return retained.first { $0.value == Array("hall".utf8) && !junkIDs.contains($0.key.split(separator: "/")[2].description) }
                .map { String($0.key.split(separator: "/")[2]) }
        }, "the hall never claimed the stream")

        b.gateways[0].kill()  // the hall, alice's room and the stream's carrier
        let killed = Instant.now
        let status = b.streamStatus(within: 10)
        let took = Instant.now - killed
        let err = b.read("err.txt")
        #expect(status?.trimmingCharacters(in: .whitespacesAndNewlines) == "1", "baton stream went on after its gateway died (\(took)): \(err)")
        #expect(err.contains("gone: gateway hall went offline"), "the endpoint was not told: \(err)")
        // The kitchen, first online now, knew the stream despite the junk and said gone on its
        // …/down (error 06, docs/protocol.md §5.4).
        let told = eventually(within: 5) { () -> Bool? in
            return b.read("downs.txt").split(separator: "\n").contains { $0.hasPrefix("baton/streams/\(stream)/down 1506") } ? true : nil
        }
        #expect(told != nil, "the kitchen did not tell stream \(stream) gone: \(b.gateways[1].log)")

        // Every junk message was counted by the kitchen, by reason; the claims beyond what a
        // gateway carries replaced that gateway's oldest.
        // Stats written after the kitchen told the hall's streams gone: the real one and the 15
        // junk claims naming the hall that it kept with it.
        var last: [String: Any]?
        let streams = eventually(within: 10) { () -> [String: Any]? in
            let s = json((try? broker.retained("baton/gateways/kitchen/stats"))?["baton/gateways/kitchen/stats"] ?? [])
            last = (s?["relay"] as? [String: Any])?["streams"] as? [String: Any]
            return (last?["gone_for_others"] as? Int ?? 0) > 0 ? last : nil
        }
        #expect(streams?["gone_for_others"] as? Int == 16, "\(last.map { "\($0)" } ?? "no stats")")
        let drops = streams?["drops"] as? [String: Any]
        #expect(drops?["stream-carrier-not-retained"] as? Int == 100, "\(last.map { "\($0)" } ?? "no stats")")
        #expect(drops?["stream-carrier-malformed"] as? Int == 40, "\(last.map { "\($0)" } ?? "no stats")")
        #expect(drops?["stream-carrier-offline"] as? Int == 20, "\(last.map { "\($0)" } ?? "no stats")")
        #expect(drops?["stream-directory-full"] as? Int == 9, "\(last.map { "\($0)" } ?? "no stats")")
        #expect(b.gateways[1].log.contains("relay.streams"), "the full rule was not logged naming its knob: \(b.gateways[1].log)")
        for g in b.gateways.dropFirst() { #expect(g.stop() == 0) }
    }

    /// Garbage on the stream topics is answered with an error frame or counted, and the
    /// gateway goes on carrying the stream that was open. `relay.streams: 1` makes the
    /// second open one too many.
    @Test func garbageOnTheStreamTopicsIsAnsweredOrCountedAndTheStreamGoesOn() throws {
        let broker = try MosquittoBroker(extraConfig: streamBroker)
        let b = try RelayBuilding(name: "stream-garbage", brokers: [broker], extra: "relay:\n  streams: 1\n")
        try b.subscribe("downs.txt", on: broker, ["-v", "-F", "%t %x", "-t", "baton/streams/+/down"])
        usleep(300_000)
        // The one stream the hall may carry: a writer that keeps it open.
        try "import sys,time\nwhile True:\n    sys.stdout.buffer.write(b'x'*1024); sys.stdout.flush()\n    time.sleep(0.02)\n"
            .write(to: b.dir.appendingPathComponent("endless.py"), atomically: true, encoding: .utf8)
        let run = try ChildProcess("/bin/sh", ["-c", "cd '\(b.dir.path)' && python3 endless.py | '\(batonBinary.path)' stream \(alice) --broker mqtt://127.0.0.1:\(broker.port) > out.bin 2> err.txt"])
        defer { run.signal(SIGKILL); _ = run.wait(timeout: .seconds(5)) }
        func size() -> Int {
            (try? FileManager.default.attributesOfItem(atPath: b.dir.appendingPathComponent("out.bin").path)[.size] as? Int) ?? 0
        }
        #expect(eventually(within: 10) { size() > 0 ? true : nil } != nil, "the stream never flowed")

        func publish(_ topic: String, hex: String) throws {
            let file = b.dir.appendingPathComponent("frame.bin")
            try Data(hx(hex)).write(to: file)
            #expect(try ChildProcess.run("/usr/bin/mosquitto_pub", ["-h", "127.0.0.1", "-p", "\(broker.port)", "-q", "1",
                                                                    "-t", topic, "-f", file.path]) == 0)
        }
        try publish("baton/stream/\(alice)/g1", hex: "68 65 6c 6c 6f")          // not a frame
        try publish("baton/stream/\(alice)/g2", hex: "11 00 00 00 00 41")       // data, not open
        try publish("baton/stream/5affffffffff/g3", hex: "10 08 00 00 04")      // nobody hears it
        try publish("baton/stream/\(bob)/g4", hex: "10 08 00 00 04")            // no streams offered
        try publish("baton/stream/\(alice)/g5", hex: "10 08 00 00 04")          // one too many
        try publish("baton/stream/\(alice)/BAD", hex: "10 08 00 00 04")         // not a stream id
        try publish("baton/streams/nosuch/up", hex: "11 00 00 00 00 41")        // nobody carries it

        // Each refused open gets exactly one error frame (15 | reason | detail) on its down topic.
        let expected = ["g1": "02", "g2": "02", "g3": "03", "g4": "03", "g5": "05"]
        func errors() -> [String: [String]] {
            let text = b.read("downs.txt")
            var result: [String: [String]] = [:]
            for line in text.split(separator: "\n") {
                let parts = line.split(separator: " ", maxSplits: 1)
                guard parts.count == 2, parts[1].hasPrefix("15") else { continue }
                let id = parts[0].split(separator: "/")[2]
                result[String(id), default: []].append(String(parts[1].dropFirst(2).prefix(2)))
            }
            return result
        }
        _ = eventually(within: 10) { errors().count >= expected.count ? true : nil }
        usleep(500_000)
        let got = errors()
        for (id, reason) in expected.sorted(by: { $0.key < $1.key }) {
            #expect(got[id] == [reason], "stream \(id): error frames \(got[id] ?? [])")
        }
        #expect(got.keys.allSatisfy { expected[$0] != nil }, "error frames for streams nobody opened: \(got)")

        var last: [String: Any]?
        let drops = eventually(within: 5) { () -> [String: Any]? in
            let s = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            last = ((s?["relay"] as? [String: Any])?["streams"] as? [String: Any])?["drops"] as? [String: Any]
            return last?["stream-topic"] as? Int == 1 && last?["stream-not-open"] as? Int == 1 ? last : nil
        }
        #expect(drops != nil, "the hall did not count the bad topic and the open that was not one: \(last.map { "\($0)" } ?? "no stats")")

        // The stream that was open goes on.
        let before = size()
        #expect(eventually(within: 10) { size() > before + 4096 ? true : nil } != nil, "the open stream stopped")
        #expect(run.isRunning)
        b.stopAll()
    }
}

/// Whether `needle` occurs in `haystack` as a run of bytes.
func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return false }
    for i in 0 ... haystack.count - needle.count where haystack[i] == needle[0] {
        if Array(haystack[i ..< i + needle.count]) == needle { return true }
    }
    return false
}
