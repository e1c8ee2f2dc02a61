// The reference clients (mosquitto_sub, mosquitto_pub, from mosquitto-clients) on any MQTT
// listener on 127.0.0.1: a MosquittoBroker's, or a node of a NATSCluster. They speak MQTT
// v3.1.1 unless told otherwise, which every broker here takes. Split out of MosquittoBroker so
// the cluster's checks read a node exactly as the mosquitto tests read their broker.
import Foundation
import Glibc

public struct ReferenceClients: Sendable {
    public let port: Int
    /// Where the helpers' scratch files go (the broker's own temporary directory).
    public let directory: URL
    public let login: (username: String, password: String)?

    /// How long `retained` waits after subscribing before its first sentinel. mosquitto sends
    /// a new subscription's retained messages before anything published after the SUBACK, so
    /// 0; a NATS node reads them from JetStream first, and a sentinel can overtake them.
    public let sentinelDelay: Duration

    public init(port: Int, directory: URL, login: (username: String, password: String)? = nil,
                sentinelDelay: Duration = .zero) {
        self.port = port; self.directory = directory; self.login = login; self.sentinelDelay = sentinelDelay
    }

    /// The retained messages a fresh subscriber to `pattern` receives, topic → payload,
    /// read with mosquitto_sub (the reference client, not ours).
    ///
    /// mosquitto_sub --retained-only prints only messages with the retain flag (the broker sets
    /// it only on messages it sends from its retained store, MQTT 3.1.1 §3.3.1.3) and exits at
    /// the first message without it. To end promptly, the helper also subscribes to a topic of
    /// its own and publishes one plain message there until mosquitto_sub has exited: that
    /// message arrives after the retained ones, which the broker sends right after SUBACK.
    /// The payload is printed in hex (`%x`) so every byte survives.
    public func retained(_ pattern: String = "#") throws -> [String: [UInt8]] {
        let sentinel = "baton-test/sentinel/\(UInt64.random(in: 0...UInt64.max))"
        // A file, not a pipe: many retained messages cannot fill it and stall mosquitto_sub.
        let outPath = directory.appendingPathComponent("sub-\(UInt64.random(in: 0...UInt64.max)).out").path
        defer { try? FileManager.default.removeItem(atPath: outPath) }
        let sub = try ChildProcess("/usr/bin/mosquitto_sub",
                                   ["-h", "127.0.0.1", "-p", String(port), "-t", pattern, "-t", sentinel,
                                    "--retained-only", "-F", "%x %t", "-W", "10"] + loginArguments,
                                   stdout: outPath)
        let deadline = ContinuousClock.now + .seconds(10)
        if sentinelDelay > .zero { sub.wait(timeout: sentinelDelay) }
        while sub.isRunning && ContinuousClock.now < deadline {
            try publish(topic: sentinel, payload: Array("end".utf8), retain: false)
            sub.wait(timeout: .milliseconds(100))
        }
        if sub.isRunning {
            sub.signal(SIGKILL)
            sub.wait(timeout: .seconds(5))
            throw BrokerError("mosquitto_sub -t \(pattern) did not finish within 10 s")
        }
        let data = FileManager.default.contents(atPath: outPath) ?? Data()

        var result: [String: [UInt8]] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: true) {
            guard let space = line.firstIndex(of: " ") else { continue }
            let hex = line[..<space]
            let topic = String(line[line.index(after: space)...])
            guard topic != sentinel, let bytes = hexBytes(hex) else { continue }
            result[topic] = bytes
        }
        return result
    }

    /// Publishes one message with mosquitto_pub (payload from a file, `-f`, so any bytes go
    /// through). An empty retained payload clears the topic's retained message. `qos` 1: a
    /// subscriber at QoS 1 gets it at QoS 1 (it is delivered at the lower of the two).
    public func publish(topic: String, payload: [UInt8], retain: Bool = false, qos: Int = 0) throws {
        let unique = UInt64.random(in: 0...UInt64.max)
        let payloadPath = directory.appendingPathComponent("pub-\(unique).payload").path
        let errPath = directory.appendingPathComponent("pub-\(unique).err").path
        defer {
            try? FileManager.default.removeItem(atPath: payloadPath)
            try? FileManager.default.removeItem(atPath: errPath)
        }
        var arguments = ["-h", "127.0.0.1", "-p", String(port), "-t", topic]
        if payload.isEmpty {
            arguments.append("-n")
        } else {
            try Data(payload).write(to: URL(fileURLWithPath: payloadPath))
            arguments += ["-f", payloadPath]
        }
        if retain { arguments.append("-r") }
        if qos > 0 { arguments += ["-q", String(qos)] }
        let status = try ChildProcess.run("/usr/bin/mosquitto_pub", arguments + loginArguments, stderr: errPath)
        if status != 0 {
            let text = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
            throw BrokerError("mosquitto_pub -t \(topic) failed (\(status)): \(text)")
        }
    }

    private var loginArguments: [String] {
        guard let login else { return [] }
        return ["-u", login.username, "-P", login.password]
    }
}
