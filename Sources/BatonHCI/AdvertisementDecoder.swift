// The decode path every radio source feeds (architecture.md §3a): HCI event or sniffed
// link-layer PDU → advertising reports → what each advertisement carries. It counts as it
// goes (reports, beacons, Continuity messages by type, drops by reason) in fixed storage,
// and hands each decoded advertisement to the caller, borrowed. Nothing is allocated per
// report: the zero is measured by scripts/bench.
public import BatonWire

/// One advertisement heard, borrowed from the event or record it came in.
public struct HeardAdvertisement {
    /// Microseconds since the Unix epoch.
    public let timestamp: Int64
    public let report: AdvertisingReport
    public let content: AdvertisementContent
}

public struct AdvertisementTally {
    /// Capture records read (replay only).
    public var records = 0
    /// Advertising reports, legacy and extended, including those dropped afterwards: HCI
    /// reports as tshark counts them, so each fragment of a long advertisement is one.
    public var reports = 0
    public var legacyReports = 0
    public var extendedReports = 0
    /// Advertisements assembled from more than one report (docs/radio.md "Advertisements in
    /// fragments"), truncated ones included, and the reports they were assembled from.
    public var assembled = 0
    public var fragments = 0
    public var beacons = 0
    /// Reports carrying valid Apple Continuity data.
    public var continuityReports = 0
    /// Reports that are neither (decoded fine, nothing of ours in them).
    public var other = 0
    /// Continuity messages by type byte.
    public var continuityByType: InlineArray<256, Int> = .init(repeating: 0)
    public var drops = DropCounts()

    public init() {}

    /// Continuity message counts by name (`ContinuityType.name`), for printing.
    public var continuityByName: [(name: String, count: Int)] {
        var byName: [String: Int] = [:]
        for t in 0..<256 where continuityByType[t] > 0 {
            byName[ContinuityType.name(UInt8(t)).description, default: 0] += continuityByType[t]
        }
        return byName.sorted { $0.key < $1.key }.map { (name: $0.key, count: $0.value) }
    }
}

public struct AdvertisementDecoder {
    public var beaconCompanyID: UInt16
    public var tally = AdvertisementTally()
    /// Extended advertisements in fragments are put back together here (Reassembly.swift).
    public private(set) var reassembly: AdvertisementReassembly

    /// `reassembly`: how many fragmented advertisements may be in progress at once
    /// (`radio.reassembly`); its buffers are allocated here, once.
    public init(beaconCompanyID: UInt16 = ActivityBeacon.defaultCompanyID,
                reassembly: Int = AdvertisementReassembly.defaultCapacity) {
        self.beaconCompanyID = beaconCompanyID
        self.reassembly = AdvertisementReassembly(capacity: reassembly)
    }

    /// Decodes the advertising reports in one HCI event packet (without its H4 indicator).
    /// Other events are ignored. A malformed event is one drop, counted under its reason.
    public mutating func decode(event: UnsafeRawBufferPointer, timestamp: Int64,
                                _ body: (HeardAdvertisement) -> Void) {
        do throws(WireError) {
            _ = try HCIEvent.forEachAdvertisingReport(inEvent: event) { report in
                self.decode(report: report, timestamp: timestamp, body)
            }
        } catch {
            tally.drops.count(error)
        }
    }

    /// Decodes one capture record: HCI events and sniffed advertising PDUs with a good CRC.
    public mutating func decode(record: CaptureRecord, _ body: (HeardAdvertisement) -> Void) {
        tally.records &+= 1
        switch record.kind {
        case .hci(let hci):
            // Only the controller's events carry reports; commands and ACL data are skipped.
            guard hci.type == .event else { return }
            decode(event: hci.bytes, timestamp: record.timestamp, body)
        case .linkLayer(let ll):
            guard ll.isAdvertising else { return }
            guard ll.crc != .bad else { return tally.drops.count("ll-crc-bad") }
            do throws(WireError) {
                if let report = try ll.advertisingReport() { decode(report: report, timestamp: record.timestamp, body) }
            } catch {
                tally.drops.count(error)
            }
        case .malformed(let error):
            tally.drops.count(error)
        case .other, .unsupported:
            return
        }
    }

    /// Takes one report: a whole advertisement is decoded at once, a fragment of a longer one
    /// (§7.7.65.13 Data_Status) waits in the reassembly pool for the rest of its chain.
    public mutating func decode(report: AdvertisingReport, timestamp: Int64, _ body: (HeardAdvertisement) -> Void) {
        tally.reports &+= 1
        guard report.isExtended else {
            tally.legacyReports &+= 1
            return decodeWhole(report, timestamp: timestamp, body)
        }
        tally.extendedReports &+= 1
        // Legacy PDUs reported in extended events are never fragmented (Data_Status is 0).
        guard !report.isLegacyPDU else { return decodeWhole(report, timestamp: timestamp, body) }
        var expired = 0
        let outcome = reassembly.take(report, timestamp: timestamp) { expired &+= 1 }
        for _ in 0 ..< expired { tally.drops.count(Malformed.extAdvChainExpired.name) }
        switch outcome {
        case .whole:
            decodeWhole(report, timestamp: timestamp, body)
        case .held, .discarded:
            tally.fragments &+= 1
        case .dropped(let reason):
            if reason != .extAdvDataStatusReserved { tally.fragments &+= 1 }
            tally.drops.count(reason.name)
        case .truncatedReport:
            tally.drops.count(Malformed.extAdvTruncated.name)
            var cut = report
            cut.data = UnsafeRawBufferPointer(rebasing: report.data[..<AdvertisementReassembly.wholePrefix(report.data)])
            cut.eventType &= ~0x60
            decodeWhole(cut, timestamp: timestamp, body)
        case .assembled(let slot, let truncated):
            tally.fragments &+= 1
            tally.assembled &+= 1
            var whole = report
            let bytes = reassembly.bytes(slot)
            // The last fragment's RSSI and timestamp stand for the advertisement's; Data_Status
            // becomes 0: what is handed on is complete (or, truncated, its whole part).
            whole.data = truncated ? UnsafeRawBufferPointer(rebasing: bytes[..<AdvertisementReassembly.wholePrefix(bytes)]) : bytes
            whole.eventType &= ~0x60
            if truncated { tally.drops.count(Malformed.extAdvTruncated.name) }
            decodeWhole(whole, timestamp: timestamp, body)
            reassembly.release(slot)
        }
    }

    /// Decodes one whole advertisement's data and counts it.
    mutating func decodeWhole(_ report: AdvertisingReport, timestamp: Int64, _ body: (HeardAdvertisement) -> Void) {
        let content: AdvertisementContent
        var messages = ContinuityIterator.empty
        do throws(WireError) {
            content = try AdvertisementContent.decode(report.data, beaconCompanyID: beaconCompanyID)
            // Decode every Continuity message now, so a short Handoff is a drop here and
            // consumers only ever see messages that decode.
            if content.apple != nil {
                messages = content.continuityMessages
                var each = messages
                while let m = each.next() { _ = try m.decode() }
            }
        } catch {
            return tally.drops.count(error)
        }
        switch content.kind {
        case .beacon: tally.beacons &+= 1
        case .continuity:
            tally.continuityReports &+= 1
            while let m = messages.next() { tally.continuityByType[Int(m.type)] &+= 1 }
        case .other: tally.other &+= 1
        }
        body(HeardAdvertisement(timestamp: timestamp, report: report, content: content))
    }
}
