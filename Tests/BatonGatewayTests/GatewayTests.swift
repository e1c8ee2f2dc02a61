// `baton gateway` against a real mosquitto, checked with mosquitto_sub the way a user would
// check it (docs/mqtt.md is the contract these tests read from).
import BatonKeys
import BatonTestSupport
import BatonWire
import Foundation
import Testing

/// A broker, and the hall's gateway replaying a generated capture of 30 devices (10 of them
/// Baton beacons), once every activity it holds is retained: those activities.
private func replayedHall(_ name: String, seed: UInt64) throws
    -> (broker: MosquittoBroker, gateway: GatewayProcess, activities: [String: [UInt8]]) {
    let (broker, capture, gateway) = try hallReplaying(name, devices: 30, reports: 2_000, seed: seed)
    let retained = try broker.retained("baton/activities/+", within: 15) { $0.count == capture.lastBeacons.count }
    guard let retained else {
        gateway.kill()
        throw BrokerError("the hall never retained its \(capture.lastBeacons.count) activities:\n\(gateway.log)")
    }
    return (broker, gateway, retained)
}

@Suite(.serialized) struct GatewayTests {
    /// docs/mqtt.md §2: after a replay, a fresh subscriber sees exactly one retained activity
    /// per Baton device, with the last sequence it sent, and the gateway `online` (§1).
    @Test func replayedCaptureLeavesExactlyTheDevicesActivities() throws {
        let (broker, capture, gateway) = try hallReplaying("replay", devices: 30, reports: 3_000, seed: 11)
        defer { gateway.kill() }

        let expected = Set(capture.lastBeacons.keys.map { String(format: "baton/activities/%012llx", $0) })
        #expect(expected.count == 10)
        let activities = try broker.retained("baton/activities/+", within: 15) { Set($0.keys) == expected }
        let got = try #require(activities, "retained activities never matched; gateway log:\n\(gateway.log)")
        for (id, beacon) in capture.lastBeacons {
            let o = try #require(json(got[String(format: "baton/activities/%012llx", id)]!))
            #expect(o["seq"] as? Int == Int(beacon.sequence))
            #expect(o["state"] as? String == "current")
            #expect(o["room"] as? String == "Hall")
            #expect(o["gateway"] as? String == "hall")
            #expect(o["type_hash"] as? String == String(format: "%08x", beacon.activityTypeHash))
            #expect(o["supports_streams"] as? Bool == beacon.flags.contains(.supportsStreams))
        }
        #expect(text(try broker.retained("baton/gateways/hall/status")["baton/gateways/hall/status"]) == "online")
        // Apple devices with Handoff get pseudonymous entries, without MAC addresses.
        let apple = try broker.retained("baton/apple/+")
        #expect(apple.count == capture.apple)
        for (_, payload) in apple { #expect(json(payload)?["address"] == nil) }
    }

    /// docs/mqtt.md §2: the invalidated flag clears the retained activity.
    @Test func invalidateClearsEveryActivity() throws {
        let (broker, capture, gateway) = try hallReplaying("invalidate", devices: 30, reports: 3_000, seed: 12,
                                                           invalidateAtEnd: true)
        defer { gateway.kill() }
        // The stats say the capture was heard and changes were published; then nothing is left.
        let o = try finishedStats(broker, gateway)
        #expect(o["beacons"] as? Int ?? 0 > 900)
        // Each device became current at least once and was cleared once: published at once,
        // or owed while the broker had not answered yet (a replay as fast as possible can
        // outrun the connection on a loaded machine) and sent on connect (docs/mqtt.md §1).
        let brokerStats = o["broker"] as? [String: Any] ?? [:]
        #expect(o["changes_published"] as? Int ?? 0 >= capture.lastBeacons.count)
        #expect((o["changes_published"] as? Int ?? 0) + (brokerStats["changes_while_away"] as? Int ?? 0)
                >= 2 * capture.lastBeacons.count)
        #expect(try broker.retained("baton/activities/+").isEmpty)
        // Their Home Assistant devices stay (the device is still in the room), reading unknown.
        #expect(try broker.retained("homeassistant/sensor/#").count == 2 * capture.lastBeacons.count)
    }

    /// docs/mqtt.md §2 and §4: silence for `table.expiry` clears the activity; the Home
    /// Assistant device stays, its tracker reading `not_home`, so it does not vanish and return.
    @Test func expiryClearsActivitiesAndKeepsTheirEntities() throws {
        let (broker, _, gateway) = try hallReplaying("expiry", devices: 9, reports: 500, seed: 13, expiry: "3s")
        defer { gateway.kill() }
        let appeared = try eventually(within: 10) { try broker.retained("baton/activities/+").count == 3 ? true : nil }
        #expect(appeared == true, "activities never appeared: \(gateway.log)")
        #expect(try broker.retained("homeassistant/sensor/#").count == 6)
        let cleared = try eventually(within: 15) {
            try broker.retained("baton/activities/+").isEmpty ? true : nil
        }
        #expect(cleared == true, "still retained after expiry: \(gateway.log)")
        #expect(try broker.retained("homeassistant/sensor/#").count == 6, "the entities stay")
        let trackers = try broker.retained("baton/trackers/+")
        #expect(trackers.count == 3 && trackers.values.allSatisfy { text($0) == "not_home" }, "\(trackers.mapValues { text($0) ?? "" })")
        #expect(gateway.isRunning)
    }

    /// docs/mqtt.md §1: the last will says `offline` when the gateway is killed.
    @Test func statusTurnsOfflineWhenTheGatewayIsKilled() throws {
        let (broker, _, gateway) = try hallReplaying("will", devices: 6, reports: 200, seed: 14)
        let status = "baton/gateways/hall/status"
        #expect(try eventually(within: 10) { text(try broker.retained(status)[status]) == "online" ? true : nil } == true)
        gateway.kill()
        #expect(try eventually(within: 10) { text(try broker.retained(status)[status]) == "offline" ? true : nil } == true)
    }

    /// docs/broker.md "A status the broker did not keep": the gateway reads its retained
    /// status back after the connect and every `status.interval`; gone (a broker that took the
    /// publish but did not store it) or `offline` (a stale will), it says `online` again, with
    /// its connectivity config, and a kept one is left alone.
    @Test func aStatusTheBrokerDidNotKeepIsSaidAgain() throws {
        let (broker, _, gateway) = try hallReplaying("status-kept", devices: 6, reports: 200, seed: 24)
        defer { gateway.kill() }
        let status = "baton/gateways/hall/status", config = "homeassistant/binary_sensor/baton_hall/connectivity/config"
        let stats = "baton/gateways/hall/stats"
        func republished() throws -> Int? {
            guard let s = json(try broker.retained(stats)[stats] ?? []) else { return nil }
            return (s["broker"] as? [String: Any])?["status_republished"] as? Int
        }
        #expect(try eventually(within: 10) { text(try broker.retained(status)[status]) == "online" ? true : nil } == true)
        // Lost, as nats-server loses it: no status retained, no connectivity config.
        try broker.publish(topic: status, payload: [], retain: true)
        try broker.publish(topic: config, payload: [], retain: true)
        let back = try broker.retained("#", within: 15) { text($0[status]) == "online" && $0[config] != nil }
        #expect(back != nil, "the lost status never came back: \(gateway.log)")
        #expect(try eventually(within: 5) { try republished().flatMap { $0 >= 1 ? $0 : nil } } == 1, "\(gateway.log)")
        #expect(gateway.log.contains("the broker did not keep this gateway's status (it holds nothing at baton/gateways/hall/status, not 'online')"),
                "\(gateway.log)")
        // Kept, and read back every second: nothing is said again.
        sleep(3)
        #expect(try republished() == 1, "a kept status was said again: \(gateway.log)")
        // A stale `offline` is not what a running gateway leaves retained either.
        try broker.publish(topic: status, payload: Array("offline".utf8), retain: true)
        #expect(try eventually(within: 5) { text(try broker.retained(status)[status]) == "online" ? true : nil } == true,
                "the stale offline stayed: \(gateway.log)")
        #expect(try eventually(within: 5) { try republished().flatMap { $0 >= 2 ? $0 : nil } } == 2, "\(gateway.log)")
        #expect(gateway.isRunning)
    }

    /// A clean stop (SIGTERM) says offline itself and exits 0.
    @Test func sigtermSaysOfflineAndExitsCleanly() throws {
        let (broker, _, gateway) = try hallReplaying("sigterm", devices: 6, reports: 200, seed: 15)
        let status = "baton/gateways/hall/status"
        #expect(try eventually(within: 10) { text(try broker.retained(status)[status]) == "online" ? true : nil } == true)
        #expect(gateway.stop() == 0)
        #expect(text(try broker.retained(status)[status]) == "offline")
        // Said by the gateway with a clean DISCONNECT, not by the broker's will.
        #expect(broker.waitForLog("Client baton-hall disconnected."), "\(broker.log)")
    }

    /// docs/mqtt.md §5: a broker restarted without persistence holds the gateway's exact
    /// retained state again within 2 s of its return.
    @Test func brokerRestartWithoutPersistenceConverges() throws {
        let (broker, gateway, state) = try replayedHall("restart", seed: 16)
        defer { gateway.kill() }
        broker.kill()
        usleep(300_000)
        try broker.restart()
        let returned = Date()
        let after = try broker.retained("baton/activities/+", within: 2) { $0 == state }
        #expect(after != nil, "not converged \(Date().timeIntervalSince(returned)) s after the broker returned; log:\n\(gateway.log)")
        let status = "baton/gateways/hall/status"
        #expect(text(try broker.retained(status)[status]) == "online")
    }

    /// docs/rooms.md §7 rule 3: whoever writes a device's retained activity, its owner puts
    /// its own back (issue 16: a thawed gateway's stale message stayed retained for good).
    @Test func theOwnerCorrectsAWrongRetainedActivity() throws {
        let (broker, gateway, state) = try replayedHall("correct", seed: 17)
        defer { gateway.kill() }
        let (topic, own) = try #require(state.first)
        // Another room's message, as a gateway thawed with an old view would leave it; then a clear.
        let wrong = Array(#"{"device":"x","state":"current","seq":1,"room":"Kitchen","gateway":"kitchen"}"#.utf8)
        for payload in [wrong, []] {
            try broker.publish(topic: topic, payload: payload, retain: true)
            let back = try eventually(within: 5) { () -> [String: Any]? in
                let now = try broker.retained(topic)[topic]
                guard let now, let o = json(now), o["gateway"] as? String == "hall" else { return nil }
                return o
            }
            let o = try #require(back, "still wrong 5 s later: \(gateway.log)")
            #expect(o["room"] as? String == "Hall" && o["seq"] as? Int == json(own)?["seq"] as? Int)
        }
        let corrections = try eventually(within: 3) { () -> Int? in
            let stats = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? [])
            return ((stats?["rooms"] as? [String: Any])?["corrections"] as? Int).flatMap { $0 >= 2 ? $0 : nil }
        }
        #expect(corrections == 2, "\(gateway.log)")
        #expect(gateway.log.contains("the retained activity says otherwise than this room, which owns it"))
    }

    /// docs/broker.md: refused credentials are a clear log line and a retry with backoff,
    /// never a crash loop.
    @Test func refusedCredentialsAreLoggedAndRetriedWithBackoff() throws {
        let dir = try scratchDirectory("auth")
        let broker = try MosquittoBroker(users: ["hall": "right"])
        let capture = try GeneratedCapture(in: dir, devices: 6, reports: 200, seed: 17)
        let yaml = gatewayYAML(port: broker.port, radio: "capture:\(capture.path)")
            .replacingOccurrences(of: "  keepalive: 5s", with: "  keepalive: 5s\n  username: hall\n  password: wrong")
        let gateway = try GatewayProcess(yaml: yaml, in: dir)
        defer { gateway.kill() }
        usleep(3_000_000)
        #expect(gateway.isRunning)
        let refusals = gateway.log.components(separatedBy: "\n").filter { $0.contains("refused") }
        #expect(!refusals.isEmpty, "no refusal logged: \(gateway.log)")
        // Backoff from 100 ms doubling to 1 s with full jitter (docs/broker.md): about ten
        // attempts in 3 s; a retry loop without backoff would make hundreds.
        #expect(refusals.count <= 15, "\(refusals.count) attempts in 3 s")
        #expect(!refusals[0].contains("wrong"), "the password must never be logged")
    }

    /// docs/config.md: a typo stops the start with file, line and key.
    @Test func configTypoStopsWithFileLineAndKey() throws {
        let dir = try scratchDirectory("typo")
        let gateway = try GatewayProcess(yaml: "gateway:\n  id: hall\nbrokr:\n  url: mqtt://127.0.0.1:1\n", in: dir)
        gateway.process.waitUntilExit()
        #expect(gateway.process.terminationStatus == 2)
        #expect(gateway.log.contains("baton.yaml:3: unknown key \"brokr\" (did you mean \"broker\"?)"), "\(gateway.log)")
    }

    /// docs/relay.md §9: re-advertising goes out through the adapter the gateway scans with, so
    /// a gateway on a capture (or the simulator, or a serial controller) refuses to start with
    /// the reason, instead of running without what the user asked for.
    @Test func reAdvertisingWithoutAnAdapterStopsWithTheReason() throws {
        let dir = try scratchDirectory("readvertise")
        let capture = dir.appendingPathComponent("empty.btsnoop")
        try Data(Array("btsnoop\0".utf8) + [0, 0, 0, 1, 0, 0, 0x03, 0xEA]).write(to: capture)
        let yaml = gatewayYAML(port: 1, radio: "capture:\(capture.path)",
                               extra: "relay:\n  readvertise: 2\nsecurity:\n  beacon-key: \(BeaconKey(bytes: Array(0x10..<0x20)).text)\n")
        let gateway = try GatewayProcess(yaml: yaml, in: dir)
        gateway.process.waitUntilExit()
        #expect(gateway.process.terminationStatus == 1)
        #expect(gateway.log.contains("relay.readvertise: re-advertising needs a Bluetooth adapter as radio.source"), "\(gateway.log)")
    }

    /// Bad input keeps the gateway running: a capture cut mid-record and adverts that do not
    /// decode are counted, and the rest is published.
    @Test func truncatedCaptureAndMalformedAdvertsAreCountedNotFatal() throws {
        let (broker, capture, gateway) = try hallReplaying("truncated", devices: 30, reports: 3_000, seed: 18, truncateBy: 7,
                                                           corruptFirstBeacon: true)
        defer { gateway.kill() }
        let o = try finishedStats(broker, gateway)
        let drops = try #require(o["drops"] as? [String: Int])
        #expect(drops["ad-overlong"] == 1, "the corrupted beacon is one counted drop: \(drops)")
        #expect(drops.values.reduce(0, +) >= 2, "the cut record is counted too: \(drops)")
        #expect(try broker.retained("baton/activities/+").count == capture.lastBeacons.count)
        #expect(gateway.isRunning)
    }

    /// docs/mqtt.md §6: `baton watch --once` shows each activity under its room.
    @Test func watchShowsTheActivitiesPerRoom() throws {
        let (broker, capture, gateway) = try hallReplaying("watch", devices: 12, reports: 600, seed: 19)
        defer { gateway.kill() }
        #expect(try eventually(within: 10) { try broker.retained("baton/activities/+").count == 4 ? true : nil } == true)
        let (status, printed) = try watchOnce(broker)
        #expect(status == 0)
        let rows = printed.split(separator: "\n").filter { $0.hasPrefix("Hall ") }
        #expect(rows.count == 4, "\(printed)")
        for id in capture.lastBeacons.keys {
            #expect(rows.contains { $0.contains(String(format: "%012llx", id)) }, "\(printed)")
        }
        #expect(printed.contains("hall online"))
    }

    /// docs/mqtt.md §5: retained activities an earlier run of this gateway left, for devices
    /// nobody hears any more, are cleared after the expiry; the ones still heard stay.
    @Test func aRestartedGatewayClearsWhatItsEarlierRunLeft() throws {
        let dir = try scratchDirectory("orphans")
        let broker = try MosquittoBroker()
        let before = try GeneratedCapture(in: dir, devices: 9, reports: 400, seed: 31)
        let first = try GatewayProcess(
            yaml: gatewayYAML(port: broker.port, radio: "capture:\(before.path)", expiry: "3s"), in: dir)
        let left = try broker.retained("baton/activities/+", within: 10) { $0.count == before.lastBeacons.count }
        try #require(left != nil, "\(first.log)")
        first.kill()
        // The same gateway comes back and hears other devices only.
        let after = try GeneratedCapture(in: dir, devices: 9, reports: 400, seed: 32)
        let second = try GatewayProcess(
            yaml: gatewayYAML(port: broker.port, radio: "capture:\(after.path)", expiry: "3s"), in: dir)
        defer { second.kill() }
        let earlier = Set(left!.keys)
        let cleared = try eventually(within: 15) { () -> Int? in
            guard Set(try broker.retained("baton/activities/+").keys).isDisjoint(with: earlier) else { return nil }
            let stats = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? [])
            // The stats are republished every second; wait for the count to catch up.
            let count = (stats?["broker"] as? [String: Any])?["orphans_cleared"] as? Int
            // Its activities and its Apple entries alike.
            return count == before.lastBeacons.count + before.apple ? count : nil
        }
        // Cleared by the orphan rule (counted), not by anything else.
        #expect(cleared != nil, "\(second.log)")
    }
}

/// docs/broker.md "Reconnect" and "Several nodes": a broker of two nodes, neither there. The
/// gateway goes round the list, an attempt within a second of the last, and still says each
/// node's failure once a minute (each reason names its node), not once an attempt.
@Suite struct DeadNodesTests {
    @Test func twoDeadNodesAreEachSaidOnceAMinute() throws {
        let a = try MosquittoBroker(), b = try MosquittoBroker()
        let ports = [a.port, b.port]
        a.stop(); b.stop()
        let dir = try scratchDirectory("dead-nodes")
        let capture = try GeneratedCapture(in: dir, devices: 2, reports: 50, seed: 35)
        let yaml = gatewayYAML(port: ports[0], radio: "capture:\(capture.path)", extra: "log:\n  level: debug").replacingOccurrences(
            of: "url: mqtt://127.0.0.1:\(ports[0])", with: "url: [mqtt://127.0.0.1:\(ports[0]), mqtt://127.0.0.1:\(ports[1])]")
        let gateway = try GatewayProcess(yaml: yaml, in: dir)
        sleep(4)
        let log = gateway.log
        _ = gateway.stop()
        let warnings = log.split(separator: "\n").filter { $0.hasPrefix("<4>broker connection lost") }
        let attempts = log.split(separator: "\n").filter { $0.contains("Connection refused") }
        #expect(attempts.count >= 5, "it kept going round the list:\n\(log)")
        #expect(warnings.count == 2, "\(warnings.joined(separator: "\n"))")
        #expect(warnings.contains { $0.contains("mqtt://127.0.0.1:\(ports[0]): Connection refused; next: mqtt://127.0.0.1:\(ports[1])") })
        #expect(warnings.contains { $0.contains("mqtt://127.0.0.1:\(ports[1]): Connection refused; next: mqtt://127.0.0.1:\(ports[0])") })
    }
}

/// A first start that explains itself (issue 31, docs/install.md, docs/broker.md): what goes
/// wrong names its cause and its fix.
@Suite struct FirstStartTests {
    /// Two gateways left with one `gateway.id`: each takes the client id `baton-hall` from the
    /// other at every connect. The log says so, naming the id and the key that fixes it.
    @Test func twoGatewaysWithOneIDAreToldSo() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("one-id")
        let capture = try GeneratedCapture(in: dir, devices: 2, reports: 50, seed: 31)
        let yaml = gatewayYAML(port: broker.port, radio: "capture:\(capture.path)", expiry: "1h")
        let first = try GatewayProcess(yaml: yaml, in: dir)
        let alone = eventually(within: 10) { first.log.contains("connected to the broker") ? true : nil }
        try #require(alone != nil, "\(first.log)")
        // Alone for longer than a short connection: no word of a collision.
        sleep(6)
        let collision = "most likely another client uses the client id baton-hall (two gateways with gateway.id hall"
        #expect(!first.log.contains(collision), "\(first.log)")

        let second = try GatewayProcess(yaml: yaml, in: dir)
        let told = eventually(within: 30, every: 0.2) { () -> String? in
            let lines = (first.log + "\n" + second.log).split(separator: "\n")
            return lines.first { $0.hasPrefix("<3>") && $0.contains(collision) }.map(String.init)
        }
        #expect(told?.contains("Give each gateway its own gateway.id (or broker.client-id)") == true,
                "first:\n\(first.log)\nsecond:\n\(second.log)")
        _ = first.stop(); _ = second.stop()
    }

    /// A capture that cannot be read says why, as the OS does.
    @Test func anUnreadableCaptureSaysWhy() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("no-capture")
        let missing = dir.appendingPathComponent("missing.btsnoop").path
        let gateway = try GatewayProcess(yaml: gatewayYAML(port: broker.port, radio: "capture:\(missing)"), in: dir)
        let ended = eventually(within: 10) { gateway.isRunning ? nil : true }
        #expect(ended != nil)
        #expect(gateway.process.terminationStatus == 1)
        #expect(gateway.log.contains("<2>radio capture:\(missing): cannot read the file: No such file or directory"), "\(gateway.log)")
    }

    /// The largest relay capacities poll 1,539 entries, more than systemd's soft open-file limit
    /// of 1024, where poll(2) fails every turn (EINVAL). The gateway raises its soft limit to what
    /// it polls, and runs; a hard limit below that stops the start naming the keys.
    @Test func theLargestRelayCapacitiesRaiseTheOpenFileLimit() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("open-files")
        let capture = try GeneratedCapture(in: dir, devices: 30, reports: 2_000, seed: 36)
        let yaml = gatewayYAML(port: broker.port, radio: "capture:\(capture.path)", extra: "relay:\n  links: 256\n  streams: 1024")
        let gateway = try GatewayProcess(yaml: yaml, in: dir, openFiles: (1024, 4096))
        defer { gateway.kill() }
        let retained = try broker.retained("baton/activities/+", within: 15) { $0.count == capture.lastBeacons.count }
        #expect(retained?.count == capture.lastBeacons.count, "\(gateway.log)")
        let limits = try String(contentsOfFile: "/proc/\(gateway.process.processIdentifier)/limits", encoding: .utf8)
        let line = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max open files") })
        let soft = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst(3).first.flatMap { Int($0) }
        #expect(soft == 1539 + 32, "\(line)")
        #expect(gateway.log.contains("<6>open files: raised this process's soft limit from 1024 to 1571"), "\(gateway.log)")
        #expect(!gateway.log.contains("poll:"), "\(gateway.log)")

        let short = try GatewayProcess(yaml: yaml, in: dir, openFiles: (1024, 1200))
        let ended = eventually(within: 10) { short.isRunning ? nil : true }
        #expect(ended != nil)
        #expect(short.process.terminationStatus == 1)
        #expect(short.log.contains("<2>open files: relay.links 256, relay.streams 1024 need 1571 open files, but this process may open at most 1200 (RLIMIT_NOFILE): lower them, or raise LimitNOFILE= in the unit"), "\(short.log)")
    }
}
