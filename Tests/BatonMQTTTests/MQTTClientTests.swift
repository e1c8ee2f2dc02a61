// MQTTClient against a real mosquitto (BatonTestSupport.MosquittoBroker), driven by a real
// poll() loop (PollLoop.swift). docs/broker.md describes each behaviour checked here.
import BatonLibc
import Glibc
import Testing
@testable import BatonMQTT
import BatonTestSupport

/// A client of `broker` with a short backoff so the tests reconnect quickly.
func clientConfig(_ broker: MosquittoBroker, id: String, version: MQTTProtocol = .automatic) -> MQTTConfig {
    MQTTConfig(host: "127.0.0.1", port: broker.port, clientID: id, keepalive: 30, protocolVersion: version,
               reconnectMin: .milliseconds(100), reconnectMax: .milliseconds(800))
}

/// Starts `client` and runs the loop until it is connected.
func connect(_ client: inout MQTTClient, _ log: EventLog) throws {
    client.start(now: .now)
    let ok = runLoop(&client, log) { log.isConnected }
    try #require(ok, "no CONNACK within 5 s; events: \(log.events)")
}

@Suite struct MQTTClientTests {
    @Test func connectsWithMQTTv5ByDefault() throws {
        let broker = try MosquittoBroker()
        var client = try MQTTClient(config: clientConfig(broker, id: "v5-client"))
        let log = EventLog()
        let before = ClientState(client)
        #expect(before.socket == -1 && !before.isConnected && before.protocolVersion == nil)
        #expect(before.nextDeadline == nil, "not started: nothing to do")
        try connect(&client, log)
        #expect(log.events == [.connected(protocolVersion: .v5, sessionPresent: false)])
        let after = ClientState(client)
        #expect(after.protocolVersion == .v5)
        #expect(after.socket >= 0)
        #expect(after.counters.connects == 1)
        // While connected the loop must come back within about a second for the keepalive.
        let deadline = try #require(after.nextDeadline)
        #expect(deadline <= Instant.now + .seconds(1))
        #expect(broker.waitForLog("v5-client (p5, c1, k30)"), "the broker saw a v5 CONNECT with keepalive 30")
    }

    @Test func forcedV311ConnectsWithV311() throws {
        let broker = try MosquittoBroker()
        var client = try MQTTClient(config: clientConfig(broker, id: "old-client", version: .v311))
        let log = EventLog()
        try connect(&client, log)
        #expect(log.connects == [.v311])
        #expect(log.state?.protocolVersion == .v311)
        // mosquitto logs its protocol enum: p2 is v3.1.1, p5 is v5.
        #expect(broker.waitForLog("old-client (p2, c1, k30)"), "the broker saw a v3.1.1 CONNECT\n\(broker.log)")
    }

    @Test func publishWhileNotConnectedThrowsNotConnected() throws {
        let broker = try MosquittoBroker()
        var client = try MQTTClient(config: clientConfig(broker, id: "early"))
        let payload: [UInt8] = [1, 2, 3]
        #expect(throws: MQTTError.notConnected) {
            try payload.withUnsafeBytes { try client.publish(topic: "baton/x", payload: $0) }
        }
        do {
            try client.subscribe("baton/#")
            Issue.record("subscribe before connecting did not throw")
        } catch {
            #expect(error == .notConnected)
        }
        let log = EventLog()
        try connect(&client, log)
        try payload.withUnsafeBytes { try client.publish(topic: "baton/x", payload: $0) }
        client.disconnect()
        #expect(throws: MQTTError.notConnected) {
            try payload.withUnsafeBytes { try client.publish(topic: "baton/x", payload: $0) }
        }
        #expect(ClientState(client).counters.published == 1)
    }

    /// MQTT 5.0 §3.3.2.3: message expiry (0x02), content type (0x03), response topic (0x08),
    /// correlation data (0x09), user properties (0x26) travel with a retained message and reach
    /// a later v5 subscriber; the payload's bytes survive, and mosquitto_sub reads the same.
    @Test func retainedPublishCarriesV5Properties() throws {
        let broker = try MosquittoBroker()
        var publisher = try MQTTClient(config: clientConfig(broker, id: "publisher"))
        let publisherLog = EventLog()
        try connect(&publisher, publisherLog)

        let payload: [UInt8] = [0x7B, 0x00, 0xFF, 0x22, 0x0A, 0x7D]  // NUL, 0xFF and a newline included
        let properties = MQTTProperties(
            messageExpiry: 3600, contentType: "application/json", responseTopic: "baton/fetch/reply/gw1",
            correlationData: [0xDE, 0xAD, 0x00, 0xBE, 0xEF],
            userProperties: [MQTTUserProperty("room", "kitchen"), MQTTUserProperty("room", "hall"),
                             MQTTUserProperty("gateway", "gw1")])
        try payload.withUnsafeBytes {
            try publisher.publish(topic: "baton/activities/dev1", payload: $0, qos: 1, retain: true, properties: properties)
        }
        // Let the PUBLISH (and its PUBACK) go through the loop.
        runLoop(&publisher, publisherLog, limit: .milliseconds(300)) { false }

        var subscriber = try MQTTClient(config: clientConfig(broker, id: "subscriber"))
        let log = EventLog()
        try connect(&subscriber, log)
        try subscriber.subscribe("baton/activities/#", qos: 1)
        #expect(runLoop(&subscriber, log) { !log.messages.isEmpty })

        let m = try #require(log.messages.first)
        #expect(m.topic == "baton/activities/dev1")
        #expect(m.payload == payload)
        #expect(m.retained, "sent from the broker's retained store")
        #expect(m.qos == 1)
        #expect(m.properties.contentType == "application/json")
        #expect(m.properties.responseTopic == "baton/fetch/reply/gw1")
        #expect(m.properties.correlationData == [0xDE, 0xAD, 0x00, 0xBE, 0xEF])
        #expect(m.properties.userProperties == properties.userProperties, "repeated names kept, in order (§3.3.2.3.7)")
        // §3.3.2.3.3: the broker forwards the expiry minus the time the message waited.
        let expiry = try #require(m.properties.messageExpiry)
        #expect(expiry <= 3600 && expiry >= 3590)
        #expect(log.state?.counters.received == 1)

        #expect(try broker.retained("baton/#") == ["baton/activities/dev1": payload])
    }

    @Test func v311DropsPropertiesSilently() throws {
        let broker = try MosquittoBroker()
        var publisher = try MQTTClient(config: clientConfig(broker, id: "v311-publisher", version: .v311))
        let publisherLog = EventLog()
        try connect(&publisher, publisherLog)
        let body: [UInt8] = Array("on".utf8)
        try body.withUnsafeBytes {
            try publisher.publish(topic: "baton/status", payload: $0, retain: true,
                                  properties: MQTTProperties(contentType: "text/plain", userProperties: [.init("a", "b")]))
        }
        runLoop(&publisher, publisherLog, limit: .milliseconds(200)) { false }

        var subscriber = try MQTTClient(config: clientConfig(broker, id: "v5-subscriber"))
        let log = EventLog()
        try connect(&subscriber, log)
        try subscriber.subscribe("baton/status")
        #expect(runLoop(&subscriber, log) { !log.messages.isEmpty })
        let m = try #require(log.messages.first)
        #expect(m.payload == body)
        #expect(m.properties == MQTTProperties(), "a v3.1.1 PUBLISH has no properties")
    }

    @Test func aLiveMessageIsNotMarkedRetained() throws {
        let broker = try MosquittoBroker()
        var client = try MQTTClient(config: clientConfig(broker, id: "listener"))
        let log = EventLog()
        try connect(&client, log)
        try client.subscribe("baton/streams/+/up", qos: 1)
        // A reference client publishes while we are subscribed (retain flag set: a subscriber
        // that is already there gets it with the flag clear, MQTT 3.1.1 §3.3.1.3).
        var published = false
        #expect(runLoop(&client, log) {
            if !published && broker.log.contains("listener 1 baton/streams/+/up") {
                published = true
                try? broker.publish(topic: "baton/streams/s1/up", payload: [0x01, 0x02], retain: true)
            }
            return !log.messages.isEmpty
        })
        #expect(log.messages == [MQTTMessage(topic: "baton/streams/s1/up", payload: [0x01, 0x02], qos: 0, retained: false)])
    }

    /// MQTT 5.0 §3.8.3.1, Retain Handling 2: a filter subscribed to again at QoS 0 without the
    /// retained messages (the gateway's activities after its retained scan) brings the live
    /// changes at QoS 0, and not the retained store a second time.
    @Test func subscribingAgainWithoutRetainedBringsOnlyLiveChangesAtTheNewQoS() throws {
        let broker = try MosquittoBroker()
        try broker.publish(topic: "baton/activities/d1", payload: [0x31], retain: true, qos: 1)
        var client = try MQTTClient(config: clientConfig(broker, id: "rescan"))
        let log = EventLog()
        try connect(&client, log)
        try client.subscribe("baton/activities/+", qos: 1)
        #expect(runLoop(&client, log) { log.messages.count == 1 })
        #expect(log.messages.first?.retained == true && log.messages.first?.qos == 1, "the scan: \(log.messages)")
        try client.subscribe("baton/activities/+", qos: 0, sendRetained: false)
        var published = false
        #expect(runLoop(&client, log) {
            if !published && broker.log.contains("rescan 0 baton/activities/+") {
                published = true
                try? broker.publish(topic: "baton/activities/d2", payload: [0x32], qos: 1)
            }
            return log.messages.count >= 2
        })
        // Anything else would come within a moment: the retained d1 again, say.
        runLoop(&client, log, limit: .milliseconds(300)) { false }
        #expect(log.messages.count == 2, "\(log.messages)")
        #expect(log.messages.last == MQTTMessage(topic: "baton/activities/d2", payload: [0x32], qos: 0, retained: false))
    }

    /// MQTT 5.0 §3.1.2.5: a connection that ends without DISCONNECT gets its will published.
    /// Dropping the client closes its socket without DISCONNECT, as a crash would.
    @Test func willIsPublishedWhenTheConnectionEndsAbruptly() throws {
        let broker = try MosquittoBroker()
        var config = clientConfig(broker, id: "gw-crash")
        config.will = MQTTWill(topic: "baton/gateways/gw-crash/status", payload: Array("offline".utf8), qos: 1, retain: true)
        do {
            var client = try MQTTClient(config: config)
            try connect(&client, EventLog())
        }  // deinit: mosquitto_destroy closes the socket, no DISCONNECT
        var found: [String: [UInt8]] = [:]
        let deadline = Instant.now + .seconds(5)
        while found.isEmpty && Instant.now < deadline {
            found = try broker.retained("baton/gateways/#")
        }
        #expect(found == ["baton/gateways/gw-crash/status": Array("offline".utf8)])
    }

    /// …and a clean DISCONNECT discards it (MQTT 5.0 §3.14.4).
    @Test func cleanDisconnectDoesNotPublishTheWill() throws {
        let broker = try MosquittoBroker()
        var config = clientConfig(broker, id: "gw-clean")
        config.will = MQTTWill(topic: "baton/gateways/gw-clean/status", payload: Array("offline".utf8))
        var client = try MQTTClient(config: config)
        let log = EventLog()
        try connect(&client, log)
        let online: [UInt8] = Array("online".utf8)
        // Published just before disconnect(): the flush must carry it out before DISCONNECT.
        try online.withUnsafeBytes {
            try client.publish(topic: "baton/gateways/gw-clean/status", payload: $0, qos: 1, retain: true)
        }
        client.disconnect()
        let afterDisconnect = ClientState(client)
        #expect(!afterDisconnect.isConnected && afterDisconnect.socket == -1)
        #expect(broker.waitForLog("Client gw-clean disconnected."), "the broker saw DISCONNECT")
        #expect(try broker.retained("baton/gateways/#") == ["baton/gateways/gw-clean/status": online])
        // The next poll reports it, and nothing reconnects.
        runLoop(&client, log, limit: .milliseconds(300)) { false }
        #expect(log.disconnects.count == 1)
        #expect(log.disconnects.first?.contains("clean DISCONNECT") == true)
        #expect(log.state?.nextDeadline == nil)
        #expect(log.connects.count == 1)
    }

    @Test func reconnectsAfterTheBrokerIsKilledAndRestarted() throws {
        let broker = try MosquittoBroker()
        var client = try MQTTClient(config: clientConfig(broker, id: "survivor"))
        let log = EventLog()
        try connect(&client, log)

        broker.kill()
        #expect(runLoop(&client, log) { !log.disconnects.isEmpty })
        #expect(log.disconnects.first?.contains("lost the connection to mqtt://127.0.0.1:\(broker.port)") == true)
        #expect(log.state?.isConnected == false)
        #expect(log.state?.socket == -1)
        // Let a few attempts fail against the dead port (backoff 100 ms → 800 ms).
        runLoop(&client, log, limit: .milliseconds(700)) { false }
        let failed = log.disconnects.count - 1
        #expect(failed >= 1, "it kept trying")
        #expect(log.disconnects.dropFirst().allSatisfy { $0.contains("could not connect to mqtt://127.0.0.1:\(broker.port): Connection refused") },
                "\(log.disconnects)")

        try broker.restart()
        // The window tops out at 800 ms: well inside 5 s.
        #expect(runLoop(&client, log) { log.isConnected }, "events: \(log.events)")
        #expect(log.connects == [.v5, .v5])
        #expect(log.state?.counters.connects == 2)

        // And it works: the restarted broker has nothing retained until we publish again.
        let state: [UInt8] = Array("{}".utf8)
        try state.withUnsafeBytes { try client.publish(topic: "baton/activities/d", payload: $0, qos: 1, retain: true) }
        runLoop(&client, log, limit: .milliseconds(300)) { false }
        #expect(try broker.retained() == ["baton/activities/d": state])
    }

    /// Issue 16 item 2, the issue's recipe: default backoff (250 ms … 30 s), the broker killed and
    /// back 3 s later. Every attempt during the outage is refused, and each next attempt is
    /// scheduled within a second of the failure, so the client is back within a second of the
    /// broker's return whatever the outage did to the backoff.
    @Test func aThreeSecondOutageKeepsEveryRetryWithinASecond() throws {
        let broker = try MosquittoBroker()
        var config = clientConfig(broker, id: "quick-return")
        config.reconnectMin = .milliseconds(250)
        config.reconnectMax = .seconds(30)
        var client = try MQTTClient(config: config)
        let log = EventLog()
        try connect(&client, log)
        broker.kill()
        var longest: Duration = .zero
        var seen = 0
        runLoop(&client, log, limit: .seconds(3)) {
            // After each failure: how far ahead the next attempt is.
            if log.disconnects.count > seen, let next = log.state?.nextDeadline {
                seen = log.disconnects.count
                longest = max(longest, next - .now)
            }
            return false
        }
        #expect(seen >= 3, "it kept trying: \(log.disconnects)")
        #expect(log.disconnects.dropFirst().allSatisfy { $0.hasSuffix("Connection refused") }, "\(log.disconnects)")
        #expect(longest <= .seconds(1), "a retry was scheduled \(longest) after a failure")
        try broker.restart()
        #expect(runLoop(&client, log) { log.isConnected }, "events: \(log.events)")
    }

    @Test func badCredentialsAreRefusedWithTheReasonAndRetriedWithBackoff() throws {
        let broker = try MosquittoBroker(users: ["gateway": "right-password"])
        var config = clientConfig(broker, id: "gw-wrong")
        config.username = "gateway"
        config.password = "wrong-password"
        config.reconnectMin = .milliseconds(200)
        config.reconnectMax = .milliseconds(800)
        var client = try MQTTClient(config: config)
        let log = EventLog()
        client.start(now: .now)
        runLoop(&client, log, limit: .seconds(3)) { false }

        #expect(log.connects.isEmpty)
        let refusals = log.refusals
        // Waits of at least 200 ms: at most 3 s / 200 ms + 1 attempts, where a tight loop would make thousands.
        #expect(refusals.count >= 2 && refusals.count <= 16, "\(refusals.count) refusals in 3 s")
        #expect(refusals.first == "the broker refused the login: not authorized (check broker.username and broker.password)")
        #expect(log.state?.counters.refusals == refusals.count)
        #expect(log.disconnects.isEmpty, "a refusal is reported once, not again as a disconnect")
        #expect(!log.isConnected)
        // The broker saw the same number of attempts.
        let attempts = broker.log.components(separatedBy: "Sending CONNACK to 127.0.0.1 (0, 135)").count - 1
        #expect(attempts == refusals.count || attempts == refusals.count + 1, "\(attempts) attempts, \(refusals.count) refusals\n\(broker.log)")
    }

    @Test func badCredentialsOnV311NameTheV311Reason() throws {
        let broker = try MosquittoBroker(users: ["gateway": "right-password"])
        var config = clientConfig(broker, id: "gw-old-wrong", version: .v311)
        config.username = "gateway"
        config.password = "nope"
        var client = try MQTTClient(config: config)
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log) { !log.refusals.isEmpty })
        #expect(log.refusals.first == "the broker refused the login: not authorised (check broker.username and broker.password)")
    }

    @Test func rightCredentialsConnect() throws {
        let broker = try MosquittoBroker(users: ["gateway": "right-password", "other": "x"])
        var config = clientConfig(broker, id: "gw-right")
        config.username = "gateway"
        config.password = "right-password"
        var client = try MQTTClient(config: config)
        let log = EventLog()
        try connect(&client, log)
        #expect(log.refusals.isEmpty)
        #expect(broker.waitForLog("u'gateway'"), "the broker logged the username")
    }

    @Test func refusedWhenNoBrokerListensAndRetriesQuietly() throws {
        // A port nothing listens on: every attempt fails at once, each is one event, spaced by backoff.
        let broker = try MosquittoBroker()
        let port = broker.port
        broker.stop()
        var config = MQTTConfig(host: "127.0.0.1", port: port, clientID: "nobody-home",
                                reconnectMin: .milliseconds(200), reconnectMax: .milliseconds(400))
        config.keepalive = 10
        var client = try MQTTClient(config: config)
        let log = EventLog()
        client.start(now: .now)
        runLoop(&client, log, limit: .seconds(2)) { false }
        #expect(log.disconnects.count >= 2 && log.disconnects.count <= 11, "\(log.disconnects.count) attempts in 2 s")
        #expect(log.disconnects.allSatisfy { $0 == "could not connect to mqtt://127.0.0.1:\(port): Connection refused" }, "\(log.disconnects)")
        let next = try #require(log.state?.nextDeadline)
        #expect(next > Instant.now - .seconds(1))
    }

    /// The keepalive PINGREQ comes from mosquitto_loop_misc, which `poll` calls about once a
    /// second; with keepalive 5 s (libmosquitto's minimum) the broker sees one within ~5 s.
    @Test func keepaliveSendsPingWhenIdle() throws {
        let broker = try MosquittoBroker()
        var config = clientConfig(broker, id: "quiet")
        config.keepalive = 5
        var client = try MQTTClient(config: config)
        let log = EventLog()
        try connect(&client, log)
        #expect(runLoop(&client, log, limit: .seconds(9)) { broker.log.contains("Received PINGREQ from quiet") })
        #expect(runLoop(&client, log, limit: .seconds(2)) { broker.log.contains("Sending PINGRESP to quiet") })
        #expect(log.isConnected && log.disconnects.isEmpty)
    }

    /// A second client with the same id takes the first one's place (MQTT 5.0 §3.1.4): the
    /// first loses its connection (mosquitto 2.0.11 just closes it) and reconnects on its own.
    @Test func sameClientIDTwiceLosesTheConnection() throws {
        let broker = try MosquittoBroker()
        var first = try MQTTClient(config: clientConfig(broker, id: "gw-twin"))
        let firstLog = EventLog()
        try connect(&first, firstLog)
        var second = try MQTTClient(config: clientConfig(broker, id: "gw-twin"))
        let secondLog = EventLog()
        second.start(now: .now)
        #expect(runLoop(&first, firstLog, &second, secondLog) { !firstLog.disconnects.isEmpty })
        #expect(firstLog.disconnects.first == "lost the connection to mqtt://127.0.0.1:\(broker.port): the broker closed the connection")
    }

    /// A broker that says why in an MQTT v5 DISCONNECT (MQTT 5.0 §3.14.2.1) is quoted, with the fix.
    @Test func v5DisconnectReasonsAreNamed() {
        #expect(connectionReason(code: 0x8E, errno: 0, keepalive: 30, clientID: "gw1")
                == "the broker disconnected this client: session taken over (another client connected with the same client id \"gw1\"; every gateway needs its own id)")
        #expect(connectionReason(code: 0x8B, errno: 0, keepalive: 30, clientID: "gw1")
                == "the broker disconnected this client: server shutting down")
        #expect(connectionReason(code: 19, errno: 0, keepalive: 30, clientID: "gw1")
                == "no answer from the broker within the keepalive (30 s)")
    }
}
