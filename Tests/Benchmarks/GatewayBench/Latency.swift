// End-to-end latency (docs/performance.md "Latency"): from an advertising report entering the
// gateway to the retained activity message at a subscriber, over loopback.
//
// The release `baton gateway` runs as a child process with `--radio sim:SOCKET`; this bench is
// the controller on that socket and a subscriber to `baton/activities/+` on the same broker.
// One beacon device saves over and over: each report carries the next sequence number, so
// each is a change (`saved`) the gateway must publish. The bench writes one LE Advertising
// Report event, waits for the message with that `seq`, and only then sends the next (ping-
// pong), so every latency is one report's own trip and none queues behind another.
//
// The clock starts just before the event's bytes are written to the socket and stops when
// the subscriber's client hands over the message. It therefore includes the Unix socket hop
// into the gateway, the gateway's loop (read, decode, table, JSON, publish), the broker, and
// the subscriber's own read.
import BatonLibc
import BatonSim
import BatonTestSupport
import Foundation
import Glibc

struct LatencyFigures {
    var changes: Int
    var warmup: Int
    var samples: [Double]  // µs, sorted

    var json: String {
        let n = Double(samples.count)
        let mean = samples.reduce(0, +) / n
        return """
            {"changes": \(changes), "warmup": \(warmup), "p50_us": \(percentile(samples, 0.50)), \
            "p90_us": \(percentile(samples, 0.90)), "p99_us": \(percentile(samples, 0.99)), \
            "p999_us": \(percentile(samples, 0.999)), "max_us": \(samples.last!), "min_us": \(samples.first!), \
            "mean_us": \(mean)}
            """
    }
}

func measureLatency(baton: String, broker: MosquittoBroker, dir: URL, changes: Int, warmup: Int) throws -> LatencyFigures {
    let socketPath = dir.appendingPathComponent("latency.sock").path
    let controller = try H4Controller(path: socketPath)
    let subscriber = try Subscriber(port: broker.port, clientID: "bench-latency-subscriber")
    try subscriber.connect(subscribing: ["baton/activities/+"])

    // One device whose every report is a save: with saveEvery 1 the generator bumps the
    // sequence before each report. Built before the clock runs.
    var generator = CaptureGenerator(devices: 1, seed: 11, saveEvery: 1)
    let total = warmup + changes
    var events: [[UInt8]] = []
    var sequences: [Int] = []
    events.reserveCapacity(total)
    for _ in 0..<total {
        let report = generator.next()
        guard case .baton(let beacon) = report.kind else { throw BenchError("device 0 of the generator is not a Baton device") }
        events.append([0x04] + AdvertisingEvents.event([report][...]))
        sequences.append(Int(beacon.sequence))
    }

    let logPath = dir.appendingPathComponent("latency-gateway.log").path
    let gateway = try ChildProcess(baton, ["gateway", "--radio", "sim:\(socketPath)",
                                           "--broker", "mqtt://127.0.0.1:\(broker.port)", "--id", "bench", "--room", "Bench"],
                                   stderr: logPath)
    defer {
        gateway.signal(SIGTERM)
        if gateway.wait(timeout: .seconds(5)) == nil { gateway.signal(SIGKILL); gateway.wait(timeout: .seconds(5)) }
    }
    try controller.acceptAndInitialise(timeout: .seconds(20)) { readLog(logPath) }

    var samples: [Double] = []
    samples.reserveCapacity(changes)
    for i in 0..<total {
        let expected = sequences[i]
        var arrived: Instant?
        let sent = Instant.now
        controller.send(events[i])
        // The first change also waits out the gateway's connect to the broker.
        let deadline = sent + .seconds(i == 0 ? 20 : 5)
        while arrived == nil {
            subscriber.pump(timeoutMs: 100) { m in
                let at = Instant.now
                if arrived == nil, jsonInteger("seq", in: m.payload) == expected { arrived = at }
            }
            if arrived == nil, Instant.now > deadline {
                throw BenchError("change \(i) (seq \(expected)) never reached the subscriber: \(readLog(logPath))")
            }
        }
        if i >= warmup { samples.append(microseconds(arrived! - sent)) }
    }
    samples.sort()
    return LatencyFigures(changes: changes, warmup: warmup, samples: samples)
}
