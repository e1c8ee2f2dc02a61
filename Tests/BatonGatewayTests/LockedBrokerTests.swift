// A locked-down broker (docs/broker.md "A locked-down broker"): TLS with certificates the
// test makes with openssl, a password per user, and board/mosquitto-baton.acl. What a user
// checks: the gateway works through it, a client without credentials is refused, and a
// reader cannot forge an activity.
import BatonTestSupport
import Foundation
import Testing

@Suite struct LockedBrokerTests {
    /// board/mosquitto-baton.acl, as a building's broker loads it.
    static let exampleACL = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../board/mosquitto-baton.acl").standardized.path

    /// The hall's config on the locked broker: `tls` is its broker.tls line.
    func hallYAML(port: Int, capture: GeneratedCapture, tls: String) -> String {
        """
        gateway: {id: hall, room: Hall}
        broker:
          url: mqtts://127.0.0.1:\(port)
          reconnect-min: 100ms
          reconnect-max: 1s
          tls: \(tls)
        radio: {source: "capture:\(capture.path)", paced: false}
        rooms: {settle: 0s}
        status: {interval: 1s}
        """
    }

    /// A CA and a broker certificate for 127.0.0.1 (subjectAltName, so hostname checks pass).
    func makeCertificates(in dir: URL) throws -> (ca: String, cert: String, key: String) {
        let p = dir.path
        func openssl(_ args: [String]) throws {
            let status = try ChildProcess.run("/usr/bin/openssl", args, stdout: "\(p)/openssl.log", stderr: "\(p)/openssl.err",
                                              timeout: .seconds(30))
            guard status == 0 else {
                throw BrokerError("openssl \(args.first ?? "") failed: \((try? String(contentsOfFile: "\(p)/openssl.err", encoding: .utf8)) ?? "")")
            }
        }
        try "subjectAltName=IP:127.0.0.1\n".write(toFile: "\(p)/san.ext", atomically: true, encoding: .utf8)
        try openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=Baton test CA",
                     "-keyout", "\(p)/ca.key", "-out", "\(p)/ca.crt"])
        try openssl(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                     "-keyout", "\(p)/broker.key", "-out", "\(p)/broker.csr"])
        try openssl(["x509", "-req", "-in", "\(p)/broker.csr", "-CA", "\(p)/ca.crt", "-CAkey", "\(p)/ca.key",
                     "-CAcreateserial", "-days", "2", "-extfile", "\(p)/san.ext", "-out", "\(p)/broker.crt"])
        return ("\(p)/ca.crt", "\(p)/broker.crt", "\(p)/broker.key")
    }

    /// A client certificate with common name `name`, signed by the test CA.
    func makeClientCertificate(_ name: String, ca: String, in dir: URL) throws -> (cert: String, key: String) {
        let p = dir.path, caKey = (ca as NSString).deletingPathExtension + ".key"
        for args in [["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=\(name)", "-keyout", "\(p)/\(name).key",
                      "-out", "\(p)/\(name).csr"],
                     ["x509", "-req", "-in", "\(p)/\(name).csr", "-CA", ca, "-CAkey", caKey, "-CAcreateserial",
                      "-days", "2", "-out", "\(p)/\(name).crt"]] {
            let status = try ChildProcess.run("/usr/bin/openssl", args, stdout: "\(p)/openssl.log", stderr: "\(p)/openssl.err",
                                              timeout: .seconds(30))
            guard status == 0 else { throw BrokerError("openssl \(args[0]) for \(name) failed") }
        }
        return ("\(p)/\(name).crt", "\(p)/\(name).key")
    }

    /// mosquitto_sub for the retained messages of `topic`, with `login` arguments (a client
    /// certificate or a pre-shared key): exit status and what it printed.
    func read(_ topic: String, port: Int, login: [String], in dir: URL) throws -> (status: Int32?, text: String) {
        let out = dir.appendingPathComponent("sub-\(UUID().uuidString.prefix(6))").path
        let status = try ChildProcess.run("/usr/bin/mosquitto_sub", ["-h", "127.0.0.1", "-p", "\(port)", "-t", topic, "-v",
                                                                      "--retained-only", "-W", "2"] + login,
                                          stdout: out + ".out", stderr: out + ".err", timeout: .seconds(10))
        return (status, ["out", "err"].map { (try? String(contentsOfFile: out + "." + $0, encoding: .utf8)) ?? "" }.joined())
    }

    /// Issue 7 part 5: a gateway logs in with its own client certificate (the broker takes its
    /// common name as the ACL user); a client without a certificate is refused.
    @Test func aGatewayLogsInWithItsClientCertificate() throws {
        let dir = try scratchDirectory("locked-cert")
        let certs = try makeCertificates(in: dir)
        let hall = try makeClientCertificate("hall", ca: certs.ca, in: dir)
        let ha = try makeClientCertificate("homeassistant", ca: certs.ca, in: dir)
        let acl = Self.exampleACL
        let broker = try MosquittoBroker(extraConfig: [
            "cafile \(certs.ca)", "certfile \(certs.cert)", "keyfile \(certs.key)", "acl_file \(acl)",
            "require_certificate true", "use_identity_as_username true", "allow_anonymous false",
        ])
        let capture = try GeneratedCapture(in: dir, devices: 6, reports: 200, seed: 22)
        let gateway = try GatewayProcess(yaml: hallYAML(port: broker.port, capture: capture,
                                                        tls: "{ca-file: \(certs.ca), cert-file: \(hall.cert), key-file: \(hall.key)}"),
                                         in: dir)
        let asHA = ["--cafile", certs.ca, "--cert", ha.cert, "--key", ha.key]
        let online = eventually(within: 15, every: 0.5) { () -> String? in
            let r = try? read("baton/activities/+", port: broker.port, login: asHA, in: dir)
            return (r?.text.contains("\"gateway\":\"hall\"") ?? false) ? r?.text : nil
        }
        #expect(online != nil, "no activity through a certificate login: \(gateway.log)\n\(broker.log)")
        #expect(broker.log.contains("u'hall'"), "the broker did not take the certificate's name as the user")
        let noCertificate = try read("baton/#", port: broker.port, login: ["--cafile", certs.ca], in: dir)
        #expect(noCertificate.status != 0 && !noCertificate.text.contains("baton/activities"),
                "a client without a certificate got: \(noCertificate.text)")
        #expect(gateway.stop() == 0)
    }

    /// Issue 7 part 5: TLS with a pre-shared key instead of certificates (mosquitto's
    /// `psk_file`); the key never reaches the log or the stats; a wrong key is refused.
    @Test func aGatewayLogsInWithAPreSharedKey() throws {
        let dir = try scratchDirectory("locked-psk")
        let acl = Self.exampleACL
        let hallKey = "4a6f1c22e5b0d9a8b7c6d5e4f3a2b1c0", haKey = "00112233445566778899aabbccddeeff"
        let pskFile = dir.appendingPathComponent("broker-psk").path
        try "hall:\(hallKey)\nhomeassistant:\(haKey)\n".write(toFile: pskFile, atomically: true, encoding: .utf8)
        try "\(hallKey)\n".write(to: dir.appendingPathComponent("hall.psk"), atomically: true, encoding: .utf8)
        let broker = try MosquittoBroker(extraConfig: [
            "psk_hint baton", "psk_file \(pskFile)", "use_identity_as_username true", "acl_file \(acl)",
            "allow_anonymous false",
        ])
        let capture = try GeneratedCapture(in: dir, devices: 6, reports: 200, seed: 23)
        let gateway = try GatewayProcess(yaml: hallYAML(port: broker.port, capture: capture,
                                                        tls: "{psk-identity: hall, psk-file: hall.psk}"), in: dir)
        let asHA = ["--psk", haKey, "--psk-identity", "homeassistant"]
        let online = eventually(within: 15, every: 0.5) { () -> String? in
            let r = try? read("baton/activities/+", port: broker.port, login: asHA, in: dir)
            return (r?.text.contains("\"gateway\":\"hall\"") ?? false) ? r?.text : nil
        }
        #expect(online != nil, "no activity through a TLS-PSK login: \(gateway.log)\n\(broker.log)")
        let wrongKey = try read("baton/#", port: broker.port, login: ["--psk", "ffeeddccbbaa99887766554433221100",
                                                                       "--psk-identity", "homeassistant"], in: dir)
        #expect(wrongKey.status != 0 && !wrongKey.text.contains("baton/activities"), "a wrong key got: \(wrongKey.text)")
        let stats = try read("baton/gateways/hall/stats", port: broker.port, login: asHA, in: dir)
        #expect(stats.text.contains("\"gateway\"") || stats.text.contains("hall"), "\(stats.text)")
        for secret in [hallKey, hallKey.uppercased()] {
            #expect(!gateway.log.contains(secret) && !stats.text.contains(secret), "the pre-shared key leaked")
        }
        #expect(gateway.stop() == 0)
    }

    @Test func aGatewayWorksThroughTLSAndTheACLAndNobodyElseWritesItsTopics() throws {
        let dir = try scratchDirectory("locked")
        let certs = try makeCertificates(in: dir)
        let acl = Self.exampleACL
        let broker = try MosquittoBroker(users: ["hall": "hall-secret", "homeassistant": "ha-secret"], extraConfig: [
            "cafile \(certs.ca)", "certfile \(certs.cert)", "keyfile \(certs.key)", "acl_file \(acl)",
        ])
        let capture = try GeneratedCapture(in: dir, devices: 6, reports: 200, seed: 21)
        try "hall-secret\n".write(to: dir.appendingPathComponent("mqtt-password"), atomically: true, encoding: .utf8)
        let gateway = try GatewayProcess(yaml: """
            gateway: {id: hall, room: Hall}
            broker:
              url: mqtts://127.0.0.1:\(broker.port)
              username: hall
              password-file: mqtt-password
              reconnect-min: 100ms
              reconnect-max: 1s
              tls: {ca-file: \(certs.ca)}
            radio: {source: "capture:\(capture.path)", paced: false}
            rooms: {settle: 0s}
            status: {interval: 1s}
            """, in: dir)

        // Reads as Home Assistant would: TLS, its own login.
        func read(_ topic: String, as login: (String, String)?) throws -> (status: Int32?, text: String) {
            var args = ["-h", "127.0.0.1", "-p", "\(broker.port)", "--cafile", certs.ca, "-t", topic, "-v",
                        "--retained-only", "-W", "2"]
            if let login { args += ["-u", login.0, "-P", login.1] }
            let out = dir.appendingPathComponent("sub-\(UUID().uuidString.prefix(6))").path
            let status = try ChildProcess.run("/usr/bin/mosquitto_sub", args, stdout: out + ".out", stderr: out + ".err",
                                              timeout: .seconds(10))
            return (status, ["out", "err"].map { (try? String(contentsOfFile: out + "." + $0, encoding: .utf8)) ?? "" }.joined())
        }
        let ha = ("homeassistant", "ha-secret")
        let online = eventually(within: 15, every: 0.5) { () -> String? in
            let r = try? read("baton/activities/+", as: ha)
            return (r?.text.contains("\"gateway\":\"hall\"") ?? false) ? r?.text : nil
        }
        #expect(online != nil, "no activity through TLS and the ACL: \(gateway.log)")
        #expect(try read("baton/gateways/hall/status", as: ha).text.contains("online"))

        // No credentials: refused (mosquitto_sub exits non-zero and says why).
        let anonymous = try read("baton/#", as: nil)
        #expect(anonymous.status != 0 && anonymous.text.lowercased().contains("not authori"),
                "an anonymous client got: \(anonymous.text)")

        // A reader forging an activity: the broker drops it, nothing is retained.
        let forged = "5a00000000ff"
        let pub = try ChildProcess.run("/usr/bin/mosquitto_pub", [
            "-h", "127.0.0.1", "-p", "\(broker.port)", "--cafile", certs.ca, "-u", ha.0, "-P", ha.1,
            "-t", "baton/activities/\(forged)", "-r", "-q", "1", "-m", #"{"device":"5a00000000ff","room":"Vault"}"#,
        ], stdout: dir.appendingPathComponent("pub.out").path, stderr: dir.appendingPathComponent("pub.err").path,
           timeout: .seconds(10))
        _ = pub
        #expect(!(try read("baton/activities/\(forged)", as: ha).text.contains("Vault")), "a reader forged an activity")
        let denial = broker.log.split(separator: "\n").first { $0.contains("Denied PUBLISH") && $0.contains(forged) }
        #expect(denial != nil, "the broker did not log the denial")
        // Home Assistant may ask for a payload and hear the answer (the ACL lets it write
        // baton/fetch/…, the gateway write baton/answers/…): a capture gives no link, so the
        // hall answers `unreachable`, and it does answer (docs/relay.md §3).
        let device = try #require(capture.lastBeacons.keys.sorted().first)
        let out = dir.appendingPathComponent("fetch.out").path, err = dir.appendingPathComponent("fetch.err").path
        let fetched = try ChildProcess.run(batonBinary.path, [
            "fetch", String(format: "%012llx", device), "--broker", "mqtts://127.0.0.1:\(broker.port)",
            "--ca-file", certs.ca, "--username", ha.0, "--password", ha.1,
        ], stdout: out, stderr: err, timeout: .seconds(20))
        let said = (try? String(contentsOfFile: err, encoding: .utf8)) ?? ""
        #expect(fetched == 1 && said.contains("unreachable") && said.contains("gateway hall"),
                "a fetch through the locked broker: exit \(fetched), \(said)")
        // A re-advertising gateway asks for the phones in its room (docs/relay.md §9): as the
        // gateway user, a fetch is answered, and a stream's open and up frames are not denied.
        let asGateway = try ChildProcess.run(batonBinary.path, [
            "fetch", String(format: "%012llx", device), "--broker", "mqtts://127.0.0.1:\(broker.port)",
            "--ca-file", certs.ca, "--username", "hall", "--password", "hall-secret",
        ], stdout: out, stderr: err, timeout: .seconds(20))
        #expect(asGateway == 1 && ((try? String(contentsOfFile: err, encoding: .utf8)) ?? "").contains("unreachable"),
                "a gateway's fetch through the locked broker: exit \(asGateway)")
        for topic in ["baton/stream/\(String(format: "%012llx", device))/phone1", "baton/streams/phone1/up"] {
            _ = try ChildProcess.run("/usr/bin/mosquitto_pub", [
                "-h", "127.0.0.1", "-p", "\(broker.port)", "--cafile", certs.ca, "-u", "hall", "-P", "hall-secret",
                "-t", topic, "-q", "1", "-m", "x",
            ], stdout: dir.appendingPathComponent("pub2.out").path, stderr: dir.appendingPathComponent("pub2.err").path,
               timeout: .seconds(10))
        }
        #expect(!broker.log.contains("Denied PUBLISH from baton-hall") && !broker.log.split(separator: "\n")
                    .contains { $0.contains("Denied PUBLISH") && $0.contains("phone1") },
                "the ACL denies a gateway what it asks for phones: \(broker.log.split(separator: "\n").filter { $0.contains("Denied") })")
        // The password never reaches the log or the stats.
        #expect(!gateway.log.contains("hall-secret"))
        #expect(!(try read("baton/gateways/hall/stats", as: ha).text.contains("hall-secret")))
        #expect(gateway.stop() == 0)
    }
}
