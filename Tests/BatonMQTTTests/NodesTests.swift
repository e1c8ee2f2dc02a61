// A broker of several nodes (docs/broker.md "Several nodes"): the client tries them in list
// order, moves to the next when an attempt fails or a connection is lost, and is on the next
// node within about a second of losing one. Two real mosquittos stand for two nodes here (the
// NATS cluster itself is in BatonGatewayTests/NATSClusterTests.swift).
import BatonLibc
import Foundation
import Glibc
import Testing
@testable import BatonMQTT
import BatonTestSupport

/// A client of `nodes` (all on 127.0.0.1) with the gateway's default backoff.
private func nodesConfig(_ ports: [Int], id: String) -> MQTTConfig {
    MQTTConfig(host: "127.0.0.1", port: ports[0], clientID: id, keepalive: 30,
               otherNodes: ports.dropFirst().map { MQTTNode(host: "127.0.0.1", port: $0) })
}

@Suite struct NodesTests {
    @Test func aKilledNodeIsLeftForTheNextWithinASecond() throws {
        let a = try MosquittoBroker(), b = try MosquittoBroker()
        var client = try MQTTClient(config: nodesConfig([a.port, b.port], id: "mover"))
        let log = EventLog()
        try connect(&client, log)
        #expect(client.brokerName == "mqtt://127.0.0.1:\(a.port)")
        #expect(a.log.contains("mover"), "the first node in the list is the one tried first")

        a.kill()
        let killed = Instant.now
        #expect(runLoop(&client, log) { log.connects.count == 2 }, "events: \(log.events)")
        let back = Instant.now - killed
        #expect(back < .seconds(1), "on the next node \(back) after the first was killed")
        #expect(client.brokerName == "mqtt://127.0.0.1:\(b.port)")
        #expect(log.disconnects == ["lost the connection to mqtt://127.0.0.1:\(a.port): the broker closed the connection; next: mqtt://127.0.0.1:\(b.port)"])

        // And it is a working connection on the second node.
        let state: [UInt8] = Array("{}".utf8)
        try state.withUnsafeBytes { try client.publish(topic: "baton/activities/d", payload: $0, qos: 1, retain: true) }
        runLoop(&client, log, limit: .milliseconds(300)) { false }
        #expect(try b.retained() == ["baton/activities/d": state])
    }

    @Test func aDeadFirstNodeAtStartCostsOneRefusedAttempt() throws {
        let a = try MosquittoBroker(), b = try MosquittoBroker()
        a.stop()
        var client = try MQTTClient(config: nodesConfig([a.port, b.port], id: "late"))
        let log = EventLog()
        let started = Instant.now
        try connect(&client, log)
        #expect(Instant.now - started < .seconds(1))
        #expect(log.disconnects == ["could not connect to mqtt://127.0.0.1:\(a.port): Connection refused; next: mqtt://127.0.0.1:\(b.port)"])
        #expect(client.brokerName == "mqtt://127.0.0.1:\(b.port)")
    }

    /// Every node down: the attempts go round the list in order, each refused one within a
    /// second of the last (the broker is absent), and the first node to come back takes it.
    @Test func withEveryNodeDownItGoesRoundTheListUntilOneIsBack() throws {
        let a = try MosquittoBroker(), b = try MosquittoBroker(), c = try MosquittoBroker()
        let ports = [a.port, b.port, c.port]
        var client = try MQTTClient(config: nodesConfig(ports, id: "patient"))
        let log = EventLog()
        try connect(&client, log)
        a.kill(); b.stop(); c.stop()
        runLoop(&client, log, limit: .seconds(3)) { log.disconnects.count >= 5 }
        let tried = log.disconnects.map { reason in ports.firstIndex { reason.contains("mqtt://127.0.0.1:\($0):") } ?? -1 }
        #expect(Array(tried.prefix(5)) == [0, 1, 2, 0, 1], "\(log.disconnects)")
        try c.restart()
        #expect(runLoop(&client, log, limit: .seconds(5)) { log.connects.count == 2 }, "events: \(log.events)")
        #expect(client.brokerName == "mqtt://127.0.0.1:\(c.port)")
    }

    /// docs/config.md `broker.max-qos`: at 0, a publish asked at QoS 1 goes at QoS 0, and the
    /// broker delivers it so to a QoS 1 subscriber (mosquitto_sub prints the QoS it got, %q).
    @Test func maxQoSZeroSendsAQoSOnePublishAtZero() throws {
        let broker = try MosquittoBroker()
        let out = broker.directory.appendingPathComponent("qos.txt").path
        let sub = try ChildProcess("/usr/bin/mosquitto_sub", ["-h", "127.0.0.1", "-p", "\(broker.port)", "-q", "1",
                                                              "-t", "baton/qos/+", "-F", "%q %t"], stdout: out)
        defer { sub.signal(SIGKILL); sub.wait(timeout: .seconds(5)) }
        usleep(300_000)
        for (maxQoS, topic) in [(Int32(1), "baton/qos/one"), (0, "baton/qos/zero")] {
            var config = MQTTConfig(host: "127.0.0.1", port: broker.port, clientID: "qos-\(maxQoS)")
            config.maxQoS = maxQoS
            var client = try MQTTClient(config: config)
            let log = EventLog()
            try connect(&client, log)
            let payload: [UInt8] = Array("x".utf8)
            try payload.withUnsafeBytes { try client.publish(topic: topic, payload: $0, qos: 1) }
            runLoop(&client, log, limit: .milliseconds(300)) { false }
        }
        let lines = runLoopUntilFile(out, contains: "baton/qos/zero")
        #expect(lines.contains("1 baton/qos/one"), "\(lines)")
        #expect(lines.contains("0 baton/qos/zero"), "\(lines)")
    }

    @Test func aListOfURLsOnOneLine() throws {
        let urls = try MQTTURL.nodes(parsing: "mqtt://node-a:1883, mqtt://node-b,tcp://[fd00::3]:1884")
        #expect(urls.map(\.description) == ["mqtt://node-a:1883", "mqtt://node-b:1883", "mqtt://[fd00::3]:1884"])
        #expect(try MQTTURL.nodes(parsing: "mqtts://one").map(\.description) == ["mqtts://one:8883"])
    }

    @Test func aBadListSaysWhatIsWrong() {
        func reason(_ text: String) -> String? {
            do throws(MQTTError) { _ = try MQTTURL.nodes(parsing: text); return nil } catch { return "\(error)" }
        }
        #expect(reason("mqtt://a,,mqtt://b") == #"invalid broker URL: an empty entry in the list "mqtt://a,,mqtt://b": separate the nodes' URLs with one comma each, like mqtt://node-a:1883,mqtt://node-b:1883"#)
        #expect(reason("mqtt://a,") == #"invalid broker URL: an empty entry in the list "mqtt://a,": separate the nodes' URLs with one comma each, like mqtt://node-a:1883,mqtt://node-b:1883"#)
        #expect(reason("mqtt://a,mqtts://b") == "invalid broker URL: every node takes the same scheme (one set of TLS settings serves them all): mqtt://a:1883 is mqtt://, mqtts://b:8883 is mqtts://")
        #expect(reason("mqtt://a:1883,mqtt://a") == "invalid broker URL: mqtt://a:1883 is listed twice")
        #expect(reason("mqtt://a,b.lan") == #"invalid broker URL: "b.lan" has no scheme; write mqtt://b.lan (or mqtts:// for TLS)"#)
        let seventeen = (1...17).map { "mqtt://n\($0)" }.joined(separator: ",")
        #expect(reason(seventeen) == "invalid broker URL: 17 broker nodes; at most 16")
    }

    @Test func theClientRefusesAnEmptyListOfNodes() {
        var config = MQTTConfig(clientID: "none")
        config.nodes = []
        #expect(throws: MQTTError.invalidConfiguration("broker configuration: no broker node")) { _ = try MQTTClient(config: config) }
    }
}

/// The file's text once it holds `text`, waited for up to 5 s.
private func runLoopUntilFile(_ path: String, contains text: String) -> String {
    let deadline = Instant.now + .seconds(5)
    var content = ""
    while Instant.now < deadline {
        content = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        if content.contains(text) { break }
        usleep(50_000)
    }
    return content
}
