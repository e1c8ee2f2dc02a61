// Reconnect backoff (docs/broker.md "Reconnect") and the configuration checks MQTTClient.init
// makes before libmosquitto would answer only "Invalid function arguments".
import BatonTestSupport
import Testing
@testable import BatonMQTT

/// SplitMix64: a fixed sequence, so a test can draw many waits and check every one.
typealias SeededGenerator = SplitMix

@Suite struct BackoffTests {
    @Test func firstWaitIsTheMinimumThenTheWindowDoublesToTheMaximum() {
        var b = Backoff(min: .milliseconds(250), max: .seconds(2))
        var rng = SeededGenerator(state: 1)
        // The window's top: 250 ms, 500 ms, 1 s, 2 s, then stays at 2 s.
        let tops: [Duration] = [.milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2), .seconds(2), .seconds(2)]
        for top in tops {
            let wait = b.next(using: &rng)
            #expect(wait >= .milliseconds(250) && wait <= top, "wait \(wait) outside [250 ms, \(top)]")
        }
        #expect(b.ceiling == .seconds(2))
    }

    @Test func waitsAreSpreadOverTheWholeWindow() {
        // Full jitter: at the widest window the draws cover it, not just one end.
        var b = Backoff(min: .milliseconds(100), max: .seconds(10))
        var rng = SeededGenerator(state: 42)
        for _ in 0..<10 { _ = b.next(using: &rng) }
        let waits = (0..<200).map { _ in b.next(using: &rng) }
        #expect(waits.allSatisfy { $0 >= .milliseconds(100) && $0 <= .seconds(10) })
        #expect(waits.contains { $0 < .seconds(2) })
        #expect(waits.contains { $0 > .seconds(8) })
    }

    /// docs/broker.md "Several nodes": a failure followed by an attempt at another node does not
    /// widen the window; the client grows it once per round of the list.
    @Test func aFailureBeforeAnotherNodeLeavesTheWindowAsItIs() {
        var b = Backoff(min: .milliseconds(250), max: .seconds(30))
        var rng = SeededGenerator(state: 7)
        for _ in 0..<5 {
            #expect(b.next(grow: false, using: &rng) == .milliseconds(250))
        }
        #expect(b.ceiling == .milliseconds(250))
        _ = b.next(grow: true, using: &rng)
        #expect(b.ceiling == .milliseconds(500))
    }

    @Test func resetReturnsToTheMinimum() {
        var b = Backoff(min: .milliseconds(100), max: .seconds(5))
        var rng = SeededGenerator(state: 7)
        for _ in 0..<8 { _ = b.next(using: &rng) }
        b.reset()
        #expect(b.next(using: &rng) == .milliseconds(100))
    }

    @Test func aFatalErrorDrawsFromTheWidestWindowAtOnce() {
        var b = Backoff(min: .milliseconds(100), max: .seconds(30))
        var rng = SeededGenerator(state: 3)
        _ = b.next(fatal: true, using: &rng)
        #expect(b.ceiling == .seconds(30))
    }

    /// Issue 16 item 2: a 3 s outage of refused connections pushed the ceiling to 2–4 s, so the
    /// gateway came back 2.1–4.3 s after the broker did. While the broker is absent every wait
    /// stays within a second, and the ceiling is left where it was.
    @Test func anAbsentBrokerIsTriedAgainWithinASecondWhateverFailedBefore() {
        var b = Backoff(min: .milliseconds(250), max: .seconds(30))
        var rng = SeededGenerator(state: 11)
        // Connections lost after the broker took them (it was going down): the ceiling climbs.
        for _ in 0..<6 { _ = b.next(using: &rng) }
        #expect(b.ceiling == .seconds(16))
        let waits = (0..<200).map { _ in b.next(absent: true, using: &rng) }
        #expect(waits.allSatisfy { $0 >= .milliseconds(250) && $0 <= .seconds(1) }, "\(waits.max()!)")
        #expect(waits.contains { $0 > .milliseconds(900) }, "still jittered over the whole second")
        #expect(b.ceiling == .seconds(16), "refused connections do not move the ceiling")
        // A minimum above a second is the user's: it is kept.
        var slow = Backoff(min: .seconds(2), max: .seconds(30))
        #expect(slow.next(absent: true, using: &rng) == .seconds(2))
    }

    @Test func onlyANonListeningBrokerCountsAsAbsent() {
        #expect(MQTTError.isBrokerAbsent(code: 14, errno: 111))   // MOSQ_ERR_ERRNO with ECONNREFUSED
        #expect(MQTTError.isBrokerAbsent(code: 14, errno: 101))   // ENETUNREACH
        #expect(MQTTError.isBrokerAbsent(code: 14, errno: 113))   // EHOSTUNREACH
        #expect(!MQTTError.isBrokerAbsent(code: 14, errno: 104))  // ECONNRESET: it was there
        #expect(!MQTTError.isBrokerAbsent(code: 7, errno: 111))   // MOSQ_ERR_CONN_LOST
        #expect(!MQTTError.isBrokerAbsent(code: 5, errno: 0))     // a refused CONNACK: it answered
    }

    @Test func fatalSplitFollowsLibMosquittoLoop() {
        // lib/loop.c, mosquitto_loop_forever: these return instead of reconnecting.
        #expect(MQTTError.isFatal(code: 8, errno: 0))    // MOSQ_ERR_TLS
        #expect(MQTTError.isFatal(code: 15, errno: 0))   // MOSQ_ERR_EAI
        #expect(MQTTError.isFatal(code: 2, errno: 0))    // MOSQ_ERR_PROTOCOL
        #expect(MQTTError.isFatal(code: 14, errno: 71))  // MOSQ_ERR_ERRNO with EPROTO
        // …and these reconnect.
        #expect(!MQTTError.isFatal(code: 7, errno: 0))   // MOSQ_ERR_CONN_LOST
        #expect(!MQTTError.isFatal(code: 19, errno: 0))  // MOSQ_ERR_KEEPALIVE
        #expect(!MQTTError.isFatal(code: 5, errno: 0))   // MOSQ_ERR_CONN_REFUSED
        #expect(!MQTTError.isFatal(code: 14, errno: 111)) // MOSQ_ERR_ERRNO with ECONNREFUSED
    }

    @Test func errorTextsComeFromLibMosquitto() {
        #expect(MQTTError.mosquitto(4, "publishing to x", errno: 0) == .notConnected)  // MOSQ_ERR_NO_CONN
        #expect(MQTTError.mosquitto(9, "publishing to x", errno: 0).description
                == "publishing to x failed: Payload too large. (libmosquitto error 9)")
        // MOSQ_ERR_ERRNO: the text is errno's, as it was right after the call.
        #expect(MQTTError.mosquitto(14, "connecting", errno: 111).description.contains("Connection refused"))
    }
}

@Suite struct ConfigCheckTests {
    private func refusal(_ change: (inout MQTTConfig) -> Void) -> String? {
        var config = MQTTConfig(clientID: "check")
        change(&config)
        do {
            _ = try MQTTClient(config: config)
            return nil
        } catch {
            guard case .invalidConfiguration(let why) = error else { return "unexpected \(error)" }
            return why
        }
    }

    @Test func theDefaultsAreAccepted() {
        #expect(refusal { _ in } == nil)
        #expect(refusal { $0.keepalive = 0 } == nil)       // keepalive off
        #expect(refusal { $0.keepalive = 5 } == nil)
        #expect(refusal { $0.keepalive = 65535 } == nil)
    }

    @Test func eachBadSettingIsNamed() throws {
        #expect(try #require(refusal { $0.clientID = "" }).contains("client id is empty"))
        #expect(try #require(refusal { $0.keepalive = 4 }).contains("keepalive 4 s: use 0 (off) or 5 to 65535"))
        #expect(try #require(refusal { $0.keepalive = 65536 }).contains("keepalive 65536 s"))
        #expect(try #require(refusal { $0.port = 0 }).contains("port 0"))
        #expect(try #require(refusal { $0.host = "" }).contains("no broker host"))
        #expect(try #require(refusal { $0.password = "x" }).contains("password without a username"))
        #expect(try #require(refusal { $0.reconnectMin = .zero }).contains("reconnectMin"))
        #expect(try #require(refusal { $0.reconnectMax = .milliseconds(100) }).contains("reconnectMax"))
        #expect(try #require(refusal { $0.will = MQTTWill(topic: "baton/#", payload: []) }).contains("will topic"))
        #expect(try #require(refusal { $0.will = MQTTWill(topic: "a", payload: [], qos: 3) }).contains("will QoS 3"))
        #expect(try #require(refusal { $0.tls = MQTTTLS(caFile: "/nonexistent/ca.crt") })
                .contains("TLS CA file /nonexistent/ca.crt: No such file or directory"))
        #expect(try #require(refusal { $0.tls = MQTTTLS(certFile: "/etc/hostname") }).contains("key file"))
    }
}
