// MQTT v5 first, v3.1.1 when the broker refuses v5 (docs/broker.md "MQTT v5 and v3.1.1"),
// against OldBroker: a v3.1.1-only broker served from the test's poll loop.
import Testing
import BatonMQTT

@Suite struct FallbackTests {
    private func config(_ port: Int, _ version: MQTTProtocol = .automatic) -> MQTTConfig {
        MQTTConfig(host: "127.0.0.1", port: port, clientID: "fallback", protocolVersion: version,
                   reconnectMin: .milliseconds(100), reconnectMax: .milliseconds(400))
    }

    /// MQTT 3.1.1 §3.1.2.2: a v3.1.1 server answers an unknown protocol level with CONNACK
    /// 0x01 "unacceptable protocol version" and closes.
    @Test func unacceptableProtocolVersionFallsBackToV311() throws {
        let old = try OldBroker(answer: .unacceptableVersion)
        var client = try MQTTClient(config: config(old.port))
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log, peer: old) { log.isConnected }, "events: \(log.events)")
        #expect(old.levels == [5, 4], "one v5 CONNECT, then v3.1.1")
        #expect(log.events.count == 2)
        #expect(log.disconnects == ["mqtt://127.0.0.1:\(old.port) does not accept MQTT v5 (it answered \"unsupported protocol version\"); using MQTT v3.1.1 from now on"])
        #expect(log.events.last == .connected(protocolVersion: .v311, sessionPresent: false))
        #expect(log.state?.protocolVersion == .v311)
        #expect(log.refusals.isEmpty, "falling back is not a refused login")
    }

    /// §3.1.2.2 also lets a server just close the connection. That could mean other things,
    /// so the client tries v3.1.1 next, after the usual backoff, and keeps it once it connects.
    @Test func closedBeforeConnackTriesV311AndRemembersIt() throws {
        let old = try OldBroker(answer: .close)
        var client = try MQTTClient(config: config(old.port))
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log, peer: old) { log.isConnected }, "events: \(log.events)")
        #expect(old.levels == [5, 4])
        #expect(log.connects == [.v311])
        #expect(log.disconnects == ["could not connect to mqtt://127.0.0.1:\(old.port): the broker closed the connection before answering the MQTT v5 CONNECT; the next attempt tries MQTT v3.1.1"])

        // Remembered: after a disconnect, the next attempt speaks v3.1.1 at once.
        client.disconnect()
        client.start(now: .now)
        #expect(runLoop(&client, log, peer: old) { log.connects.count == 2 })
        #expect(old.levels == [5, 4, 4])
    }

    /// A broker that closes every connection is not a v3.1.1 broker: the client alternates,
    /// spaced by backoff, and keeps neither version.
    @Test func closingEverythingAlternatesVersionsWithBackoff() throws {
        let old = try OldBroker(answer: .closeEverything)
        var client = try MQTTClient(config: config(old.port))
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log, peer: old) { old.levels.count >= 4 }, "levels \(old.levels)")
        #expect(Array(old.levels.prefix(4)) == [5, 4, 5, 4])
        #expect(log.connects.isEmpty)
        #expect(log.disconnects.dropFirst().first?.hasSuffix("before answering the MQTT v3.1.1 CONNECT either; the next attempt goes back to MQTT v5") == true,
                "\(log.disconnects)")
        // Spaced by backoff (100 ms first): not a burst of attempts.
        #expect(log.disconnects.count == old.levels.count || log.disconnects.count == old.levels.count - 1)
    }

    /// Forced v5 never falls back: the refusal names the setting to change.
    @Test func forcedV5IsRefusedAndSaysWhatToChange() throws {
        let old = try OldBroker(answer: .unacceptableVersion)
        var client = try MQTTClient(config: config(old.port, .v5))
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log, peer: old, limit: .seconds(1)) { log.refusals.count >= 2 })
        #expect(log.refusals.first == "the broker refused the login: unsupported protocol version (set broker.protocol to auto or 3.1.1 for this broker)")
        #expect(old.levels.allSatisfy { $0 == 5 })
        #expect(log.connects.isEmpty)
    }
}
