// The Swift side of scripts/bench (docs/performance.md): generates a capture of advertising
// reports, optionally writes it for the C walk and the Python peers, then decodes the whole
// in-memory file with the path every radio source feeds — CaptureReader, then
// AdvertisementDecoder (LE Meta event, each report, one AD walk classifying beacon /
// Continuity / other, every Continuity message decoded, counts) — and reports:
//   * reports per second: the best of `--runs` full decodes, on whatever core the caller
//     pinned it to (scripts/bench uses `taskset -c 0`);
//   * allocations per report: malloc calls counted by ordo-one/malloc-interposer over every
//     measured decode, after one warm-up decode, divided by the reports decoded.
// Everything that allocates (generating, writing, the decoder's fixed tables, printing)
// happens outside the counted window; the window holds only the per-record loop.
import ArgumentParser
import BatonHCI
import BatonSim
import BatonWire
import Glibc
import MallocInterposerSwift

@main
struct BatonBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "BatonBench",
        abstract: "Decodes a generated capture and reports reports/s and allocations/report.")

    @Option(help: "Advertising reports in the generated capture.")
    var reports = 250_000

    @Option(help: "Simulated devices (a third Baton, a third Apple, a third ordinary).")
    var devices = 300

    @Option(help: "Generator seed: a seed names a capture exactly.")
    var seed: UInt64 = 1

    @Option(help: "Measured full decodes (after one warm-up); the best time is reported.")
    var runs = 5

    @Option(help: "Write the capture (btsnoop, datalink 1002) to this path.")
    var capture: String?

    @Flag(help: "Print one JSON object instead of text.")
    var json = false

    @Option(help: "Stop the decode early, to see where time goes: records (capture reader only), reports (+ HCI event parsing), content (+ AD walk, beacon, Continuity validation), full.")
    var stage: Stage = .full

    mutating func validate() throws {
        guard reports >= 1, devices >= 1, runs >= 1 else { throw ValidationError("--reports, --devices and --runs must be at least 1") }
    }

    mutating func run() throws {
        var generator = CaptureGenerator(devices: devices, seed: seed)
        let (file, generated) = generator.capture(reports: reports, datalink: .androidH4)
        var expected = Expected()
        for r in generated {
            switch r.kind {
            case .baton: expected.beacons += 1
            case .apple: expected.continuity += 1
            case .ordinary: expected.other += 1
            }
            if r.extended { expected.extended += 1 }
        }
        if let capture { try write(file, to: capture) }

        let calibration = calibrateCounter()
        guard calibration >= Self.calibrationObjects else {
            throw BenchError("the malloc counter saw \(calibration) allocations for \(Self.calibrationObjects) objects: is the interposer linked?")
        }

        var results: [DecodeRun] = []
        results.reserveCapacity(runs + 1)
        file.withUnsafeBytes { raw in
            // Warm-up: first touches of the file's pages and of every code path.
            results.append(decodeOnce(raw, stage: stage, counting: false))
            for _ in 0 ..< runs { results.append(decodeOnce(raw, stage: stage, counting: true)) }
        }
        let warmup = results.removeFirst()
        if stage == .full {
            for r in [warmup] + results { try expected.check(r, reports: generated.count) }
        }

        let best = results.map(\.seconds).min()!
        let mallocs = results.reduce(0) { $0 + $1.mallocs }
        let decoded = results.reduce(0) { $0 + $1.tally.reports }
        let summary = Summary(
            reports: generated.count, records: warmup.tally.records, bytes: file.count, devices: devices, seed: seed,
            runs: results.map(\.seconds), bestSeconds: best, reportsPerSecond: Double(generated.count) / best,
            nanosecondsPerReport: best * 1e9 / Double(generated.count),
            mallocs: mallocs, frees: results.reduce(0) { $0 + $1.frees }, reportsCounted: decoded,
            allocationsPerReport: Double(mallocs) / Double(decoded), calibrationMallocs: calibration,
            tally: warmup.tally)
        print(json ? summary.json : summary.text)
    }

    static let calibrationObjects = 1_000

    /// Proves the counter counts: allocates a known number of class instances while counting.
    /// A counter that is not wired in (the interposer not loaded) would report 0 here, and a
    /// 0 for the decode would then mean nothing.
    func calibrateCounter() -> Int {
        var boxes: [Box] = []
        boxes.reserveCapacity(Self.calibrationObjects)
        MallocInterposerSwift.initialize()
        MallocInterposerSwift.hook()
        for i in 0 ..< Self.calibrationObjects { boxes.append(Box(i)) }
        MallocInterposerSwift.unhook()
        let n = MallocInterposerSwift.getStatistics().mallocCount
        precondition(boxes.count == Self.calibrationObjects)
        return n
    }

    func write(_ bytes: [UInt8], to path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw BenchError("cannot open \(path): errno \(errno)") }
        defer { close(fd) }
        var done = 0
        try bytes.withUnsafeBytes { raw in
            while done < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + done, raw.count - done)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw BenchError("cannot write \(path): errno \(errno)") }
                done += n
            }
        }
    }
}

final class Box {
    let value: Int
    init(_ value: Int) { self.value = value }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

struct DecodeRun {
    var seconds: Double
    var mallocs: Int
    var frees: Int
    var tally: AdvertisementTally
    /// Sum over every heard advertisement of RSSI and AD structure count: a use of each
    /// result, so the optimiser cannot drop the work the callback would do.
    var sink: Int
    var captureError: WireError?
}

/// One full decode of the capture. The reader and decoder are made before the counted window
/// (a gateway makes them once at start; the decoder's drop table is allocated then).
func decodeOnce(_ raw: UnsafeRawBufferPointer, stage: Stage, counting: Bool) -> DecodeRun {
    var reader: CaptureReader
    do { reader = try CaptureReader(raw) } catch {
        return DecodeRun(seconds: 0, mallocs: 0, frees: 0, tally: AdvertisementTally(), sink: 0, captureError: error)
    }
    var decoder = AdvertisementDecoder()
    var sink = 0
    var captureError: WireError?
    if counting {
        MallocInterposerSwift.initialize()
        MallocInterposerSwift.hook()
    }
    let start = now()
    switch stage {
    case .full: decodeAll(&reader, &decoder, &sink, &captureError)
    default: decodePartly(stage, &reader, &decoder, &sink, &captureError)
    }
    let seconds = now() - start
    var mallocs = 0, frees = 0
    if counting {
        MallocInterposerSwift.unhook()
        let s = MallocInterposerSwift.getStatistics()
        mallocs = s.mallocCount
        frees = s.freeCount
    }
    return DecodeRun(seconds: seconds, mallocs: mallocs, frees: frees, tally: decoder.tally, sink: sink,
                     captureError: captureError)
}

/// The measured loop: every record of the file through the decoder.
@inline(never)
func decodeAll(_ reader: inout CaptureReader, _ decoder: inout AdvertisementDecoder, _ sink: inout Int,
               _ captureError: inout WireError?) {
    var s = 0
    do throws(WireError) {
        while let record = try reader.next() {
            decoder.decode(record: record) { heard in
                s &+= Int(heard.report.rssi) &+ heard.content.structures
            }
        }
    } catch {
        captureError = error
    }
    sink = s
}

enum Stage: String, ExpressibleByArgument, Sendable { case records, reports, content, full }

/// The loop cut short at `stage`, for finding where the time goes (not the headline figure).
@inline(never)
func decodePartly(_ stage: Stage, _ reader: inout CaptureReader, _ decoder: inout AdvertisementDecoder,
                  _ sink: inout Int, _ captureError: inout WireError?) {
    var s = 0
    do throws(WireError) {
        while let record = try reader.next() {
            decoder.tally.records &+= 1
            guard case .hci(let hci) = record.kind, hci.type == .event else { continue }
            if stage == .records { s &+= hci.bytes.count; continue }
            let n = try HCIEvent.forEachAdvertisingReport(inEvent: hci.bytes) { report in
                if stage == .reports { s &+= Int(report.rssi) &+ report.data.count; return }
                do throws(WireError) {
                    let content = try AdvertisementContent.decode(report.data)
                    s &+= Int(report.rssi) &+ content.structures
                } catch {
                    s &+= 1_000_000
                }
            }
            decoder.tally.reports &+= n
        }
    } catch {
        captureError = error
    }
    sink = s
}

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// What the generator says it wrote; every decode must agree, or the figure is meaningless.
struct Expected {
    var beacons = 0
    var continuity = 0
    var other = 0
    var extended = 0

    func check(_ r: DecodeRun, reports: Int) throws {
        if let e = r.captureError { throw BenchError("the capture did not read to its end: \(e)") }
        let t = r.tally
        guard t.reports == reports, t.beacons == beacons, t.continuityReports == continuity, t.other == other,
              t.extendedReports == extended, t.drops.total == 0 else {
            throw BenchError("""
                decode disagrees with the generator: reports \(t.reports)/\(reports), beacons \(t.beacons)/\(beacons), \
                continuity \(t.continuityReports)/\(continuity), other \(t.other)/\(other), \
                extended \(t.extendedReports)/\(extended), drops \(t.drops.total)
                """)
        }
    }
}

struct Summary {
    var reports: Int
    var records: Int
    var bytes: Int
    var devices: Int
    var seed: UInt64
    var runs: [Double]
    var bestSeconds: Double
    var reportsPerSecond: Double
    var nanosecondsPerReport: Double
    var mallocs: Int
    var frees: Int
    var reportsCounted: Int
    var allocationsPerReport: Double
    var calibrationMallocs: Int
    var tally: AdvertisementTally

    var continuity: [(name: String, count: Int)] { tally.continuityByName }

    var json: String {
        let runList = runs.map { String($0) }.joined(separator: ", ")
        let byName = continuity.map { "\"\($0.name)\": \($0.count)" }.joined(separator: ", ")
        return """
            {"decoder": "baton", "reports": \(reports), "records": \(records), "bytes": \(bytes), \
            "devices": \(devices), "seed": \(seed), "runs_seconds": [\(runList)], "best_seconds": \(bestSeconds), \
            "reports_per_second": \(reportsPerSecond), "ns_per_report": \(nanosecondsPerReport), \
            "mallocs": \(mallocs), "frees": \(frees), "reports_counted": \(reportsCounted), \
            "allocations_per_report": \(allocationsPerReport), "calibration_mallocs": \(calibrationMallocs), \
            "beacons": \(tally.beacons), "continuity_reports": \(tally.continuityReports), "other": \(tally.other), \
            "legacy_reports": \(tally.legacyReports), "extended_reports": \(tally.extendedReports), \
            "continuity": {\(byName)}, "drops": \(tally.drops.total)}
            """
    }

    var text: String {
        """
        capture: \(reports) reports in \(records) records, \(bytes) bytes (\(devices) devices, seed \(seed))
        decoded: \(tally.beacons) beacons, \(tally.continuityReports) Continuity, \(tally.other) other, \(tally.drops.total) drops
        runs (s): \(runs.map { String(format3($0)) }.joined(separator: " "))
        best: \(format3(reportsPerSecond / 1e6)) M reports/s (\(format3(nanosecondsPerReport)) ns/report)
        allocations: \(mallocs) mallocs over \(reportsCounted) reports = \(allocationsPerReport) per report \
        (counter check: \(calibrationMallocs) for \(BatonBench.calibrationObjects) objects)
        """
    }
}

func format3(_ x: Double) -> String {
    let scaled = (x * 1000).rounded()
    let whole = Int(scaled) / 1000
    let frac = abs(Int(scaled) % 1000)
    let f = String(frac)
    return "\(whole).\(String(repeating: "0", count: 3 - f.count))\(f)"
}
