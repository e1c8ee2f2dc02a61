// A building's broker on three real nats-server nodes on loopback (docs/broker.md "A broker
// that can die: a NATS cluster"). `scripts/nats-cluster --write` writes the nodes' configs
// (free ports on 127.0.0.1, one cluster, JetStream, MQTT with its streams at three replicas);
// this harness runs each node itself, as a ChildProcess that dies with the test, so a test can
// kill -9 one node and start it again on the same ports and store, as a machine that lost its
// power and came back would.
import Foundation
import Glibc

public final class NATSCluster: @unchecked Sendable {
    /// Debian's, or another build named by `NATS_SERVER` (as for scripts/nats-cluster): how
    /// trixie's 2.10 was measured on bookworm (docs/broker.md).
    public static let server = ProcessInfo.processInfo.environment["NATS_SERVER"] ?? "/usr/sbin/nats-server"
    /// Debian's package, so a test can say `.enabled(if:)` and be skipped visibly without it.
    public static var isInstalled: Bool { FileManager.default.isExecutableFile(atPath: server) }

    /// `nats-server --version`'s answer ("nats-server: v2.9.10"), for the test's report.
    public static var version: String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: server)
        p.arguments = ["--version"]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        guard (try? p.run()) != nil else { return "unknown version" }
        p.waitUntilExit()
        return String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    public let names = ["a", "b", "c"]
    public let directory: URL
    /// Each node's MQTT port, in `names` order.
    public let mqttPorts: [Int]
    /// Each node's HTTP monitoring port (/healthz, /jsz).
    public let monitorPorts: [Int]
    private var processes: [ChildProcess?]

    /// Writes the configs with the script and starts the three nodes; returns once every node's
    /// /healthz says ok (JetStream current there), within 20 s.
    public init(file: String = #filePath) throws {
        guard Self.isInstalled else { throw BrokerError("\(Self.server) is missing: install the nats-server package (scripts/setup)") }
        var root = URL(fileURLWithPath: file)
        for _ in 0 ..< 3 { root.deleteLastPathComponent() }
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("baton-nats-\(getpid())-\(UInt64.random(in: 0...UInt64.max))")
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let script = root.appendingPathComponent("scripts/nats-cluster").path
        let written = directory.appendingPathComponent("ports.txt").path
        let status = try ChildProcess.run(script, ["--write", directory.path], stdout: written,
                                          stderr: directory.appendingPathComponent("script.err").path)
        guard status == 0 else { throw BrokerError("scripts/nats-cluster --write failed (\(status))") }
        func port(_ name: String, _ kind: String) throws -> Int {
            let path = directory.appendingPathComponent("node-\(name).\(kind)-port").path
            guard let text = try? String(contentsOfFile: path, encoding: .utf8),
                  let n = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw BrokerError("scripts/nats-cluster wrote no \(path)")
            }
            return n
        }
        let names = ["a", "b", "c"]
        mqttPorts = try names.map { try port($0, "mqtt") }
        monitorPorts = try names.map { try port($0, "monitor") }
        processes = [nil, nil, nil]
        for i in names.indices { try launch(i) }
        for i in names.indices { try waitHealthy(i, within: 20) }
    }

    deinit {
        // The directory (configs, logs, stores) stays for a look after a failure, as the
        // gateway tests' scratch directories do.
        for i in names.indices { kill(i) }
    }

    /// The reference clients on node `i`: a fresh subscriber there, a publish through it.
    public func clients(_ i: Int) -> ReferenceClients {
        ReferenceClients(port: mqttPorts[i], directory: directory, sentinelDelay: .milliseconds(500))
    }

    /// `mqtt://127.0.0.1:PORT` of every node, starting with node `first` and going round: the
    /// list a gateway placed on that node is given.
    public func urls(startingAt first: Int) -> [String] {
        names.indices.map { "mqtt://127.0.0.1:\(mqttPorts[(first + $0) % names.count])" }
    }

    /// SIGKILL, as a power cut: no goodbye to the routes, no wills of its clients sent.
    public func kill(_ i: Int) {
        guard let p = processes[i] else { return }
        p.signal(SIGKILL)
        _ = p.wait(timeout: .seconds(5))
        processes[i] = nil
    }

    public func isRunning(_ i: Int) -> Bool { processes[i]?.isRunning ?? false }

    /// Starts node `i` again with its config and its JetStream store, as a rebooted machine;
    /// returns once its /healthz says ok.
    public func restart(_ i: Int, within seconds: Double = 20) throws {
        kill(i)
        try launch(i)
        try waitHealthy(i, within: seconds)
    }

    /// Node `i`'s log so far.
    public func log(_ i: Int) -> String {
        (try? String(contentsOf: directory.appendingPathComponent("node-\(names[i]).log"), encoding: .utf8)) ?? ""
    }

    /// GET on node `i`'s monitoring port (curl; loopback only), nil if it does not answer.
    public func monitor(_ i: Int, _ path: String) -> String? {
        let out = directory.appendingPathComponent("monitor-\(UInt64.random(in: 0...UInt64.max)).json").path
        defer { try? FileManager.default.removeItem(atPath: out) }
        guard let status = try? ChildProcess.run("/usr/bin/curl", ["-fs", "-m", "2", "http://127.0.0.1:\(monitorPorts[i])\(path)"],
                                                  stdout: out), status == 0 else { return nil }
        return try? String(contentsOfFile: out, encoding: .utf8)
    }

    /// MQTT's streams as node `i` sees them: name → (replicas configured, leader, peers that
    /// are current). What "rejoined without a fight" is read from.
    public func mqttStreams(seenBy i: Int) -> [String: (replicas: Int, leader: String, current: Int)] {
        guard let text = monitor(i, "/jsz?streams=true&config=true"),
              let root = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
              let accounts = root["account_details"] as? [[String: Any]] else { return [:] }
        var result: [String: (Int, String, Int)] = [:]
        for account in accounts {
            for stream in account["stream_detail"] as? [[String: Any]] ?? [] {
                guard let name = stream["name"] as? String, name.hasPrefix("$MQTT_") else { continue }
                let replicas = (stream["config"] as? [String: Any])?["num_replicas"] as? Int ?? 0
                let cluster = stream["cluster"] as? [String: Any] ?? [:]
                let peers = cluster["replicas"] as? [[String: Any]] ?? []
                let current = peers.filter { $0["current"] as? Bool == true }.count + (cluster["leader"] == nil ? 0 : 1)
                result[name] = (replicas, cluster["leader"] as? String ?? "", current)
            }
        }
        return result
    }

    /// Node `i` is a current replica of every MQTT stream again, as each stream's leader
    /// sees it (a follower's own view does not know its peers).
    public func isCurrentReplicaOfEveryMQTTStream(_ i: Int) -> Bool {
        let name = "baton-\(names[i])"
        let views = names.indices.map { mqttReplicas(seenBy: $0) }
        let streams = mqttStreams(seenBy: (i + 1) % names.count)
        // Three on 2.9 ($MQTT_sess, $MQTT_msgs, $MQTT_rmsgs); 2.10 adds $MQTT_out and
        // $MQTT_qos2in (QoS 2, which Baton does not use), each of them replicated as well.
        guard streams.count >= 3 else { return false }
        return streams.allSatisfy { stream, info in
            // Elected leader again: a leader is current, and its own list of replicas does
            // not name it (the CI failures: node c led $MQTT_msgs again after its return).
            if info.leader == name { return true }
            guard let leader = names.indices.first(where: { "baton-\(names[$0])" == info.leader }) else { return false }
            return views[leader][stream]?[name] == true
        }
    }

    /// stream → (peer name → current) as node `i` reports its streams' followers.
    private func mqttReplicas(seenBy i: Int) -> [String: [String: Bool]] {
        guard let text = monitor(i, "/jsz?streams=true"),
              let root = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
              let accounts = root["account_details"] as? [[String: Any]] else { return [:] }
        var result: [String: [String: Bool]] = [:]
        for account in accounts {
            for stream in account["stream_detail"] as? [[String: Any]] ?? [] {
                guard let name = stream["name"] as? String, name.hasPrefix("$MQTT_") else { continue }
                let peers = (stream["cluster"] as? [String: Any])?["replicas"] as? [[String: Any]] ?? []
                result[name] = Dictionary(peers.compactMap { p in (p["name"] as? String).map { ($0, p["current"] as? Bool == true) } },
                                          uniquingKeysWith: { a, _ in a })
            }
        }
        return result
    }

    /// The JetStream meta leader (the node that places streams and consumers) as node `i`
    /// sees it; "" when it has none.
    public func metaLeader(seenBy i: Int) -> String {
        guard let text = monitor(i, "/jsz"),
              let root = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else { return "" }
        return (root["meta_cluster"] as? [String: Any])?["leader"] as? String ?? ""
    }

    private func launch(_ i: Int) throws {
        let name = names[i]
        let config = directory.appendingPathComponent("node-\(name).conf").path
        // Appended to, not truncated, so a restarted node's log follows its first life.
        let log = directory.appendingPathComponent("node-\(name).log").path
        processes[i] = try ChildProcess(Self.server, ["-c", config, "-l", log])
    }

    private func waitHealthy(_ i: Int, within seconds: Double) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let text = monitor(i, "/healthz"), text.contains("ok") { return }
            if let p = processes[i], !p.isRunning { break }
            usleep(100_000)
        }
        throw BrokerError("nats-server node \(names[i]) was not healthy within \(seconds) s:\n\(log(i).suffix(2000))")
    }
}
