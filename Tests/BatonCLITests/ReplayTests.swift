// `baton replay` as a user runs it: the built binary on capture files, its JSON lines and its
// summary compared with what the generator wrote and with what tshark counts in the same file.
import BatonHCI
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

/// The directory holding the test bundle also holds the `baton` executable.
let binaries = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()

struct Run {
    var status: Int32
    var stdout: String
    var stderr: String
    var lines: [[String: Any]] {
        stdout.split(separator: "\n").compactMap { line in
            guard line.hasPrefix("{") else { return nil }
            return try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        }
    }
}

func run(_ executable: URL, _ arguments: [String]) throws -> Run {
    let p = Process()
    p.executableURL = executable
    p.arguments = arguments
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    // Read before waiting: a full pipe would block the child.
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return Run(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
}

func baton(_ arguments: String...) throws -> Run { try run(binaries.appendingPathComponent("baton"), arguments) }

func temporaryFile(_ name: String, _ bytes: [UInt8]) throws -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("baton-tests-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    let url = dir.appendingPathComponent(name)
    try Data(bytes).write(to: url)
    return url.path
}

func hex48(_ v: UInt64) -> String {
    (0..<6).map { String(format: "%02X", UInt8(truncatingIfNeeded: v >> (8 * (5 - UInt64($0))))) }.joined(separator: ":")
}

@Suite struct ReplayTests {
    @Test(arguments: [CaptureDatalink.androidH4, .btmon])
    func replayPrintsExactlyTheBeaconsWritten(_ datalink: CaptureDatalink) throws {
        var g = CaptureGenerator(devices: 30, seed: 7)
        let (file, written) = g.capture(reports: 3_000, datalink: datalink, invalidateAtEnd: true)
        let path = try temporaryFile("beacons-\(datalink).btsnoop", file)
        let r = try baton("replay", path)
        #expect(r.status == 0, "\(r.stderr)")

        let heard = r.lines
        #expect(heard.count == written.count, "one line per report, none dropped")
        var beaconsChecked = 0, handoffsChecked = 0, namesChecked = 0
        for (line, report) in zip(heard, written) {
            #expect(line["address"] as? String == hex48(report.address))
            #expect(line["rssi"] as? Int == Int(report.rssi))
            #expect(line["extended"] as? Bool == report.extended)
            switch report.kind {
            case .baton(let b):
                #expect(line["kind"] as? String == "beacon")
                #expect(line["device"] as? String == hex48(b.deviceID))
                #expect(line["seq"] as? Int == Int(b.sequence))
                #expect(line["psm"] as? Int == Int(b.psm))
                #expect(line["group"] as? String == "a1b2c3d4")
                var flags: [String] = []
                if b.flags.contains(.supportsStreams) { flags.append("streams") }
                if b.flags.contains(.hasWebURL) { flags.append("web-url") }
                if b.flags.contains(.invalidated) { flags.append("invalidated") }
                #expect(line["flags"] as? [String] == flags)
                beaconsChecked += 1
            case .apple(let seq):
                #expect(line["kind"] as? String == "continuity")
                let messages = line["messages"] as? [[String: Any]] ?? []
                #expect(messages.map { $0["type"] as? String } == ["nearby-info", "handoff"])
                #expect(messages.last?["seq"] as? Int == Int(seq))
                handoffsChecked += 1
            case .ordinary(let name):
                #expect(line["kind"] as? String == "other")
                #expect(line["name"] as? String == name)
                namesChecked += 1
            }
        }
        #expect(beaconsChecked > 900 && handoffsChecked > 900 && namesChecked > 900)
        // The last 10 lines are the invalidations, one per Baton device.
        let invalidated = heard.suffix(10).filter { ($0["flags"] as? [String])?.contains("invalidated") == true }
        #expect(invalidated.count == 10)
    }

    @Test func summaryJSONCountsWhatWasWritten() throws {
        var g = CaptureGenerator(devices: 9, seed: 3)
        let (file, written) = g.capture(reports: 900)
        let path = try temporaryFile("summary.btsnoop", file)
        let r = try baton("replay", "--summary", "--json", path)
        #expect(r.status == 0)
        let s = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any])
        let beacons = written.filter { if case .baton = $0.kind { true } else { false } }.count
        let apple = written.filter { if case .apple = $0.kind { true } else { false } }.count
        #expect(s["reports"] as? Int == 900)
        #expect(s["beacons"] as? Int == beacons)
        #expect(s["continuity"] as? [String: Int] == ["handoff": apple, "nearby-info": apple])
        #expect(s["drops"] as? [String: Int] == [:])
        #expect((s["records"] as? Int ?? 0) < 900, "events carry 1–3 reports each")
        #expect(!r.stdout.contains("\"kind\""), "--summary prints no advertisement lines")
    }

    @Test func aTruncatedFileYieldsWhatCameBeforeAndNamesTheOffset() throws {
        var g = CaptureGenerator(devices: 6, seed: 5)
        let (file, _) = g.capture(reports: 200)
        let whole = try baton("replay", temporaryFile("whole.btsnoop", file)).lines.count
        let cut = Array(file[..<(file.count - 10)])
        let r = try baton("replay", try temporaryFile("cut.btsnoop", cut))
        #expect(r.status == 1)
        #expect(r.stderr.contains("is damaged"))
        // The last record started somewhere in the final 10 + 24 + 257 bytes; the error names it.
        let offset = try #require(r.stdout.split(separator: "\n").first { $0.hasPrefix("damaged:") })
        #expect(offset.contains("at byte"))
        let before = r.lines.count
        #expect(before >= whole - 3 && before < whole, "every report before the damaged record is printed")
    }

    @Test func notACaptureIsAClearError() throws {
        let r = try baton("replay", try temporaryFile("notes.txt", Array("hello, this is not a capture\n".utf8)))
        #expect(r.status != 0)
        #expect(r.stderr.contains("is not a capture Baton reads"))
        let missing = try baton("replay", "/nonexistent/file.btsnoop")
        #expect(missing.status != 0 && missing.stderr.contains("cannot read"))
    }
}

/// tshark, Wireshark's decoder, counts the same advertising reports in the same file.
func tsharkCounts(_ path: String) throws -> (records: Int, legacy: Int, extended: Int) {
    let tshark = URL(fileURLWithPath: "/usr/bin/tshark")
    func sum(_ subevent: String) throws -> Int {
        let r = try run(tshark, ["-r", path, "-Y", "bthci_evt.le_meta_subevent == \(subevent)", "-T", "fields", "-e", "bthci_evt.le_num_reports"])
        return r.stdout.split(whereSeparator: \.isNewline).compactMap { Int($0) }.reduce(0, +)
    }
    let frames = try run(tshark, ["-r", path, "-T", "fields", "-e", "frame.number"])
    return (frames.stdout.split(whereSeparator: \.isNewline).count, try sum("0x02"), try sum("0x0d"))
}

func ourCounts(_ path: String) throws -> (records: Int, legacy: Int, extended: Int) {
    let r = try baton("replay", "--summary", "--json", path)
    let s = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] ?? [:]
    return (s["records"] as? Int ?? -1, s["legacy_reports"] as? Int ?? -1, s["extended_reports"] as? Int ?? -1)
}

@Suite struct TsharkAgreementTests {
    @Test(arguments: [CaptureDatalink.androidH4, .btmon])
    func tsharkCountsTheSameReportsInAGeneratedCapture(_ datalink: CaptureDatalink) throws {
        #expect(FileManager.default.isExecutableFile(atPath: "/usr/bin/tshark"), "tshark is missing: run scripts/setup")
        var g = CaptureGenerator(devices: 20, seed: 11)
        let (file, _) = g.capture(reports: 1_500, datalink: datalink)
        let path = try temporaryFile("tshark-\(datalink).btsnoop", file)
        let theirs = try tsharkCounts(path)
        let ours = try ourCounts(path)
        #expect(ours.records == theirs.records)
        #expect(ours.legacy == theirs.legacy && ours.extended == theirs.extended)
        #expect(ours.legacy + ours.extended == 1_500)
    }

    @Test("§7.7.65.13: long extended advertisements in fragments, interleaved: `reports` counts HCI reports as tshark does, `assembled` the advertisements put back together")
    func fragmentedCaptureCountsReportsAsTsharkAndAssemblesTheAdvertisements() throws {
        #expect(FileManager.default.isExecutableFile(atPath: "/usr/bin/tshark"), "tshark is missing: run scripts/setup")
        var g = CaptureGenerator(devices: 20, seed: 19)
        g.longAdvertisements = true
        let (file, written) = g.capture(reports: 1_500)
        let fragments = written.filter { $0.extended }
        let chains = fragments.filter { $0.dataStatus == 1 }
        let path = try temporaryFile("fragmented.btsnoop", file)
        let theirs = try tsharkCounts(path)
        let ours = try ourCounts(path)
        #expect(ours.records == theirs.records)
        #expect(ours.legacy == theirs.legacy && ours.extended == theirs.extended)
        #expect(ours.extended == fragments.count)
        let r = try baton("replay", "--summary", "--json", path)
        let s = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any])
        let assembled = try #require(s["assembled"] as? Int)
        #expect(assembled == g.chainsCompleted && assembled > 20, "every chain the generator finished is assembled")
        #expect((s["fragments"] as? Int) == chains.count + assembled, "each chain's reports")
        #expect((s["drops"] as? [String: Int]) == [:], "nothing blamed on anyone: \(s["drops"] ?? "")")
        // Every Baton device's beacon is heard, the long advertisers' included.
        let batons = Set(written.filter { if case .baton = $0.kind { true } else { false } }.map(\.device))
        let lines = try baton("replay", path).lines
        let heardDevices = Set(lines.filter { $0["kind"] as? String == "beacon" }.compactMap { $0["address"] as? String })
        #expect(heardDevices.count == batons.count)
        let text = try baton("replay", "--summary", path).stdout
        #expect(text.contains("assembled advertisements: \(assembled) (from \(chains.count + assembled) fragment reports)"), "\(text)")
    }

    /// Real captures recorded by other tools (Tests/Fixtures/SOURCES.md). Their bytes come
    /// from public repositories and are kept outside this repository: set BATON_REAL_CAPTURES
    /// to the folder holding them, or place them in ../shared/captures.
    static let realCaptures: String? = {
        let candidates: [String?] = [ProcessInfo.processInfo.environment["BATON_REAL_CAPTURES"],
                          repository.deletingLastPathComponent().appendingPathComponent("shared/captures").path]
        return candidates.compactMap { $0 }.first { FileManager.default.fileExists(atPath: $0 + "/android-horizon-treadmill.log") }
    }()

    @Test(.enabled(if: realCaptures != nil, "real captures are not on this machine (Tests/Fixtures/SOURCES.md)"))
    func tsharkCountsTheSameReportsInRealCaptures() throws {
        let dir = try #require(Self.realCaptures)
        let table = try String(contentsOf: repository.appendingPathComponent("Tests/Fixtures/expected-counts.tsv"), encoding: .utf8)
        let rows = table.split(separator: "\n").dropFirst().map { $0.split(separator: "\t") }
        #expect(rows.count >= 4)
        for row in rows {
            let path = dir + "/" + row[0]
            let ours = try ourCounts(path)
            let theirs = try tsharkCounts(path)
            #expect(ours.records == theirs.records, "\(row[0])")
            #expect(ours.legacy == theirs.legacy && ours.extended == theirs.extended, "\(row[0])")
            // And the numbers recorded when the fixture was chosen.
            #expect(ours.records == Int(row[2]) && ours.legacy == Int(row[3]) && ours.extended == Int(row[4]), "\(row[0])")
        }
    }
}
