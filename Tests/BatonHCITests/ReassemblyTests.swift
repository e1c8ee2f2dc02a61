// Extended advertisements in fragments: LE Extended Advertising Report, Data_Status in
// Event_Type bits 5–6 (Core 5.4, Vol 4, Part E, §7.7.65.13): 0 complete, 1 incomplete with
// more to come, 2 incomplete and truncated. The rules are docs/radio.md "Advertisements in
// fragments"; every vector is an HCI event as the controller sends it (no H4 indicator).
//
// The advertisement of advertiser A (random C1:22:33:44:55:66, SID 3) is 42 bytes:
//   02 01 06                          Flags: LE General Discoverable, BR/EDR not supported
//   0A 09 48 61 6C 6C 20 6C 61 6D 70  Complete Local Name "Hall lamp"
//   1B FF FF FF 01 03 02 01 …         the activity beacon of protocol.md §2.5 vector 1
// The controller cuts it after "Hall": the name's AD structure spans both reports.
import Testing
import BatonTestSupport
import BatonHCI
import BatonWire

/// One report of LE Extended Advertising Report (§7.7.65.13), fields in order.
private func extendedEvent(type: String, addressType: String, address: String, sid: String, rssi: String,
                           data: String) -> [UInt8] {
    let payload = hx(data)
    let report = hx(type + addressType + address + "01 02" + sid + "7f" + rssi + "0000 00 000000000000")
        + [UInt8(payload.count)] + payload
    return [0x3E, UInt8(2 + report.count), 0x0D, 0x01] + report
}

// A's first fragment: Event_Type 0x0020 (Data_Status 1, more to come), random, C1:22:33:44:55:66
// (least significant octet first), SID 3, RSSI -64: Flags, then the name's first 4 bytes.
private let aFirst = extendedEvent(type: "2000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "c0",
                                   data: "020106 0a09 48616c6c")
// A's second fragment: Event_Type 0x0000 (complete): " lamp", then the beacon AD structure.
private let aSecond = extendedEvent(type: "0000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "be",
                                    data: "206c616d70 1bffffff 0103 0201 b74b9bbe d4c3b2a1 9a785634125a 8000 00000000")
// A's second fragment cut by the controller: Event_Type 0x0040 (Data_Status 2, truncated):
// " lamp" and the beacon's first 6 bytes.
private let aSecondTruncated = extendedEvent(type: "4000", addressType: "01", address: "665544 3322c1", sid: "03",
                                             rssi: "be", data: "206c616d70 1bffffff 0103")
// Advertiser B (public 00:1A:7D:DA:71:13, SID 0): a whole advertisement in one report, Flags only.
private let bWhole = extendedEvent(type: "0000", addressType: "00", address: "1371da 7d1a00", sid: "00", rssi: "b5",
                                   data: "020106")
// Advertiser C (random C3:00:00:00:00:01, SID 1): a two-fragment chain of two name pieces.
private let cFirst = extendedEvent(type: "2000", addressType: "01", address: "010000 0000c3", sid: "01", rssi: "b0",
                                   data: "020106 0609 4261")
private let cSecond = extendedEvent(type: "0000", addressType: "01", address: "010000 0000c3", sid: "01", rssi: "b0",
                                    data: "746f6e")

/// What one decoded advertisement said, copied out of the borrowed report.
private struct Heard: Equatable {
    var address: UInt64
    var data: [UInt8]
    var name: String?
    var beacon: ActivityBeacon?
    var dataStatus: UInt8
}

/// Feeds events (each at `every` µs after the last) through one decoder.
private struct Feed {
    var decoder: AdvertisementDecoder
    var heard: [Heard] = []
    var now: Int64 = 1_795_000_000_000_000

    init(capacity: Int = AdvertisementReassembly.defaultCapacity) {
        decoder = AdvertisementDecoder(reassembly: capacity)
    }

    mutating func take(_ events: [UInt8]..., every: Int64 = 5_000) {
        for e in events {
            now += every
            e.withUnsafeBytes { raw in
                decoder.decode(event: raw, timestamp: now) { h in
                    heard.append(Heard(address: h.report.address, data: Array(h.report.data),
                                       name: h.content.localName.map { String(decoding: $0, as: UTF8.self) },
                                       beacon: h.content.beacon, dataStatus: h.report.dataStatus))
                }
            }
        }
    }

    var drops: [String: Int] { Dictionary(uniqueKeysWithValues: decoder.tally.drops.sorted.map { ($0.reason, $0.count) }) }
}

/// protocol.md §2.5 vector 1.
private let vector1 = ActivityBeacon(flags: [.supportsStreams, .hasWebURL], sequence: 258,
                                     activityTypeHash: activityTypeHash("com.example.reader.article".utf8),
                                     groupHash: 0xA1B2_C3D4, deviceID: 0x5A12_3456_789A, psm: 0x0080)

@Suite struct ReassemblyTests {
    @Test("§7.7.65.13: a beacon in the second fragment of a two-fragment advertisement is decoded, with another advertiser's report in between")
    func beaconInTheSecondFragment_7_7_65_13() throws {
        var feed = Feed()
        feed.take(aFirst, bWhole, aSecond)
        #expect(feed.heard.count == 2, "B at once, then A once whole: \(feed.heard)")
        #expect(feed.heard[0].address == 0x00_1A_7D_DA_71_13 && feed.heard[0].data == [0x02, 0x01, 0x06])
        let a = try #require(feed.heard.last)
        #expect(a.address == 0xC1_22_33_44_55_66)
        #expect(a.data.count == 42, "9 + 33 bytes, in order")
        #expect(a.name == "Hall lamp", "the structure cut between the reports is whole again")
        #expect(a.beacon == vector1)
        #expect(a.dataStatus == 0)
        let t = feed.decoder.tally
        #expect(t.reports == 3 && t.extendedReports == 3, "reports are HCI reports, as tshark counts them")
        #expect(t.assembled == 1 && t.fragments == 2)
        #expect(t.beacons == 1 && t.other == 1)
        #expect(t.drops.total == 0, "nothing is blamed on the peer: \(feed.drops)")
        #expect(feed.decoder.reassembly.openChains == 0, "the buffer is free again")
    }

    @Test("§7.7.65.13: two chains interleaved report by report are both assembled")
    func interleavedChains() {
        var feed = Feed()
        feed.take(aFirst, cFirst, bWhole, cSecond, aSecond)
        #expect(feed.heard.map(\.name) == [nil, "Baton", "Hall lamp"])
        #expect(feed.decoder.tally.assembled == 2 && feed.decoder.tally.drops.total == 0)
    }

    @Test("§7.7.65.13 Data_Status 2: a truncated chain is counted as truncated, not as the peer's malformed data, and its whole structures are decoded")
    func truncatedChain_7_7_65_13() throws {
        var feed = Feed()
        feed.take(aFirst, bWhole, aSecondTruncated)
        #expect(feed.drops == ["ext-adv-truncated": 1], "not ad-overlong: \(feed.drops)")
        let a = try #require(feed.heard.last)
        // Flags and the name are whole; the beacon's structure is cut: it and what follows are not decoded.
        #expect(a.data == hx("020106 0a09 48616c6c206c616d70"))
        #expect(a.name == "Hall lamp" && a.beacon == nil)
        #expect(feed.decoder.tally.assembled == 1)
    }

    @Test("§7.7.65.13 Data_Status 2 on a report of its own: the same rule")
    func truncatedSingleReport() throws {
        var feed = Feed()
        let cut = extendedEvent(type: "4000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "be",
                                data: "020106 0a09 48616c6c")
        feed.take(cut)
        #expect(feed.drops == ["ext-adv-truncated": 1])
        #expect(feed.heard.map(\.data) == [[0x02, 0x01, 0x06]])
    }

    @Test("full pool (capacity + 1): the chain that finds no buffer is refused and counted, its last fragment is not blamed on the peer, the open chains complete")
    func fullPool() throws {
        var feed = Feed(capacity: 1)
        feed.take(aFirst, cFirst, bWhole, cSecond, aSecond)
        #expect(feed.drops == ["ext-adv-pool-full": 1], "\(feed.drops)")
        #expect(feed.heard.map(\.name) == [nil, "Hall lamp"], "B and A; C is discarded to its end")
        #expect(feed.decoder.reassembly.lowWater == 0)
        // With room for both, both are assembled.
        var roomy = Feed(capacity: 2)
        roomy.take(aFirst, cFirst, bWhole, cSecond, aSecond)
        #expect(roomy.drops.isEmpty && roomy.decoder.tally.assembled == 2)
    }

    @Test("a chain whose next fragment misses the 2.5 s deadline is counted expired, and its late fragment is discarded with it")
    func deadline() {
        var feed = Feed()
        feed.take(aFirst)
        feed.take(aSecond, every: 2_600_000)
        #expect(feed.drops == ["ext-adv-chain-expired": 1], "not ad-overlong: \(feed.drops)")
        #expect(feed.heard.isEmpty)
        // Within the deadline it is assembled.
        var prompt = Feed()
        prompt.take(aFirst)
        prompt.take(aSecond, every: 2_400_000)
        #expect(prompt.heard.count == 1 && prompt.drops.isEmpty)
    }

    @Test("a chain past 1,650 bytes (§7.8.57) is dropped as too long and discarded to its end")
    func tooLong() {
        var feed = Feed()
        // 8 reports of 229 bytes of padding-free data (one 0xE4-byte AD structure each: its
        // content is irrelevant, it never gets decoded) make 1,832 bytes.
        let piece = String(repeating: "e3ff", count: 1) + String(repeating: "aa", count: 227)
        let more = extendedEvent(type: "2000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "c0", data: piece)
        let last = extendedEvent(type: "0000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "c0", data: piece)
        feed.take(more, more, more, more, more, more, more, more, last)
        #expect(feed.drops == ["ext-adv-chain-too-long": 1], "\(feed.drops)")
        #expect(feed.heard.isEmpty)
        #expect(feed.decoder.tally.fragments == 9)
    }

    @Test("§7.7.65.13 Data_Status 3 is reserved: the report is dropped and the chain it continues abandoned")
    func reservedStatus() {
        var feed = Feed()
        let reserved = extendedEvent(type: "6000", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "be",
                                     data: "020106")
        feed.take(aFirst, reserved)
        #expect(feed.drops == ["ext-adv-data-status-reserved": 1])
        #expect(feed.decoder.reassembly.openChains == 0)
    }

    @Test("the scan response is its own chain (§7.7.65.13 Event_Type bit 3)")
    func scanResponseIsItsOwnChain() {
        var feed = Feed()
        // A's scan response (Event_Type 0x0008, complete) arrives inside A's advertising chain.
        let response = extendedEvent(type: "0800", addressType: "01", address: "665544 3322c1", sid: "03", rssi: "be",
                                     data: "0309 4869")
        feed.take(aFirst, response, aSecond)
        #expect(feed.heard.map(\.name) == ["Hi", "Hall lamp"])
    }

    @Test func wholePrefixStopsBeforeTheCutStructure() {
        func prefix(_ hex: String) -> Int { hx(hex).withUnsafeBytes { AdvertisementReassembly.wholePrefix($0) } }
        #expect(prefix("") == 0)
        #expect(prefix("020106") == 3)
        #expect(prefix("020106 0309") == 3)
        #expect(prefix("020106 00 0000") == 3, "the non-significant part")
        #expect(prefix("ff") == 0)
    }
}
