// TLS to the broker (docs/broker.md "TLS"): a throwaway CA made with the openssl tool, a
// mosquitto TLS listener signed by it, and MQTTClient over mqtts. The handshake runs inside the
// same poll() loop as everything else (libmosquitto 2.0.11 drives it from mosquitto_loop_read).
import Foundation
import Glibc
import Testing
import BatonMQTT
import BatonTestSupport

/// A CA, a server certificate for 127.0.0.1 (or for another name), and a client certificate,
/// all P-256 so they are made in milliseconds. Files live in a temporary directory.
final class TestCertificates {
    let directory: URL
    var caFile: String { path("ca.crt") }
    var serverCert: String { path("server.crt") }
    var serverKey: String { path("server.key") }
    var clientCert: String { path("client.crt") }
    var clientKey: String { path("client.key") }

    init(serverNames: String = "IP:127.0.0.1,DNS:localhost") throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("baton-tls-\(getpid())-\(UInt64.random(in: 0...UInt64.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try "subjectAltName=\(serverNames)\n".write(toFile: path("server.ext"), atomically: true, encoding: .utf8)
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try openssl(["req", "-x509"] + ec + ["-keyout", path("ca.key"), "-out", caFile, "-days", "2",
                                             "-subj", "/CN=Baton Test CA"])
        for (name, extra) in [("server", ["-extfile", path("server.ext")]), ("client", [])] {
            try openssl(["req"] + ec + ["-keyout", path("\(name).key"), "-out", path("\(name).csr"),
                                        "-subj", "/CN=baton-\(name)"])
            try openssl(["x509", "-req", "-in", path("\(name).csr"), "-CA", caFile, "-CAkey", path("ca.key"),
                         "-CAcreateserial", "-out", path("\(name).crt"), "-days", "2"] + extra)
        }
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    /// The broker's TLS listener settings (they follow its `listener` line).
    var listenerConfig: [String] { ["cafile \(caFile)", "certfile \(serverCert)", "keyfile \(serverKey)"] }

    private func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

    private func openssl(_ arguments: [String]) throws {
        let status = try ChildProcess.run("/usr/bin/openssl", arguments, stderr: path("openssl.err"))
        guard status == 0 else {
            throw BrokerError("openssl \(arguments.prefix(2).joined(separator: " ")) failed: "
                              + ((try? String(contentsOfFile: path("openssl.err"), encoding: .utf8)) ?? ""))
        }
    }
}

@Suite struct TLSTests {
    private func tlsConfig(_ broker: MosquittoBroker, id: String, _ tls: MQTTTLS) -> MQTTConfig {
        MQTTConfig(host: "127.0.0.1", port: broker.port, tls: tls, clientID: id,
                   reconnectMin: .milliseconds(100), reconnectMax: .milliseconds(400))
    }

    @Test func connectsOverTLSWithTheBrokersCA() throws {
        let certs = try TestCertificates()
        let broker = try MosquittoBroker(extraConfig: certs.listenerConfig)
        var client = try MQTTClient(config: tlsConfig(broker, id: "tls-ok", MQTTTLS(caFile: certs.caFile)))
        let log = EventLog()
        try connect(&client, log)
        #expect(log.connects == [.v5])
        // A publish goes through the TLS session and back.
        try client.subscribe("baton/tls")
        let body: [UInt8] = [0x00, 0x01, 0xFE]
        try body.withUnsafeBytes { try client.publish(topic: "baton/tls", payload: $0, qos: 1) }
        #expect(runLoop(&client, log) { !log.messages.isEmpty })
        #expect(log.messages.first?.payload == body)
    }

    /// mqtts:// without a CA file trusts the system store, which does not know our test CA: the
    /// handshake fails, and the reason quotes OpenSSL instead of only "A TLS error occurred".
    @Test func anUnknownCAIsReportedWithOpenSSLsReason() throws {
        let certs = try TestCertificates()
        let broker = try MosquittoBroker(extraConfig: certs.listenerConfig)
        var client = try MQTTClient(config: tlsConfig(broker, id: "tls-unknown-ca", MQTTTLS()))
        let log = EventLog()
        client.start(now: .now)
        #expect(runLoop(&client, log) { !log.disconnects.isEmpty })
        let reason = try #require(log.disconnects.first)
        #expect(reason.hasPrefix("could not connect to mqtts://127.0.0.1:\(broker.port): "), "\(reason)")
        #expect(reason.contains("certificate verify failed"), "\(reason)")
        #expect(log.connects.isEmpty)
    }

    /// `insecure` skips the host name check only: a certificate for another name is accepted,
    /// one from an unknown CA still is not.
    @Test func insecureSkipsOnlyTheHostNameCheck() throws {
        let certs = try TestCertificates(serverNames: "DNS:elsewhere.example")
        let broker = try MosquittoBroker(extraConfig: certs.listenerConfig)

        var strict = try MQTTClient(config: tlsConfig(broker, id: "tls-strict", MQTTTLS(caFile: certs.caFile)))
        let strictLog = EventLog()
        strict.start(now: .now)
        #expect(runLoop(&strict, strictLog) { !strictLog.disconnects.isEmpty })
        #expect(strictLog.connects.isEmpty, "a certificate for elsewhere.example does not pass for 127.0.0.1")

        var relaxed = try MQTTClient(config: tlsConfig(broker, id: "tls-insecure", MQTTTLS(caFile: certs.caFile, insecure: true)))
        let relaxedLog = EventLog()
        try connect(&relaxed, relaxedLog)

        var unknown = try MQTTClient(config: tlsConfig(broker, id: "tls-insecure-unknown", MQTTTLS(insecure: true)))
        let unknownLog = EventLog()
        unknown.start(now: .now)
        #expect(runLoop(&unknown, unknownLog) { !unknownLog.disconnects.isEmpty })
        #expect(unknownLog.connects.isEmpty, "the chain is still checked")
    }

    @Test func clientCertificateLogin() throws {
        let certs = try TestCertificates()
        let broker = try MosquittoBroker(extraConfig: certs.listenerConfig + ["require_certificate true"])

        var without = try MQTTClient(config: tlsConfig(broker, id: "tls-no-cert", MQTTTLS(caFile: certs.caFile)))
        let withoutLog = EventLog()
        without.start(now: .now)
        #expect(runLoop(&without, withoutLog) { !withoutLog.disconnects.isEmpty })
        #expect(withoutLog.connects.isEmpty, "the broker requires a client certificate")
        // OpenSSL said why ("alert certificate required"), so this is not taken for a broker
        // that only speaks MQTT v3.1.1.
        #expect(withoutLog.disconnects.allSatisfy { !$0.contains("v3.1.1") }, "\(withoutLog.disconnects)")

        var with = try MQTTClient(config: tlsConfig(broker, id: "tls-cert",
                                                    MQTTTLS(caFile: certs.caFile, certFile: certs.clientCert, keyFile: certs.clientKey)))
        let withLog = EventLog()
        try connect(&with, withLog)
        #expect(withLog.connects == [.v5])
    }
}
