// `baton replay FILE`: decode a capture and print what it heard (README.md, docs/captures.md).
import BatonLibc
import ArgumentParser
import BatonHCI
import BatonWire
import Foundation

struct Replay: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Decode a capture (btsnoop, btmon -w, Android snoop log, pcap, pcapng) and print what it heard.",
        discussion: """
            Prints one JSON line per advertisement (kind beacon, continuity or other), then a summary. \
            A damaged file prints everything before the damage, names the byte offset, and exits 1.
            """)

    @Argument(help: "The capture file.")
    var file: String

    @Flag(help: "Print only the summary.")
    var summary = false

    @Flag(help: "Print the summary as one JSON object (records, reports, beacons, continuity, drops).")
    var json = false

    @Flag(help: "Replay at the pace of the capture's timestamps instead of as fast as possible.")
    var paced = false

    @Option(help: "The company id activity beacons are sent under (default 0xFFFF).",
            transform: { s throws(ValidationError) in try parseCompanyID(s) })
    var companyID: UInt16 = ActivityBeacon.defaultCompanyID

    func run() throws {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw ValidationError("cannot read \(file)")
        }
        var out = LineOutput()
        var decoder = AdvertisementDecoder(beaconCompanyID: companyID)
        var damage: WireError?
        var firstTimestamp: Int64?
        let start = Instant.now
        let printLines = !summary

        try data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws in
            var reader: CaptureReader
            do { reader = try CaptureReader(raw) } catch {
                throw ValidationError("\(file) is not a capture Baton reads: \(error) (formats: docs/captures.md)")
            }
            while true {
                let record: CaptureRecord?
                do throws(WireError) { record = try reader.next() } catch { damage = error; break }
                guard let record else { break }
                if paced { pace(record.timestamp, first: &firstTimestamp, start: start) }
                decoder.decode(record: record) { heard in
                    guard printLines else { return }
                    out.line { w throws(WireError) in try heard.renderJSON(into: &w) }
                }
            }
        }
        out.flush()
        let tally = decoder.tally
        if json {
            print(summaryJSON(tally, damage: damage))
        } else {
            printSummary(tally, damage: damage)
        }
        if let damage {
            Stderr.say("replay", "\(file) is damaged: \(damage); the records before it were read")
            throw ExitCode(1)
        }
    }

    private func pace(_ t: Int64, first: inout Int64?, start: Instant) {
        let origin = first ?? t
        first = origin
        let due = start + .microseconds(max(0, t - origin))
        let now = Instant.now
        if due > now { Thread.sleep(forTimeInterval: Double((due - now).components.attoseconds) / 1e18 + Double((due - now).components.seconds)) }
    }

    private func printSummary(_ t: AdvertisementTally, damage: WireError?) {
        print("records: \(t.records)")
        print("advertising reports: \(t.reports) (legacy \(t.legacyReports), extended \(t.extendedReports))")
        // Reports are HCI reports as tshark counts them; a long extended advertisement is
        // several (docs/radio.md "Advertisements in fragments").
        print("assembled advertisements: \(t.assembled) (from \(t.fragments) fragment reports)")
        print("beacons: \(t.beacons)")
        let byName = t.continuityByName
        print("continuity: \(t.continuityReports) report(s)" + (byName.isEmpty ? "" : ": " + byName.map { "\($0.name) \($0.count)" }.joined(separator: ", ")))
        print("other advertisements: \(t.other)")
        let drops = t.drops.sorted
        print("drops: \(t.drops.total)" + (drops.isEmpty ? "" : ": " + drops.map { "\($0.reason) \($0.count)" }.joined(separator: ", ")))
        if let damage { print("damaged: \(damage)") }
    }

    private func summaryJSON(_ t: AdvertisementTally, damage: WireError?) -> String {
        var object: [String: Any] = [
            "records": t.records,
            "reports": t.reports,
            "legacy_reports": t.legacyReports,
            "extended_reports": t.extendedReports,
            "assembled": t.assembled,
            "fragments": t.fragments,
            "beacons": t.beacons,
            "continuity_reports": t.continuityReports,
            "other": t.other,
            "continuity": Dictionary(uniqueKeysWithValues: t.continuityByName.map { ($0.name, $0.count) }),
            "drops": Dictionary(uniqueKeysWithValues: t.drops.sorted.map { ($0.reason, $0.count) }),
        ]
        if let damage {
            object["damaged"] = ["reason": damage.reason, "at": damage.byteOffset ?? -1, "message": damage.description] as [String: Any]
        }
        let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }
}

func parseCompanyID(_ s: String) throws(ValidationError) -> UInt16 {
    let t = s.lowercased()
    let v = t.hasPrefix("0x") ? UInt16(t.dropFirst(2), radix: 16) : UInt16(t)
    guard let v else { throw ValidationError("company id '\(s)' is not a 16-bit number (e.g. 0xFFFF)") }
    return v
}

extension WireError {
    /// The byte offset the error names, if it names one.
    var byteOffset: Int? {
        switch self {
        case .truncated(let at, _), .badLength(let at, _), .trailing(let at, _), .unsupported(let at, _), .malformed(let at, _): at
        case .noRoom: nil
        }
    }
}

/// JSON lines into one reusable buffer, written to stdout in large chunks.
struct LineOutput {
    private var buffer = [UInt8](repeating: 0, count: 1 << 16)
    private var used = 0

    mutating func line(_ body: (inout JSONWriter) throws(WireError) -> Void) {
        if buffer.count - used < 4096 { flush() }
        let written: Int = buffer.withUnsafeMutableBytes { raw in
            let room = UnsafeMutableRawBufferPointer(rebasing: raw[used...])
            var w = JSONWriter(room)
            do { try body(&w) } catch { return 0 }  // a line over 4 KB cannot happen: reports are ≤ 229 bytes
            return w.written.count
        }
        guard written > 0 else { return }
        used += written
        buffer[used] = UInt8(ascii: "\n")
        used += 1
    }

    mutating func flush() {
        guard used > 0 else { return }
        buffer.withUnsafeBytes { raw in FileHandle.standardOutput.write(Data(raw[..<used])) }
        used = 0
    }
}
